"""pi: Pi coding-agent sessions, a message tree with forks (issue 40 item 5), and the context as
Pi sends it (issue 50 item 2).

``sample_data/pi/`` is written by us from badlogic/pi-mono's ``session-manager.ts`` (entries with
``id``/``parentId``, ``buildSessionContext``) and ``messages.ts`` (``convertToLlm``): a rename
with a ``grep`` and an ``edit`` call, a fork that keeps an alias, a ``branch_summary`` back to the
clean rename, a ``!pytest`` bash execution, and a compaction keeping the last exchange. The
expected prompts are written out by hand.

The second sample, ``--home-dev-cli--/``, is a v1 session (no ``version``, no ids; Pi's
``migrateV1ToV2`` chains its entries and turns ``firstKeptEntryIndex`` into an id) holding what
``transformMessages`` (``packages/ai/src/providers/transform-messages.ts``) changes: a tool call
left without its result when Pi was closed, an ``error`` reply that Pi's auto-retry followed, and
an ``aborted`` partial reply. Upstream files read at badlogic/pi-mono
83378aad7e74a0e2bb8f37c007a9685fb4609d8a.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import InputError
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.pi import BRANCH_PREFIX, COMPACTION_PREFIX, FORMAT, NO_RESULT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
PI = ROOT / "sample_data" / "pi"
SID = "9a8b7c6d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"
SAMPLE = PI / "--home-dev-shop--" / f"2025-11-05T09-00-00-000Z_{SID}.jsonl"
V1_SID = "5c4d3e2f-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
V1 = PI / "--home-dev-cli--" / f"2025-10-20T14-00-00-000Z_{V1_SID}.jsonl"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(p: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(p), opts or ReadOptions()))


def _said(call: ChatCall) -> list[tuple[str, str]]:
    return [(m.role, m.text()) for m in call.messages]


def test_detection() -> None:
    assert detect_format(str(SAMPLE), SAMPLE.read_bytes()) is FORMAT
    codex = next((ROOT / "sample_data" / "codex").rglob("*.jsonl"))
    assert detect_format(str(codex), codex.read_bytes()[:65536]) is not FORMAT


def test_every_assistant_entry_is_a_call_on_its_path() -> None:
    calls = _read(SAMPLE)
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.call_id.split("/")[1] for c in calls] == ["e2", "e4", "e6", "e8", "e11", "e13"]
    assert [c.branch_reason for c in calls] == [None, None, None, None, "retry", "compaction"]
    first = calls[0]
    assert first.group_id == SID and first.model == "claude-sonnet-4-5"
    assert first.completion.reasoning_content == "Find where fmt_price is defined and used."
    assert first.completion.content == "I will search for it."
    (tc,) = first.completion.tool_calls or []
    assert (tc.id, tc.function.name, tc.function.arguments) == (
        "tc1",
        "grep",
        {"pattern": "fmt_price"},
    )
    assert calls[1].messages[-1].tool_call_id == "tc1" and calls[1].messages[-1].name == "grep"


def test_a_fork_prompts_with_its_own_branch() -> None:
    calls = _read(SAMPLE)
    retry = calls[4]  # from e6 again: the branch summary, the bash run, the question
    assert _said(retry)[-4:] == [
        ("assistant", "Renamed fmt_price to format_price in shop/util.py."),
        ("user", BRANCH_PREFIX + "Tried keeping an alias fmt_price; the user went back to a "
         "clean rename.</summary>"),
        ("user", "Ran `pytest -q`\n```\n3 passed\n```"),
        ("user", "Good. Summarize what changed."),
    ]  # fmt: skip
    assert retry.parent_call_id == f"{SID}/e6"
    assert ("user", "Also keep an alias fmt_price for old callers.") not in _said(retry)


def test_after_a_compaction_the_summary_and_the_kept_entries() -> None:
    last = _read(SAMPLE)[-1]
    assert _said(last) == [
        ("user", COMPACTION_PREFIX + "Renamed fmt_price to format_price in shop/util.py; tests "
         "pass.\n</summary>"),
        ("user", "Good. Summarize what changed."),
        ("assistant", "fmt_price is now format_price; the tests pass."),
        ("user", "Write a changelog line."),
    ]  # fmt: skip


def test_a_dangling_parent_is_a_reject_naming_it(tmp_path: Path) -> None:
    lines = SAMPLE.read_text().splitlines()
    bad = json.loads(lines[3])
    bad["parentId"] = "nowhere"
    p = tmp_path / "s.jsonl"
    p.write_text("\n".join([lines[0], lines[1], lines[2], json.dumps(bad)]) + "\n")
    (rej,) = _read(p)
    assert isinstance(rej, Reject) and rej.line == 4
    assert rej.reason == "parentId 'nowhere' names no earlier entry of the session"


def test_the_session_builds_into_one_tree(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (6, 1, 0)


@needs_qwen
@pytest.mark.parametrize("sample", [SAMPLE, V1], ids=["v3", "v1"])
def test_calls_render_as_apply_chat_template_qwen3(sample: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    items = _read(sample, ReadOptions(system_prompt="You are Pi."))
    calls = [c for c in items if isinstance(c, ChatCall)]
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


# --------------------------------------------------------------------------------------------
# the context as Pi sends it (issue 50 item 2)
# --------------------------------------------------------------------------------------------

HEADER = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/w"}


def _session(tmp_path: Path, messages: list[dict[str, Any]], header: Any = HEADER) -> Path:
    """A v3 session chaining ``messages`` (entry ids m1, m2, ...)."""
    lines = [header]
    for i, m in enumerate(messages, 1):
        parent = f"m{i - 1}" if i > 1 else None
        lines.append({"type": "message", "id": f"m{i}", "parentId": parent, "timestamp": "t",
                      "message": {"timestamp": i, **m}})  # fmt: skip
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _reply(content: list[dict[str, Any]], stop: str = "stop") -> dict[str, Any]:
    return {"role": "assistant", "content": content, "api": "openai-responses",
            "provider": "openai", "model": "gpt-5-mini", "stopReason": stop}  # fmt: skip


def _text(t: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": t}]


def test_a_v1_session_is_migrated_not_refused_line_by_line() -> None:
    """Before: every entry of a v1 file was a reject (``id: expected a string``), 16 here."""
    items = _read(V1)
    calls = [i for i in items if isinstance(i, ChatCall)]
    rejects = [i for i in items if isinstance(i, Reject)]
    assert [c.source_line for c in calls] == [4, 8, 10, 14, 17]
    assert [(r.line, r.call_id) for r in rejects] == [(7, f"{V1_SID}/L7"), (12, f"{V1_SID}/L12")]
    assert all(c.group_id == V1_SID for c in calls)
    # migrateV1ToV2 chains every entry to the one before it
    assert [c.parent_call_id for c in calls] == [
        None, f"{V1_SID}/L4", f"{V1_SID}/L8", f"{V1_SID}/L10", f"{V1_SID}/L14"
    ]  # fmt: skip
    assert [c.branch_reason for c in calls] == [None, None, None, None, "compaction"]


def test_a_v1_compaction_keeps_from_its_first_kept_entry_index() -> None:
    """``firstKeptEntryIndex`` counts the file's entries, the header being 0: 12 is line 13."""
    last = _read(V1)[-1]
    assert _said(last) == [
        ("user", COMPACTION_PREFIX + "Fixed `cli --version`: main() now prints VERSION.\n"
         "</summary>"),
        ("user", "Never mind the flag. Summarize the fix in one line."),
        ("assistant", "main() printed nothing because it returned VERSION; it prints it now."),
        ("user", "Write a commit message."),
    ]  # fmt: skip


def test_pi_migration_test_fixtures(tmp_path: Path) -> None:
    """packages/coding-agent/test/session-manager/migration.test.ts: a v1 file (no version, no
    ids) gets ids and a parent chain; a v2 file keeps its ids (``abc12345``, ``def67890``)."""
    head = {"type": "session", "id": "sess-1", "timestamp": "2025-01-01T00:00:00Z", "cwd": "/tmp"}
    hello = {"role": "assistant", "content": _text("hello"), "api": "test", "provider": "test",
             "model": "test", "stopReason": "stop", "timestamp": 2}  # fmt: skip
    v1 = [head, {"type": "message", "timestamp": "t1", "message": _user("hi")},
          {"type": "message", "timestamp": "t2", "message": hello}]  # fmt: skip
    p = tmp_path / "v1.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in v1))
    (call,) = _read(p)
    assert call.call_id == "sess-1/L3" and _said(call) == [("user", "hi")]
    v2 = [{**head, "version": 2}, {**v1[1], "id": "abc12345", "parentId": None},
          {**v1[2], "id": "def67890", "parentId": "abc12345"}]  # fmt: skip
    p.write_text("".join(json.dumps(x) + "\n" for x in v2))
    (call,) = _read(p)
    assert call.call_id == "sess-1/def67890" and _said(call) == [("user", "hi")]


def test_a_v2_hook_message_is_a_custom_message(tmp_path: Path) -> None:
    """migrateV2ToV3 renames the role ``hookMessage`` to ``custom``, which is sent as a user
    message. Before: a reject (unknown message role)."""
    hook = {"role": "hookMessage", "customType": "todo", "content": "Open todos: 1",
            "display": True}  # fmt: skip
    p = _session(tmp_path, [_user("go"), hook, _reply(_text("ok"))], {**HEADER, "version": 2})
    (call,) = _read(p)
    assert _said(call) == [("user", "go"), ("user", "Open todos: 1")]
    p = _session(tmp_path, [_user("go"), hook, _reply(_text("ok"))])
    (rej,) = _read(p)  # a v3 file is not migrated
    assert isinstance(rej, Reject) and "hookMessage" in rej.reason


def test_a_file_without_a_session_header_is_one_reject(tmp_path: Path) -> None:
    """Pi's ``loadEntriesFromFile`` reads nothing of a file whose first entry is not the header.
    Before: a reject per entry."""
    p = _session(tmp_path, [_user("go"), _reply(_text("ok"))], header={"type": "model_change"})
    with pytest.raises(InputError) as e:
        _read(p)
    assert e.value.line == 1 and "session header" in e.value.reason


def test_an_aborted_or_errored_reply_is_cut_off_and_leaves_later_prompts() -> None:
    """Before: both were calls (an empty and a partial reply trained as finished) and stayed in
    every later prompt as assistant turns."""
    items = _read(V1)
    rejects = [i for i in items if isinstance(i, Reject)]
    assert [r.reason for r in rejects] == [
        "stopReason 'error': the reply was cut off, so it is no completion "
        "(Pi drops it from the context it sends)",
        "stopReason 'aborted': the reply was cut off, so it is no completion "
        "(Pi drops it from the context it sends)",
    ]
    calls = [i for i in items if isinstance(i, ChatCall)]
    retry, after_abort = calls[1], calls[3]
    assert _said(retry)[-2:] == [
        ("tool", NO_RESULT),
        ("user", "Pi was closed while reading; go on."),
    ]
    assert _said(after_abort)[-3:] == [
        ("assistant", "Fixed: `cli --version` now prints the version."),
        ("user", "Also add a --json flag."),
        ("user", "Never mind the flag. Summarize the fix in one line."),
    ]
    for c in calls:
        assert all(m.content or m.tool_calls for m in c.messages if m.role == "assistant")


def test_pi_reasoning_replay_fixture_drops_the_aborted_turn(tmp_path: Path) -> None:
    """packages/ai/test/openai-responses-reasoning-replay-e2e.test.ts ("skips reasoning-only
    history after an aborted turn"): [user, aborted thinking-only reply, user] is sent as the
    two user messages."""
    thinking = [{"type": "thinking", "thinking": "Double 21.", "thinkingSignature": "rs_1"}]
    p = _session(tmp_path, [
        _user("Use the double_number tool to double 21."), _reply(thinking, "aborted"),
        _user("Say hello to confirm you can continue."), _reply(_text("Hello!")),
    ])  # fmt: skip
    rej, call = _read(p)
    assert isinstance(rej, Reject) and "cut off" in rej.reason and rej.call_id == "s/m2"
    assert _said(call) == [
        ("user", "Use the double_number tool to double 21."),
        ("user", "Say hello to confirm you can continue."),
    ]
    assert call.parent_call_id is None


def test_a_partial_reply_that_does_not_parse_spoils_no_later_prompt(tmp_path: Path) -> None:
    """An aborted reply can stop inside a tool call (here before its name came); Pi leaves it
    out unread, so the next call is read. Before: that call was a reject too."""
    partial = [{"type": "toolCall", "id": "c1", "arguments": {}}]
    p = _session(tmp_path, [
        _user("go"), _reply(partial, "aborted"), _user("again"), _reply(_text("ok")),
    ])  # fmt: skip
    rej, call = _read(p)
    assert isinstance(rej, Reject) and isinstance(call, ChatCall)
    assert _said(call) == [("user", "go"), ("user", "again")]


def test_pi_tool_call_without_result_fixture(tmp_path: Path) -> None:
    """packages/ai/test/tool-call-without-result.test.ts: a tool call, then a user message
    without its result; transformMessages answers the call with an error result holding
    "No result provided", named by the call's id and tool."""
    call_block = {"type": "toolCall", "id": "call_1", "name": "calculate",
                  "arguments": {"expression": "25 * 18"}}  # fmt: skip
    p = _session(tmp_path, [
        _user("Please calculate 25 * 18 using the calculate tool."),
        _reply([call_block], "toolUse"),
        _user("Never mind, just tell me what is 2+2?"), _reply(_text("4")),
    ])  # fmt: skip
    first, second = _read(p)
    assert [m.role for m in second.messages] == ["user", "assistant", "tool", "user"]
    synthetic = second.messages[2]
    assert (synthetic.tool_call_id, synthetic.name, synthetic.text()) == (
        "call_1",
        "calculate",
        "No result provided",
    )


def test_an_errored_replys_tool_calls_get_no_synthetic_results(tmp_path: Path) -> None:
    """Pi's changelog (pi-mono#812): an errored reply's tool calls are dropped with it, so no
    "No result provided" result answers them. A sent reply's unanswered call is answered when
    the next assistant message comes, before that one is dropped as errored."""
    bad = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}}
    good = {"type": "toolCall", "id": "c2", "name": "bash", "arguments": {"command": "pwd"}}
    p = _session(tmp_path, [
        _user("go"), _reply([bad], "error"), _user("again"), _reply([good], "toolUse"),
        _reply([], "error"), _reply(_text("done")),
    ])  # fmt: skip
    items = _read(p)
    assert [type(i).__name__ for i in items] == ["Reject", "ChatCall", "Reject", "ChatCall"]
    assert [m.role for m in items[1].messages] == ["user", "user"]
    assert [(m.role, m.tool_call_id, m.text()) for m in items[3].messages] == [
        ("user", None, "go"), ("user", None, "again"), ("assistant", None, ""),
        ("tool", "c2", NO_RESULT),
    ]  # fmt: skip
    assert items[3].parent_call_id == "s/m4"


def test_both_sessions_build_and_their_counts_reconcile(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(PI)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (11, 2, 2)


@pytest.mark.parametrize("path", sorted(Path("sample_data/pi").rglob("*.jsonl")), ids=str)
def test_paths_and_contexts_kept_between_calls_change_nothing(path: Path, monkeypatch) -> None:
    """A call's path and context go on from the last call's (issue 54 item 9: a session's read
    was quadratic); computed from the root for every call, every record is the same."""
    from treeprep.formats import pi

    kept = [r.model_dump() for r in pi.read(str(path), ReadOptions())]
    whole = pi._Session.context

    def from_the_root(self: Any, ids: list[str]) -> Any:
        self.sent = None
        return whole(self, ids)

    monkeypatch.setattr(pi, "_PATHS_KEPT", 0)
    monkeypatch.setattr(pi._Session, "context", from_the_root)
    assert [r.model_dump() for r in pi.read(str(path), ReadOptions())] == kept


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ({"type": "image", "data": "x"}, "type: expected text, thinking or toolCall, got 'image'"),
        ({"type": "text"}, "text: expected a string, got null"),
        ({"type": "thinking", "text": "t"}, "thinking: expected a string, got null"),
        ({"type": "toolCall", "id": "c1", "name": 3}, "name: expected a string, got int"),
    ],
)
def test_a_reply_block_pi_does_not_write_is_a_reject_naming_it(
    tmp_path: Path, block: dict[str, Any], reason: str
) -> None:
    """Pi reads its replies strictly (formats._fields.assistant_blocks with Pi's names): a
    block's text must be a string, and a block of another type is no reply Pi wrote."""
    (rej,) = _read(_session(tmp_path, [_user("go"), _reply([block])]))
    assert isinstance(rej, Reject) and rej.reason == f"message.content[0].{reason}"
