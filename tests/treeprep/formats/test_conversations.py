"""chat-messages and sharegpt: conversation datasets become one call per assistant turn.

Counts and reject reasons on the sample files, exact tokens against ``apply_chat_template`` on the
real Qwen2.5 tokenizer (skipped when ``../shared/data`` is absent), and a property test on random
conversations. The reference messages are built by this test from the raw JSON on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.formats import ReadOptions, detect_format, get_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data" / "conversations"
TOKENIZERS = ROOT / ".." / "shared" / "data" / "tokenizers"
needs_qwen = pytest.mark.skipif(
    not (TOKENIZERS / "qwen2_5" / "tokenizer.json").is_file(), reason="../shared/data is absent"
)


def _read(path: Path) -> tuple[str, list]:
    spec = detect_format(str(path), read_head(str(path)))
    assert spec is not None, f"{path} not recognised"
    return spec.name, list(spec.read(str(path), ReadOptions()))


def test_openai_finetune_sample() -> None:
    name, items = _read(SAMPLES / "openai_finetune.jsonl")
    assert name == "chat-messages"
    calls = [x for x in items if isinstance(x, ChatCall)]
    rejects = [x for x in items if isinstance(x, Reject)]
    assert [c.group_id for c in calls] == ["openai_finetune:1"] * 2 + ["openai_finetune:2"] * 3
    # the weight-0 answer is context: in the prompt of the next target, never a target itself
    first, second = calls[0], calls[1]
    assert len(first.completion.tool_calls or []) == 2 and len(first.messages) == 2
    assert second.messages[5].content == "Oslo is 4 C, Bergen 7 C."
    assert second.completion.content == "Oslo: 4 C and snowing. Bergen: 7 C and raining."
    assert second.tools is not None and second.tools[0]["function"]["name"] == "get_weather"
    assert [c.parent_call_id for c in calls[2:]] == [
        None,
        "openai_finetune:2#0",
        "openai_finetune:2#1",
    ]
    assert [(r.line, r.reason) for r in rejects] == [
        (3, "no assistant turn to train on (every assistant message has weight 0, or none)"),
        (4, "messages[1].weight: expected 0 or 1, got 0.5"),
    ]


def test_hf_messages_parquet_sample() -> None:
    name, items = _read(SAMPLES / "hf_messages.parquet")
    assert name == "chat-messages"
    assert all(isinstance(x, ChatCall) for x in items) and len(items) == 3
    a0, a1, b0 = items
    assert a0.group_id == "hf_messages:conv-a" and a0.source_line == 1 and b0.source_line == 2
    assert a0.completion.reasoning_content == "Use the converter tool."  # the 'reasoning' key
    assert a0.tools is not None and a0.tools[0]["function"]["name"] == "convert_units"
    assert [m.role for m in a1.messages] == ["user", "assistant", "tool"]
    assert b0.tools is None  # an empty tools string


def test_sharegpt_sample() -> None:
    name, items = _read(SAMPLES / "sharegpt_tools.json")
    assert name == "sharegpt"
    calls = [x for x in items if isinstance(x, ChatCall)]
    rejects = [x for x in items if isinstance(x, Reject)]
    assert [c.group_id for c in calls] == ["sharegpt_tools[0]"] * 4 + ["sharegpt_tools[1]"]
    c0, _, c2, c3, _ = calls
    assert c0.messages[0].role == "system" and c0.messages[0].content == "You are a weather bot."
    assert c0.completion.tool_calls is not None
    assert c0.completion.tool_calls[0].function.arguments == {"city": "Tromso"}
    assert [tc.function.arguments for tc in c2.completion.tool_calls or []] == [
        {"city": "Oslo"},
        {"city": "Bergen"},
    ]
    assert [m.role for m in c3.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert c0.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    assert len(rejects) == 2
    assert rejects[0].reason.startswith("[2]: conversations[1].value: expected a JSON tool call")
    assert rejects[1].reason.startswith("[3]: conversations[1].from: unknown role 'narrator'")


def test_regression_openai_chat_rejected_every_conversation_with_no_completion() -> None:
    """Forcing the per-call format still rejects (it is not a call log); detection picks ours."""
    p = SAMPLES / "openai_finetune.jsonl"
    forced = list(get_format("openai-chat").read(str(p), ReadOptions()))
    assert all(isinstance(x, Reject) and "no completion" in x.reason for x in forced)
    assert detect_format(str(p), read_head(str(p))).name == "chat-messages"  # type: ignore[union-attr]


def test_per_call_logs_are_not_taken_for_conversations(tmp_path: Path) -> None:
    p = tmp_path / "calls.jsonl"
    rec = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "completion": {"role": "assistant", "content": "b"},
    }
    p.write_bytes(orjson.dumps(rec) + b"\n")
    assert detect_format(str(p), read_head(str(p))).name == "openai-chat"  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# exact tokens: every call equals apply_chat_template on the conversation up to that turn
# --------------------------------------------------------------------------------------------

_SHAREGPT_ROLE = {"human": "user", "gpt": "assistant", "observation": "tool"}


def _ref_sharegpt(rec: dict) -> list[dict]:
    out = [{"role": "system", "content": rec["system"]}] if rec.get("system") else []
    for t in rec["conversations"]:
        if t["from"] == "function_call":
            v = json.loads(t["value"])
            calls = v if isinstance(v, list) else [v]
            out.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for c in calls
                    ],
                }
            )
        else:
            out.append({"role": _SHAREGPT_ROLE[t["from"]], "content": t["value"]})
    return out


@needs_qwen
def test_sharegpt_calls_match_apply_chat_template() -> None:
    from transformers import AutoTokenizer  # the reference only; rendering never imports it

    from treeprep.render import Renderer

    r = Renderer.load(str(TOKENIZERS / "qwen2_5"))
    hf = AutoTokenizer.from_pretrained(str(TOKENIZERS / "qwen2_5"), local_files_only=True)
    raw = json.loads((SAMPLES / "sharegpt_tools.json").read_text())[0]
    ref = _ref_sharegpt(raw)
    tools = json.loads(raw["tools"])
    tools = [{"type": "function", "function": t} for t in tools]
    _, items = _read(SAMPLES / "sharegpt_tools.json")
    calls = [x for x in items if isinstance(x, ChatCall) and x.group_id == "sharegpt_tools[0]"]
    targets = [i for i, m in enumerate(ref) if m["role"] == "assistant"]
    assert len(calls) == len(targets)
    for call, i in zip(calls, targets, strict=True):
        seq = r.render(call, group_id="g")
        full = list(
            hf.apply_chat_template(ref[: i + 1], tools=tools, tokenize=True, return_dict=False)
        )
        prompt = list(
            hf.apply_chat_template(
                ref[:i], tools=tools, tokenize=True, return_dict=False, add_generation_prompt=True
            )
        )
        assert list(seq.tokens) == full
        assert seq.loss_spans == [(len(prompt), len(full))]


# --------------------------------------------------------------------------------------------
# property: one call per weighted assistant turn, each prompt the exact prefix before it
# --------------------------------------------------------------------------------------------

_turn = st.tuples(
    st.sampled_from(["user", "assistant"]), st.text(max_size=8), st.sampled_from([None, 0, 1])
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turns=st.lists(_turn, min_size=1, max_size=8))
def test_one_call_per_target_turn(tmp_path: Path, turns: list) -> None:
    msgs = []
    for role, text, w in turns:
        m: dict = {"role": role, "content": text}
        if role == "assistant" and w is not None:
            m["weight"] = w
        msgs.append(m)
    p = tmp_path / "conv.jsonl"
    p.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    items = list(get_format("chat-messages").read(str(p), ReadOptions()))
    targets = [
        i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("weight", 1) == 1
    ]
    if not targets:
        assert len(items) == 1 and isinstance(items[0], Reject)
        return
    assert len(items) == len(targets)
    for item, i in zip(items, targets, strict=True):
        if i == 0:
            assert isinstance(item, Reject) and "nothing before it" in item.reason
            continue
        if msgs[i]["content"] == "":  # an empty reply is never trained (issue 27)
            assert isinstance(item, Reject) and "reply is empty" in item.reason
            continue
        assert isinstance(item, ChatCall)
        assert [(m.role, m.content) for m in item.messages] == [
            (m["role"], m["content"]) for m in msgs[:i]
        ]
        assert item.completion.content == msgs[i]["content"]
