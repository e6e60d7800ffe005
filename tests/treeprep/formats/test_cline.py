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
