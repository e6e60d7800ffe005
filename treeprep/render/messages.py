"""Messages as the chat template sees them: a record's :class:`~treeprep.schemas.Message` made the
plain dict ``apply_chat_template`` takes.

The one decision: nothing is invented or fixed. A prompt message's text parts become what the
inference server made of them (joined, or a list for a template that loops over parts:
:mod:`treeprep.render.text_parts`, ``--server``), ``content: null`` becomes ``""``, unset fields
are dropped; the two rewrites are a completion's inline ``<think>`` block (formats without
a reasoning field) moved to ``reasoning_content``, the split Qwen3's template makes itself
(:func:`split_inline_think`), which the renderer makes only where the template does not show
the completion as the model wrote it, and tool-call arguments logged as a string that holds a
JSON object given to the template as that object (:func:`tool_arguments`). A prompt's earlier
reply keeps its block in the content, as the server hands it to the template (Qwen3's template
splits it itself; Qwen2.5's prints it).

Why the arguments: OpenAI-style logs keep a call's arguments as a JSON string, while the
Hugging Face chat-template convention (transformers' docs: ``arguments`` is a dict) and the
templates written for it expect the object. gpt-oss's template writes ``arguments|tojson``, so a
string renders as a quoted string literal, ``"{\"cmd\": ...}"``, which gpt-oss never emits; its
response parser reads that back as a string, not as the call's arguments
(:mod:`treeprep.render.response` checks every trained call that way). A string that is not exactly
one JSON object (a list, plain text, a duplicated key, ``NaN``) stays the string: the template
shows what the log holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from treeprep.errors import RenderError
from treeprep.modes import Server
from treeprep.render.llama_caps import LlamaCaps, merge_system
from treeprep.render.server_tools import tool_call
from treeprep.render.text_parts import TextParts
from treeprep.schemas import ChatCall, Message
from treeprep.schemas.records import ArgumentsJson

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def normalize_message(
    m: Message,
    where: str = "message",
    parts: TextParts | None = None,
    *,
    raw_arguments: bool = False,
    wire: ArgumentsJson | None = None,
    call_index: bool = False,
    llama: LlamaCaps | None = None,
) -> dict[str, Any]:
    """A message as the chat template sees it.

    Text parts are the content the server's rule ``parts`` makes of them (a prompt's message:
    joined, or the list of text parts; :mod:`treeprep.render.text_parts`), or joined with nothing
    between them when ``parts`` is None (a completion: one reply, as the model streamed it); one
    part is its text. ``None`` content becomes ``""``,
    tool-call arguments are an object when logged as one or as a string holding one
    (:func:`tool_arguments`), else the logged string (with ``raw_arguments``, the request's
    string: as logged, or an object as the request wrote it, ``wire``, :func:`wire_arguments`;
    a Harmony render writes it, :mod:`treeprep.render.harmony`),
    ``reasoning_content``, ``tool_call_id`` and ``name`` pass through when set. With
    ``call_index`` a tool call is written as SGLang's model writes it
    (:func:`~treeprep.render.server_tools.tool_call`: its id, then ``index`` null). With
    ``llama`` (llama.cpp's findings for the template, :mod:`~treeprep.render.llama_caps`) the
    arguments are what llama.cpp hands it (:func:`llama_cpp_arguments`), empty
    ``reasoning_content``, ``tool_call_id``, ``name`` and call ids are left out, for gpt-oss
    a prompt's turn of reasoning and tool calls has no ``content``, and for StepFun's template
    a prompt's texts and reasoning are trimmed (``trim_all_content``). A non-text
    part (an image) cannot be rendered by a text-only template: :class:`RenderError`.
    """
    trim = _trim if llama is not None and llama.trims and parts is not None else _same
    content: str | list[dict[str, str]]
    if m.content is None:
        content = ""
    elif isinstance(m.content, str):
        content = trim(m.content)
    else:
        texts = []
        for j, p in enumerate(m.content):
            if p.type not in TEXT_PART_TYPES:
                raise RenderError(
                    f"{where} content part {j} has type {p.type!r}; only text parts can be rendered"
                )
            texts.append(trim(p.text or ""))
        if parts is None or len(texts) < 2:
            content = "".join(texts)
        elif m.role == "tool" and parts.tool_sep is not None:
            content = parts.tool_sep.join(texts)
        else:
            content = parts.content(texts)
    d: dict[str, Any] = {"role": m.role, "content": content}
    unset = (None, "") if llama is not None else (None,)  # llama.cpp leaves out empty fields
    if m.tool_calls:
        calls = _tool_calls(m, where, raw_arguments, wire, llama, unset)
        d["tool_calls"] = [tool_call(c) for c in calls] if call_index else calls
    if m.tool_call_id not in unset:
        d["tool_call_id"] = m.tool_call_id
    if m.name not in unset:
        d["name"] = m.name
    reasoning = trim(m.reasoning_content) if m.reasoning_content is not None else None
    if reasoning not in unset:
        d["reasoning_content"] = reasoning
        if llama is not None and llama.gpt_oss and m.tool_calls and parts is not None:
            # llama.cpp's gpt-oss handler sends the reasoning and calls of a prompt's turn, no
            # text (a completion keeps what the model said: the template refuses all three)
            del d["content"]
    return d


#: what C's ``isspace`` takes for whitespace (llama.cpp's ``trim_whitespace``)
_C_SPACE = " \t\n\v\f\r"


def _trim(text: str) -> str:
    return text.strip(_C_SPACE)


def _same(text: str) -> str:
    return text


def _tool_calls(
    m: Message,
    where: str,
    raw_arguments: bool,
    wire: ArgumentsJson | None,
    llama: LlamaCaps | None,
    unset: tuple[str | None, ...],
) -> list[dict[str, Any]]:
    """A message's tool calls as the template sees them (:func:`normalize_message`)."""
    calls = []
    for j, tc in enumerate(m.tool_calls or []):
        args = tc.function.arguments
        if raw_arguments:
            args = wire_arguments(args, wire)
        elif llama is not None:
            args = llama_cpp_arguments(args, llama, wire, f"{where} tool call {j}")
        else:
            args = tool_arguments(args)
        calls.append({
            **({"id": tc.id} if tc.id not in unset else {}),
            "type": tc.type,
            "function": {"name": tc.function.name, "arguments": args},
        })  # fmt: skip
    return calls


def wire_arguments(args: Any, wire: ArgumentsJson | None) -> str:
    """A call's arguments as the request's string held them: a string as logged; an object as
    the request wrote it (:attr:`~treeprep.schemas.ChatCall.arguments_json`): ``python``'s
    ``json.dumps``, ``javascript``'s ``JSON.stringify``, or (None) as a template's ``tojson``.

    >>> args = {"path": "é", "n": [1, 2]}
    >>> wire_arguments(args, "python"), wire_arguments(args, "javascript")
    ('{"path": "\\\\u00e9", "n": [1, 2]}', '{"path":"é","n":[1,2]}')
    >>> wire_arguments(args, None), wire_arguments('{"a":1}', "python")
    ('{"path": "é", "n": [1, 2]}', '{"a":1}')
    """
    if isinstance(args, str):
        return args
    value = args if args is not None else {}
    if wire == "python":
        return json.dumps(value)
    if wire == "javascript":
        return json.dumps(_as_javascript(value), ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def llama_cpp_arguments(args: Any, caps: LlamaCaps, wire: ArgumentsJson | None, where: str) -> Any:
    """A call's arguments as llama.cpp hands them to a template (:mod:`.llama_caps`): parsed
    from the request's JSON string where the template reads object arguments (a string that is
    not JSON: llama.cpp fails the request, :class:`RenderError`), else the request's string (an
    object as the request wrote it, ``wire``, or compact as nlohmann's ``dump()`` writes it).

    >>> objects, strings = LlamaCaps(object_arguments=True), LlamaCaps(object_arguments=False)
    >>> [llama_cpp_arguments(a, objects, None, "c") for a in ('{"a": [1]}', "[2]")]
    [{'a': [1]}, [2]]
    >>> llama_cpp_arguments({"p": "é", "n": 1.0}, strings, None, "c")
    '{"p":"é","n":1.0}'
    """
    if not caps.object_arguments:
        if isinstance(args, str) or wire is not None:
            return wire_arguments(args, wire)
        value = args if args is not None else {}
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise RenderError(
            f"{where} has arguments that are not JSON ({args[:60]!r}); llama.cpp parses them for "
            "this chat template, which reads object arguments, and fails such a request"
        ) from None


def _as_javascript(value: Any) -> Any:
    """``value`` as ``JSON.stringify`` orders and writes it: an object's integer-like keys first,
    in numeric order (JavaScript's property order), the rest as given; an integral number
    without a fraction (JavaScript has one number type).

    >>> _as_javascript({"b": 1.0, "2": [0.5], "1": {"x": 2.0}})
    {'1': {'x': 2}, '2': [0.5], 'b': 1}
    """
    if isinstance(value, dict):
        index = sorted((k for k in value if _is_index(k)), key=int)
        rest = [k for k in value if not _is_index(k)]
        return {k: _as_javascript(value[k]) for k in [*index, *rest]}
    if isinstance(value, list):
        return [_as_javascript(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def _is_index(key: str) -> bool:
    """Whether ``key`` is an array index to JavaScript (``"0"``, ``"12"``; not ``"01"``)."""
    return (
        key.isascii() and key.isdigit() and (key == "0" or key[0] != "0") and int(key) < 2**32 - 1
    )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("a duplicated key")
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def tool_arguments(args: str | dict[str, Any]) -> str | dict[str, Any]:
    """A tool call's arguments as the chat template should see them: the object a string holds
    when it is exactly one JSON object, else the value as logged.

    >>> tool_arguments('{"cmd": "ls", "n": 2}')
    {'cmd': 'ls', 'n': 2}
    >>> tool_arguments('["ls"]'), tool_arguments('ls -la'), tool_arguments('{"a": 1, "a": 2}')
    ('["ls"]', 'ls -la', '{"a": 1, "a": 2}')
    >>> tool_arguments({"cmd": "ls"})
    {'cmd': 'ls'}
    """
    if not isinstance(args, str) or not args.lstrip().startswith("{"):
        return args
    obj = _PARSED.get(args)
    if obj is None:
        try:
            parsed = json.loads(
                args, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant
            )
        except (ValueError, RecursionError):
            parsed = None
        obj = parsed if isinstance(parsed, dict) else _NOT_AN_OBJECT
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[args] = obj
    return args if obj is _NOT_AN_OBJECT else obj


#: argument strings parsed recently (every call of a session repeats its history's calls): the
#: object, or :data:`_NOT_AN_OBJECT`. A cached object is shared by every message that logged the
#: same string; templates and ports only read it.
_PARSED: dict[str, Any] = {}
_PARSED_MAX = 4096
_NOT_AN_OBJECT: Any = object()


#: the tags of an inline reasoning block
THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def split_inline_think(d: dict[str, Any]) -> dict[str, Any]:
    """A completion whose text opens with one ``<think>...</think>`` block and that has no
    ``reasoning_content`` (formats without a reasoning field) gets the block as its reasoning
    (a prompt's messages are handed over as sent: the server does not split them).

    The split is the one Qwen3's template makes itself (reasoning with the newlines around it
    stripped, the text after ``</think>`` with its leading newlines stripped), so templates that
    split inline tags render the same tokens, and templates that take ``reasoning_content``
    (gpt-oss's analysis channel) see the reasoning as reasoning. The renderer renders it where
    the completion as written does not show in the template's render (Qwen3's, when the model
    wrote other newlines around the block). Text with a second tag, or with words before the
    block, is left as it is.

    >>> split_inline_think({"role": "assistant", "content": "<think>\\nhm\\n</think>\\n\\nok"})
    {'role': 'assistant', 'content': 'ok', 'reasoning_content': 'hm'}
    """
    content = d.get("content")
    if (
        d.get("role") != "assistant"
        or d.get("reasoning_content") is not None
        or not isinstance(content, str)
        or not content.lstrip().startswith(THINK_OPEN)
        or content.count(THINK_OPEN) != 1
        or content.count(_THINK_CLOSE) != 1
    ):
        return d
    head, tail = content.split(_THINK_CLOSE)
    if THINK_OPEN not in head:
        return d
    reasoning = head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return {**d, "content": tail.lstrip("\n"), "reasoning_content": reasoning}


def template_messages(
    rec: ChatCall,
    parts: TextParts,
    *,
    normalized: Callable[[list[Message], ArgumentsJson | None], list[dict]] | None = None,
) -> tuple[list[dict], dict, list[dict] | None]:
    """(messages, completion, tools) of a call as passed to the chat template, each message
    normalized (the prompt's text parts by the server's rule ``parts``; the prompt's by
    ``normalized`` when given: :class:`~treeprep.render.history.NormalizedHistory`, which
    reuses the dicts of a history it has seen, normalized by the same rule). The completion is
    as the model wrote it; the renderer splits off its inline ``<think>`` block where the
    template does not show it as written (:func:`split_inline_think`)."""
    wire = rec.arguments_json
    index, caps = parts.server is Server.sglang, parts.caps
    if normalized is not None:
        msgs = normalized(rec.messages, wire)
    else:
        msgs = [
            normalize_message(m, f"messages[{i}]", parts, raw_arguments=parts.harmony,
                              wire=wire, call_index=index, llama=caps)
            for i, m in enumerate(rec.messages)
        ]  # fmt: skip
        msgs = merge_system(msgs, caps) if caps is not None else msgs
    comp = normalize_message(rec.completion, "completion", raw_arguments=parts.harmony,
                             wire=wire, call_index=index, llama=caps)  # fmt: skip
    return msgs, comp, (rec.tools or None)
