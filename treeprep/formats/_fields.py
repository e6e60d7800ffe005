"""The fields of a record: typed accessors, the one table of field-name aliases, and the
builders every adapter would otherwise write again (a chat tool call, a validated ChatCall).

Typed accessors (:func:`expect`, :func:`as_dict`, :func:`opt_dict`, :func:`as_list`,
:func:`opt_list`, :func:`opt_str`, :func:`dicts`) are how an adapter reads a field whose shape it
needs: they return the value when it has that shape and otherwise raise
:class:`~treeprep.errors.RecordError` saying where (a JSON path such as ``messages[3].content``)
and what was expected, e.g. ``messages[3].content: expected a string, got int``. The adapter
catches it once per record and turns it into a reject naming the file and line; a one-document
file whose top level is wrong raises it as an :class:`~treeprep.errors.InputError` instead. One
accessor rather than ad hoc ``isinstance`` checks keeps every such message alike, and a shape an
adapter forgot to check still shows up: the fuzz test (``tests/treeprep/formats/
test_malformed.py``) fails on any other exception.

Aliases. Providers and tools spell the same thing differently: the model's reasoning is
``reasoning_content`` (DeepSeek, vLLM, LiteLLM) or ``reasoning`` (OpenRouter, Ollama);
ShareGPT-style datasets say ``from``/``value`` where OpenAI says ``role``/``content``, and name
roles ``human``/``gpt``/``observation``. :data:`FIELDS` and :data:`ROLES` are the one table, so a
spelling learnt for one format is learnt for all. It is deliberately small: an alias is added when
a real format uses it. A field given under two spellings with different values is an
:class:`AliasError`, not a silent choice.

Tool calls. :func:`openai_tool_calls` is the one conversion of a list of OpenAI-style tool calls
(``{id, type: "function", function: {name, arguments}}``, or the flat ``{id, name, arguments}``
of tau2-bench and ShareGPT) into chat form (:func:`chat_tool_call`); arguments are kept as given,
a JSON string or an object, because the renderer must see what the model wrote.

Content blocks. :func:`assistant_blocks` is the one walk over an assistant's content blocks (Pi's
``content``, OpenCode's parts, the Messages API's ``content``) that sorts them by their ``type``
into its texts, its reasoning and its tool calls, reading each text with :func:`block_text` and
naming each block by its path. A format gives its spellings and its strictness as a
:class:`BlockNames` and converts a tool-call block itself (the fields, their checks and what else a
call carries differ per format); how the pieces become a turn (:func:`assistant_turn`: the joins,
no text as ``""`` or None) stays with the format too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from itertools import compress, count
from operator import ne
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from treeprep.errors import RecordError
from treeprep.formats.base import ReadOptions, TextRollout
from treeprep.io.jsonparse import NonFinite, json_keys
from treeprep.schemas import ChatCall, Message, Reject, TokenRollout

# --------------------------------------------------------------------------------------------
# typed accessors: a value of the expected shape, or a RecordError naming its path
# --------------------------------------------------------------------------------------------

_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def type_name(v: object) -> str:
    """The JSON name of ``v``'s type, for messages: ``null``, ``boolean``, ``int``, ``float``,
    ``string``, ``array``, ``object`` (a non-finite number read leniently is named as such)."""
    if v is None:
        return "null"
    if isinstance(v, NonFinite):
        return f"non-finite number {v}"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), type(v).__name__
    )


def one_of(v: object, allowed: Collection[str]) -> bool:
    """Whether ``v`` is one of the strings ``allowed`` (False for any other value, including
    an unhashable one: a set lookup with a list would raise TypeError)."""
    return isinstance(v, str) and v in allowed


def first_field(
    bodies: Iterable[tuple[str, dict[str, Any]]], name: str, *types: type, what: str | None = None
) -> Any:
    """The first non-null ``name`` of ``bodies`` (``(where, body)`` pairs: where a record logs its
    request's fields, ``where`` a path prefix), None where none has it. A value of another type is
    a RecordError naming ``<where><name>``: vLLM and SGLang refuse such a request (their request
    models), so it was not served as a reading that skipped the field would render it.

    >>> first_field([("", {"x": None}), ("request.", {"x": "high"})], "x", str)
    'high'
    >>> first_field([("request.", {"x": 1})], "x", str)
    Traceback (most recent call last):
    ...
    treeprep.errors.RecordError: request.x: expected a string, got int
    """
    for where, d in bodies:
        if d.get(name) is not None:
            return expect(d[name], f"{where}{name}", *types, what=what)
    return None


def template_kwargs_at(bodies: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    """A request's ``chat_template_kwargs`` (which vLLM, SGLang and llama.cpp hand the chat
    template): an object, or None where absent (:func:`first_field`)."""
    return first_field(bodies, "chat_template_kwargs", dict, what="an object")  # type: ignore[no-any-return]


def expect(v: Any, where: str, *types: type, what: str | None = None) -> Any:
    """``v`` when it is an instance of one of ``types`` (``bool`` is never an ``int`` here, and a
    non-finite marker never a string); else RecordError ``"<where>: expected <what>, got <type>"``.
    """
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if ok and isinstance(v, NonFinite) and NonFinite not in types:
        ok = False
    if not ok:
        want = what or " or ".join(_NAMES.get(t, t.__name__) for t in types)
        raise RecordError(f"{where}: expected {want}, got {type_name(v)}")
    return v


def as_dict(v: Any, where: str) -> dict[str, Any]:
    """``v`` when it is a JSON object."""
    return expect(v, where, dict)  # type: ignore[no-any-return]


def opt_dict(v: Any, where: str) -> dict[str, Any]:
    """``v`` when it is a JSON object, ``{}`` when null or absent."""
    return {} if v is None else as_dict(v, where)


def as_list(v: Any, where: str) -> list[Any]:
    """``v`` when it is a JSON array."""
    return expect(v, where, list)  # type: ignore[no-any-return]


def opt_list(v: Any, where: str) -> list[Any]:
    """``v`` when it is a JSON array, ``[]`` when null or absent."""
    return [] if v is None else as_list(v, where)


def opt_str(v: Any, where: str) -> str | None:
    """``v`` when it is a string (None when null or absent)."""
    return None if v is None else expect(v, where, str)  # type: ignore[no-any-return]


def dicts(v: Any, where: str) -> list[dict[str, Any]]:
    """``v`` when it is an array of objects (``[]`` when null or absent); the first element that is
    not an object is named by its index."""
    items = opt_list(v, where)
    for i, x in enumerate(items):
        as_dict(x, f"{where}[{i}]")
    return items


# --------------------------------------------------------------------------------------------
# field-name aliases: the one table
# --------------------------------------------------------------------------------------------

#: canonical message field -> the keys it is read from, in order of preference
FIELDS: dict[str, tuple[str, ...]] = {
    "role": ("role", "from"),
    "content": ("content", "value"),
    "reasoning_content": ("reasoning_content", "reasoning"),
    "tool_calls": ("tool_calls",),
    "tool_call_id": ("tool_call_id",),
    # a token rollout's generation as text (checked against its ids): verl/OpenRLHF dumps say
    # ``response``, vLLM's ``CompletionOutput`` ``text``
    "generation_text": ("generation_text", "completion_text", "response_text", "response"),
    # a dataset row's model (nebius SWE-agent-trajectories: ``model_name``)
    "model": ("model", "model_name"),
    # a dataset row's tool schemas (Toucan-1.5M: ``available_tools``, JSON text)
    "tools": ("tools", "available_tools"),
}

#: a dataset row's outcome read as its reward, in order of preference (``--map reward=FIELD``
#: names another): ``reward`` as it is (a number or a boolean); ``resolved`` (SWE-Gym,
#: SWE-rebench, SWE-smith), ``success`` and ``score`` when a number or a boolean, ``target``
#: (nebius: resolved) only as a boolean; a value of another type there means something else
REWARD_KEYS: tuple[str, ...] = ("reward", "resolved", "success", "score", "target")

#: role spellings (ShareGPT, LLaMA-Factory, Axolotl, ms-swift) -> the canonical chat role.
#: ``function_call``/``tool_call`` are assistant turns whose content is a JSON tool call;
#: ``observation``/``tool_response``/``function`` are tool results.
ROLES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "tool": "tool",
    "observation": "tool",
    "tool_response": "tool",
    "function": "tool",
    "ipython": "tool",
}

#: role spellings whose content is a tool call written as JSON (``{"name", "arguments"}`` or a
#: list of them), not text
TOOL_CALL_ROLES: frozenset[str] = frozenset({"function_call", "tool_call"})


class AliasError(ValueError):
    """A field is given twice under different spellings with different values."""


def aliased(m: dict[str, Any], field: str) -> Any:
    """The value of ``field`` in ``m`` under any of its spellings (None when absent).

    Two spellings that both carry a value must agree; otherwise :class:`AliasError`.

    >>> aliased({"reasoning": "hmm"}, "reasoning_content")
    'hmm'
    """
    found: tuple[str, Any] | None = None
    for key in FIELDS[field]:
        v = m.get(key)
        if v is None:
            continue
        if found is None:
            found = (key, v)
        elif found[1] != v:
            raise AliasError(
                f"{found[0]!r} and {key!r} both give the {field} with different values"
            )
    return None if found is None else found[1]


def key_of(m: dict[str, Any], field: str) -> str | None:
    """The spelling under which ``field`` is present in ``m`` (None when absent)."""
    return next((k for k in FIELDS[field] if m.get(k) is not None), None)


def reasoning_of(m: dict[str, Any]) -> str | None:
    """The message's reasoning text under any spelling; a non-string value is an AliasError.

    OpenRouter also sends ``reasoning_details`` (structured, possibly encrypted); the plain text in
    ``reasoning`` is what a chat template renders, so only the string fields are read.
    """
    v = aliased(m, "reasoning_content")
    if v is None or isinstance(v, str):
        return v
    raise AliasError(f"{key_of(m, 'reasoning_content')}: expected a string, got {type(v).__name__}")


def canonical_role(role: Any) -> str | None:
    """The chat role for a spelling (None when unknown). Tool-call roles map to ``assistant``."""
    if not isinstance(role, str):
        return None
    r = role.strip().lower()
    if r in TOOL_CALL_ROLES:
        return "assistant"
    return ROLES.get(r)


# --------------------------------------------------------------------------------------------
# builders: tool calls, calls, groups
# --------------------------------------------------------------------------------------------


def chat_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call in chat-completions form (values as the adapter read them)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_turn(
    content: Any, thinking: list[str], calls: list[dict[str, Any]], *, sep: str = "\n"
) -> dict[str, Any]:
    """An assistant turn gathered from its parts: the reasoning parts joined by ``sep`` (when
    there are any), the tool calls (when it made any).

    >>> assistant_turn("ok", ["a", "b"], [])
    {'role': 'assistant', 'content': 'ok', 'reasoning_content': 'a\\nb'}
    """
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        msg["reasoning_content"] = sep.join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


@dataclass(frozen=True, kw_only=True)
class BlockNames:
    """How a format spells an assistant's content blocks (by their ``type``), and how strictly
    :func:`assistant_blocks` reads them."""

    text: str
    """The type of a text block (its text is in ``text``)."""
    thinking: str
    """The type of a reasoning block."""
    thinking_field: str
    """The field that holds a reasoning block's text."""
    tool_call: str
    """The type of a tool-call block."""
    text_required: bool = True
    """A text or reasoning block's text must be a string; else null or absent reads as ``""``."""
    others: Literal["reject", "skip"] = "reject"
    """A block of another type: a RecordError naming the three types, or skipped."""


def block_text(b: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    """Block ``b``'s string ``key`` (not ``required``: ``""`` when null or absent); RecordError
    naming ``<where>.<key>`` otherwise.

    >>> block_text({"type": "text"}, "text", "content[0]", required=False)
    ''
    """
    if required:
        return expect(b.get(key), f"{where}.{key}", str)  # type: ignore[no-any-return]
    return opt_str(b.get(key), f"{where}.{key}") or ""


def assistant_blocks(
    blocks: Iterable[tuple[int, dict[str, Any]]],
    where: str,
    names: BlockNames,
    tool_call: Callable[[dict[str, Any], str], dict[str, Any]],
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """An assistant's content blocks, ``(index, block)`` pairs, sorted into (its texts, its
    reasoning texts, its tool calls), each in order. Block ``i`` is named ``<where>[i]``;
    ``tool_call(block, that path)`` converts a tool-call block (and raises RecordError for one
    that does not fit), in block order with the other checks.

    >>> names = BlockNames(text="text", thinking="thinking", thinking_field="thinking",
    ...                    tool_call="toolCall")
    >>> call = lambda b, w: chat_tool_call(b["id"], b["name"], {})
    >>> blocks = [{"type": "text", "text": "hi"}, {"type": "toolCall", "id": "c1", "name": "ls"}]
    >>> assistant_blocks(enumerate(blocks), "content", names, call)
    (['hi'], [], [{'id': 'c1', 'type': 'function', 'function': {'name': 'ls', 'arguments': {}}}])
    >>> assistant_blocks(enumerate([{"type": "image"}]), "content", names, call)
    Traceback (most recent call last):
    ...
    treeprep.errors.RecordError: content[0].type: expected text, thinking or toolCall, got 'image'
    """
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, b in blocks:
        w = f"{where}[{i}]"
        kind = b.get("type")
        if kind == names.text:
            text.append(block_text(b, "text", w, required=names.text_required))
        elif kind == names.thinking:
            thinking.append(block_text(b, names.thinking_field, w, required=names.text_required))
        elif kind == names.tool_call:
            calls.append(tool_call(b, w))
        elif names.others == "reject":
            raise RecordError(
                f"{w}.type: expected {names.text}, {names.thinking} or {names.tool_call}, "
                f"got {kind!r}"
            )
    return text, thinking, calls


def openai_tool_calls(v: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI-style tool calls (``[]`` when null or absent) in chat form; RecordError naming
    the field that does not fit.

    A call is ``{id, type: "function", function: {name, arguments}}`` (absent arguments are
    ``""``) or, without ``function``, the flat ``{id, name, arguments}`` (``parameters`` is read
    too; absent arguments are ``{}``). The name must be a string, the arguments a JSON string or
    an object, the id a string or absent.

    >>> openai_tool_calls([{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}], "m")
    [{'id': 'c1', 'type': 'function', 'function': {'name': 'ls', 'arguments': '{}'}}]
    >>> openai_tool_calls([{"name": "ls"}], "m")
    [{'id': None, 'type': 'function', 'function': {'name': 'ls', 'arguments': {}}}]
    >>> openai_tool_calls([{"function": {"name": 3}}], "m")
    Traceback (most recent call last):
    ...
    treeprep.errors.RecordError: m[0].function.name: expected a string, got int
    """
    out = []
    for j, tc in enumerate(dicts(v, where)):
        w = f"{where}[{j}]"
        if "function" in tc:
            if tc.get("type", "function") not in ("function", None):
                raise RecordError(f"{w}.type: expected 'function', got {tc.get('type')!r}")
            w = f"{w}.function"
            fn = as_dict(tc["function"], w)
            args = fn.get("arguments")
            args = "" if args is None else args
        else:
            fn = tc
            args = tc.get("arguments", tc.get("parameters"))
            args = {} if args is None else args
        name = expect(fn.get("name"), f"{w}.name", str)
        expect(args, f"{w}.arguments", str, dict, what="a JSON string or an object")
        out.append(chat_tool_call(opt_str(tc.get("id"), f"{where}[{j}].id"), name, args))
    return out


def token_rollout(
    check: bool, text: str | None, tool_names: list[str], **fields: Any
) -> TokenRollout:
    """A token rollout; a :class:`~treeprep.formats.base.TextRollout` (its ids checked against
    ``text`` and ``tool_names`` when rendered) when the log holds either and ``check`` (the
    options' ``check_ids``: ``--check-ids``) is on. Raises pydantic's ValidationError like the
    model does."""
    if check and ((text and text.strip()) or tool_names):
        return TextRollout(logged_text=text or "", logged_tool_names=tool_names, **fields)
    return TokenRollout(**fields)


def file_stem(path: str, suffixes: tuple[str, ...]) -> str:
    """The file's name without its folders and without ``suffixes``, removed in that order.

    >>> file_stem("runs/a.jsonl.gz", (".gz", ".zst", ".jsonl"))
    'a'
    """
    name = os.path.basename(path)
    for ext in suffixes:
        name = name.removesuffix(ext)
    return name


#: the stop reasons a log gives a reply that the model did not end: the token limit, a filter, a
#: turn the server paused, in the vocabularies of chat completions (``finish_reason``), the AI SDK
#: (OpenCode's ``step-finish``), Anthropic's Messages API and Crush (``stop_reason``), the
#: Responses API (``status``) and Gemini (``finishReason``)
CUT_REASONS = frozenset(
    {"length", "content_filter", "content-filter", "max_tokens", "pause_turn", "refusal",
     "model_context_window_exceeded", "incomplete",
     "MAX_TOKENS", "SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL", "BLOCKLIST",
     "PROHIBITED_CONTENT", "SPII", "LANGUAGE", "IMAGE_SAFETY", "UNEXPECTED_TOOL_CALL"}
)  # fmt: skip


def cut_reason(reason: Any, where: str) -> str | None:
    """Why a reply whose logged stop reason is ``reason`` is no completion, or None when the model
    ended it. Such a reply stops where the limit cut it, and the chat template writes an end of
    turn after it that the model never said: training it would teach the model to stop there.

    >>> cut_reason("length", "finish_reason").split(":")[0]
    "finish_reason 'length'"
    >>> cut_reason("tool_calls", "finish_reason") is None
    True
    """
    if isinstance(reason, str) and reason in CUT_REASONS:
        return (
            f"{where} {reason!r}: the reply was cut before the model ended its turn (the end of "
            "turn a template writes after it was never said)"
        )
    return None


def content_digest(obj: Any) -> str:
    """12 hex digits naming a JSON value by its content (object keys sorted): the same value
    gives the same digest in every file, run and process.

    >>> content_digest({"id": "s", "steps": []}) == content_digest({"steps": [], "id": "s"})
    True
    """
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer past 64 bits: the slower encoder takes it
        data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(data, digest_size=6).hexdigest()


def make_call(fields: dict[str, Any], *, file: str, line: int, fmt: str) -> ChatCall | Reject:
    """Validate a ChatCall; a validation error becomes a Reject naming the file and line.

    The messages the prompt begins with that are the same input as the last call's here are
    that call's :class:`~treeprep.schemas.Message` objects, not validated again
    (:func:`_shared_messages`).

    The readers' contract: a reader never changes a message dict (nor anything inside it) after
    it has handed it here, so a dict handed again is the input it was the first time and the
    Message made of it then stands for it (``tests/treeprep/formats/test_reader_contract.py``
    checks every format's reader on its samples). The list itself is the reader's to change."""
    shared = _shared_messages(fields.get("messages"))
    try:
        if shared is not None:
            try:
                return ChatCall.model_validate({**fields, "messages": shared})
            except ValidationError:
                pass  # validated as a whole below, so that the reject reads as it always did
        return ChatCall.model_validate(fields)
    except ValidationError as e:
        errs = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()[:3]
        )
        return Reject(
            file=file,
            line=line,
            reason=f"invalid call: {errs}",
            format=fmt,
            call_id=fields.get("call_id"),
        )


#: the last prompt :func:`make_call` validated: its message dicts (the reader's objects), each
#: one's JSON text, and the Message objects made of them
_LAST_PROMPT: tuple[list[Any], list[bytes | None], list[Message]] = ([], [], [])


def forget_shared_messages() -> None:
    """Start a new input file: its first call shares no objects with the last file's calls (a
    file's work, and the counts of its curation, depend on that file alone, not on what the
    worker process read before it)."""
    global _LAST_PROMPT
    _LAST_PROMPT = ([], [], [])


def _shared_messages(messages: Any) -> list[Message] | None:
    """``messages`` (dicts) as validated objects: the longest prefix of them that is the same
    input as the last prompt's, the last prompt's objects, and the others validated one by one.
    None when one does not validate or the list is not plain JSON (the caller then validates the
    whole call).

    A session's call k sends call k-1's messages again, and validating every message of every
    call cost pydantic time quadratic in the session. The objects are shared between the calls,
    as the rows of :mod:`~treeprep.formats.conversations` share theirs; the renderer knows a
    shared history by them (:mod:`treeprep.render.history`). A prompt need not go on from the
    last one whole: Aider sends the chat's files after the history, SWE-agent elides an old
    output in each call, a retry goes back; each still shares the messages up to where it
    leaves the last prompt. A Message is made of its dict alone, so sharing a prefix is exact;
    the build's curation of a shared turn (:mod:`treeprep.build.curate`) is done, and counted,
    by the first call that made its object.

    Same input is told per message, in two ways. A message that is the very dict of the last
    prompt at its position is the same input by the readers' contract (:func:`make_call`): the
    readers that keep their converted messages (Pi, Cline, gptme's parsed replies) hand the same
    dicts to every call, and knowing them by identity writes nothing, where writing the whole
    prompt's JSON per call was quadratic in the session. Another dict is written as JSON and is
    the same input when its text is the text kept for that position: a reader that builds equal
    dicts afresh still shares, at the cost of writing those. Equal JSON text is equal input
    (orjson tells ``1``, ``1.0`` and ``true`` apart; it writes a non-finite float as ``null``,
    which JSON logs cannot hold: :mod:`treeprep.io.jsonparse` refuses them)."""
    global _LAST_PROMPT
    if not isinstance(messages, list):
        return None
    last_dicts, last_blobs, last = _LAST_PROMPT
    blobs = json_keys(messages, last_dicts, last_blobs)
    if None in blobs:
        return None
    # up to the first message that is another input than the last prompt's (compared in C)
    shared = next(compress(count(), map(ne, blobs, last_blobs)), min(len(blobs), len(last)))
    try:
        out = last[:shared] + [Message.model_validate(m) for m in messages[shared:]]
    except ValidationError:
        return None
    _LAST_PROMPT = (list(messages), blobs, out)
    return list(out)


def group_or(doc: dict[str, Any], opts: ReadOptions, default: str) -> str:
    """The value of ``--group-by FIELD`` in ``doc`` when given and present, else ``default``."""
    if opts.group_by and doc.get(opts.group_by) is not None:
        return str(doc[opts.group_by])
    return default


def chat_content(parts: list[dict[str, Any]]) -> Any:
    """Content parts as a chat message's content: the text of one text part, else the parts
    (several text parts stay parts, which the renderer joins as the server did: ``--server``).

    >>> chat_content([{"type": "text", "text": "hi"}])
    'hi'
    >>> len(chat_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
    2
    """
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def content_parts(content: Any) -> list[Any]:
    """A message's content as parts: a string is one text part, null none, a list itself (as
    Anthropic blocks and Roo Code's ``normalizeContentToBlocks`` take it).

    >>> content_parts("hi"), content_parts(None)
    ([{'type': 'text', 'text': 'hi'}], [])
    """
    if isinstance(content, list):
        return content
    return [] if content is None else [{"type": "text", "text": str(content)}]


def system_message(text: str | None) -> list[dict[str, Any]]:
    """The system message of ``text`` as a one-element list (none when no text)."""
    return [{"role": "system", "content": text}] if text else []


#: the part types of LLaMA-Factory v1 ``messages`` (``{"type", "value"}`` parts) read as chat
VALUE_PART_TYPES = frozenset({"text", "reasoning", "tool_call"})


def value_parts(content: Any) -> tuple[str, str | None, list[Any]] | None:
    """LLaMA-Factory v1 content parts ``[{"type": "text"|"reasoning"|"tool_call", "value"}]`` as
    (the text, the reasoning or None, the tool-call values in order); None when ``content`` is not
    such a list (other part types, an image, are left to the renderer to name)."""
    if not isinstance(content, list) or not content:
        return None
    if not all(
        isinstance(p, dict)
        and isinstance(p.get("type"), str)
        and p["type"] in VALUE_PART_TYPES
        and "value" in p
        for p in content
    ):
        return None
    text = "".join(str(p["value"]) for p in content if p["type"] == "text")
    thought = [str(p["value"]) for p in content if p["type"] == "reasoning"]
    calls = [p["value"] for p in content if p["type"] == "tool_call"]
    return text, ("\n".join(thought) if thought else None), calls
