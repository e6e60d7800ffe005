"""The shared alias table: ``reasoning`` is read wherever ``reasoning_content`` is (item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeprep.formats import ReadOptions, get_format
from treeprep.formats._fields import AliasError, aliased, canonical_role, reasoning_of
from treeprep.schemas import ChatCall, Reject


def test_get_reads_every_spelling_and_refuses_disagreeing_ones() -> None:
    assert aliased({"reasoning": "r"}, "reasoning_content") == "r"
    assert aliased({"reasoning_content": "r", "reasoning": "r"}, "reasoning_content") == "r"
    with pytest.raises(AliasError, match="'reasoning_content' and 'reasoning'"):
        aliased({"reasoning_content": "a", "reasoning": "b"}, "reasoning_content")
    with pytest.raises(AliasError, match="expected a string"):
        reasoning_of({"reasoning": {"effort": "high"}})
    assert canonical_role("gpt") == "assistant"
    assert canonical_role("function_call") == "assistant"
    assert canonical_role("observation") == "tool"
    assert canonical_role("robot") is None


def _mini_traj(tmp_path: Path, key: str) -> Path:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": "ls",
            "extra": {
                "response": {
                    "choices": [{"message": {"role": "assistant", "content": "ls", key: "think"}}]
                }
            },
        },
        {"role": "user", "content": "out"},
        {"role": "assistant", "content": "done", key: "more thought"},
    ]
    p = tmp_path / "run.traj.json"
    p.write_text(json.dumps({"trajectory_format": "mini-swe-agent-1.1", "messages": msgs}))
    return p


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_regression_mini_swe_agent_drops_openrouter_reasoning(tmp_path: Path, key: str) -> None:
    items = list(get_format("mini-swe-agent").read(str(_mini_traj(tmp_path, key)), ReadOptions()))
    assert all(isinstance(x, ChatCall) for x in items)
    assert [x.completion.reasoning_content for x in items] == ["think", "more thought"]


def test_regression_openai_chat_reasoning_key(tmp_path: Path) -> None:
    rec = {
        "messages": [{"role": "user", "content": "q"}],
        "completion": {"role": "assistant", "content": "a", "reasoning": "because"},
    }
    bad = {
        "messages": [{"role": "user", "content": "q"}],
        "completion": {
            "role": "assistant",
            "content": "a",
            "reasoning": "x",
            "reasoning_content": "y",
        },
    }
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(rec) + "\n" + json.dumps(bad) + "\n")
    good, rej = list(get_format("openai-chat").read(str(p), ReadOptions()))
    assert isinstance(good, ChatCall) and good.completion.reasoning_content == "because"
    assert isinstance(rej, Reject) and rej.line == 2 and "different values" in rej.reason
