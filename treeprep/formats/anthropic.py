"""Anthropic Messages API request/response logs (JSONL, one call per line).

A line is ``{"request": {...}, "response": {...}}`` (the shape proxies and SDK hooks log), or the
request's fields at the top level next to ``"response"``. Written from the API's documented shape:

* request ``system``: a string or a list of ``text`` blocks (joined as given, nothing inserted;
  Claude Code's attribution block, ``x-anthropic-billing-header: ...``, left out as a Messages
  endpoint leaves it out);
* request ``messages``: ``user``/``assistant`` turns, and ``system`` messages, which vLLM 0.34's
  endpoint takes (Claude Code's per-turn reminders): in place where the template takes a system
  message after the first, else appended to the leading system prompt
  (``ReadOptions.merge_inline_system``). A turn's ``content`` is a string or blocks:
  ``text``, ``thinking`` (-> ``reasoning_content``), ``redacted_thinking`` (dropped: no text),
  ``tool_use`` (-> ``tool_calls`` with the ``input`` object as arguments, which the endpoint
  writes with Python's ``json.dumps``: ``arguments_json``), ``tool_result`` (-> one
  ``tool`` message each, its text blocks joined with a newline as vLLM's Messages endpoint joins
  them, before the turn's text, as the API requires them first; a result's images a user
  message after it), images (``image_url`` parts) and documents (kept as content parts);
* request ``tools``: ``{name, description, input_schema}`` -> OpenAI function schemas; server tools
  without an ``input_schema`` (web search, code execution) have no function form and are left out;
* request ``output_config.effort``, ``chat_template_kwargs`` and ``thinking``: the call's
  reasoning effort and template kwargs, which vLLM's Messages endpoint hands on (0.34), and
  whether it turned thinking off (``disabled``, ``between_tools``), which the endpoint sends as
  an effort it probes the template for (``thinking_disabled``);
* response ``content``: the completion, converted like an assistant turn.

With ``--server llama.cpp`` the request is converted as llama.cpp's endpoint converts it instead
(:mod:`treeprep.formats._anthropic_llama`), with ``--server sglang`` as SGLang's does
(:mod:`treeprep.formats._anthropic_sglang`: a request it refuses, or whose conversion depends on
its reasoning parser, is a reject). As vLLM's endpoint converts them (0.34,
``_convert_block``), empty ``text`` blocks are skipped,
an assistant's several text blocks stay text parts (the renderer joins them as the server did)
and its ``thinking`` blocks are joined with nothing.

The logged request is exactly what the model saw: ``exact_messages``. Each line is one call; with no
``--group-by`` field the builder groups the calls by file. The call id is the response ``id``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._anthropic_blocks import BLOCKS, is_billing, request_turns, text_of
from treeprep.formats._anthropic_llama import request_messages
from treeprep.formats._anthropic_llama import tools as llama_tools
from treeprep.formats._anthropic_llama import turn_messages as llama_turn_messages
from treeprep.formats._anthropic_sglang import request_messages as sglang_messages
from treeprep.formats._anthropic_sglang import tools as sglang_tools
from treeprep.formats._anthropic_sglang import turn_messages as sglang_turn_messages
from treeprep.formats._fields import (
    BlockNames,
    as_list,
    assistant_blocks,
    assistant_turn,
    block_text,
    chat_content,
    chat_tool_call,
    cut_reason,
    expect,
    first_field,
    make_call,
    opt_list,
    template_kwargs_at,
)
from treeprep.formats._read import head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.modes import Server
from treeprep.schemas import Reject

NAME = "anthropic"


def _split(rec: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    req = rec.get("request") if isinstance(rec.get("request"), dict) else rec
    resp = rec.get("response")
    return req, resp if isinstance(resp, dict) else None


def _is_anthropic_response(resp: dict[str, Any] | None) -> bool:
    return (
        resp is not None
        and isinstance(resp.get("content"), list)
        and (resp.get("type") == "message" or "stop_reason" in resp)
        and "choices" not in resp
    )


def sniff(path: str, head: bytes) -> bool:
    """JSONL whose records pair a Messages request with an Anthropic ``message`` response."""
    for o in head_json_objects(head)[:5]:
        req, resp = _split(o)
        if (
            req is not None
            and isinstance(req.get("messages"), list)
            and _is_anthropic_response(resp)
        ):
            return True
    return False


def convert_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]] | None:
    """Anthropic tool definitions -> OpenAI function tool schemas (server tools left out)."""
    if not tools:
        return None
    out = []
    for t in as_list(tools, where):
        if isinstance(t, dict) and "input_schema" in t and t.get("name"):
            fn: dict[str, Any] = {"name": t["name"]}
            if t.get("description") is not None:
                fn["description"] = t["description"]
            fn["parameters"] = t["input_schema"]
            # vLLM's endpoint hands these on (0.34, _convert_tools); its model writes them where
            # set (treeprep.render.server_tools)
            fn |= {k: t[k] for k in ("strict", "defer_loading") if t.get(k) is not None}
            out.append({"type": "function", "function": fn})
    return out or None


#: between the text blocks of a ``tool_result``: a server's Messages endpoint sends the result
#: as one tool message, its text blocks joined with a newline (vLLM's ``anthropic/serving.py``,
#: 0.31 to 0.34)
RESULT_SEP = "\n"
#: how a server's Messages endpoint writes a ``tool_use`` input as the request's arguments
#: string: Python's ``json.dumps`` (vLLM's ``_convert_tool_use_block``, 0.31 to 0.34)
ARGUMENTS_JSON = "python"

#: an assistant's content blocks, read leniently: a null or absent text is empty, and blocks of
#: other types (``redacted_thinking``, server tool blocks) are skipped
_BLOCK_NAMES = BlockNames(
    text="text",
    thinking="thinking",
    thinking_field="thinking",
    tool_call="tool_use",
    text_required=False,
    others="skip",
)


def _tool_use(b: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_use`` block as a chat tool call, its ``input`` the arguments (as logged)."""
    return chat_tool_call(b.get("id"), b.get("name", ""), b.get("input") or {})


def assistant_message(
    content: Any, where: str = "content", *, parts: bool = False
) -> dict[str, Any]:
    """An Anthropic assistant ``content`` (a string or blocks) as one OpenAI-style message.

    ``text`` blocks are joined (with ``parts``, several stay text parts: a Messages endpoint
    hands them on so, and the renderer joins them as the server did, ``--server``; a completion's
    with nothing between them), ``thinking`` blocks become ``reasoning_content``, ``tool_use``
    blocks become ``tool_calls`` with their ``input`` object as the arguments. Claude Code
    transcripts use it too (their lines carry Messages API content blocks). A misshapen content
    raises RecordError naming ``where``.
    """
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    listed = enumerate(opt_list(expect_blocks(content, where), where))
    blocks = ((i, b) for i, b in listed if isinstance(b, dict))  # others are skipped
    texts, thinking, calls = assistant_blocks(blocks, where, _BLOCK_NAMES, _tool_use)
    if not parts:
        return assistant_turn("".join(texts) if texts else None, thinking, calls, sep="\n\n")
    # as vLLM's Messages endpoint converts them (_convert_block, 0.34): empty text and thinking
    # blocks skipped, the thinking joined with nothing
    texts = [t for t in texts if t]
    text: Any = [{"type": "text", "text": t} for t in texts] if len(texts) > 1 else None
    if text is None:
        text = texts[0] if texts else None
    return assistant_turn(text, [t for t in thinking if t], calls, sep="")


def expect_blocks(content: Any, where: str) -> Any:
    """``content`` when it is null, a string or a list of content blocks."""
    return None if content is None else expect(content, where, str, list, what=BLOCKS)


def user_messages(content: Any, where: str, *, endpoint: bool = False) -> list[dict[str, Any]]:
    """An Anthropic user ``content`` as chat messages: a ``tool`` message per ``tool_result``
    block, then the text (and image) parts as one user message. Cline's task history uses it.
    With ``endpoint``, as vLLM's Messages endpoint converts it (0.34, ``_convert_block``):
    empty text blocks skipped, images as ``image_url`` parts, and a result's images as a user
    message after its ``tool`` message (:func:`_endpoint_result`)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, b in enumerate(opt_list(expect_blocks(content, where), where)):
        if not isinstance(b, dict):
            continue
        at = f"{where}[{i}]"
        kind = expect(b.get("type"), f"{at}.type", str)
        if kind == "tool_result" and endpoint:
            out.extend(_endpoint_result(b, f"{at}.content"))
        elif kind == "tool_result":
            c = b.get("content")
            text = c if isinstance(c, str) else text_of(c, f"{at}.content", RESULT_SEP)
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
        elif kind == "text":
            text = block_text(b, "text", at, required=False)
            if text or not endpoint:
                parts.append({"type": "text", "text": text})
        elif kind == "image" and endpoint:
            if b.get("source"):  # one without a source is skipped
                parts.append(_image_part(b["source"]))
        else:
            parts.append(dict(b))
    if parts:
        out.append({"role": "user", "content": chat_content(parts)})
    return out


def _image_part(source: Any) -> dict[str, Any]:
    """An image block's ``source`` as vLLM's endpoint writes it (``_convert_image_source_to_url``,
    0.34): a URL's own address, else a base64 data URI."""
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "url":
        url = source.get("url", "")
    else:
        url = f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _endpoint_result(b: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A ``tool_result`` block as vLLM's endpoint converts it (``_convert_user_tool_result``,
    0.34): one ``tool`` message of its text blocks joined with a newline (its
    ``tool_reference`` items first, as parts, where it has any), then a user message of its
    images, where it has any (a text-only template cannot render that: the call is rejected)."""
    c = expect(b.get("content"), where, str, list, type(None), what=BLOCKS)
    items = [x for x in c if isinstance(x, dict)] if isinstance(c, list) else []
    text = c if isinstance(c, str) else text_of(items, where, RESULT_SEP)
    refs = [
        {"type": "tool_reference", "name": name}
        for x in items
        if x.get("type") == "tool_reference" and (name := x.get("tool_name") or x.get("name"))
    ]
    content: Any = [*refs, *([{"type": "text", "text": text}] if text else [])] if refs else text
    out = [{"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": content}]
    images = [_image_part(x.get("source")) for x in items if x.get("type") == "image"]
    if images:
        out.append({"role": "user", "content": images})
    return out


def turn_messages(m: dict[str, Any], where: str, server: Server) -> list[dict[str, Any]]:
    """One ``user`` or ``assistant`` turn of a request as the ``server``'s Messages endpoint
    converts it: llama.cpp's (:func:`~treeprep.formats._anthropic_llama.turn_messages`),
    SGLang's (:func:`~treeprep.formats._anthropic_sglang.turn_messages`, which raises a
    RecordError for what it refuses or what no log says how it wrote), or vLLM's."""
    if server == Server.llama_cpp:
        return llama_turn_messages(m, where)
    if server == Server.sglang:
        return sglang_turn_messages(m, where)
    if m.get("role") == "user":
        return user_messages(m.get("content"), f"{where}.content", endpoint=True)
    return [assistant_message(m.get("content"), f"{where}.content", parts=True)]


def _inline_system(m: dict[str, Any], where: str) -> str | None:
    """The text of an inline ``system`` message as vLLM's Messages endpoint reads it (0.34,
    ``_extract_system_text``): a string, or its non-empty text blocks joined with nothing;
    Claude Code's attribution block left out (None: no text)."""
    content = expect(m.get("content"), f"{where}.content", str, list, what=BLOCKS)
    if isinstance(content, str):
        return None if is_billing({"text": content}) else content or None
    blocks = [b for b in content if not is_billing(b)]
    return text_of(blocks, f"{where}.content") or None


def _system(req: dict[str, Any], opts: ReadOptions) -> str | None:
    """The leading system prompt as vLLM's Messages endpoint writes it
    (``_convert_system_message``, 0.34): the request's system blocks, Claude Code's attribution
    block left out, then with ``opts.merge_inline_system`` the texts of the inline ``system``
    messages, all joined with nothing."""
    system = req.get("system")
    if isinstance(system, list):
        system = [b for b in system if not is_billing(b)]
    sys_text = text_of(system, "request.system") if system is not None else opts.system_prompt
    inline: list[str] = []
    if opts.merge_inline_system:
        for i, m in enumerate(opt_list(req.get("messages"), "request.messages")):
            if isinstance(m, dict) and m.get("role") == "system":
                inline.append(_inline_system(m, f"request.messages[{i}]") or "")
    return "".join([sys_text or "", *inline]) or None


def _vllm_messages(req: dict[str, Any], opts: ReadOptions) -> list[dict[str, Any]]:
    """The chat messages vLLM's Messages endpoint makes of the request."""
    msgs: list[dict[str, Any]] = []
    sys_text = _system(req, opts)
    if sys_text:
        msgs.append({"role": "system", "content": sys_text})
    for where, role, m in request_turns(req):
        if role != "system":
            msgs.extend(turn_messages(m, where, opts.server))
        elif text := None if opts.merge_inline_system else _inline_system(m, where):
            msgs.append({"role": "system", "content": text})  # the template takes it in place
    return msgs


def _server_fields(req: dict[str, Any], opts: ReadOptions) -> dict[str, Any]:
    """The fields of a call that the server's Messages endpoint makes of the request: its
    messages, tools, effort, template kwargs, and whether it turned thinking off."""
    config = first_field([("request.", req)], "output_config", dict, what="an object") or {}
    thinking = first_field([("request.", req)], "thinking", dict, what="an object")
    effort = first_field([("request.output_config.", config)], "effort", str)
    if opts.server == Server.llama_cpp:
        # only the kwargs reach the template; the effort and thinking do not
        return {"messages": request_messages(req, opts.system_prompt),
                "tools": llama_tools(req) or None,
                "chat_template_kwargs": template_kwargs_at([("request.", req)])}  # fmt: skip
    if opts.server == Server.sglang:
        if thinking is not None:
            raise RecordError(
                "request.thinking: SGLang's endpoint turns it into its --reasoning-parser's "
                "switch, which no log records"
            )
        if effort == "none":
            raise RecordError("request.output_config.effort: 'none', which SGLang refuses")
        messages = sglang_messages(req, opts.system_prompt, opts.merge_inline_system)
        # the top-level chat_template_kwargs are not read (0.5.23); xhigh is sent as max
        return {"messages": messages, "tools": sglang_tools(req),
                "reasoning_effort": "max" if effort == "xhigh" else effort}  # fmt: skip
    # vLLM's endpoint hands the effort and the kwargs on (_handle_output_config,
    # _build_base_request)
    return {
        "messages": _vllm_messages(req, opts),
        "tools": convert_tools(req.get("tools"), "request.tools"),
        "reasoning_effort": effort,
        "chat_template_kwargs": template_kwargs_at([("request.", req)]),
        "thinking_disabled": (thinking or {}).get("type") in ("disabled", "between_tools"),
    }


def to_call_fields(
    req: dict[str, Any], resp: dict[str, Any], opts: ReadOptions
) -> tuple[dict[str, Any] | None, str | None]:
    """(ChatCall fields, None) or (None, reason). A misshapen field, or one the server's
    endpoint refuses or converts as no log records, raises RecordError."""
    fields = _server_fields(req, opts)
    if why := cut_reason(resp.get("stop_reason"), "response.stop_reason"):
        return None, why
    completion = assistant_message(resp.get("content"), "response.content", parts=True)
    if (
        not completion.get("content")
        and not completion.get("tool_calls")
        and not completion.get("reasoning_content")
    ):
        return None, "response content has no text, thinking or tool_use block"
    return {
        "model": resp.get("model") or req.get("model"),
        **fields,
        # --tools stands in for tools no request declares, not for ones it chose not to pass
        "tools": opts.tools if fields["tools"] is None else fields["tools"] or None,
        "completion": completion,
        "provenance": {"exact_tokens": False, "exact_messages": True, "reconstructed": False},
    }, None


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    for no, rec in records(path, NAME, objects=True):
        if isinstance(rec, Reject):
            yield rec
            continue
        req, resp = _split(rec)
        if req is None or not isinstance(req.get("messages"), list):
            yield Reject(
                file=path,
                line=no,
                format=NAME,
                reason="expected a Messages API request with a 'messages' list",
            )
            continue
        if not _is_anthropic_response(resp):
            yield Reject(
                file=path,
                line=no,
                format=NAME,
                reason="expected a 'response' Messages API object with a 'content' list",
            )
            continue
        assert resp is not None
        try:
            fields, why = to_call_fields(req, resp, opts)
        except RecordError as e:
            fields, why = None, str(e)
        if fields is None:
            yield Reject(file=path, line=no, format=NAME, reason=str(why))
            continue
        gid = None
        if opts.group_by:
            v = rec.get(opts.group_by, req.get(opts.group_by))
            gid = None if v is None else str(v)
        fields.update(
            group_id=gid,
            call_id=str(resp.get("id") or f"line-{no}"),
            # llama.cpp writes the input with nlohmann's dump() (None there: render.llama_caps)
            arguments_json=None if opts.server == Server.llama_cpp else ARGUMENTS_JSON,
            source_file=path,
            source_line=no,
            source_format=NAME,
        )
        yield make_call(fields, file=path, line=no, fmt=NAME)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=25)
