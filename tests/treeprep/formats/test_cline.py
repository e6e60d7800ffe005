"""cline: Cline / Roo Code task histories (issue 40 item 5).

``sample_data/cline/tasks/*/api_conversation_history.json`` are written by us from Cline's
``ClineStorageMessage`` (Anthropic ``MessageParam`` plus ``modelInfo``, ``metrics``, ``ts``): one
task with Cline's XML tool calls in text, one with native ``tool_use``/``tool_result`` blocks and
a ``thinking`` block. The expected messages are written out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import EmptyBuildError, InputError
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.cline import FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "sample_data" / "cline" / "tasks"
CLASSIC = TASKS / "1762336800000" / "api_conversation_history.json"
NATIVE = TASKS / "1762340400000" / "api_conversation_history.json"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(p: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(p), opts or ReadOptions()))


def test_detection() -> None:
    for p in (CLASSIC, NATIVE):
        assert detect_format(str(p), p.read_bytes()) is FORMAT
    other = ROOT / "sample_data" / "tau_bench_shop.json"
    assert detect_format(str(other), other.read_bytes()[:65536]) is not FORMAT


def test_classic_xml_tool_calls_stay_text() -> None:
    calls = _read(CLASSIC, ReadOptions(system_prompt="You are Cline."))
    assert [c.call_id for c in calls] == [f"1762336800000#{k}" for k in range(3)]
    assert {c.group_id for c in calls} == {"1762336800000"}
    assert {c.model for c in calls} == {"claude-sonnet-4-5"}
    last = calls[-1]
    assert [(m.role, m.text()) for m in last.messages[-2:]] == [
        ("assistant", calls[1].completion.text()),
        ("user", "[replace_in_file for 'cli.py'] Result:"
                 "The content was successfully saved to cli.py."),
    ]  # fmt: skip
    assert last.messages[0].content == "You are Cline."
    assert last.completion.text().startswith("<attempt_completion>")


def test_native_tool_use_and_thinking() -> None:
    first, second = _read(NATIVE)
    assert first.completion.reasoning_content == "Count them with wc."
    (tc,) = first.completion.tool_calls or []
    assert (tc.id, tc.function.name) == ("toolu_01", "execute_command")
    assert tc.function.arguments == {"command": "wc -l cli.py", "requires_approval": False}
    assert [(m.role, m.tool_call_id, m.text()) for m in second.messages[-1:]] == [
        ("tool", "toolu_01", "4 cli.py")
    ]


def test_a_bad_message_rejects_the_calls_after_it(tmp_path: Path) -> None:
    hist = json.loads(CLASSIC.read_text())
    hist[2]["role"] = "system"
    p = tmp_path / "t1" / "api_conversation_history.json"
    p.parent.mkdir()
    p.write_text(json.dumps(hist))
    items = _read(p)
    assert [type(x) for x in items] == [ChatCall, Reject, Reject, Reject]
    assert items[1].reason == "[2].role: expected 'user' or 'assistant', got 'system'"
    assert items[2].reason.startswith(items[1].reason) and items[3].call_id == "t1#2"


def test_the_tasks_build_into_a_tree_each(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(TASKS)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (5, 2, 0)


@needs_qwen
@pytest.mark.parametrize("path", [CLASSIC, NATIVE])
def test_calls_render_as_apply_chat_template_qwen3(path: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = _read(path, ReadOptions(system_prompt="You are Cline."))
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


def _task(tmp_path: Path, hist: list[dict], context: object = None) -> Path:
    p = tmp_path / "t1" / "api_conversation_history.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(hist))
    if context is not None:
        (p.parent / "context_history.json").write_text(json.dumps(context))
    return p


def _edit(message: int, ts: int) -> list:
    """One entry of Cline's context_history.json: block 0 of ``message`` replaced at ``ts``."""
    return [message, [2, [[0, [[ts, "text", ["[[NOTE] This file read has been removed"], []]]]]]]


def test_calls_after_clines_context_edits_are_rejected(tmp_path: Path) -> None:
    """Cline sends a truncated, notice-edited history near the context window and records the
    edits in context_history.json (ContextManager, 3.89.2): a call after the first edit is not
    the stored history, so it is rejected with that reason; the calls before it stand."""
    hist = json.loads(CLASSIC.read_text())
    edit_at = hist[3]["ts"] - 500  # prepared for the second call (index 3)
    items = _read(_task(tmp_path, hist, [_edit(2, edit_at)]))
    assert [type(x) for x in items] == [ChatCall, Reject, Reject]
    assert all("context_history.json" in r.reason and "not rebuilt" in r.reason for r in items[1:])
    assert [r.call_id for r in items[1:]] == ["t1#1", "t1#2"]
    # replies without ts cannot be placed after or before an edit: every call is rejected
    for m in hist:
        m.pop("ts")
    assert all(isinstance(x, Reject) for x in _read(_task(tmp_path, hist, [_edit(2, 1)])))
    # an empty context history edits nothing
    assert all(isinstance(x, ChatCall) for x in _read(_task(tmp_path, hist, [])))


def test_a_broken_context_history_is_named(tmp_path: Path) -> None:
    hist = json.loads(CLASSIC.read_text())
    with pytest.raises(InputError, match="context_history.json.*Cline's context history"):
        _read(_task(tmp_path, hist, [[2, "not an edit"]]))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("I will edit cli.py.\n\n[Response interrupted by user]", "the reply was cut"),
        ("Failure: I did not provide a response.", "in place of an empty reply"),
    ],
)
def test_replies_cline_wrote_are_not_trained(tmp_path: Path, text: str, why: str) -> None:
    hist = json.loads(CLASSIC.read_text())
    hist[1]["content"] = [{"type": "text", "text": text}]
    items = _read(_task(tmp_path, hist))
    assert [type(x) for x in items] == [Reject, ChatCall, ChatCall]
    assert why in items[0].reason
    assert items[1].messages[1].text() == text  # Cline sends it back as it stored it


def test_the_files_beside_a_task_are_its_companions(tmp_path: Path) -> None:
    p = _task(tmp_path, json.loads(CLASSIC.read_text()), [])
    for name in ("ui_messages.json", "task_metadata.json"):
        (p.parent / name).write_text("[]")
    m = build(BuildConfig(inputs=[str(tmp_path)], out=str(tmp_path / "o")))
    assert m.companion_files == {
        "cline": ["t1/context_history.json", "t1/task_metadata.json", "t1/ui_messages.json"]
    }
    assert m.skipped_files == []


SESSION = ROOT / "sample_data" / "cline" / "sessions" / "1787000000000_ab12c"


def test_a_cline_4_session_is_refused_not_read_as_a_chat(tmp_path: Path) -> None:
    """Cline 4 keeps a session as its transcript (<id>.messages.json: an object with messages),
    which the chat-list formats would read as a chat, wrappers and uncut tool results included;
    Cline rebuilds each request from it at send time (@cline/core MessageBuilder), so it is
    refused, one reject naming why, and its manifest is the session's companion."""
    path = SESSION / "1787000000000_ab12c.messages.json"
    fmt = detect_format(str(path), path.read_bytes())
    assert fmt is not None and fmt.name == "cline-session"
    with pytest.raises(InputError, match="Cline 4 session transcript is not the requests"):
        list(fmt.read(str(path), ReadOptions()))
    out = tmp_path / "o"
    with pytest.raises(EmptyBuildError):
        build(BuildConfig(inputs=[str(SESSION)], out=str(out)))
    (reject,) = [json.loads(x) for x in (out / "rejects.jsonl").open()]  # no earlier build
    assert reject["format"] == "cline-session" and reject["line"] == 1
    m = build(BuildConfig(inputs=[str(SESSION.parents[1])], out=str(tmp_path / "all")))
    assert m.companion_files["cline-session"] == [
        "sessions/1787000000000_ab12c/1787000000000_ab12c.json"
    ]
    assert m.counts.records_rejected == 1 and m.skipped_files == []
