"""pi: Pi coding-agent sessions, a message tree with forks (issue 40 item 5).

``sample_data/pi/`` is written by us from badlogic/pi-mono's ``session-manager.ts`` (entries with
``id``/``parentId``, ``buildSessionContext``) and ``messages.ts`` (``convertToLlm``): a rename
with a ``grep`` and an ``edit`` call, a fork that keeps an alias, a ``branch_summary`` back to the
clean rename, a ``!pytest`` bash execution, and a compaction keeping the last exchange. The
expected prompts are written out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.pi import BRANCH_PREFIX, COMPACTION_PREFIX, FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = next((ROOT / "sample_data" / "pi").rglob("*.jsonl"))
SID = "9a8b7c6d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"
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
def test_calls_render_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = _read(SAMPLE, ReadOptions(system_prompt="You are Pi."))
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)
