"""Native chat templates: exact Python ports of known jinja chat templates.

Why
---
Rendering a chat template with jinja costs tens of microseconds per message (the sandbox checks
every attribute access, every ``+`` and every filter call), and an agent session re-renders its
whole growing history on every call, twice (the full sequence and the generation prompt). On
per-call logs of 40-call sessions that made jinja the largest cost of ``treeprep build``. A port is
the same template written as plain string building: a list of parts and one ``"".join``, so the
per-message cost is a few dictionary look-ups and the copying is done in C.

Contract
--------
A port is a function ``(messages, tools, add_generation_prompt) -> str`` that returns exactly what
the jinja template renders through transformers' ``apply_chat_template(..., tokenize=False)`` for
the same arguments, with transformers' environment (``trim_blocks``, ``lstrip_blocks``, its
``tojson`` = ``json.dumps(x, ensure_ascii=False)`` with default separators, and its aliasing of
``thinking``/``reasoning`` into ``reasoning_content``). A port is selected by the sha256 of the
template text (:func:`find_port`), so a template that differs by one byte gets no port.

A port covers the messages :func:`treeprep.render.normalize_message` produces (string
``content``, ``tool_calls`` with ``function.name`` a string and ``function.arguments`` a string
or an object). Outside that domain it does not guess: a missing key, a non-string where the
template concatenates strings, or anything else unusual raises (``KeyError``, ``TypeError``,
``AttributeError``, ``IndexError``), and the caller renders with jinja instead
(:data:`FALLBACK_ERRORS`). Because ``"".join`` refuses non-strings, a value that jinja would have
stringified (``{{ x }}`` of a number) never silently renders differently: it falls back.

Trust, but verify: :class:`treeprep.render.Renderer` uses a port only after it renders the probe
conversations exactly like ``apply_chat_template``, and then compares a deterministic sample of the
real renders (:mod:`treeprep.crosscheck`) with the jinja template, raising on any
difference. The tests compare the ports with the templates on hypothesis-generated conversations
and on the real logs.

Trade-offs: a port is code to maintain per template, and only templates we know are ported (Qwen3
with hybrid thinking, Qwen2.5, Qwen3-Instruct-2507, the built-in ChatML template); every other
template keeps the jinja path. No per-message cache: building a block is as cheap as hashing the
key such a cache would need. A port that can extend the text of a conversation's prefix to the
text of the conversation (:attr:`NativeTemplate.extend`: the built-in ChatML template appends;
the Qwen ports of :mod:`treeprep.render.native_qwen` render the last kept message again, and
Qwen3 the turns after the last query when a new one comes) lets a session's calls render only
what they append (:mod:`treeprep.render.history`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from treeprep.errors import NativeTemplateMismatch, RenderError, TemplateLimitError
from treeprep.render.native_qwen import (
    _GENERATION_PROMPT,
    _end_assistant,
    _extend,
    _finish,
    _reasoning,
    _system_block,
    _turn,
    extend_qwen2_5,
    extend_qwen3,
    extend_qwen3_instruct_2507,
    render_qwen2_5,
    render_qwen3,
    render_qwen3_instruct_2507,
)
from treeprep.render.template import first_char_difference
from treeprep.schemas.tokenizer import sha256_text

__all__ = [
    "FALLBACK_ERRORS",
    "check_port",
    "NativeTemplate",
    "PORTS",
    "find_port",
    "find_verified_port",
    "probe_conversations",
    "extend_builtin_chatml",
    "extend_qwen2_5",
    "extend_qwen3",
    "extend_qwen3_instruct_2507",
    "render_builtin_chatml",
    "render_qwen2_5",
    "render_qwen3",
    "render_qwen3_instruct_2507",
]

#: what a port raises on input outside its domain (the caller then renders with jinja)
FALLBACK_ERRORS: tuple[type[Exception], ...] = (
    KeyError,
    TypeError,
    AttributeError,
    IndexError,
    ValueError,
)

RenderFn = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]
#: (text of ``old``, old, messages, shared, tools) -> text of ``messages``, where the first
#: ``shared >= 1`` messages of ``old`` are those of ``messages``
ExtendFn = Callable[
    [str, list[dict[str, Any]], list[dict[str, Any]], int, list[dict[str, Any]] | None], str
]


@dataclass(frozen=True, slots=True)
class NativeTemplate:
    """A port: its name (for reports) and the function."""

    name: str
    render: RenderFn
    #: the text of a conversation (no generation prompt) from the text of another that begins
    #: with the same messages (at least one), exactly ``render(messages, tools, False)``: the
    #: other's turns after the shared ones cut off, and the conversation's appended
    #: (:func:`extend_builtin_chatml`), the last shared turns rendered again where they depend on
    #: later messages (:func:`~treeprep.render.native_qwen.extend_qwen3`); None: every call is
    #: rendered whole
    extend: ExtendFn | None = None
    #: with ``extend``: what ``add_generation_prompt`` appends to the text
    generation_prompt: str = ""


# --------------------------------------------------------------------------------------------------
# The built-in ChatML template (treeprep.render.builtin.CHAT_TEMPLATE)
# --------------------------------------------------------------------------------------------------

_BUILTIN_TOOLS_HEAD = "# Tools\n\nYou may call the functions below. Their JSON schemas:\n<tools>"
_BUILTIN_TOOLS_TAIL = (
    "\n</tools>\n\nTo call one, write <tool_call>\n"
    '{"name": <name>, "arguments": <json>}\n</tool_call><|im_end|>\n'
)


def render_builtin_chatml(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    """The built-in tokenizer's ChatML template: reasoning in a ``<think>`` block on every
    assistant turn that has it, tool results as ``tool`` turns."""
    out: list[str] = []
    _system_block(out, messages, tools, head=_BUILTIN_TOOLS_HEAD, tail=_BUILTIN_TOOLS_TAIL)
    _builtin_turns(out, messages, 0, len(messages))
    return _finish(out, add_generation_prompt)


def extend_builtin_chatml(
    text: str,
    old: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    shared: int,
    tools: list[dict[str, Any]] | None,
) -> str:
    """``render_builtin_chatml(messages, tools, False)``, given ``text``, the render of ``old``
    with the same tools, whose first ``shared >= 1`` messages are those of ``messages``: the
    system block reads only ``messages[0]`` and the tools, and each turn only its own message,
    so the turns of ``old[shared:]`` are cut off ``text`` and those of ``messages[shared:]``
    appended (:func:`~treeprep.render.native_qwen._extend`)."""
    whole = partial(render_builtin_chatml, messages, tools, False)
    return _extend(text, old, messages, shared, _builtin_turns, (), (), whole)


def _builtin_turns(out: list[str], messages: list[dict[str, Any]], start: int, stop: int) -> None:
    """The turns of ``messages[start:stop]`` (a leading system message is the system block's)."""
    ap = out.append
    for i in range(start, stop):
        m = messages[i]
        role = m["role"]
        if role == "system" and i == 0:
            continue
        if role == "assistant":
            ap("<|im_start|>assistant\n")
            reasoning = _reasoning(m)
            if reasoning:
                ap("<think>\n")
                ap(reasoning)
                ap("\n</think>\n\n")
            content = m["content"]
            if content:
                ap(content)
            _end_assistant(out, m, content, if_defined=True)
        elif role == "tool":
            ap("<|im_start|>tool\n<tool_response>\n")
            ap(m["content"])
            ap("\n</tool_response><|im_end|>\n")
        else:
            _turn(out, role, m["content"])


# --------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------

#: sha256 of the template text (UTF-8) -> its port
PORTS: dict[str, NativeTemplate] = {
    # tokenizers/qwen3 (Qwen3 hybrid thinking, with tools)
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": NativeTemplate(
        "qwen3",
        render_qwen3,
        extend=extend_qwen3,
        generation_prompt=_GENERATION_PROMPT,
    ),
    # tokenizers/qwen2_5 (Qwen2.5 tool calling)
    "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f": NativeTemplate(
        "qwen2_5",
        render_qwen2_5,
        extend=extend_qwen2_5,
        generation_prompt=_GENERATION_PROMPT,
    ),
    # tokenizers/qwen3-4b-instruct-2507-config-from-openhands
    "64f85b198065d0fba2a81f37e10ed68161ce2c19a754c7100e67e0ca2ee9c326": NativeTemplate(
        "qwen3_instruct_2507",
        render_qwen3_instruct_2507,
        extend=extend_qwen3_instruct_2507,
        generation_prompt=_GENERATION_PROMPT,
    ),
    # treeprep.render.builtin.CHAT_TEMPLATE
    "1da93fe193dbadec53c47e6d813de217c0975f039d60190ee04e61b2157c4d2f": NativeTemplate(
        "builtin_chatml",
        render_builtin_chatml,
        extend=extend_builtin_chatml,
        generation_prompt=_GENERATION_PROMPT,
    ),
}


def find_port(template_sha256: str) -> NativeTemplate | None:
    """The port of the template whose text has this sha256, or None."""
    return PORTS.get(template_sha256)


# --------------------------------------------------------------------------------------------------
# Verification: a port is used only once it renders the probe conversations like its template
# --------------------------------------------------------------------------------------------------


def check_port(
    text: str, reference: Callable[[], str], *, port: str, tokenizer: str,
    add_generation_prompt: bool, where: str,
) -> None:  # fmt: skip
    """:class:`NativeTemplateMismatch` (naming ``where``, the record's ``file:line``) unless the
    port's ``text`` is the jinja template's (``reference()``); a render that breaks the
    template's limits is the record's reject, not the port's fault."""
    try:
        ref = reference()
    except TemplateLimitError:
        raise
    except RenderError as e:
        ref_err: str | None = e.reason
    else:
        if ref == text:
            return
        ref_err = None
    what = (
        f"the template fails ({ref_err})"
        if ref_err is not None
        else f"they differ at character {first_char_difference(text, ref)}"
    )
    raise NativeTemplateMismatch(
        f"{where or 'a record'}: the native port {port!r} of the chat template of tokenizer "
        f"{tokenizer!r} renders this record differently from the jinja template "
        f"(add_generation_prompt={add_generation_prompt}; {what}). This is a bug in "
        "treeprep.render.native, not in the record; build with --no-native-templates "
        "(Renderer.load(..., native_templates=False)) to render with jinja only."
    )


def find_verified_port(template: str, reference: RenderFn) -> NativeTemplate | None:
    """The template's native port, if it has one that renders the probe conversations exactly
    like ``reference`` (the jinja template); otherwise None (jinja renders everything)."""
    port = find_port(sha256_text(template))
    if port is None:
        return None
    for msgs, tools in probe_conversations():
        for gen in (False, True):
            try:
                ref = reference(msgs, tools, gen)
            except TemplateLimitError:
                return None  # a hostile template: no more probes, jinja (with its limits) renders
            except RenderError:
                continue  # the template refuses it: the port falls back to it at run time
            try:
                same = port.render(msgs, tools, gen) == ref
            except FALLBACK_ERRORS:
                same = False
            if not same:
                return None
    return port


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
