"""kimi-cli: Kimi Code CLI context files (``sessions/<dir md5>/<session>/context*.jsonl``).

``sample_data/kimi_cli/`` is written by us from kimi-cli 1.49.0's ``Context`` (markers written by
``json.dumps``, messages by kosong's ``Message.model_dump_json(exclude_none=True)``): a session
rotated by a compaction (``context_1.jsonl`` before it, ``context.jsonl`` after) and a sub-agent.
The expected messages are written out by hand from kimi-cli's ``normalize_history`` and the kimi
provider's ``_convert_message``, not read back from the adapter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, companion_format, detect_format
from treeprep.formats.kimi_cli import FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "kimi_cli"
FOLDER = SAMPLE / "sessions" / "9c1e4f0a7b3d2e6f8a5b4c3d2e1f0a9b"
SESSION = FOLDER / "5d2c8e1a-4b7f-4c3e-9a6d-2f1e0b9c8d7a"
SID = SESSION.name
BEFORE, AFTER = SESSION / "context_1.jsonl", SESSION / "context.jsonl"
AGENT = SESSION / "subagents" / "explore-7f3a" / "context.jsonl"
SYSTEM = (
    "You are Kimi Code CLI, an interactive general AI agent running on a user's computer.\n\n"
    "Working directory: /home/dev/calc\n"
)
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(path: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(path), opts or ReadOptions()))


def _dump(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def _text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def _call(cid: str, name: str, args: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_detection_and_the_files_beside_a_context() -> None:
    for p in (BEFORE, AFTER, AGENT):
        assert detect_format(str(p), p.read_bytes()) is FORMAT
    for p in (SESSION / "wire.jsonl", AGENT.parent / "meta.json"):
        assert detect_format(str(p), p.read_bytes()) is None
        assert companion_format(str(p)) == "kimi-cli"
    vibe = next((ROOT / "sample_data" / "mistral_vibe").glob("*/messages.jsonl"))
    assert detect_format(str(vibe), vibe.read_bytes()) is not FORMAT
    chat = ROOT / "sample_data" / "openai_chat.jsonl"
    assert detect_format(str(chat), chat.read_bytes()[:65536]) is not FORMAT


def test_prompts_are_what_normalize_history_sends() -> None:
    calls = _read(BEFORE)
    stem = f"{SID}/context_1"
    assert [(c.call_id, c.parent_call_id, c.source_line) for c in calls] == [
        (f"{stem}#0", None, 7), (f"{stem}#1", f"{stem}#0", 12),
        (f"{stem}#2", f"{stem}#1", 18), (f"{stem}#3", f"{stem}#2", 23),
    ]  # fmt: skip
    assert {(c.group_id, c.trajectory_id, c.agent_id) for c in calls} == {(SID, SID, "main")}
    assert all(c.provenance.exact_messages and not c.provenance.reconstructed for c in calls)
    first_reply = {
        "role": "assistant", "content": "Let me look at the test.",
        "reasoning_content": "Read the test first.",
        "tool_calls": [_call("ReadFile:0", "ReadFile", '{"path": "tests/test_math.py"}')],
    }  # fmt: skip
    # blank text beside a tool call is dropped; an empty think part is sent as ""
    edit = {
        "role": "assistant", "reasoning_content": "",
        "tool_calls": [_call("StrReplaceFile:1", "StrReplaceFile",
                             '{"path": "tests/test_math.py", "edit": {"old": "== 5", '
                             '"new": "== 4"}}')],
    }  # fmt: skip
    reread = {
        "role": "assistant", "reasoning_content": "The file changed; read it again.",
        "tool_calls": [_call("ReadFile:2", "ReadFile", '{"path": "tests/test_math.py"}')],
    }  # fmt: skip
    header = "<system>2 lines read from file starting from line 1. End of file reached.</system>"
    assert _dump(calls[3]) == [
        {"role": "system", "content": SYSTEM},
        # the user's turn and the reminder injected after it: one message of both parts
        {"role": "user", "content": [
            _text("The test in tests/test_math.py fails. Fix it."),
            _text("<system-reminder>\nAuto-approve is on: tool calls run without asking.\n"
                  "</system-reminder>")]},
        first_reply,
        {"role": "tool", "tool_call_id": "ReadFile:0", "content": [
            _text(header), _text("     1\tdef test_add():\n     2\t    assert add(2, 2) == 5\n")]},
        edit,
        {"role": "tool", "tool_call_id": "StrReplaceFile:1", "content":
            "<system>ERROR: tests/test_math.py was changed on disk since it was read.</system>"},
        {"role": "user", "content": '<notification id="n-1" category="file" type="changed" '
                                    'source_kind="watcher">tests/test_math.py changed on disk.'
                                    "</notification>"},
        reread,
        {"role": "tool", "tool_call_id": "ReadFile:2", "content": [
            _text(header),
            _text("     1\tdef test_add():\n     2\t    assert add(2, 2) == 4  # fixed by the "
                  "user\n")]},
    ]  # fmt: skip
    assert calls[3].completion.model_dump(exclude_none=True) == {
        "role": "assistant", "reasoning_content": "Already fixed.",
        "content": "You fixed the assertion while I was editing: 2 + 2 is 4, and the test now "
                   "says so.",
    }  # fmt: skip
    assert [_dump(c) for c in calls[:3]] == [_dump(calls[3])[:n] for n in (2, 4, 7)]
    replies = [c.completion.model_dump(exclude_none=True) for c in calls[:3]]
    assert replies == [first_reply, edit, reread]


def test_a_compacted_file_starts_from_the_summary_and_its_copies_are_no_calls() -> None:
    calls = _read(AFTER)
    # the answer the compaction kept (line 4) is history: it replied to the old prompt
    assert [c.source_line for c in calls] == [10, 15]
    assert [c.branch_reason for c in calls] == ["compaction", None]
    kept = {
        "role": "assistant", "reasoning_content": "Already fixed.",
        "content": "You fixed the assertion while I was editing: 2 + 2 is 4, and the test now "
                   "says so.",
    }  # fmt: skip
    assert _dump(calls[0]) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [
            _text("<system>Previous context has been compacted. Here is the compaction output:"
                  "</system>"),
            _text("<current_focus>\ntests/test_math.py: test_add asserted 2 + 2 == 5; the user "
                  "fixed it to 4.\n</current_focus>")]},
        kept,
        {"role": "user", "content": "Add a test for sub as well."},
    ]  # fmt: skip
    assert calls[0].completion.content is None and calls[0].completion.tool_calls
    assert _dump(calls[1])[-1] == {
        "role": "tool", "tool_call_id": "WriteFile:0",
        "content": "<system>File successfully appended.</system>",
    }  # fmt: skip


def test_an_automatic_compaction_mid_turn_goes_on_at_the_next_step(tmp_path: Path) -> None:
    """Compacted at a step's start: the kept tool call and result are copies, and the step's
    checkpoint (the first after the file's first) begins the replies to the new prompt."""
    summary = "<system>Previous context has been compacted. Here is the compaction output:</system>"
    kept = {"role": "assistant", "content": "",
            "tool_calls": [_call("Shell:0", "Shell", '{"command": "pytest"}')]}  # fmt: skip
    lines = [
        {"role": "_system_prompt", "content": "S"}, {"role": "_checkpoint", "id": 0},
        {"role": "user", "content": [_text(summary), _text("pytest was run.")]},
        kept, {"role": "tool", "content": "1 passed", "tool_call_id": "Shell:0"},
        {"role": "_usage", "token_count": 90}, {"role": "_checkpoint", "id": 1},
        {"role": "assistant", "content": "It passes."},
    ]  # fmt: skip
    (call,) = _read(_write(tmp_path / "s" / "context.jsonl", lines))
    assert (call.source_line, call.branch_reason) == (8, "compaction")
    assert [m["role"] for m in _dump(call)] == ["system", "user", "assistant", "tool"]
    assert _dump(call)[2] == {"role": "assistant", "tool_calls": kept["tool_calls"]}
    # a bad line among the copies: the copy after it is still no call, the reply after the
    # step's checkpoint is rejected with the line
    bad = [*lines[:3], {"role": "user", "content": [{"type": "file"}]}, *lines[3:]]
    items = _read(_write(tmp_path / "t" / "context.jsonl", bad))
    assert [(type(x), x.line) for x in items] == [(Reject, 4), (Reject, 9)]


def test_a_sub_agent_joins_the_session_under_its_id_with_its_model() -> None:
    calls = _read(AGENT)
    assert [(c.group_id, c.agent_id, c.trajectory_id) for c in calls] == [
        (SID, "explore-7f3a", SID)
    ] * 2
    assert [c.branch_reason for c in calls] == ["sub-agent", None]
    assert {c.model for c in calls} == {"kimi-k2-turbo-preview"}
    assert calls[0].call_id == f"{SID}/explore-7f3a/context#0"
    assert _dump(calls[0]) == [
        {"role": "system", "content": "You are an explore agent: find code and report, change "
                                      "nothing.\n"},
        {"role": "user", "content": "Find where add and sub are defined."},
    ]  # fmt: skip
    assert calls[1].completion.content == "Both are in calc/ops.py: add on line 1, sub on line 4."


def test_notifications_are_never_merged(tmp_path: Path) -> None:
    note = '<notification id="n" category="task">done</notification>'
    lines = [
        {"role": "_system_prompt", "content": "S"},
        {"role": "user", "content": "a"}, {"role": "user", "content": note},
        {"role": "user", "content": [_text("b")]}, {"role": "user", "content": "c"},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip
    (call,) = _read(_write(tmp_path / "s" / "context.jsonl", lines))
    assert _dump(call) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "a"},
        {"role": "user", "content": note}, {"role": "user", "content": [_text("b"), _text("c")]},
    ]  # fmt: skip


def test_a_context_file_that_opens_with_a_message(tmp_path: Path) -> None:
    """kimi-cli restores a file whose first line is a message (its own tests write such files):
    detected by its name and a marker after it; another name, or no marker, is not taken."""
    lines = [
        {"role": "user", "content": "Hello"}, {"role": "_usage", "token_count": 42},
        {"role": "_checkpoint", "id": 0}, {"role": "assistant", "content": "World"},
    ]  # fmt: skip
    path = _write(tmp_path / "s" / "context_2.jsonl", lines)
    assert detect_format(str(path), path.read_bytes()) is FORMAT
    (call,) = _read(path)
    assert (call.group_id, call.call_id, call.source_line) == ("s", "s/context_2#0", 4)
    other = _write(tmp_path / "s" / "chat.jsonl", lines)
    assert detect_format(str(other), other.read_bytes()) is not FORMAT
    plain = _write(tmp_path / "t" / "context.jsonl", [lines[0], lines[3]])
    assert detect_format(str(plain), plain.read_bytes()) is not FORMAT


def test_a_file_without_its_system_prompt_takes_the_option(tmp_path: Path) -> None:
    """A session from before 1.21.0, in the layout before session folders."""
    lines = [{"role": "_checkpoint", "id": 0}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello"}]  # fmt: skip
    path = _write(tmp_path / "sessions" / "h" / "0a1b.jsonl", lines)
    assert detect_format(str(path), path.read_bytes()) is FORMAT
    (call,) = _read(path, ReadOptions(system_prompt="Given."))
    assert (call.group_id, call.call_id) == ("0a1b", "0a1b/0a1b#0")
    assert _dump(call)[0] == {"role": "system", "content": "Given."}
    assert not call.provenance.exact_messages


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("{not json", None),
        ({"role": "_compaction", "id": 1},
         "role: a marker this reader does not know ('_compaction'; expected _system_prompt, "
         "_checkpoint, _usage)"),
        ({"role": "tool", "content": "x"}, "tool_call_id: expected a string, got null"),
        ({"role": "user", "content": [{"type": "file", "path": "a"}]},
         "content[0].type: expected text, think, image_url, audio_url, video_url, got 'file'"),
        ({"role": "_checkpoint", "id": "2"}, "id: expected an integer, got string"),
        ({"role": "critic", "content": "x"},
         "role: expected user, assistant, tool, system, got 'critic'"),
    ],
)  # fmt: skip
def test_a_bad_line_is_rejected_with_every_later_call(
    tmp_path: Path, bad: Any, reason: str | None
) -> None:
    lines = [json.loads(x) for x in BEFORE.read_text().splitlines()]
    path = tmp_path / "s" / "context.jsonl"
    path.parent.mkdir()
    text = [json.dumps(x) for x in lines]
    text.insert(10, bad if isinstance(bad, str) else json.dumps(bad))  # before the 2nd reply
    path.write_text("".join(t + "\n" for t in text))
    items = _read(path)
    assert [type(x) for x in items] == [ChatCall, Reject, Reject, Reject, Reject]
    lines_of = [x.source_line if isinstance(x, ChatCall) else x.line for x in items]
    assert lines_of == [7, 11, 13, 19, 24]
    if reason is not None:
        assert items[1].reason == reason
    assert {x.reason for x in items[2:]} == {
        f"line 11: {items[1].reason} (the prompts after it would miss it)"
    }
    assert [x.call_id for x in items[2:]] == [f"s/context#{k}" for k in (1, 2, 3)]


def test_the_sample_builds_one_tree_and_a_reverted_copy_is_deduplicated(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (8, 1, 0)
    # a D-Mail revert: the lines before checkpoint 2 copied into a new context file, then a
    # different step; the copied calls replied to the same prompts and are built once
    session = tmp_path / "in" / SID
    shutil.copytree(SESSION, session)
    lines = (session / "context_1.jsonl").read_text().splitlines()
    cut = lines.index('{"role": "_checkpoint", "id": 2}')
    revert = [*lines[:cut], '{"role": "_checkpoint", "id": 2}',
              '{"role":"user","content":"<system>D-Mail: the file is fixed already.</system>"}',
              '{"role":"assistant","content":"Then nothing is left to do."}']  # fmt: skip
    (session / "context_2.jsonl").write_text("".join(x + "\n" for x in revert))
    m = build(BuildConfig(inputs=[str(session)], out=str(tmp_path / "r")))
    assert (m.counts.records_read, m.counts.records_in_trees, m.counts.trees) == (10, 9, 1)
    assert m.counts.records_filtered == 1


@needs_qwen
@pytest.mark.parametrize("path", [BEFORE, AFTER, AGENT])
def test_calls_render_as_apply_chat_template_qwen3(path: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), _read(path))
