"""An Anthropic request as SGLang's Messages endpoint converts it
(treeprep/formats/_anthropic_sglang.py, ``--server sglang``), written out from SGLang 0.5.23's
``entrypoints/anthropic/serving.py`` (``_convert_to_chat_completion_request``) and
``protocol.py``: what it converts, and what it refuses or writes as no log records (rejects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats.anthropic import FORMAT
from treeprep.formats.base import ReadOptions
from treeprep.modes import Server
from treeprep.schemas import ChatCall, Reject

SGLANG = ReadOptions(server=Server.sglang)
USE = {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"q": "x"}}


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def _read(tmp_path: Path, req: dict[str, Any], opts: ReadOptions = SGLANG) -> ChatCall | Reject:
    resp = {"id": "msg_1", "type": "message", "model": "m", "role": "assistant",
            "content": [_text("Done.")], "stop_reason": "end_turn"}  # fmt: skip
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"request": req, "response": resp}) + "\n")
    (item,) = FORMAT.read(str(path), opts)
    return item


def _request(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, **kw}


def test_a_request_converts_as_sglang_s_endpoint_converts_it(tmp_path: Path) -> None:
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [_text("r1"), _text(""), _text("r2")]},
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "tool_reference", "tool_name": "grep"}, _text("r3")]},
    ]  # fmt: skip
    req = _request(
        system=[_text("x-anthropic-billing-header: cch=00000;"), _text(""), _text("Be brief.")],
        messages=[
            {"role": "user", "content": "Find x."},
            {"role": "assistant", "content": [_text(""), _text("Looking."), USE]},
            {"role": "user", "content": [_text("pre"), *results, _text("post")]},
        ],
    )
    call = _read(tmp_path, req)
    assert isinstance(call, ChatCall)
    got = [m.model_dump(exclude_none=True) for m in call.messages]
    tool = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "grep", "arguments": {"q": "x"}},
    }
    assert got == [
        # the attribution block kept, the blocks with text joined with a newline
        {"role": "system", "content": "x-anthropic-billing-header: cch=00000;\nBe brief."},
        {"role": "user", "content": "Find x."},
        # an empty text block is a part too
        {"role": "assistant", "content": [_text(""), _text("Looking.")], "tool_calls": [tool]},
        # the text before a result goes before its tool messages, the text after it after them
        {"role": "user", "content": "pre"},
        # empty text items dropped; several stay parts (SGLang joins them with a space)
        {"role": "tool", "tool_call_id": "toolu_1", "content": [_text("r1"), _text("r2")]},
        # a run of tool_reference items is a tool message of its own, the same id
        {"role": "tool", "tool_call_id": "toolu_1",
         "content": [{"type": "tool_reference", "name": "grep"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "r3"},
        {"role": "user", "content": "post"},
    ]  # fmt: skip


def test_tools_effort_and_kwargs_as_sglang_hands_them_on(tmp_path: Path) -> None:
    tools = [
        {"type": "web_search_20250305", "name": "web_search"},  # a server tool: left out
        {"name": "grep", "input_schema": {"properties": {}}, "defer_loading": True},
        {"type": "custom", "name": "ls", "description": "List.", "strict": True,
         "input_schema": {"type": "object"}},
    ]  # fmt: skip
    req = _request(messages=[{"role": "user", "content": "Go."}], tools=tools,
                   output_config={"effort": "xhigh"},
                   chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    call = _read(tmp_path, req)
    assert isinstance(call, ChatCall)
    assert call.tools == [
        {"type": "function", "defer_loading": True,
         "function": {"name": "grep", "description": "",
                      "parameters": {"properties": {}, "type": "object"}, "strict": False}},
        {"type": "function", "defer_loading": None,
         "function": {"name": "ls", "description": "List.",
                      "parameters": {"type": "object"}, "strict": True}},
    ]  # fmt: skip
    # xhigh is sent as max; the top-level chat_template_kwargs are not read
    assert call.reasoning_effort == "max" and not call.chat_template_kwargs
    one = _read(tmp_path, {**req, "tool_choice": {"type": "tool", "name": "ls"}})
    assert isinstance(one, ChatCall) and [t["function"]["name"] for t in one.tools] == ["ls"]
    none = _read(tmp_path, {**req, "tool_choice": {"type": "none"}})
    assert isinstance(none, ChatCall) and not none.tools
    # --tools stands in for a log without tools, not for tools the request chose not to pass
    given = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    opts = ReadOptions(server=Server.sglang, tools=given)
    none = _read(tmp_path, {**req, "tool_choice": {"type": "none"}}, opts)
    assert isinstance(none, ChatCall) and not none.tools
    bare = _read(tmp_path, _request(messages=req["messages"]), opts)
    assert isinstance(bare, ChatCall) and bare.tools == given


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "--reasoning-parser's switch"),
        ({"output_config": {"effort": "none"}}, "'none', which SGLang refuses"),
        ({"messages": [{"role": "user", "content": [
            {"type": "document", "source": {}}]}]}, "a 'document' block, which SGLang"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Hm."}, _text("Yo")]},
            {"role": "user", "content": "Go"}]}, "earlier thinking"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "x"}, _text("Yo")]},
            {"role": "user", "content": "Go"}]}, "redacted_thinking, which SGLang"),
        ({"messages": [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Sure"}]}, "ends with an assistant"),
        ({"tools": [{"type": "memory_20250818", "name": "memory"}]}, "type 'memory_20250818'"),
    ],
)  # fmt: skip
def test_what_sglang_refuses_or_no_log_records_is_a_reject(
    tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    item = _read(tmp_path, _request(messages=[{"role": "user", "content": "Go."}]) | change)
    assert isinstance(item, Reject) and why in item.reason
