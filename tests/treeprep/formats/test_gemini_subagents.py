"""Gemini CLI session folders (issue 51 item 2): ``kind: subagent`` sessions in
``chats/<main session id>/`` join their main session's tree, and the tool responses that 0.44+
records again as ``user`` messages are not read as user turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, detect_format, get_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
CHATS = ROOT / "sample_data" / "gemini_cli_subagents" / "chats"
MAIN_ID = "5d0c1e2f-8a7b-4c6d-9e0f-1a2b3c4d5e6f"
AGENT_ID = "c4f1a9e2-3b7d-4e8a-b6c5-0d9e8f7a6b5c"
MAIN = CHATS / "session-2026-08-20T09-15-5d0c1e2f.jsonl"
SUB = CHATS / MAIN_ID / f"{AGENT_ID}.jsonl"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(path: Path, **kw: Any) -> list[ChatCall | Reject]:
    return list(get_format("gemini-cli").read(str(path), ReadOptions(**kw)))  # type: ignore[misc]


@pytest.mark.parametrize("path", [MAIN, SUB], ids=["main", "sub-agent"])
def test_detected_without_format(path: Path) -> None:
    spec = detect_format(str(path), read_head(str(path)))
    assert spec is not None and spec.name == "gemini-cli"


def test_synthetic_tool_response_messages_are_not_user_turns() -> None:
    first, second = _read(MAIN)
    assert isinstance(first, ChatCall) and isinstance(second, ChatCall)
    # u-02 (functionResponse parts) is the investigator's result, already the tool message
    assert [m.model_dump(exclude_none=True) for m in second.messages[1:]] == [
        # sent back without its thoughts (Gemini CLI stores the model turn without them)
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "inv-1", "type": "function", "function": {
             "name": "codebase_investigator",
             "arguments": {"objective": "Find where request retries are configured."}}}]},
        {"role": "tool", "tool_call_id": "inv-1",
         "content": "Retries are configured in src/http/client.ts (maxRetries: 3) and overridden "
         "in src/jobs/sync.ts (maxRetries: 0)."},
    ]  # fmt: skip
    assert first.completion.reasoning_content == (
        "**Delegating the search** The investigator sub-agent can search the codebase."
    )
    assert (second.group_id, second.agent_id, second.branch_reason) == (
        MAIN_ID, "main", "reasoning-dropped"
    )  # fmt: skip


def test_a_sub_agent_joins_its_main_session_s_tree() -> None:
    first, second = _read(SUB)
    assert isinstance(first, ChatCall) and isinstance(second, ChatCall)
    assert (first.group_id, first.agent_id) == (MAIN_ID, AGENT_ID)
    assert (first.branch_reason, first.parent_call_id) == ("sub-agent", "m-01")
    assert (second.branch_reason, second.parent_call_id) == (None, None)
    assert [(m.role, m.tool_call_id) for m in second.messages] == [
        ("user", None), ("assistant", None), ("tool", "rf-1"), ("tool", "gr-1")]  # fmt: skip
    assert second.completion.tool_calls is not None
    assert second.completion.tool_calls[0].function.name == "complete_task"


def test_a_sub_agent_without_its_main_session_still_joins_the_folder_s_tree(
    tmp_path: Path,
) -> None:
    p = tmp_path / "chats" / MAIN_ID / SUB.name
    p.parent.mkdir(parents=True)
    p.write_text(SUB.read_text())
    first = _read(p)[0]
    assert isinstance(first, ChatCall)
    assert (first.group_id, first.branch_reason, first.parent_call_id) == (
        MAIN_ID, "sub-agent", None)  # fmt: skip


def test_a_sub_agent_file_outside_a_session_folder_is_its_own_tree(tmp_path: Path) -> None:
    p = tmp_path / "chats" / SUB.name
    p.parent.mkdir(parents=True)
    p.write_text(SUB.read_text())
    first = _read(p)[0]
    assert isinstance(first, ChatCall) and (first.group_id, first.agent_id) == (AGENT_ID, "main")


def test_a_nested_sub_agent_links_to_its_sibling_s_call(tmp_path: Path) -> None:
    folder = tmp_path / "chats" / MAIN_ID
    folder.mkdir(parents=True)
    recs = [json.loads(x) for x in SUB.read_text().splitlines()]
    recs[2]["toolCalls"][0]["agentId"] = "nested-1"  # s-g1's read_file call started it
    (folder / SUB.name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    nested = [recs[0] | {"sessionId": "nested-1"}, recs[1], recs[4]]
    (folder / "nested-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nested))
    first = _read(folder / "nested-1.jsonl")[0]
    assert isinstance(first, ChatCall)
    assert (first.group_id, first.agent_id, first.parent_call_id) == (MAIN_ID, "nested-1", "s-g1")


def test_the_sample_builds_into_one_tree(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(CHATS.parent)], out=str(tmp_path / "o")))
    c = m.counts
    assert (c.records_read, c.records_in_trees, c.records_rejected, c.trees) == (4, 4, 0, 1)


@needs_qwen
def test_calls_render_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = [c for p in (MAIN, SUB) for c in _read(p, system_prompt="You are Gemini CLI.")]
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


def test_the_session_context_set_at_the_start_is_no_compaction(tmp_path: Path) -> None:
    """Regression (a 0.61.0 session file from a run against a mock endpoint): 0.44+ writes the
    session context as a ``$set`` on the file's second line, before any reply; the first call
    was hinted ``compaction``. A ``$set`` that replaces messages still is one."""
    sid = "d0414d57-f138-44e8-af3c-e4235aa89eea"
    ctx = {"id": "c0", "type": "user", "content": [{"text": "<session_context/>"}]}
    snapshot = {"id": "s1", "type": "user", "content": "<state_snapshot/>"}

    def said(mid: str, kind: str, text: str) -> dict[str, Any]:
        return {"id": mid, "timestamp": "t", "type": kind, "content": text, "model": "m"}

    lines = [
        {"sessionId": sid, "projectHash": "ab", "startTime": "t", "kind": "main"},
        {"$set": {"messages": [ctx], "lastUpdated": "t"}},
        said("u1", "user", "What does hello.py do?"),
        said("g1", "gemini", "It prints hi."),
        said("u2", "user", "Thanks."),
        {"$set": {"messages": [ctx, snapshot]}},
        said("g2", "gemini", "You're welcome."),
    ]
    path = tmp_path / f"session-2026-12-07T08-46-{sid[:8]}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    first, second = _read(path)
    assert isinstance(first, ChatCall) and isinstance(second, ChatCall)
    assert [m.text() for m in first.messages] == ["<session_context/>", "What does hello.py do?"]
    assert (first.branch_reason, second.branch_reason) == (None, "compaction")
