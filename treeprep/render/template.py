"""The chat template: jinja in transformers' sandbox, a faster direct call, and verified ports.

Trade-offs: the template is still rendered once per call and once more for the generation prompt,
so that cost grows with the context, not with unique text. With a native port
(:mod:`treeprep.render.native`, used only after it matched ``apply_chat_template`` on probe
conversations, and compared with jinja on the first 16 renders and every 64th after, which costs
about half of the port's own time) that is about a microsecond per message, and the third render
needed by the branch hint (the previous turn) is simply done again. With jinja it is tens of
microseconds per message, and the third render is skipped when the previous call's sequence is
still in a small cache keyed by a hash of its messages, the common case when a session's calls are
read in order.

Three ways to render, all checked against ``apply_chat_template`` (the reference) before use: the
public API itself; the compiled template called directly (:func:`make_direct`, skipping the API's
per-call deep copy, in a sandbox with a fast attribute lookup for plain data,
:func:`fast_sandbox_class`); and a native Python port (:func:`find_verified_port`). Untrusted
templates run only in transformers' immutable jinja sandbox; a template error becomes a
:class:`~treeprep.errors.RenderError` naming the exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from treeprep.errors import RenderError
from treeprep.render.native import FALLBACK_ERRORS, NativeTemplate, find_port
from treeprep.schemas.tokenizer import sha256_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: a render function: (messages, tools, add_generation_prompt) -> text
RenderFn = Callable[[list[dict], list[dict] | None, bool], str]

#: the native port's renders compared with the jinja template: the first ones, then every n-th
CHECK_FIRST = 16
CHECK_EVERY = 64
_TEMPLATE_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
)


def render_jinja(
    tokenizer: PreTrainedTokenizerBase,
    direct: RenderFn | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    """The template's text through ``direct`` when given, else ``apply_chat_template``; a failing
    template becomes :class:`RenderError`."""
    from jinja2 import TemplateError

    try:
        if direct is not None:
            return direct(messages, tools, add_generation_prompt)
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,  # type: ignore[arg-type]
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    except (TemplateError, *_TEMPLATE_ERRORS) as e:  # type: ignore[misc]
        raise RenderError(f"the chat template failed: {type(e).__name__}: {e}") from e
    assert isinstance(text, str)
    return text


def make_direct(tokenizer: PreTrainedTokenizerBase, reference: RenderFn) -> RenderFn | None:
    """The compiled template called directly, without ``apply_chat_template``'s per-call
    preprocessing (a deep copy of every message into plain data, which ours already are).

    It is what ``apply_chat_template`` does for one conversation of plain dicts: drop ``None``
    fields (ours have none), alias ``reasoning_content`` as ``thinking``, pass the special
    tokens map as template variables. It is used only if it renders the probe conversations
    exactly as ``reference`` (the public API) does; otherwise (another transformers version, a
    template dict) None, and every render goes through the public API.
    """
    try:
        from transformers.utils.chat_template_utils import (
            _alias_reasoning_fields,
            _cached_compile_jinja_template,
        )
    except ImportError:
        return None
    template = tokenizer.chat_template
    if not isinstance(template, str):
        return None
    try:
        # a private copy (not the lru-cached one apply_chat_template uses), so that giving its
        # environment the fast attribute lookup below never touches the reference path
        compiled = _cached_compile_jinja_template(template)
        env = compiled.environment
        env.__class__ = fast_sandbox_class(type(env))
    except Exception:  # any failure means: use the public API
        return None
    kwargs = dict(tokenizer.special_tokens_map)

    def direct(messages: list[dict], tools: list[dict] | None, gen: bool) -> str:
        return compiled.render(
            messages=_alias_reasoning_fields(messages),
            tools=tools,
            documents=None,
            add_generation_prompt=gen,
            **kwargs,
        )

    for msgs, tools in probe_conversations():
        for gen in (False, True):
            try:
                same = direct(msgs, tools, gen) == reference(msgs, tools, gen)
            except Exception:  # a template that fails here fails in the API too
                same = False
            if not same:
                return None
    return direct


def find_verified_port(template: Any, reference: RenderFn) -> NativeTemplate | None:
    """The template's native port, if it has one that renders the probe conversations exactly
    like ``reference`` (the jinja template); otherwise None (jinja renders everything)."""
    if not isinstance(template, str):
        return None
    port = find_port(sha256_text(template))
    if port is None:
        return None
    for msgs, tools in probe_conversations():
        for gen in (False, True):
            try:
                ref = reference(msgs, tools, gen)
            except RenderError:
                continue  # the template refuses it: the port falls back to it at run time
            try:
                same = port.render(msgs, tools, gen) == ref
            except FALLBACK_ERRORS:
                same = False
            if not same:
                return None
    return port


def first_char_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter length if none)."""
    m = min(len(a), len(b))
    return next((i for i in range(m) if a[i] != b[i]), m)


def probe_conversations() -> list[tuple[list[dict], list[dict] | None]]:
    """Conversations that exercise a template: system, tools, parallel calls, reasoning, results."""
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run <b>it</b> é",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    conv: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "run", "arguments": "{}"}},
                {"id": "2", "type": "function", "function": {"name": "run", "arguments": {"a": 1}}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "ok"},
        {"role": "tool", "tool_call_id": "2", "name": "run", "content": "ok"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "fine"},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Sure."},
    ]
    # the corners a template port must get right: reasoning inside the content, a wrapped tool
    # response as a user turn (Qwen3's last-query search), a later system turn, no system at all,
    # consecutive tool results at the end, content with leading/trailing newlines, an assistant
    # turn with tool calls and text, and a turn that is neither reasoning nor text
    corners: list[dict[str, Any]] = [
        {"role": "user", "content": "  Hi \n"},
        {"role": "assistant", "content": "<think>\n  a \n</think>\n\nOk\n"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
        {"role": "system", "content": "Later."},
        {
            "role": "assistant",
            "content": "\nCalling.",
            "tool_calls": [
                {"type": "function", "function": {"name": "run", "arguments": {"é": [1, 2.5]}}}
            ],
        },
        {"role": "tool", "content": "<think>r</think>"},
        {"role": "assistant", "content": "", "reasoning_content": ""},
        {"role": "user", "content": "ü 🙂"},
        {"role": "assistant", "content": "x</think>y", "reasoning_content": "\nr\n"},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    return [
        (conv, tools),
        (conv, None),
        (conv[1:3], tools),
        (conv[1:2], None),
        (corners, tools),
        (corners, None),
        (corners[:2], None),
        (corners[:3], tools),
        (corners[:5], None),
    ]


_FAST_SANDBOXES: dict[type, type] = {}


def fast_sandbox_class(base: type) -> type:
    """``base`` (transformers' immutable jinja sandbox) with a fast path for ``message.content``.

    Chat templates spend most of their time in the sandbox's attribute lookup, which for a plain
    ``dict`` first tries a Python attribute, checks it against the sandbox rules, then falls back to
    the item. For a ``dict`` whose key is not also a ``dict`` attribute name the result is always
    the item, a plain data value, so it is returned at once. A public ``str`` method other than
    ``format``/``format_map`` is what the sandbox would return too. Everything else (other types,
    private names, missing keys) goes through the sandbox unchanged.
    """
    cls = _FAST_SANDBOXES.get(base)
    if cls is not None:
        return cls
    dict_attrs = frozenset(dir(dict))
    # str methods the sandbox allows and returns as they are (it wraps format and format_map)
    str_attrs = frozenset(a for a in dir(str) if not a.startswith("_")) - {"format", "format_map"}

    def getattr_(self, obj, attribute):  # type: ignore[no-untyped-def]
        t = type(obj)
        if t is dict and attribute not in dict_attrs:
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        elif t is str and attribute in str_attrs:
            return getattr(obj, attribute)
        return base.getattr(self, obj, attribute)

    def getitem(self, obj, argument):  # type: ignore[no-untyped-def]
        if type(obj) is dict and type(argument) is str:
            try:
                return obj[argument]
            except KeyError:
                pass
        return base.getitem(self, obj, argument)

    cls = type(f"Fast{base.__name__}", (base,), {"getattr": getattr_, "getitem": getitem})
    _FAST_SANDBOXES[base] = cls
    return cls
