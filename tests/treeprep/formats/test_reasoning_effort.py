"""The request's reasoning effort, where a log records it, is the call's ``reasoning_effort``.

The fields are the APIs' own: the Chat Completions request's ``reasoning_effort`` (a dataset
row, a logged ``request``, LiteLLM's ``kwargs`` as OpenHands logs them), the Responses request's
``reasoning.effort`` (the response echoes it), and Codex's ``turn_context.effort`` (codex-rs's
``TurnContextItem``). gpt-oss's prompt states it (tests/treeprep/render/test_harmony.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from treeprep.formats import ReadOptions, get_format
from treeprep.schemas import ChatCall

MESSAGES = [{"role": "user", "content": "Hi"}]
REPLY = {"role": "assistant", "content": "Hello."}


def _calls(fmt: str, path: Path, lines: list[Any]) -> list[ChatCall]:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    out = list(get_format(fmt).read(str(path), ReadOptions()))
    assert all(isinstance(c, ChatCall) for c in out), out
    return out  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("row", "effort"),
    [
        ({"messages": MESSAGES, "completion": REPLY, "reasoning_effort": "high"}, "high"),
        ({"request": {"messages": MESSAGES, "reasoning_effort": "low"},
          "response": {"choices": [{"message": REPLY}]}}, "low"),
        ({"messages": MESSAGES, "kwargs": {"reasoning_effort": "medium"},
          "response": {"choices": [{"message": REPLY}]}}, "medium"),
        ({"messages": MESSAGES, "completion": REPLY}, None),
    ],
    ids=["row", "request", "litellm-kwargs", "none"],
)  # fmt: skip
def test_chat_completions_requests(tmp_path: Path, row: dict, effort: str | None) -> None:
    (call,) = _calls("openai-chat", tmp_path / "rows.jsonl", [row])
    assert call.reasoning_effort == effort


def test_responses_requests(tmp_path: Path) -> None:
    output = [{"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Hello."}]}]  # fmt: skip
    asked = {"request": {"input": "Hi", "reasoning": {"effort": "high"}},
             "response": {"output": output, "reasoning": {"effort": "high"}}}  # fmt: skip
    echoed = {"input": "Hi", "output": output, "reasoning": {"effort": "low", "summary": None}}
    unset = {"input": "Hi", "output": output, "reasoning": {"effort": None}}
    calls = _calls("openai-responses", tmp_path / "r.jsonl", [asked, echoed, unset])
    assert [c.reasoning_effort for c in calls] == ["high", "low", None]


def test_an_effort_that_is_not_a_string_is_a_reject_naming_the_field(tmp_path: Path) -> None:
    """The servers and the Responses API refuse a request whose effort is not a string: such a
    call is rejected with the field's path, not rendered as if no effort were asked."""
    from treeprep.schemas import Reject

    output = [{"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Hello."}]}]  # fmt: skip
    cases = [
        ("openai-chat", {"messages": MESSAGES, "completion": REPLY, "reasoning_effort": 2,
                         "request": {"reasoning_effort": "low"}}, "reasoning_effort"),
        ("openai-chat", {"request": {"messages": MESSAGES, "extra_body": {"reasoning_effort": {}}},
                         "response": {"choices": [{"message": REPLY}]}},
         "request.extra_body.reasoning_effort"),
        ("openai-responses", {"request": {"input": "Hi", "reasoning": {"effort": ["high"]}},
                              "response": {"output": output}}, "request.reasoning.effort"),
        ("openai-responses", {"input": "Hi", "output": output, "reasoning": {"effort": 1}},
         "reasoning.effort"),
        ("openai-responses", {"request": {"input": "Hi"},
                              "response": {"output": output, "reasoning": {"effort": True}}},
         "response.reasoning.effort"),
    ]  # fmt: skip
    for n, (fmt, row, where) in enumerate(cases):
        path = tmp_path / f"{n}.jsonl"
        path.write_bytes(orjson.dumps(row) + b"\n")
        (item,) = list(get_format(fmt).read(str(path), ReadOptions()))
        assert isinstance(item, Reject) and item.line == 1, (where, item)
        assert f"{where}: expected a string, got" in item.reason, item.reason


def test_codex_turn_context(tmp_path: Path) -> None:
    def line(kind: str, payload: dict) -> dict:
        return {"timestamp": "2025-11-03T10:00:00.000Z", "type": kind, "payload": payload}

    def msg(role: str, text: str) -> dict:
        part = "output_text" if role == "assistant" else "input_text"
        item = {"type": "message", "role": role, "content": [{"type": part, "text": text}]}
        return line("response_item", item)

    rollout = [
        line("session_meta", {"id": "s-1", "cwd": "/w"}),
        line("turn_context", {"cwd": "/w", "model": "gpt-oss-120b", "effort": "high"}),
        msg("user", "Hi"),
        msg("assistant", "Hello."),
        line("turn_context", {"cwd": "/w", "model": "gpt-oss-120b"}),
        msg("user", "Again"),
        msg("assistant", "Hello again."),
    ]
    calls = _calls("codex", tmp_path / "rollout-2025-11-03T10-00-00-s-1.jsonl", rollout)
    assert [c.reasoning_effort for c in calls] == ["high", None]
