"""An Anthropic request as llama.cpp's Messages endpoint converts it
(treeprep/formats/_anthropic_llama.py, ``--server llama.cpp``).

The expected messages are written out from llama.cpp's own code (``tools/server/server-chat.cpp``
@03eb25f, ``server_chat_convert_anthropic_to_oai`` and ``normalize_anthropic_billing_header``;
``common/chat.cpp``, ``common_chat_msg::to_json_oaicompat`` for the join), not from treeprep's
reading of the request for vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.errors import RecordError
from treeprep.formats._anthropic_llama import billing_normalized, request_messages
from treeprep.formats.anthropic import FORMAT
from treeprep.formats.base import ReadOptions
from treeprep.modes import Server
from treeprep.schemas import ChatCall

QWEN3 = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers" / "qwen3"
HEADER = "x-anthropic-billing-header: cc_version=2.1.90.e51; cc_entrypoint=cli;"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"{HEADER} cch=a5145;You are", f"{HEADER} cch=fffff;You are"),
        (f"{HEADER} cch=a5145;", f"{HEADER} cch=fffff;"),
        (f"{HEADER} cch=a5145", f"{HEADER} cch=a5145"),  # nothing after the stamp: kept
        (f"{HEADER} cch=a514;", f"{HEADER} cch=a514;"),  # not 5 characters: kept
        (f"{HEADER} no stamp;", f"{HEADER} no stamp;"),
        ("You are. x-anthropic-billing-header: cch=a5145;", None),  # not at the start
        ("x-anthropic-billing-headercch=a5145;", None),  # no colon: not the header
        # bytes, as the server counts: the stamp's 5 bytes are pinned, the text after kept
        (f"{HEADER} cch=a5145;Grüße", f"{HEADER} cch=fffff;Grüße"),
        (f"{HEADER} cch=aé12;", f"{HEADER} cch=fffff;"),  # 'é' is 2 of the 5 bytes
    ],
)
def test_the_attribution_stamp_is_pinned_as_llama_cpp_pins_it(text: str, want: str | None) -> None:
    assert billing_normalized(text) == (text if want is None else want)


def _use(cid: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": "read", "input": args}


REQUEST = {
    "system": [
        {"type": "text", "text": f"{HEADER} cch=0a1b2;"},
        {"type": "text", "text": "You are CC."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": ""},
                                     {"type": "text", "text": "Fix a.py"}]},
        {"role": "system", "content": "<reminder>"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look ", "signature": "s"},
            {"type": "redacted_thinking", "data": "zz"},
            {"type": "thinking", "thinking": "first."},
            {"type": "text", "text": "Reading."},
            _use("t1", path="a.py"), _use("t2", path="b.py")]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"type": "text", "text": "and b?"},
            {"type": "document", "source": {"type": "text", "data": "doc"}},
            {"type": "tool_result", "tool_use_id": "t2", "content": None, "is_error": True}]},
        {"role": "assistant"},  # no content: skipped
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "ls"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3",
                                      "content": "a.py b.py"}]},
    ],
}  # fmt: skip


def test_a_request_converts_as_llama_cpp_converts_it() -> None:
    """Attribution stamp pinned and kept, system blocks joined with nothing (the image left
    out); text blocks kept as parts, empty ones too; thinking joined with nothing; the turn's
    message before its results, whatever the blocks' order; a result's text blocks joined with
    nothing, a null one empty; documents, redacted thinking and a turn with no content left
    out; a call's turn with no text has the content ""; an inline system message in place."""
    text = [{"type": "text", "text": "Reading."}]
    assert request_messages(REQUEST, None) == [
        {"role": "system", "content": f"{HEADER} cch=fffff;You are CC."},
        {"role": "user", "content": [{"type": "text", "text": ""},
                                     {"type": "text", "text": "Fix a.py"}]},
        {"role": "system", "content": "<reminder>"},
        {"role": "assistant", "content": text, "reasoning_content": "Look first.",
         "tool_calls": [
             {"id": "t1", "type": "function",
              "function": {"name": "read", "arguments": {"path": "a.py"}}},
             {"id": "t2", "type": "function",
              "function": {"name": "read", "arguments": {"path": "b.py"}}}]},
        {"role": "user", "content": [{"type": "text", "text": "and b?"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "onetwo"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t3", "type": "function", "function": {"name": "ls", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "t3", "content": "a.py b.py"},
    ]  # fmt: skip


def test_a_system_field_without_text_is_an_empty_system_message() -> None:
    assert request_messages({"system": [], "messages": []}, "fallback") == [
        {"role": "system", "content": ""}
    ]
    assert request_messages({"messages": []}, "fallback") == [
        {"role": "system", "content": "fallback"}  # --system-prompt, for a request with none
    ]
    with pytest.raises(RecordError, match=r"request\.messages\[0\]: role 'tool'"):
        request_messages({"messages": [{"role": "tool", "content": "x"}]}, None)


def _call(tmp_path: Path, request: dict[str, Any], server: Server) -> ChatCall:
    rec = {"request": {"model": "m", **request},
           "response": {"id": "r1", "type": "message", "model": "m", "stop_reason": "end_turn",
                        "content": [{"type": "text", "text": "Done."}]}}  # fmt: skip
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,) = FORMAT.read(str(path), ReadOptions(server=server))
    assert isinstance(call, ChatCall), call
    return call


def test_only_the_template_kwargs_reach_llama_cpp_s_template(tmp_path: Path) -> None:
    """llama.cpp passes ``chat_template_kwargs`` through; ``output_config.effort`` and
    ``thinking`` (a sampling budget there) do not reach the template, where vLLM's endpoint
    hands both on."""
    request = {"messages": [{"role": "user", "content": "Hi"}],
               "output_config": {"effort": "high"}, "thinking": {"type": "disabled"},
               "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    llama = _call(tmp_path, request, Server.llama_cpp)
    vllm = _call(tmp_path, request, Server.vllm)
    assert (llama.reasoning_effort, llama.thinking_disabled) == (None, False)
    assert (vllm.reasoning_effort, vllm.thinking_disabled) == ("high", True)
    assert llama.chat_template_kwargs == vllm.chat_template_kwargs == {"enable_thinking": False}
    assert (llama.arguments_json, vllm.arguments_json) == (None, "python")


@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
def test_qwen3_renders_the_parts_as_llama_cpp_joins_them(tmp_path: Path) -> None:
    """Qwen3's template takes strings, so llama.cpp joins a message's text parts with a newline,
    none before a part while the text so far is empty: ["", "Fix a.py", "", "now"] is
    "Fix a.py\\n\\nnow"; the turn's text comes before its tool result."""
    from tests.treeprep.render.hf_reference import apply_at_fixed_date
    from treeprep.render import Renderer

    request = {"system": "S", "messages": [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [_use("t1", path="a.py")]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
            {"type": "text", "text": ""}, {"type": "text", "text": "Fix a.py"},
            {"type": "text", "text": ""}, {"type": "text", "text": "now"}]}]}  # fmt: skip
    call = _call(tmp_path, request, Server.llama_cpp)
    r = Renderer.load(str(QWEN3), server="llama.cpp")
    seq = r.render(call, group_id="g")
    got = r.decode(seq.tokens[: seq.loss_spans[-1][0]])
    call_msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "read",
                                                      "arguments": {"path": "a.py"}}}]}  # fmt: skip
    want = apply_at_fixed_date(r, [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Go"}, call_msg,
        {"role": "user", "content": "Fix a.py\n\nnow"},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"}],
        tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert got == want


def test_every_tool_is_a_function_on_llama_cpp(tmp_path: Path) -> None:
    """llama.cpp converts every tool, a server tool too (parameters ``{}``), with ``""`` for an
    absent description; vLLM's endpoint leaves the server tool out and the description absent."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    request = {"messages": [{"role": "user", "content": "Hi"}],
               "tools": [{"name": "get", "input_schema": schema}, server_tool]}  # fmt: skip
    llama = _call(tmp_path, request, Server.llama_cpp)
    vllm = _call(tmp_path, request, Server.vllm)
    assert llama.tools == [
        {"type": "function", "function": {"name": "get", "description": "", "parameters": schema}},
        {"type": "function",
         "function": {"name": "web_search", "description": "", "parameters": {}}},
    ]  # fmt: skip
    assert vllm.tools == [{"type": "function", "function": {"name": "get", "parameters": schema}}]
