"""The tool schemas a server hands the chat template: its own models' dump of the request's
tools, not the request's dicts (``--server``; SGLang's by ``--sglang-version``).

Every server validates the request's ``tools`` into its models and renders the template with
what those models write back. A template that writes a tool with ``tojson`` (Qwen2.5's,
Qwen3's, Llama 3's...) therefore prints the models' fields in the models' order, nulls
included, and no key the models do not know:

- **vLLM** (0.34: ``FunctionDefinition``, ``ChatCompletionToolsParam``,
  ``renderers/online_renderer.py``'s ``tool.model_dump()``): ``{"type": "function",
  "function": {"name", "description", "parameters"}}``, ``description`` and ``parameters`` null
  where the request has none, ``strict`` and ``defer_loading`` after them where set (a tool's
  ``defer_loading`` is handed down to its function, and kept on the tool too); other keys are
  left out.
- **llama.cpp** (``common/chat.cpp``: ``common_chat_tools_parse_oaicompat`` then
  ``common_chat_tools_to_json_oaicompat``): ``{"type": "function", "function": {"name",
  "description", "parameters"}}``, ``description`` ``""`` and ``parameters`` ``{}`` where the
  request has none, nothing else.
- **SGLang** (``entrypoints/openai/protocol.py``: ``Function``, ``Tool``; ``serving_chat.py``,
  read in the wheels 0.5.5 to 0.5.23):

  - up to 0.5.8 each tool's function alone: ``{"description", "name", "parameters", "strict"}``
    in that order, ``description`` and ``parameters`` null where the request has none,
    ``strict`` false unless set;
  - 0.5.9 and 0.5.10 the whole tool: ``{"type", "function": {...as above}}``;
  - 0.5.11 to 0.5.22 the tool also carries ``defer_loading`` (null where unset), and its
    function carries it where the tool or the function sets it;
  - 0.5.23 the function's keys in the request's order, then those it lacked (``description``
    and ``parameters`` null), ``strict`` and ``defer_loading`` only where set; the tool's
    ``defer_loading`` as before.

  SGLang also writes each call of a message's ``tool_calls`` with ``"index": null``
  (``ToolCall``, every version read): :func:`tool_call`.

A ``tool_choice`` naming one function passes that tool alone on SGLang, and ``none`` none; the
logs read here keep the tools the request declared, which is what ``auto`` passes.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from treeprep.errors import RenderError, TreeprepError
from treeprep.modes import Server

__all__ = ["SGLANG_NEWEST", "Version", "parse_sglang_version", "template_tools", "tool_call"]

#: the newest SGLang read (the default of ``--sglang-version``)
SGLANG_NEWEST = (0, 5, 23)
#: the first SGLang versions of each change (see the module docstring)
_WHOLE_TOOL = (0, 5, 9)
_DEFER_LOADING = (0, 5, 11)
_REQUEST_ORDER = (0, 5, 23)

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_BOOL = TypeAdapter(bool)

Version = tuple[int, int, int]


def parse_sglang_version(text: str) -> Version:
    """``"0.5.23"`` as ``(0, 5, 23)``; anything else is a :class:`TreeprepError`.

    >>> parse_sglang_version("0.5.9")
    (0, 5, 9)
    """
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise TreeprepError(f"--sglang-version: expected a version such as 0.5.23, got {text!r}")
    return int(m[1]), int(m[2]), int(m[3])


def template_tools(
    tools: list[dict[str, Any]] | None, server: Server, sglang: Version = SGLANG_NEWEST
) -> list[dict[str, Any]] | None:
    """``tools`` (the request's) as ``server`` hands them to the template (``sglang``: the
    SGLang version). A value the server's models refuse is a :class:`RenderError`.

    >>> t = {"function": {"parameters": {}, "name": "ls"}, "type": "function", "x": 1}
    >>> template_tools([t], Server.vllm)
    [{'type': 'function', 'function': {'name': 'ls', 'description': None, 'parameters': {}}}]
    >>> template_tools([t], Server.sglang, (0, 5, 8))
    [{'description': None, 'name': 'ls', 'parameters': {}, 'strict': False}]
    """
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        given = t.get("function")
        fn: dict[str, Any] = given if isinstance(given, dict) else {}
        where = f"tools[{i}]"
        if server is Server.llama_cpp:
            out.append(_llama_cpp(fn))
        elif server is Server.vllm:
            out.append(_vllm(t, fn, where))
        else:
            out.append(_sglang(t, fn, sglang, where))
    return out


def _flag(value: Any, where: str) -> bool | None:
    """An optional boolean as pydantic reads it (``"true"``, ``1``...), None where null."""
    if value is None:
        return None
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        raise RenderError(f"{where}: expected a boolean, got {value!r}") from None


def _flags(
    t: dict[str, Any], fn: dict[str, Any], where: str
) -> tuple[bool | None, bool | None, bool | None]:
    """The tool's ``defer_loading``, its function's, and the function's ``strict``, read."""
    return (
        _flag(t.get("defer_loading"), f"{where}.defer_loading"),
        _flag(fn.get("defer_loading"), f"{where}.function.defer_loading"),
        _flag(fn.get("strict"), f"{where}.function.strict"),
    )


def _vllm(t: dict[str, Any], fn: dict[str, Any], where: str) -> dict[str, Any]:
    function = {
        "name": fn.get("name"),
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    tool_defer, defer, strict = _flags(t, fn, where)
    defer = tool_defer if defer is None else defer
    if strict is not None:
        function["strict"] = strict
    if defer is not None:
        function["defer_loading"] = defer
    tool: dict[str, Any] = {"type": "function", "function": function}
    if tool_defer is not None:
        tool["defer_loading"] = tool_defer
    return tool


def _llama_cpp(fn: dict[str, Any]) -> dict[str, Any]:
    function = {
        "name": fn.get("name"),
        "description": fn.get("description", ""),
        "parameters": fn.get("parameters", {}),
    }
    return {"type": "function", "function": function}


def _sglang(t: dict[str, Any], fn: dict[str, Any], version: Version, where: str) -> dict[str, Any]:
    tool_defer, defer, strict = _flags(t, fn, where)
    if defer is None and version >= _DEFER_LOADING:
        defer = tool_defer
    fields: dict[str, Any] = {
        "description": fn.get("description"),
        "name": fn.get("name"),
        "parameters": fn.get("parameters"),
    }
    if version < _REQUEST_ORDER:
        fields["strict"] = bool(strict)
        if defer is not None and version >= _DEFER_LOADING:
            fields["defer_loading"] = defer
        function = fields
    else:
        # None-valued strict and defer_loading are left out; the request's keys come first
        fields |= {k: v for k, v in (("strict", strict), ("defer_loading", defer)) if v is not None}
        order = [k for k in fn if k in fields]
        function = {k: fields[k] for k in order + [k for k in fields if k not in order]}
    if version < _WHOLE_TOOL:
        return function
    tool: dict[str, Any] = {"type": t.get("type", "function"), "function": function}
    if version >= _DEFER_LOADING:
        tool["defer_loading"] = tool_defer
    return tool


def tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A message's tool call (``{"id"?, "type", "function"}``) as SGLang's ``ToolCall`` dumps
    it: its id (null where it has none), then ``index`` null.

    >>> tool_call({"type": "function", "function": {"name": "ls", "arguments": {}}})
    {'id': None, 'index': None, 'type': 'function', 'function': {'name': 'ls', 'arguments': {}}}
    """
    return {"id": call.get("id"), "index": None, "type": "function", "function": call["function"]}
