"""The Qwen ChatML ports (Qwen3 with hybrid thinking, Qwen3-Instruct-2507, Qwen2.5) and the
pieces they share with the built-in ChatML port (:mod:`treeprep.render.native` holds the contract,
the registry and the verification).

Extending a rendered prefix
---------------------------
An agent session's call k sends its whole history again, and rendering every call whole makes a
build quadratic in the session's length. Each port here is a system block (``messages[0]`` and the
tools) followed by one piece per message, and a piece depends on its own message and a context:

- a tool result on whether the message before it is one (it opens the shared ``user`` turn) and
  whether it is the last message or the next is not a tool result (it closes the turn);
- a Qwen3 assistant turn on whether it is after the last real user query (``last_query``: then it
  keeps its reasoning) and whether it is the last message (then it always has a ``<think>`` block).

So the render of ``messages`` is the render of ``messages[:k]`` with the pieces of ``messages[s:k]``
cut off its end and the pieces of ``messages[s:]`` appended, where ``s`` is the first message whose
context changed: ``k - 1`` (it is no longer last, and the next message's role is now known), or,
for Qwen3 when the appended messages hold a new real user query, the first message after the old
``last_query`` (those turns lose their reasoning). The cut pieces are rendered again in their old
context (those few messages cost twice) and the kept text must end with them, else the whole
conversation is rendered: an extension is exactly the whole render or is not used. The system
block reads only ``messages[0]``, which a non-empty prefix keeps, and the tools, which
:class:`~treeprep.render.history.RenderedPrefixes` compares exactly. What can still cost in
proportion to the whole history on a call is done in C: the search for a query (roles read lazily,
from the start for the first one, from the end for the last) and copying the kept text.

A call need not go on from the whole kept conversation: Aider sends the chat's files after the
history, SWE-agent elides an old output in each call. When ``messages`` shares only the first
``j`` messages of the kept one, the kept pieces from ``s`` on are cut the same way, with
``s = j - 1`` (the last shared message's next one changed), or for Qwen3 when the two
conversations' last queries differ, the first message after the earlier one. A call then costs
what it changed, not its whole history.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from itertools import islice
from operator import indexOf, itemgetter
from typing import Any

from treeprep.io.jsonparse import json_key


def _tojson(x: Any) -> str:
    # transformers' tojson filter with its defaults
    return json.dumps(x, ensure_ascii=False)


_TOOL_JSON: dict[bytes, str] = {}
_TOOL_JSON_MAX = 1024


def _tool_json(tool: Any) -> str:
    """``_tojson(tool)``, memoized: every call of a session lists the same tool schemas (and its
    history the same tool-call arguments), and
    ``json.dumps`` costs ten times what ``orjson.dumps`` does. The key is orjson's serialization,
    which tells apart any two values that ``json.dumps`` serializes differently, except that it
    writes NaN and infinities as ``null`` (a key containing ``null`` is not memoized) and that it
    knows types ``json.dumps`` refuses (subclasses, datetimes and dataclasses are passed through to
    a refusal here; a ``uuid.UUID`` or an ``enum.Enum`` value would still be keyed as its value:
    JSON-parsed tools hold neither). Values orjson refuses (non-string keys, integers over 64 bits)
    are not memoized either."""
    key = json_key(tool)
    if key is None:
        return _tojson(tool)
    text = _TOOL_JSON.get(key)
    if text is None:
        text = _tojson(tool)
        if b"null" not in key:
            if len(_TOOL_JSON) >= _TOOL_JSON_MAX:
                _TOOL_JSON.clear()
            _TOOL_JSON[key] = text
    return text


def _reasoning(m: dict[str, Any]) -> Any:
    """``reasoning_content`` as transformers' ``_alias_reasoning_fields`` sets it (None: unset)."""
    r = m.get("reasoning_content")
    if r is None:
        r = m.get("thinking")
        if r is None:
            r = m.get("reasoning")
    return r


# --------------------------------------------------------------------------------------------------
# Qwen (Qwen2.5, Qwen3, Qwen3-Instruct-2507): shared pieces
# --------------------------------------------------------------------------------------------------

_QWEN_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
_QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


_GENERATION_PROMPT = "<|im_start|>assistant\n"


def _turn(out: list[str], role: str, content: str) -> None:
    """One plain ChatML turn: ``<|im_start|>role\ncontent<|im_end|>\n``."""
    out.append("<|im_start|>")
    out.append(role)
    out.append("\n")
    out.append(content)
    out.append("<|im_end|>\n")


def _finish(out: list[str], add_generation_prompt: bool) -> str:
    """The rendered text, with the assistant header appended when a generation prompt is asked."""
    if add_generation_prompt:
        out.append(_GENERATION_PROMPT)
    return "".join(out)


def _system_block(
    out: list[str],
    messages: list[dict[str, Any]],
    tools: Any,
    *,
    head: str = _QWEN_TOOLS_HEAD,
    tail: str = _QWEN_TOOLS_TAIL,
    default_system: str | None = None,
) -> None:
    """The ChatML system block these templates share: the system message (or the template's
    default one) and, when tools are given, ``head``, one JSON line per tool and ``tail``."""
    ap = out.append
    first = messages[0]
    system = first["content"] if first["role"] == "system" else default_system
    if tools:
        ap("<|im_start|>system\n")
        if system is not None:
            ap(system)
            ap("\n\n")
        ap(head)
        for tool in tools:
            ap("\n")
            ap(_tool_json(tool))
        ap(tail)
    elif system is not None:
        ap("<|im_start|>system\n")
        ap(system)
        ap("<|im_end|>\n")


def _qwen3_tool_calls(
    out: list[str], tool_calls: list[dict[str, Any]], content: str, *, if_defined: bool = False
) -> None:
    """``<tool_call>`` blocks as the Qwen3 templates write them (string arguments verbatim).

    A call's ``function`` replaces it when truthy (``{%- if tool_call.function %}``), or with
    ``if_defined`` when present at all (the built-in template's ``is defined``)."""
    ap = out.append
    for j, tc in enumerate(tool_calls):
        if j or content:
            ap("\n")
        if if_defined:
            if "function" in tc:
                tc = tc["function"]
        else:
            fn = tc.get("function")
            if fn:
                tc = fn
        ap('<tool_call>\n{"name": "')
        ap(tc["name"])
        ap('", "arguments": ')
        args = tc["arguments"]
        ap(args if isinstance(args, str) else _tool_json(args))
        ap("}\n</tool_call>")


def _end_assistant(
    out: list[str], m: dict[str, Any], content: str, *, if_defined: bool = False
) -> None:
    """The end of an assistant turn: its tool calls (:func:`_qwen3_tool_calls`), then
    ``<|im_end|>``."""
    tool_calls = m.get("tool_calls")
    if tool_calls:
        _qwen3_tool_calls(out, tool_calls, content, if_defined=if_defined)
    out.append("<|im_end|>\n")


def _tool_message(
    out: list[str], messages: list[dict[str, Any]], i: int, n: int, content: str
) -> None:
    """A tool result: consecutive results share one ``user`` turn (Qwen templates)."""
    ap = out.append
    if i == 0 or messages[i - 1]["role"] != "tool":
        ap("<|im_start|>user")
    ap("\n<tool_response>\n")
    ap(content)
    ap("\n</tool_response>")
    if i == n - 1 or messages[i + 1]["role"] != "tool":
        ap("<|im_end|>\n")


# --------------------------------------------------------------------------------------------------
# Extending a rendered prefix (see the module docstring)
# --------------------------------------------------------------------------------------------------

#: ``turns(out, messages, start, stop, *context)``: the pieces of ``messages[start:stop]``
TurnsFn = Callable[..., None]


def _extend(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    cut: int,
    turns: TurnsFn,
    old_context: tuple[Any, ...],
    new_context: tuple[Any, ...],
    whole: Callable[[], str],
) -> str:
    """The render of ``messages`` from ``text``, the render of ``old``, whose pieces before
    ``cut`` are those of ``messages``: the pieces of ``old[cut:]`` in their ``old_context`` cut
    off its end, the pieces of ``messages[cut:]`` in the ``new_context`` appended; ``whole()`` if
    ``text`` does not end with those old pieces."""
    out: list[str] = []
    turns(out, old, cut, len(old), *old_context)
    tail = "".join(out)
    if not text.endswith(tail):
        return whole()
    out = [text[: len(text) - len(tail)]]
    turns(out, messages, cut, len(messages), *new_context)
    return "".join(out)


# --------------------------------------------------------------------------------------------------
# Qwen3 (hybrid thinking)
# --------------------------------------------------------------------------------------------------

_role = itemgetter("role")


def _real_query(m: dict[str, Any]) -> bool:
    """Whether a user message is a real query (not a tool response wrapped in a user turn)."""
    c = m["content"]
    return not (c.startswith("<tool_response>") and c.endswith("</tool_response>"))


def _last_query(messages: list[dict[str, Any]], start: int, stop: int) -> int:
    """The index of the last real user query in ``messages[start:stop]``, or -1; the roles are
    read from the end, lazily and in C (a session's last query can be thousands of turns back)."""
    n = len(messages)
    roles = map(_role, islice(reversed(messages), n - stop, n - start))
    i = stop
    while True:
        try:
            i -= indexOf(roles, "user") + 1
        except ValueError:
            return -1
        if _real_query(messages[i]):
            return i


def _first_query(messages: list[dict[str, Any]], stop: int) -> int:
    """The index of the first real user query in ``messages[:stop]``, or -1 (as
    :func:`_last_query`, from the start)."""
    roles = map(_role, islice(messages, stop))
    i = -1
    while True:
        try:
            i += indexOf(roles, "user") + 1
        except ValueError:
            return -1
        if _real_query(messages[i]):
            return i


def render_qwen3(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    """The Qwen3 template (``tokenizers/qwen3``): reasoning kept only after the last real user
    query, the last assistant turn always with a ``<think>`` block, ``enable_thinking`` unset."""
    out: list[str] = []
    n = len(messages)
    _system_block(out, messages, tools)
    last_query = _last_query(messages, 0, n)
    _qwen3_turns(out, messages, 0, n, n - 1, n - 1 if last_query < 0 else last_query)
    return _finish(out, add_generation_prompt)


def extend_qwen3(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    shared: int,
    tools: list[dict[str, Any]] | None,
) -> str:
    """``render_qwen3(messages, tools, False)`` from ``text``, the render of ``old`` with the same
    tools, whose first ``shared >= 1`` messages are those of ``messages``.

    When ``old`` is all shared (``messages`` goes on from it), the pieces from ``shared - 1`` on
    are rendered again, or from the message after the old last query when the appended messages
    hold a new one (the turns in between lose their reasoning). When ``messages`` leaves ``old``
    (or is shorter), the pieces from ``shared - 1`` on are, or from the one after the earlier of
    the two last queries when they differ (the turns between them keep their reasoning in one
    and not in the other)."""
    n, k = len(messages), len(old)
    whole = partial(render_qwen3, messages, tools, False)
    if shared < k:
        a, b = _last_query_or_last(old), _last_query_or_last(messages)
        cut = shared - 1 if a == b else min(shared - 1, min(a, b) + 1)
        return _extend(text, old, messages, cut, _qwen3_turns, (k - 1, a), (n - 1, b), whole)
    new = _last_query(messages, k, n)
    if new < 0:
        # the last query did not move: only the last kept piece is rendered again, and as it is
        # the last query or after it, any query before ``k`` (the first costs least) stands for
        # the last one in both contexts; none: none in either
        first = _first_query(messages, k)
        cut = k - 1
        was, new = (k - 1, n - 1) if first < 0 else (first, first)
    else:
        found = _last_query(messages, 0, k)
        was = k - 1 if found < 0 else found
        cut = min(k - 1, was + 1)
    return _extend(text, old, messages, cut, _qwen3_turns, (k - 1, was), (n - 1, new), whole)


def _last_query_or_last(messages: list[dict[str, Any]]) -> int:
    """The ``last_query`` the Qwen3 template renders ``messages`` with: the index of the last real
    user query, or of the last message when there is none."""
    n = len(messages)
    found = _last_query(messages, 0, n)
    return n - 1 if found < 0 else found


def _qwen3_turns(
    out: list[str],
    messages: list[dict[str, Any]],
    start: int,
    stop: int,
    last: int,
    last_query: int,
) -> None:
    """The pieces of ``messages[start:stop]`` in a conversation whose last message is ``last``."""
    ap = out.append
    for i in range(start, stop):
        m = messages[i]
        role = m["role"]
        if role == "tool":  # inlined _tool_message (the most frequent turn in agent logs)
            if i == 0 or messages[i - 1]["role"] != "tool":
                ap("<|im_start|>user")
            ap("\n<tool_response>\n")
            ap(m["content"])
            ap("\n</tool_response>")
            if i == last or messages[i + 1]["role"] != "tool":
                ap("<|im_end|>\n")
        elif role == "assistant":
            content = m["content"]
            reasoning = m.get("reasoning_content")
            if reasoning is None and ("thinking" in m or "reasoning" in m):
                reasoning = _reasoning(m)  # the other names transformers aliases
            if reasoning is None:
                reasoning = ""
                if "</think>" in content:
                    halves = content.split("</think>")
                    content = halves[-1].lstrip("\n")
                    reasoning = halves[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            if i > last_query and (i == last or reasoning):
                ap("<|im_start|>assistant\n<think>\n")
                ap(reasoning.strip("\n"))
                ap("\n</think>\n\n")
                ap(content.lstrip("\n"))
            else:
                ap("<|im_start|>assistant\n")
                ap(content)
            _end_assistant(out, m, content)
        elif role == "user" or (role == "system" and i):
            _turn(out, role, m["content"])


# --------------------------------------------------------------------------------------------------
# Qwen3-Instruct-2507 (no thinking) and Qwen2.5: only a tool result depends on its neighbours
# --------------------------------------------------------------------------------------------------


def render_qwen3_instruct_2507(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    """The Qwen3-4B-Instruct-2507 template (OpenHands' copy): Qwen3's layout without reasoning;
    a non-string ``content`` renders as ``""`` in the turns (not in the system header)."""
    out: list[str] = []
    _system_block(out, messages, tools)
    _qwen3_instruct_2507_turns(out, messages, 0, len(messages), len(messages))
    return _finish(out, add_generation_prompt)


def extend_qwen3_instruct_2507(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    shared: int,
    tools: list[dict[str, Any]] | None,
) -> str:
    """``render_qwen3_instruct_2507(messages, tools, False)`` from ``text``, the render of ``old``
    with the same tools, whose first ``shared >= 1`` messages are those of ``messages``
    (:func:`_extend_last`)."""
    whole = partial(render_qwen3_instruct_2507, messages, tools, False)
    return _extend_last(text, old, messages, shared, _qwen3_instruct_2507_turns, whole)


def _extend_last(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    shared: int,
    turns: TurnsFn,
    whole: Callable[[], str],
) -> str:
    """:func:`_extend` for ports whose pieces depend only on the conversation's length (no last
    query): the pieces from ``shared - 1`` on are rendered again (a tool result closes its turn
    only before a non-tool message)."""
    n = len(messages)
    return _extend(text, old, messages, shared - 1, turns, (len(old),), (n,), whole)


def _qwen3_instruct_2507_turns(
    out: list[str], messages: list[dict[str, Any]], start: int, stop: int, n: int
) -> None:
    """The pieces of ``messages[start:stop]`` in a conversation of ``n`` messages."""
    ap = out.append
    for i in range(start, stop):
        m = messages[i]
        content = m.get("content")
        if not isinstance(content, str):
            content = ""
        role = m["role"]
        if role == "user" or (role == "system" and i):
            _turn(out, role, content)
        elif role == "assistant":
            ap("<|im_start|>assistant\n")
            ap(content)
            _end_assistant(out, m, content)
        elif role == "tool":
            _tool_message(out, messages, i, n, content)


def render_qwen2_5(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    """The Qwen2.5 template (``tokenizers/qwen2_5``): a default system prompt, tool-call arguments
    always through ``tojson`` (a string argument becomes a JSON string), no reasoning."""
    out: list[str] = []
    _system_block(out, messages, tools, default_system=_QWEN25_DEFAULT_SYSTEM)
    _qwen2_5_turns(out, messages, 0, len(messages), len(messages))
    return _finish(out, add_generation_prompt)


def extend_qwen2_5(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    shared: int,
    tools: list[dict[str, Any]] | None,
) -> str:
    """``render_qwen2_5(messages, tools, False)`` from ``text``, the render of ``old`` with the
    same tools, whose first ``shared >= 1`` messages are those of ``messages``
    (:func:`_extend_last`)."""
    whole = partial(render_qwen2_5, messages, tools, False)
    return _extend_last(text, old, messages, shared, _qwen2_5_turns, whole)


def _qwen2_5_turns(
    out: list[str], messages: list[dict[str, Any]], start: int, stop: int, n: int
) -> None:
    """The pieces of ``messages[start:stop]`` in a conversation of ``n`` messages."""
    ap = out.append
    for i in range(start, stop):
        m = messages[i]
        role = m["role"]
        if (
            role == "user"
            or (role == "system" and i)
            or (role == "assistant" and not m.get("tool_calls"))
        ):
            _turn(out, role, m["content"])
        elif role == "assistant":
            ap("<|im_start|>assistant")
            content = m["content"]
            if content:
                ap("\n")
                ap(content)
            for tc in m["tool_calls"]:
                if "function" in tc:
                    tc = tc["function"]
                ap('\n<tool_call>\n{"name": "')
                ap(tc["name"])
                ap('", "arguments": ')
                ap(_tool_json(tc["arguments"]))
                ap("}\n</tool_call>")
            ap("<|im_end|>\n")
        elif role == "tool":
            _tool_message(out, messages, i, n, m["content"])
