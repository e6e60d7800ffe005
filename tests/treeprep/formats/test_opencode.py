"""opencode: OpenCode sessions, exported or in OpenCode's JSON storage (issue 40 item 5).

``sample_data/opencode/`` is written by us from OpenCode's ``MessageV2`` schemas: ``storage/``
in the layout ``json-migration.ts`` reads (a session that spawns a ``task`` sub-agent, and the
sub-agent's session), and an ``opencode export`` document of a session with a failed tool call
and a compaction. The expected prompts are written out by hand from ``toModelMessages`` and
``filterCompacted``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.opencode import FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "opencode"
SESSIONS = SAMPLE / "storage" / "session" / "4b0ea68d7af9a6031a7ffda7ad66e0cb83315750"
PARENT = SESSIONS / "ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ.json"
CHILD = SESSIONS / "ses_5b2f0e7a1ffeHk3Wd9Px4Yc6sJ.json"
EXPORT = SAMPLE / "export-ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD.json"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(p: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(p), opts or ReadOptions()))


def _dump(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


RENAME = "Rename utils.py to helpers.py and update the imports."
GIT_MV = {"command": "git mv utils.py helpers.py", "description": "Rename the module"}
SUMMARY = (
    "We renamed utils.py to helpers.py with git mv. Searching the imports failed: ripgrep is "
    "missing. Next: update the imports by hand."
)


def test_detection() -> None:
    for p in (PARENT, CHILD, EXPORT):
        assert detect_format(str(p), p.read_bytes()) is FORMAT
    # message and part files are no logs on their own
    for p in [*(SAMPLE / "storage" / "message").rglob("*.json")][:2]:
        assert detect_format(str(p), p.read_bytes()) is None
    for p in [*(SAMPLE / "storage" / "part").rglob("*.json")][:2]:
        assert detect_format(str(p), p.read_bytes()) is None
    other = ROOT / "sample_data" / "tau_bench_shop.json"
    assert detect_format(str(other), other.read_bytes()[:65536]) is not FORMAT


def test_each_step_is_a_call_prompted_with_the_steps_before_it() -> None:
    calls = _read(EXPORT)
    assert all(isinstance(c, ChatCall) for c in calls)
    sid = "ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD"
    assert [c.call_id for c in calls] == [
        f"{sid}/msg_b02#0", f"{sid}/msg_b02#1", f"{sid}/msg_b02#2",
        f"{sid}/msg_b04#0", f"{sid}/msg_b06#0", f"{sid}/msg_b06#1",
    ]  # fmt: skip
    assert {(c.group_id, c.model) for c in calls} == {(sid, "claude-sonnet-4-5")}
    assert _dump(calls[2]) == [
        {"role": "user", "content": RENAME},
        {"role": "assistant", "content": "", "tool_calls": [_call("toolu_11", "bash", GIT_MV)]},
        {"role": "tool", "tool_call_id": "toolu_11", "name": "bash", "content": ""},
        {"role": "assistant", "content": "",
         "tool_calls": [_call("toolu_12", "grep", {"pattern": "import utils"})]},
        {"role": "tool", "tool_call_id": "toolu_12", "name": "grep",
         "content": "Error: ripgrep is not installed"},  # the error part, as the model saw it
    ]  # fmt: skip
    assert calls[2].completion.content == "Renamed it; I could not search the imports (no ripgrep)."
    assert calls[0].source_line < calls[3].source_line < calls[4].source_line  # each message's


def test_a_compaction_starts_the_prompts_at_its_request() -> None:
    calls = _read(EXPORT)
    summariser, after = calls[3], calls[4]
    assert _dump(summariser)[-1] == {"role": "user", "content": "What did we do so far?"}
    assert len(summariser.messages) == 7 and summariser.branch_reason is None
    assert summariser.completion.content == SUMMARY
    assert _dump(after) == [
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": SUMMARY},
        {"role": "user", "content": "Update the import in app.py."},
    ]
    assert after.branch_reason == "compaction" and calls[5].branch_reason is None


def test_a_compaction_that_keeps_a_tail_sends_it_after_the_summary(tmp_path: Path) -> None:
    def keep(doc: dict[str, Any]) -> None:  # newer versions: the request names the kept tail
        doc["messages"][2]["parts"][0]["tail_start_id"] = "msg_b01"

    after = _read(_export(tmp_path, keep))[4]
    assert [m["content"] for m in _dump(after) if m["role"] == "user"] == [
        "What did we do so far?", RENAME, "Update the import in app.py."
    ]  # fmt: skip
    assert _dump(after)[1] == {"role": "assistant", "content": SUMMARY}
    assert len(after.messages) == 9 and after.branch_reason == "compaction"


def test_storage_sessions_and_a_sub_agent_in_its_root_sessions_tree() -> None:
    calls = _read(PARENT, ReadOptions(system_prompt="You are opencode."))
    assert len(calls) == 3 and all(isinstance(c, ChatCall) for c in calls)
    first = calls[0]
    assert first.messages[0].content == "You are opencode."
    # the user's text and the synthetic Read of the attached file; the text/plain file part
    # itself is not sent (its text is)
    assert [p.text[:30] for p in first.messages[1].content] == [
        "Add a --version flag to cli.py",
        "Called the Read tool with the ",
        "<file>\n00001| import sys\n00002",
    ]
    assert first.completion.reasoning_content == "Check the changelog for the version first."
    assert [t.function.name for t in first.completion.tool_calls or []] == ["task"]
    assert calls[2].completion.content == "Done: `cli.py --version` prints 1.2.0."
    sub = _read(CHILD)
    assert [(c.group_id, c.branch_reason) for c in sub] == [
        ("ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ", "sub-agent"),
        ("ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ", None),
    ]
    assert sub[0].agent_id == "ses_5b2f0e7a1ffeHk3Wd9Px4Yc6sJ"


def _export(tmp_path: Path, edit: Any) -> Path:
    doc = json.loads(EXPORT.read_text())
    edit(doc)
    p = tmp_path / "export.json"
    p.write_text(json.dumps(doc, indent=2))
    return p


def test_a_cut_step_is_rejected_and_an_errored_message_is_left_out(tmp_path: Path) -> None:
    def cut(doc: dict[str, Any]) -> None:
        b02 = doc["messages"][1]
        b02["parts"] = b02["parts"][:-1]  # the last step's step-finish
        b02["info"]["error"] = {"name": "APIError", "data": {"message": "overloaded"}}

    items = _read(_export(tmp_path, cut))
    assert [type(x) for x in items] == [ChatCall, ChatCall, Reject, ChatCall, ChatCall, ChatCall]
    assert "no step-finish" in items[2].reason
    # the errored message is not sent: the summariser's prompt holds the request alone
    assert _dump(items[3]) == [
        {"role": "user", "content": RENAME},
        {"role": "user", "content": "What did we do so far?"},
    ]


def test_a_bad_part_rejects_the_calls_from_its_message_on(tmp_path: Path) -> None:
    def bad(doc: dict[str, Any]) -> None:
        doc["messages"][1]["parts"][1]["state"]["input"] = "git mv"

    items = _read(_export(tmp_path, bad))
    assert [type(x) for x in items] == [Reject] * 7
    assert items[0].reason == "messages[1].parts[1].state.input: expected an object, got string"
    assert items[1].reason.endswith("(the prompts after it would miss it)")
    assert items[1].call_id == "ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD/msg_b02#0"  # its own steps


def test_a_storage_part_that_is_not_json_names_its_file(tmp_path: Path) -> None:
    store = tmp_path / "storage"
    shutil.copytree(SAMPLE / "storage", store)
    part = sorted((store / "part" / "msg_a4f10c002ffeQ2").glob("*.json"))[2]
    part.write_text("{cut")
    session = store / "session" / PARENT.parent.name / PARENT.name
    (rej,) = _read(session)  # the message, whose steps cannot be told apart any more
    assert isinstance(rej, Reject) and str(part) in rej.reason and rej.file == str(session)


def test_the_sample_builds_into_a_tree_per_root_session(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (11, 2, 0)


@needs_qwen
@pytest.mark.parametrize("path", [EXPORT, CHILD])
def test_calls_render_as_apply_chat_template_qwen3(path: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = _read(path, ReadOptions(system_prompt="You are opencode."))
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)
