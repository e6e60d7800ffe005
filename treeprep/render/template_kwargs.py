"""A call's chat-template kwargs: what the inference server handed the template besides the
messages and tools.

A request may carry ``chat_template_kwargs`` (vLLM's, SGLang's and llama.cpp's extension of the
Chat Completions API; ``{"enable_thinking": false}`` turns Qwen3's thinking off) and a
``reasoning_effort``. The server renders the template with them, so the prompt the model saw
depends on them. What each server does (read in their sources, late 2026):

- **vLLM** (``ChatCompletionRequest.build_chat_params``, 0.34): the request's kwargs, and over
  them the reasoning effort as ``reasoning_effort`` and, unless the kwargs set
  ``enable_thinking``, ``enable_thinking = effort != "none"``; then only the names the template
  reads are kept (``resolve_chat_template_kwargs``).
- **SGLang** (0.5.23, ``protocol.normalize_reasoning_inputs`` and ``serving_chat``): an effort
  sets ``thinking`` and ``enable_thinking`` where the kwargs do not; then ``reasoning_effort``
  (the one the kwargs name, or the request's), then the kwargs.
- **llama.cpp** (``tools/server/server-common.cpp``): the kwargs, and the request's
  ``reasoning_effort`` among them (forwarded since PR #26941, build b10434, August 2026; earlier
  builds ignore it), but ``none``, which turns thinking off (``enable_thinking`` false, unless
  the kwargs set it) and is not forwarded (``oaicompat_chat_params_parse``, read in the copy
  llama-cpp-python 0.3.36 bundles, llama.cpp 0c1e570). It also gives every render
  ``enable_thinking``, true where the template supports thinking, under the kwargs
  (:func:`llama_cpp_thinking`); the server's date as ``datetime`` (``Dec 08 2026``) and
  ``date_string`` (``08 Dec 2026``), under the kwargs (``common_chat_extra_context``: Llama 3's
  template prints it, where its default is ``26 Jul 2024``), here the call's date
  (:func:`llama_cpp_dates`); an effort as ``reasoning_strength`` too, and a
  ``preserve_reasoning`` kwarg as ``preserve_thinking`` and, negated, ``clear_thinking``,
  ``truncate_history_thinking`` and ``drop_thinking``, each under a kwarg of its name
  (``common/jinja/caps.cpp``, ``caps_apply_*``).

Each server may be started with default kwargs (vLLM's and SGLang's
``--default-chat-template-kwargs``, llama.cpp's ``--chat-template-kwargs``), which a request's
own override key by key; vLLM may map efforts (``--reasoning-effort-map``, :func:`map_effort`).
The build takes both (``--default-chat-template-kwargs``, ``--reasoning-effort-map``).

:func:`template_kwargs` gives those, less any the template does not read or the renderer sets
itself (the messages, tools, generation prompt, date function and special tokens). Harmony's
render (gpt-oss on vLLM) takes only the effort (:mod:`treeprep.render.harmony`).

An Anthropic request that turns thinking off (``thinking.type`` ``disabled`` or
``between_tools``) reaches vLLM's template as an effort too, which vLLM's Messages endpoint picks
by probing the template (:func:`disabled_thinking_effort`). Whether it merges a request's inline
``system`` messages into the leading system prompt is a probe of the template too
(:func:`merges_inline_system`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

from treeprep.errors import RenderError
from treeprep.modes import Server
from treeprep.render.dates import DEFAULT_DATE
from treeprep.render.template import ChatTemplate, template_ast

__all__ = [
    "disabled_thinking_effort",
    "llama_cpp_dates",
    "llama_cpp_thinking",
    "map_effort",
    "merges_inline_system",
    "template_kwargs",
]

#: the efforts vLLM takes in a request (``ReasoningEffort``, 0.34): an effort map's keys
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
#: the efforts vLLM's Messages endpoint tries against ``none`` (``AnthropicEffort``, 0.34)
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")

#: what the renderer gives the template itself, which no request's kwargs replace
_RESERVED = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "strftime_now",
     "chat_template", "tokenize", "continue_final_message"}
)  # fmt: skip


def template_kwargs(
    source: str,
    server: Server,
    kwargs: dict[str, Any] | None,
    effort: str | None,
    defaults: dict[str, Any] | None = None,
    thinking: bool | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The kwargs ``server`` renders the template ``source`` with, for a request with these
    ``chat_template_kwargs`` and reasoning ``effort`` (empty: the template's defaults), on a
    server started with ``defaults`` (its default chat-template kwargs, which a request's own
    override key by key). ``thinking``: the ``enable_thinking`` llama.cpp gives the template
    when neither sets it (None: giving it renders as leaving it out, :func:`llama_cpp_thinking`);
    ``now``: the call's date, which llama.cpp gives it (None: the default date).

    >>> t = "{% if enable_thinking is false %}<think></think>{% endif %}{{ reasoning_effort }}"
    >>> template_kwargs(t, Server.vllm, None, "none")
    {'reasoning_effort': 'none', 'enable_thinking': False}
    >>> template_kwargs(t, Server.sglang, {"enable_thinking": False, "x": 1}, None)
    {'enable_thinking': False}
    >>> template_kwargs(t, Server.llama_cpp, None, "none")
    {'enable_thinking': False}
    >>> template_kwargs(t, Server.vllm, {"enable_thinking": None}, None, {"enable_thinking": False})
    {'enable_thinking': False}
    """
    rule = {Server.vllm: _vllm, Server.sglang: _sglang, Server.llama_cpp: _llama_cpp}[server]
    out = rule(dict(kwargs or {}), effort, defaults or {})
    if server is Server.llama_cpp:
        if thinking is not None and effort != "none":
            out.setdefault("enable_thinking", thinking)
        out = {**llama_cpp_dates(now or DEFAULT_DATE), **_llama_cpp_derived(out), **out}
    if not out:
        return out
    reads = _variables(source)
    return {k: v for k, v in out.items() if k in reads and k not in _RESERVED}


def _vllm(kwargs: dict[str, Any], effort: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """vLLM (``build_chat_params``, then ``with_defaults``, 0.34): the effort and the
    ``enable_thinking`` it implies over the request's kwargs, all over the server's defaults,
    where a request's null or ``"auto"`` leaves the default (``merge_kwargs``)."""
    out = dict(kwargs)
    if effort is not None:
        out["reasoning_effort"] = effort
        if "enable_thinking" not in kwargs:
            out["enable_thinking"] = effort != "none"
    if not defaults:
        return out
    return {**defaults, **{k: v for k, v in out.items() if v is not None and v != "auto"}}


def _sglang(kwargs: dict[str, Any], effort: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """SGLang (0.5.23, in its order): an effort sets ``thinking`` and ``enable_thinking`` where
    the kwargs do not (``normalize_reasoning_inputs``); an effort the kwargs name is the
    request's (``_convert_to_internal_request``); the server's defaults fill what the kwargs
    leave unset, a default effort the request's when it has none (``_process_messages``); the
    template gets the effort, then the kwargs over it (``_apply_jinja_template``), so a default
    ``reasoning_effort`` wins over the request's own."""
    if effort is not None:
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    named = kwargs.pop("reasoning_effort", None)
    effort = named if named is not None else effort
    for k, v in defaults.items():
        kwargs.setdefault(k, v)
    if effort is None:
        effort = kwargs.get("reasoning_effort")
    return {**({} if effort is None else {"reasoning_effort": effort}), **kwargs}


def _llama_cpp(
    kwargs: dict[str, Any], effort: str | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """llama.cpp (``oaicompat_chat_params_parse``): the request's kwargs over the server's
    (``--chat-template-kwargs``), then the request's effort, but ``none``, which turns thinking
    off (unless the kwargs set ``enable_thinking``, which the template gets over it) and is
    not forwarded."""
    out = {**defaults, **kwargs}
    if effort == "none":
        out.pop("reasoning_effort", None)
        out.setdefault("enable_thinking", False)
    elif effort:
        out["reasoning_effort"] = effort
    return out


#: the months as C's ``%b`` writes them (llama.cpp's ``format_time``, the C locale)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def llama_cpp_dates(now: datetime) -> dict[str, str]:
    """The date llama.cpp gives every render (``common_chat_extra_context``: the server's clock,
    ``%b %d %Y`` and ``%d %b %Y``).

    >>> llama_cpp_dates(datetime(2026, 12, 8, 23, 59))
    {'datetime': 'Dec 08 2026', 'date_string': '08 Dec 2026'}
    """
    month, day = _MONTHS[now.month - 1], f"{now.day:02d}"
    return {"datetime": f"{month} {day} {now.year}", "date_string": f"{day} {month} {now.year}"}


def _llama_cpp_derived(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What llama.cpp derives from two kwargs (``caps_apply_reasoning_effort`` and
    ``caps_apply_preserve_reasoning``), which a kwarg of the same name overrides.

    >>> _llama_cpp_derived({"reasoning_effort": "low"})
    {'reasoning_strength': 'low'}
    >>> derived = _llama_cpp_derived({"preserve_reasoning": True})
    >>> derived["preserve_thinking"], derived["drop_thinking"]
    (True, False)
    """
    out: dict[str, Any] = {}
    effort = kwargs.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        out["reasoning_strength"] = effort
    keep = kwargs.get("preserve_reasoning")
    if isinstance(keep, bool):
        out["preserve_thinking"] = keep
        for name in ("clear_thinking", "truncate_history_thinking", "drop_thinking"):
            out[name] = not keep
    return out


def llama_cpp_thinking(
    render: Callable[[list[dict[str, Any]], dict[str, Any]], str],
) -> bool | None:
    """The ``enable_thinking`` llama.cpp gives a template when a request sets none: true where
    the template supports thinking (``common_chat_templates_support_enable_thinking``: a user
    message renders otherwise with it false than true; the server's default ``--reasoning
    auto``), else false; None where giving it renders as leaving it out (Qwen3's template, for
    one: then the native ports, which take no kwargs, still render). ``render``: the template's
    render of messages with a generation prompt and these kwargs; a failing one is taken to
    support nothing."""
    probe = [{"role": "user", "content": "test"}]
    try:
        supports = render(probe, {"enable_thinking": False}) != render(
            probe, {"enable_thinking": True}
        )
        seeded = {"enable_thinking": supports}
        same = all(render(msgs, seeded) == render(msgs, {}) for msgs in _THINKING_PROBES)
    except RenderError:
        return None
    return None if same else supports


#: conversations whose renders tell whether a seeded ``enable_thinking`` changes anything: the
#: generation prompt, and a history with reasoning and a tool call before it
_THINKING_PROBES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "test"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r",
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "d"},
        {"role": "assistant", "content": "e", "reasoning_content": "s"},
        {"role": "user", "content": "g"},
    ],
]  # fmt: skip


def map_effort(effort: str | None, effort_map: dict[str, str] | None) -> str | None:
    """The effort vLLM renders for a request's ``effort`` on a server started with
    ``--reasoning-effort-map`` (``map_reasoning_effort``, 0.34: efforts not listed pass).

    >>> map_effort("xhigh", {"xhigh": "max"}), map_effort("low", {"xhigh": "max"})
    ('max', 'low')
    """
    return effort if effort is None or not effort_map else effort_map.get(effort, effort)


def disabled_thinking_effort(
    template: ChatTemplate,
    defaults: dict[str, Any] | None = None,
    effort_map: dict[str, str] | None = None,
) -> str:
    """The effort vLLM's Messages endpoint sends ``template`` for a request that turns thinking
    off (``DisabledThinkingEffortResolver``, 0.34, its default ``auto``): ``none``, unless the
    prompt of one user message rendered with ``none`` fails or equals its render with one of
    :data:`ANTHROPIC_EFFORTS` (the template ignores ``none``), then ``low``. The probe renders
    as the server renders a request: with its default kwargs and its effort map."""

    def render(effort: str) -> str | None:
        mapped = map_effort(effort, effort_map)
        kwargs = template_kwargs(template.source, Server.vllm, None, mapped, defaults)
        try:
            return template.render([{"role": "user", "content": "Hi"}], None, True, extra=kwargs)
        except RenderError:
            return None

    none = render("none")
    if none is None or any(render(e) == none for e in ANTHROPIC_EFFORTS):
        return "low"
    return "none"


#: the conversation vLLM's Messages endpoint renders to learn whether a template takes a system
#: message after the first (``_detect_merge_inline_system``, 0.34)
_INLINE_SYSTEM_PROBE = [
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
    {"role": "system", "content": "t"},
    {"role": "user", "content": "t"},
]


def merges_inline_system(source: str | None) -> bool:
    """Whether vLLM's Messages endpoint (0.34) merges a request's inline ``system`` messages
    into the leading system prompt for the chat template ``source``: it does when there is no
    template, or when the template fails on a system message after the first, rendered in
    jinja's own sandbox with the messages and ``add_generation_prompt`` false alone (as vLLM's
    ``_detect_merge_inline_system`` renders it: a template that calls ``raise_exception``, a
    transformers helper, fails there whatever it was about to say).

    >>> merges_inline_system("{% for m in messages %}{{ m.content }}{% endfor %}")
    False
    >>> merges_inline_system("{% for m in messages %}{% if m.role == 'system' and not loop.first "
    ...                      "%}{{ raise_exception('system first') }}{% endif %}{% endfor %}")
    True
    """
    return not source or _probe_render(source, _INLINE_SYSTEM_PROBE) is None


def _probe_render(source: str, messages: list[dict[str, str]]) -> str | None:
    """``source`` rendered as the servers' inline-system probes render it: in jinja's own
    sandbox, with ``messages`` and ``add_generation_prompt`` false alone (None: it fails)."""
    try:
        probe = ChatTemplate(source, bare=True)
        return probe.render_variables({"messages": messages, "add_generation_prompt": False})
    except RenderError:
        return None


#: the message SGLang's probe looks for in the render
_SGLANG_SENTINEL = "__sglang_inline_system_sentinel__"


def sglang_inline_system(source: str | None) -> bool:
    """Whether SGLang's Messages endpoint keeps a request's inline ``system`` messages in place
    for the chat template ``source`` (0.5.23, ``detect_inline_system_support``): the template,
    rendered in jinja's own sandbox (blocks trimmed, ``loopcontrols``) with the messages and
    ``add_generation_prompt`` false alone, shows a system message after the first; a template
    that fails there, or leaves that message out, makes SGLang merge them.

    >>> sglang_inline_system("{% for m in messages %}{{ m.content }}{% endfor %}")
    True
    >>> sglang_inline_system("{{ messages[0].content }}{{ messages[1].content }}")
    False
    """
    if not source:
        return False
    messages = [*_INLINE_SYSTEM_PROBE[:2], {"role": "system", "content": _SGLANG_SENTINEL},
                _INLINE_SYSTEM_PROBE[3]]  # fmt: skip
    text = _probe_render(source, messages)
    return text is not None and _SGLANG_SENTINEL in text


@lru_cache(maxsize=16)
def _variables(source: str) -> frozenset[str]:
    """The names the template reads without setting them (a template that fails to parse reads
    none: it fails at render, naming why)."""
    import jinja2.meta

    ast = template_ast(source)
    return frozenset() if ast is None else frozenset(jinja2.meta.find_undeclared_variables(ast))
