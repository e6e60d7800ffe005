"""An Anthropic Messages request as SGLang's Messages endpoint converts it (``--server sglang``).

Read in SGLang 0.5.23's ``entrypoints/anthropic/serving.py``
(``_convert_to_chat_completion_request``) and ``protocol.py`` (the request's models), whose
conversion was also run on sample requests. It differs from vLLM's endpoint
(:mod:`treeprep.formats.anthropic`) in these ways:

- **System:** a string that is not blank, and the text blocks with text, each as it is, joined
  with a newline; Claude Code's attribution block is kept. Inline ``system`` messages are
  merged after them (each stripped, its text blocks stripped and joined with a newline) unless
  the template renders one in place (SGLang's probe,
  :func:`~treeprep.render.template_kwargs.sglang_inline_system`:
  ``ReadOptions.merge_inline_system``).
- **A turn of blocks:** each text block is a part, an empty one too; images are ``image_url``
  parts; a search result is text; ``tool_reference`` blocks at the top are left out. A user
  turn's text before a ``tool_result`` is a user message before the ``tool`` messages, its text
  after one a user message after them. A result's content is its text items that are not empty,
  images and search results, each run of ``tool_reference`` items a ``tool`` message of its own
  (all with the result's id); one text is a string, several stay parts (which SGLang joins with
  a space: :mod:`treeprep.render.text_parts`), none is ``""``. An assistant turn with neither
  parts nor calls is ``""``.
- **Refused here:** blocks SGLang's models refuse (``document`` and other types: a 400), a text
  block with no text, ``redacted_thinking`` in an assistant turn (a 400), and an assistant turn's
  thinking: SGLang puts it where its ``--reasoning-parser`` says (wrapped in the parser's think
  tokens before the text, as ``reasoning_content`` for some encoders, or dropped without a
  parser), which no log records.
- **Tools:** the server tools (``web_search_*``, ``computer_*``, ``bash_*``,
  ``text_editor_*``) are left out; a custom tool is a function of its name, its description or
  ``""``, its ``input_schema`` (``"type": "object"`` added where it has no type) and ``strict``
  (false unless set), with its ``defer_loading`` (:func:`tools`). ``tool_choice`` ``none``
  passes no tools, one naming a tool that tool alone.
"""

from __future__ import annotations

from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._anthropic_blocks import BLOCKS, request_turns
from treeprep.formats._fields import chat_tool_call, expect, opt_list, type_name

#: the content blocks SGLang's models take (``AnthropicContentBlock``); others are a 400
_TAKEN = frozenset(
    "text image tool_use tool_result tool_reference search_result thinking redacted_thinking"
    .split()
)  # fmt: skip
#: the server tools' type prefixes (``is_server_tool``)
_SERVER_TOOLS = ("web_search_", "computer_", "bash_", "text_editor_")


def _system_text(content: Any, where: str) -> str | None:
    """An inline system message's text as SGLang merges it (``_extract_system_text``)."""
    content = expect(content, f"{where}.content", str, list, what=BLOCKS)
    if isinstance(content, str):
        return content.strip() or None
    texts = [
        (b.get("text") or "").strip()
        for b in content
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    return "\n".join(t for t in texts if t) or None


def system_message(req: dict[str, Any], system_prompt: str | None, merge: bool) -> list[Any]:
    """The leading system message (none where there is no text): the request's ``system``
    (``system_prompt`` where it has none) and, with ``merge``, its inline system messages."""
    system = req.get("system")
    if system is None:
        system = system_prompt
    parts: list[str] = []
    if isinstance(system, str):
        if system.strip():
            parts.append(system)
    elif system is not None:
        for i, b in enumerate(opt_list(system, "request.system")):
            b = expect(b, f"request.system[{i}]", dict)
            if b.get("type") == "text" and b.get("text"):
                parts.append(expect(b["text"], f"request.system[{i}].text", str))
    if merge:
        for i, m in enumerate(opt_list(req.get("messages"), "request.messages")):
            if isinstance(m, dict) and m.get("role") == "system":
                text = _system_text(m.get("content"), f"request.messages[{i}]")
                if text:
                    parts.append(text)
    return [{"role": "system", "content": "\n".join(parts)}] if parts else []


def _check(b: Any, where: str) -> dict[str, Any]:
    """A content block SGLang's models take (else a RecordError naming the refusal)."""
    b = expect(b, where, dict)
    kind = b.get("type")
    if not isinstance(kind, str) or kind not in _TAKEN:
        shown = repr(kind) if isinstance(kind, str | None) else type_name(kind)
        raise RecordError(f"{where}: a {shown} block, which SGLang's Messages endpoint refuses")
    if kind == "text" and not isinstance(b.get("text"), str):
        raise RecordError(f"{where}.text: expected a string (SGLang's endpoint refuses others)")
    return b


def _image(source: Any) -> dict[str, Any] | None:
    """An image source as an ``image_url`` part
    (``_convert_anthropic_image_source_to_openai_part``)."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        data = source.get("data", "")
        if not data:
            return None
        url = f"data:{source.get('media_type', 'image/png')};base64,{data}"
        return {"type": "image_url", "image_url": {"url": url}}
    if source.get("url"):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    return None


def _search_text(b: dict[str, Any]) -> str:
    """A search result as text (``_text_from_search_result``)."""
    lines = []
    if b.get("title"):
        lines.append(f"Title: {b['title']}")
    source = b.get("source")
    if isinstance(source, dict):
        if text := source.get("url") or source.get("text"):
            lines.append(f"Source: {text}")
    elif source:
        lines.append(f"Source: {source}")
    content = b.get("content")
    items = content if isinstance(content, list) else []
    texts = [content] if isinstance(content, str) else [
        p["text"] for p in items
        if isinstance(p, dict) and p.get("type") == "text" and p.get("text")
    ]  # fmt: skip
    if texts:
        lines.append("Content: " + "\n".join(texts))
    return "\n".join(lines)


def _result_contents(content: Any, where: str) -> list[Any]:
    """A ``tool_result``'s content as the contents of its tool messages
    (``_convert_tool_result_content``)."""
    if not isinstance(expect(content, where, str, list, type(None), what=BLOCKS), list):
        return [content or ""]
    parts: list[dict[str, Any]] = []
    for i, item in enumerate(content):
        item = _check(item, f"{where}[{i}]")
        kind = item["type"]
        if kind == "text" and item["text"]:
            parts.append({"type": "text", "text": item["text"]})
        elif kind == "image" and (image := _image(item.get("source"))) is not None:
            parts.append(image)
        elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
            parts.append({"type": "tool_reference", "name": name})
        elif kind == "search_result" and (text := _search_text(item)):
            parts.append({"type": "text", "text": text})
    groups: list[list[dict[str, Any]]] = []
    for p in parts:
        ref = p["type"] == "tool_reference"
        if not groups or (groups[-1][0]["type"] == "tool_reference") != ref:
            groups.append([])
        groups[-1].append(p)
    out = [g[0]["text"] if len(g) == 1 and g[0]["type"] == "text" else g for g in groups]
    return out or [""]


def _content(parts: list[dict[str, Any]]) -> Any:
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else list(parts)


def turn_messages(m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The messages of one request turn ``m`` (a user, assistant or in-place system turn)."""
    role = m.get("role")
    content = expect(m.get("content"), f"{where}.content", str, list, what=BLOCKS)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = [_check(b, f"{where}.content[{k}]") for k, b in enumerate(content)]
    if role == "assistant":
        if any(b["type"] == "redacted_thinking" for b in blocks):
            raise RecordError(f"{where}: redacted_thinking, which SGLang's endpoint refuses")
        if any(b["type"] == "thinking" and b.get("thinking") for b in blocks):
            raise RecordError(
                f"{where}: earlier thinking, which SGLang's endpoint writes where its "
                "--reasoning-parser says (wrapped in the parser's think tokens, as "
                "reasoning_content, or dropped), and no log records which"
            )
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for k, b in enumerate(blocks):
        kind, at = b["type"], f"{where}.content[{k}]"
        if kind == "text":
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image" and b.get("source") and (image := _image(b["source"])):
            parts.append(image)
        elif kind == "search_result" and (text := _search_text(b)):
            parts.append({"type": "text", "text": text})
        elif kind == "tool_use" and role != "user":  # a user turn's calls are dropped
            calls.append(chat_tool_call(b.get("id"), b.get("name") or "", b.get("input") or {}))
        elif kind == "tool_result" and role == "user":
            if parts:  # the text before the result goes before it
                out.append({"role": "user", "content": _content(parts)})
                parts = []
            tid = b.get("tool_use_id") or b.get("id") or ""
            for c in _result_contents(b.get("content"), f"{at}.content"):
                out.append({"role": "tool", "tool_call_id": tid, "content": c})
        elif kind == "tool_result":
            text = "\n".join(_result_text(b.get("content")))
            parts.append({"type": "text", "text": f"Tool result: {text}"})
    msg: dict[str, Any] = {"role": role}
    if calls:
        msg["tool_calls"] = calls
    if parts or calls or role != "user":  # a user turn of results alone makes no message
        out.append({**msg, "content": _content(parts) if parts else ""})
    return out


def _result_text(content: Any) -> list[str]:
    """A result's texts, as an assistant or system turn writes it (``tool_text``)."""
    if not isinstance(content, list):
        return [str(content) if content else ""]
    return [x["text"] for x in content if isinstance(x, dict) and x.get("type") == "text"
            and x.get("text")]  # fmt: skip


def tools(req: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tools as SGLang's endpoint hands them on (server tools left out), then
    filtered by its ``tool_choice`` (``none``: no tools, ``[]``; a named tool: that one alone;
    None: the request declares none)."""
    listed = req.get("tools")
    if not listed:
        return None
    out = []
    for i, t in enumerate(opt_list(listed, "request.tools")):
        t = expect(t, f"request.tools[{i}]", dict)
        kind = t.get("type")
        if isinstance(kind, str) and kind.startswith(_SERVER_TOOLS):
            continue
        if kind not in (None, "custom"):
            raise RecordError(f"request.tools[{i}]: a tool of type {kind!r}, which SGLang refuses")
        schema = expect(t.get("input_schema"), f"request.tools[{i}].input_schema", dict)
        if "type" not in schema:
            schema = {**schema, "type": "object"}
        fn = {"name": t.get("name"), "description": t.get("description") or "",
              "parameters": schema, "strict": bool(t.get("strict") or False)}  # fmt: skip
        out.append({"type": "function", "function": fn, "defer_loading": t.get("defer_loading")})
    choice = req.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "none":
        return []  # none on purpose: not the tools --tools supplies for logs without any
    if isinstance(choice, dict) and choice.get("type") == "tool":
        out = [t for t in out if t["function"]["name"] == choice.get("name")]
        if not out:
            raise RecordError(
                f"request.tool_choice: tool {choice.get('name')!r} is not among the request's "
                "own tools, which SGLang refuses"
            )
    return out or None


def request_messages(
    req: dict[str, Any], system_prompt: str | None, merge: bool
) -> list[dict[str, Any]]:
    """The chat messages SGLang's endpoint makes of the request ``req`` (``merge``: it merges
    inline system messages into the leading one)."""
    out = system_message(req, system_prompt, merge)
    for where, role, m in request_turns(req):
        if role == "system" and merge:
            continue
        out.extend(turn_messages(m, where))
    if out and out[-1]["role"] == "assistant":
        raise RecordError(
            "request.messages: the request ends with an assistant turn, which SGLang's endpoint "
            "turns into a user message where the template takes strings: not rebuilt"
        )
    return out
