"""codex: Codex CLI rollouts (sample written from codex-rs RolloutLine and ResponseItem)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from treeprep.formats import ReadOptions, detect_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

SAMPLE = next(
    (Path(__file__).resolve().parents[3] / "sample_data" / "codex").rglob("rollout-*.jsonl")
)
SID = "5f0c1a2e-7b3d-4e21-9a55-0d6c2b8e4f11"


def _items(p: Path, opts: ReadOptions | None = None) -> list:
    spec = detect_format(str(p), read_head(str(p)))
    assert spec is not None and spec.name == "codex"
    return list(spec.read(str(p), opts or ReadOptions()))


def test_codex_sample() -> None:
    items = _items(SAMPLE)
    calls = [x for x in items if isinstance(x, ChatCall)]
    rejects = [x for x in items if isinstance(x, Reject)]
    assert [c.call_id for c in calls] == [f"{SID}#{k}" for k in range(6)]
    assert {c.group_id for c in calls} == {SID} and {c.model for c in calls} == {"gpt-5-codex"}
    c0, c1, c2, c3, c4, c5 = calls
    assert c0.messages[0].role == "system" and "Codex" in (c0.messages[0].content or "")
    assert c0.completion.reasoning_content == "**Inspecting wc.py**"
    # every call continues the previous one exactly (Codex only appends)
    for a, b in zip(calls[:2], calls[1:3], strict=True):
        assert b.messages[: len(a.messages) + 1] == [*a.messages, a.completion]
    # apply_patch is a freeform tool: its raw input is the arguments string
    assert c1.completion.tool_calls is not None
    assert c1.completion.tool_calls[0].function.arguments.startswith("*** Begin Patch")
    assert c2.completion.text().startswith("Fixed:")
    # after the compaction the prompt is the stored replacement history
    assert c3.branch_reason == "compaction"
    assert [m.text() for m in c3.messages[1:]] == [
        "wc.py counts blank lines as words; fix it.",
        "Add a test too.",
        "Summary: fixed wc.py words(); user wants a test.",
    ]
    # the hosted web search ends its call; the text after it is the next call, whose prompt holds
    # the search and a tool turn standing for its results
    assert c4.completion.tool_calls is not None and c4.completion.text() == ""
    ws = c4.completion.tool_calls[0].function
    assert ws.name == "web_search"
    assert ws.arguments == {"type": "search", "query": "pytest blank words"}
    assert c5.messages[-2:] == [c4.completion, c5.messages[-1]]
    assert (c5.messages[-1].role, c5.messages[-1].text()) == ("tool", "(results not logged)")
    assert c5.completion.text() == "Added test_wc.py." and not c5.completion.tool_calls
    assert rejects == []


def test_compaction_without_replacement_history_rejects_later_calls(tmp_path: Path) -> None:
    lines = [
        {"timestamp": "t", "type": "session_meta", "payload": {"id": "s"}},
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        },
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello"}],
            },
        },
        {"timestamp": "t", "type": "compacted", "payload": {"message": "summary"}},
        {
            "timestamp": "t",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "again"}],
            },
        },
        "not json",
        {"timestamp": "t", "type": "mystery", "payload": {}},
    ]
    p = tmp_path / "rollout-x.jsonl"
    p.write_bytes(
        b"".join((orjson.dumps(x) if isinstance(x, dict) else x.encode()) + b"\n" for x in lines)
    )
    items = _items(p, ReadOptions(system_prompt="SYS"))
    assert [type(x) for x in items] == [ChatCall, Reject, Reject, Reject]
    assert items[0].messages[0].content == "SYS"
    assert "compacted at line 4 without a stored replacement_history" in items[3].reason
    assert [x.line for x in items[1:]] == [6, 7, 5]
    assert json.loads(json.dumps(items[0].model_dump()))["group_id"] == "s"
