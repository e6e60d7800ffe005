"""openai-responses: NeMo-Gym rollouts whose ``output`` is a list of per-step states (aviary)."""

from __future__ import annotations

import json
from pathlib import Path

from treeprep.formats import ReadOptions, detect_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "openai_responses_aviary.jsonl"


def _items(p: Path) -> list:
    spec = detect_format(str(p), read_head(str(p)))
    assert spec is not None and spec.name == "openai-responses"
    return list(spec.read(str(p), ReadOptions()))


def test_regression_aviary_output_list_of_lists_was_rejected() -> None:
    items = _items(SAMPLE)
    calls = [x for x in items if isinstance(x, ChatCall)]
    rejects = [x for x in items if isinstance(x, Reject)]
    raw = json.loads(SAMPLE.read_text().splitlines()[0])
    states = raw["response"]["output"]
    assert [c.call_id for c in calls] == [f"resp_aviary_0#{k}" for k in range(3)]
    assert {c.group_id for c in calls} == {"openai_responses_aviary:task-0"}
    # step 0: the initial input and the seeded observation; the model's reasoning + call
    c0, c1, c2 = calls
    assert [m.content for m in c0.messages] == [states[0][0]["content"], states[0][1]["content"]]
    assert c0.completion.reasoning_content == "12*7 first."
    assert c0.completion.tool_calls is not None and c0.completion.tool_calls[0].id == "c0"
    # step k's prompt is the stored state k-1, item for item
    assert len(c1.messages) == len(states[0]) - 1  # reasoning + call merge into one message
    assert len(c2.messages) == len(states[1]) - 1
    assert c2.messages[1].content == "[Previous environment state - hidden]"
    # the agent collapsed old environment states before step 2: its prompt rewrote history
    # a NeMo-Gym rollout's first call starts a sample of its task (treeprep/formats/_samples.py)
    assert [c.branch_reason for c in calls] == ["sampling", None, "elided-history"]
    assert all(c.reward == 1.0 and c.tools is not None and len(c.tools) == 2 for c in calls)
    assert [(r.line, r.reason) for r in rejects] == [
        (
            2,
            "response.output[1][6]: expected the model's output right after the previous "
            "step's 6 items",
        )
    ]
