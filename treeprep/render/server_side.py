"""What the inference server decides for a call besides the messages: the reasoning effort and
the template kwargs it renders the call with, the tools as its models write them
(:mod:`treeprep.render.server_tools`), and whether its Messages endpoint merges an
Anthropic request's inline system messages (each server's rules:
:mod:`treeprep.render.template_kwargs`).

A renderer holds one :class:`ServerSide`. The build sets the server (``--server``) and the
settings the server was started with (``--default-chat-template-kwargs``, vLLM's
``--reasoning-effort-map``); the probes of the template that vLLM runs once (the effort for
thinking turned off, inline system messages) are run once per setting here too.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from treeprep.modes import Server
from treeprep.render.server_tools import SGLANG_NEWEST, Version, template_tools
from treeprep.render.template import ChatTemplate
from treeprep.render.template_kwargs import (
    disabled_thinking_effort,
    llama_cpp_thinking,
    map_effort,
    merges_inline_system,
    sglang_inline_system,
    template_kwargs,
)
from treeprep.schemas import ChatCall

__all__ = ["ServerSide"]


class ServerSide:
    """The server's part in a call's render, for one chat template."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        #: the server the calls were served by (None: not set, no kwargs are handed on)
        self.server: Server | None = None
        #: the server renders this template's calls with Harmony (vLLM, gpt-oss): effort only
        self.harmony = False
        #: the server's default chat-template kwargs and vLLM's effort map (:meth:`set_settings`)
        self.defaults: dict[str, Any] | None = None
        self.effort_map: dict[str, str] | None = None
        self.disabled_effort = "auto"
        self._disabled_effort: str | None = None  # probed once per server and settings
        self._merges_inline_system: bool | None = None  # probed once
        #: the SGLang version whose models' dump of the tools the template got
        self.sglang_version: Version = SGLANG_NEWEST

    def set_server(self, server: Server, *, harmony: bool) -> None:
        """Render for ``server`` (``harmony``: it renders this template with Harmony)."""
        self.server, self.harmony = server, harmony
        self._disabled_effort = self._merges_inline_system = None

    def template_tools(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """The request's ``tools`` as the server hands them to the template
        (:mod:`~treeprep.render.server_tools`); as they are where no server is set or the
        server renders with Harmony (openai_harmony writes them itself)."""
        if self.server is None or self.harmony:
            return tools
        return template_tools(tools, self.server, self.sglang_version)

    def set_settings(
        self,
        defaults: dict[str, Any] | None,
        effort_map: dict[str, str] | None = None,
        disabled_effort: str = "auto",
    ) -> None:
        """Render as a server started with these default chat-template kwargs (vLLM's and
        SGLang's ``--default-chat-template-kwargs``, llama.cpp's ``--chat-template-kwargs``),
        which a request's own override, and with vLLM's ``--reasoning-effort-map`` and
        ``--anthropic-disabled-thinking-effort`` (``auto``: probed)."""
        self.defaults, self.effort_map = defaults or None, effort_map or None
        self.disabled_effort = disabled_effort
        self._disabled_effort = None  # probed with them

    @property
    def merges_inline_system(self) -> bool:
        """Whether the server's Messages endpoint merges an Anthropic request's inline system
        messages into the leading system prompt for this template (probed once, by vLLM's
        probe, :func:`~.template_kwargs.merges_inline_system`, or SGLang's,
        :func:`~.template_kwargs.sglang_inline_system`); llama.cpp's keeps them in place."""
        if self.server not in (Server.vllm, Server.sglang):
            return False
        if self._merges_inline_system is None:
            source = self.template.source
            self._merges_inline_system = (
                merges_inline_system(source)
                if self.server is Server.vllm
                else not sglang_inline_system(source)
            )
        return self._merges_inline_system

    def effort(self, rec: ChatCall) -> str | None:
        """The reasoning effort the server gave ``rec``'s render: the request's, or for one that
        turned thinking off the Anthropic way, the effort vLLM's Messages endpoint was started
        with or probes for (Harmony refuses ``none``: ``low``); on vLLM, through its effort
        map. llama.cpp's endpoint hands the template neither (the reader leaves both out);
        SGLang's is not read."""
        if self.server is not Server.vllm:
            return rec.reasoning_effort
        if not rec.thinking_disabled:
            return map_effort(rec.reasoning_effort, self.effort_map)
        if self._disabled_effort is None:
            if self.disabled_effort != "auto":
                chosen = self.disabled_effort  # the server's: Harmony refuses none
            elif self.harmony:
                chosen = "low"
            else:
                chosen = disabled_thinking_effort(self.template, self.defaults, self.effort_map)
            self._disabled_effort = map_effort(chosen, self.effort_map)
        return self._disabled_effort

    def kwargs(
        self, rec: ChatCall, effort: str | None, now: datetime | None = None
    ) -> dict[str, Any]:
        """The template kwargs ``rec`` renders with at ``effort`` on date ``now`` (none for
        Harmony, which states the effort itself, or before a server is set)."""
        if self.harmony or self.server is None:
            return {}
        thinking = self.llama_cpp_thinking if self.server is Server.llama_cpp else None
        return template_kwargs(
            self.template.source,
            self.server,
            rec.chat_template_kwargs,
            effort,
            self.defaults,
            thinking,
            now,
        )

    @cached_property
    def llama_cpp_thinking(self) -> bool | None:
        """The ``enable_thinking`` llama.cpp seeds this template's render with (probed once:
        :func:`~.template_kwargs.llama_cpp_thinking`)."""

        def render(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
            return self.template.render(messages, None, True, extra=kwargs)

        return llama_cpp_thinking(render)
