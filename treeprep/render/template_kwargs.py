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
- **SGLang** (``serving_chat._apply_jinja_template``): ``reasoning_effort`` (the request's, or
  the one its kwargs name), then the kwargs.
- **llama.cpp** (``tools/server/server-common.cpp``): the kwargs, and the request's
  ``reasoning_effort`` among them (forwarded since PR #26941, build b10434, August 2026; earlier
  builds ignore it), but ``none``, which turns thinking off (``enable_thinking`` false) and is
  not forwarded (known from the PR and a reading of build b10453, not from its source here).

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

from functools import lru_cache
from typing import Any

from treeprep.errors import RenderError
from treeprep.modes import Server
from treeprep.render.template import ChatTemplate, template_ast

__all__ = ["disabled_thinking_effort", "merges_inline_system", "template_kwargs"]

#: the efforts vLLM's Messages endpoint tries against ``none`` (``AnthropicEffort``, 0.34)
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")

#: what the renderer gives the template itself, which no request's kwargs replace
_RESERVED = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "strftime_now",
     "chat_template", "tokenize", "continue_final_message"}
)  # fmt: skip


def template_kwargs(
    source: str, server: Server, kwargs: dict[str, Any] | None, effort: str | None
) -> dict[str, Any]:
    """The kwargs ``server`` renders the template ``source`` with, for a request with these
    ``chat_template_kwargs`` and reasoning ``effort`` (empty: the template's defaults).

    >>> t = "{% if enable_thinking is false %}<think></think>{% endif %}{{ reasoning_effort }}"
    >>> template_kwargs(t, Server.vllm, None, "none")
    {'reasoning_effort': 'none', 'enable_thinking': False}
    >>> template_kwargs(t, Server.sglang, {"enable_thinking": False, "x": 1}, None)
    {'enable_thinking': False}
    >>> template_kwargs(t, Server.llama_cpp, None, "none")
    {'enable_thinking': False}
    """
    out = dict(kwargs or {})
    if server is Server.sglang and effort is None:
        effort = out.pop("reasoning_effort", None)
    if server is Server.llama_cpp and effort == "none":
        out.pop("reasoning_effort", None)
        out["enable_thinking"] = False
    elif effort is not None:
        out["reasoning_effort"] = effort
        if server is Server.vllm and "enable_thinking" not in (kwargs or {}):
            out["enable_thinking"] = effort != "none"
    if not out:
        return out
    reads = _variables(source)
    return {k: v for k, v in out.items() if k in reads and k not in _RESERVED}


def disabled_thinking_effort(template: ChatTemplate) -> str:
    """The effort vLLM's Messages endpoint sends ``template`` for a request that turns thinking
    off (``DisabledThinkingEffortResolver``, 0.34, its default ``auto``): ``none``, unless the
    prompt of one user message rendered with ``none`` fails or equals its render with one of
    :data:`ANTHROPIC_EFFORTS` (the template ignores ``none``), then ``low``."""

    def render(effort: str) -> str | None:
        kwargs = template_kwargs(template.source, Server.vllm, None, effort)
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
    if not source:
        return True
    try:
        probe = ChatTemplate(source, bare=True)
        probe.render_variables({"messages": _INLINE_SYSTEM_PROBE, "add_generation_prompt": False})
    except RenderError:
        return True
    return False


@lru_cache(maxsize=16)
def _variables(source: str) -> frozenset[str]:
    """The names the template reads without setting them (a template that fails to parse reads
    none: it fails at render, naming why)."""
    import jinja2.meta

    ast = template_ast(source)
    return frozenset() if ast is None else frozenset(jinja2.meta.find_undeclared_variables(ast))
