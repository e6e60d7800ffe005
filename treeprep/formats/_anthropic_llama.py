"""An Anthropic Messages request as llama.cpp's Messages endpoint converts it (``--server
llama.cpp``).

Read from llama.cpp's ``tools/server/server-chat.cpp`` (``server_chat_convert_anthropic_to_oai``
and ``normalize_anthropic_billing_header``, @03eb25f, late 2026). It differs from vLLM's endpoint
(:mod:`treeprep.formats.anthropic`) in these ways:

- **System:** the text blocks are joined with nothing, as vLLM joins them, but Claude Code's
  attribution block is kept: its per-request ``cch=`` stamp (the 5 characters after ``cch=``,
  when a ``;`` follows them) is overwritten with ``fffff`` (:func:`billing_normalized`). A
  ``system`` field that is present makes a system message even when it holds no text.
- **A turn of blocks:** its text blocks stay text parts, empty ones too (the server joins them:
  :mod:`treeprep.render.text_parts`); its ``thinking`` blocks are joined with nothing; images
  become ``image_url`` parts; other blocks (``document``, ``redacted_thinking``) are left out.
  The turn's message comes first, then a ``tool`` message per ``tool_result``, whatever the
  blocks' order; a result's text blocks are joined with nothing. A turn left with no text, no
  call and no thinking is no message. A turn whose content is a string is sent as it is, a
  ``system`` one included (inline system messages stay in place).
- **Tools:** every tool is a function, the server tools too (no ``input_schema``: parameters
  ``{}``), its description ``""`` where it has none (:func:`tools`).
- **Request fields:** only ``chat_template_kwargs`` reach the template; ``output_config``
  (the effort) and ``thinking`` (a sampling budget there) do not.
"""

from __future__ import annotations

from typing import Any

from treeprep.formats._anthropic_blocks import BILLING_HEADER, BLOCKS, request_turns, text_of
from treeprep.formats._fields import block_text, chat_tool_call, expect, opt_list

#: how Claude Code's attribution line begins (with its colon), and the stamp llama.cpp pins
_BILLING = f"{BILLING_HEADER}:"
_STAMP = "cch="
_STAMP_LENGTH = 5


def billing_normalized(text: str) -> str:
    """``text`` with the ``cch=`` stamp of Claude Code's attribution line pinned to ``fffff``,
    as llama.cpp pins it so that prompts share a prefix; any other text as it is. The server
    counts in UTF-8 bytes, and so does this.

    >>> billing_normalized("x-anthropic-billing-header: cc_version=2.1.101; cch=a5145;You are")
    'x-anthropic-billing-header: cc_version=2.1.101; cch=fffff;You are'
    >>> billing_normalized("x-anthropic-billing-header: cch=a514;")  # not 5 before the ';'
    'x-anthropic-billing-header: cch=a514;'
    """
    if not text.startswith(_BILLING):
        return text
    raw = text.encode()
    at = raw.find(_STAMP.encode(), len(_BILLING))
    if at < 0:
        return text
    start = at + len(_STAMP)
    end = start + _STAMP_LENGTH
    if not (end < len(raw) and raw[end : end + 1] == b";"):
        return text
    # the stamp lies between ASCII "cch=" and ";", so it is whole characters
    return (raw[:start] + b"f" * _STAMP_LENGTH + raw[end:]).decode()


def system_message(system: Any) -> list[dict[str, Any]]:
    """The system message of the request's ``system`` field (absent or null: none)."""
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": billing_normalized(system)}]
    texts = [
        billing_normalized(block_text(b, "text", f"request.system[{i}]", required=False))
        for i, b in enumerate(opt_list(system, "request.system"))
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    return [{"role": "system", "content": "".join(texts)}]


def _image(b: dict[str, Any]) -> dict[str, Any] | None:
    """An ``image`` block as an ``image_url`` part (a source of another type: none)."""
    source: dict[str, Any] = b["source"] if isinstance(b.get("source"), dict) else {}
    if source.get("type") == "base64":
        media = source.get("media_type") or "image/jpeg"
        return {
            "type": "image_url",
            "image_url": {"url": f"data:{media};base64,{source.get('data', '')}"},
        }
    if source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url", "")}}
    return None


def turn_messages(m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The messages of one request turn ``m`` (``where``: its path in the log)."""
    role = m.get("role")
    content = expect(m.get("content"), f"{where}.content", str, list, what=BLOCKS)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    thinking = ""
    for k, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        at = f"{where}.content[{k}]"
        if kind == "text":
            parts.append({"type": "text", "text": block_text(b, "text", at, required=False)})
        elif kind == "thinking":
            thinking += block_text(b, "thinking", at, required=False)
        elif kind == "image" and (image := _image(b)) is not None:
            parts.append(image)
        elif kind == "tool_use":
            calls.append(
                chat_tool_call(b.get("id") or "", b.get("name") or "", b.get("input") or {})
            )
        elif kind == "tool_result":
            # a string, or its text blocks joined with nothing (null: empty)
            text = text_of(b.get("content"), f"{at}.content")
            results.append(
                {"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text}
            )
    out: list[dict[str, Any]] = []
    if parts or calls or thinking:
        msg: dict[str, Any] = {"role": role, "content": parts or ""}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = thinking
        out.append(msg)
    return out + results


def request_messages(req: dict[str, Any], system_prompt: str | None) -> list[dict[str, Any]]:
    """The chat messages llama.cpp's endpoint makes of the request ``req`` (``system_prompt``:
    ``--system-prompt``, for a request with no ``system`` field)."""
    system = req.get("system")
    out = system_message(system if system is not None else system_prompt)
    for where, role, m in request_turns(req):
        if "content" not in m and role == "assistant":
            continue  # the endpoint skips it
        out.extend(turn_messages(m, where))
    return out


def tools(req: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's ``tools`` as llama.cpp hands them on: each a function of its name,
    description (``""`` when absent) and ``input_schema`` (``{}`` when absent)."""
    listed = req.get("tools")
    if not isinstance(listed, list):
        return None  # the endpoint converts a list alone
    out = []
    for i, t in enumerate(listed):
        t = expect(t, f"request.tools[{i}]", dict)
        fn = {
            # absent or null: "", as llama.cpp's json_value(tool, key, std::string()) reads it
            "name": block_text(t, "name", f"request.tools[{i}]", required=False),
            "description": block_text(t, "description", f"request.tools[{i}]", required=False),
            "parameters": t["input_schema"] if "input_schema" in t else {},
        }
        out.append({"type": "function", "function": fn})
    return out
