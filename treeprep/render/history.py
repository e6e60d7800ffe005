"""A session's shared history, normalized once and rendered once.

Why
---
Call k of an agent session sends the whole history again: its messages are call k-1's plus the
last completion and its tool results. Normalizing every message of every call
(:func:`~treeprep.render.messages.normalize_message`) and rendering the whole history with a
native port on every call (three times: the full sequence, the generation prompt and the previous
turn) made a build's CPU quadratic in the session's length: 4x the turns cost 13-16x the CPU.
Here each message is normalized once, and the text of a known prefix is extended by the text of
the appended messages, so a call costs what it appends (plus C-speed list and string copies).

What the caches are keyed by
----------------------------
- :class:`NormalizedHistory` keeps the last call's prompt :class:`~treeprep.schemas.Message`
  objects and their template dicts. A call reuses the dicts of the messages it begins with that
  are *the same objects* (identity, not equality: ``1 == True`` in a tool call's arguments would
  render differently), up to the first that is not: a call need not go on from the last one
  whole (Aider sends the chat's files after the history, SWE-agent elides an old output in each
  call, a retry goes back). The adapters hand out the same validated objects for the messages
  a history shares with the last one (:func:`treeprep.formats._fields.make_call`, within one
  input file). Records are not changed in place after they are read, except by the build's
  curation (:mod:`treeprep.build.curate`), which runs on each call before it renders and is
  idempotent: a shared message is rewritten by the first call that carries it, before its first
  render, and left as it is by the later ones.
- :class:`RenderedPrefixes` keeps the last few texts a native port rendered, each with its
  template dicts (identity again: the dicts of :class:`NormalizedHistory` are only read) and its
  tools (by their JSON text, compared exactly; tools holding a non-finite number are not cached,
  as orjson writes it as ``null``). Only ports that declare the prefix property extend a text
  (:attr:`~treeprep.render.native.NativeTemplate.extend`); the renderer's cross-check against the
  jinja template (:mod:`treeprep.crosscheck`) covers extended texts like whole ones. A call is
  extended from the longest kept text whose messages all begin it; when none does, from the one
  that shares the most messages with it, whose turns after those are cut off first.
"""

from __future__ import annotations

import math
from typing import Any

from treeprep.io.jsonparse import json_key
from treeprep.modes import Server
from treeprep.render.gaps import SYSTEM_ROLES
from treeprep.render.llama_caps import merge_system
from treeprep.render.messages import normalize_message
from treeprep.render.native import NativeTemplate
from treeprep.render.text_parts import VLLM_STRINGS, TextParts, flattened_kind
from treeprep.schemas import Message
from treeprep.schemas.records import ArgumentsJson, shared_prefix, starts_with

#: texts kept by :class:`RenderedPrefixes` (a call renders three: full, prompt, previous turn)
KEEP = 4


class NormalizedHistory:
    """The template dicts of a call's prompt messages, reusing the last call's for the messages
    it shares with it (see the module docstring), each normalized by the server's rule ``parts``
    (:mod:`treeprep.render.text_parts`)."""

    def __init__(self, parts: TextParts = VLLM_STRINGS) -> None:
        self.parts = parts
        self._source: list[Message] = []
        self._dicts: list[dict[str, Any]] = []
        self._returned: list[dict[str, Any]] = []
        self._n_returned = 0
        self._first_system = -1  # the index of the first system-role dict (-1: none)
        self._first_parts = -1  # the index of the first message of several text parts (-1: none)
        #: the arguments' wire format the dicts were made with
        self._wire: ArgumentsJson | None = None

    def messages(
        self, messages: list[Message], wire: ArgumentsJson | None = None
    ) -> list[dict[str, Any]]:
        """``[normalize_message(m, f"messages[{i}]", self.parts) ...]`` of
        ``messages`` (``wire``: how the request wrote arguments logged as objects), with a
        leading system message merged as llama.cpp does for a template that takes none
        (:func:`~treeprep.render.llama_caps.merge_system`); :class:`~treeprep.errors.RenderError`
        as they raise it."""
        if wire != self._wire:
            self.clear()
            self._wire = wire
        k = shared_prefix(messages, self._source)
        out = self._dicts[:k]
        first = self._first_system if self._first_system < k else -1
        multi = self._first_parts if self._first_parts < k else -1
        index, caps = self.parts.server is Server.sglang, self.parts.caps
        for i in range(k, len(messages)):
            m = messages[i]
            d = normalize_message(m, f"messages[{i}]", self.parts, raw_arguments=self.parts.harmony,
                                  wire=wire, call_index=index, llama=caps)  # fmt: skip
            if first < 0 and d.get("role") in SYSTEM_ROLES:
                first = i
            if multi < 0 and isinstance(m.content, list) and len(m.content) > 1:
                multi = i
            out.append(d)
        self._source, self._dicts, self._first_system = list(messages), out, first
        self._first_parts = multi
        merged = merge_system(out, caps) if caps is not None else out
        self._returned = list(out) if merged is out else merged
        self._n_returned = len(self._returned)
        return self._returned

    def _is_last(self, msgs: list[dict[str, Any]]) -> bool:
        """Whether ``msgs`` is the list :meth:`messages` returned last, unchanged since."""
        return msgs is self._returned and len(msgs) == self._n_returned

    def has_system(self, msgs: list[dict[str, Any]]) -> bool | None:
        """Whether ``msgs``, the list :meth:`messages` returned last and unchanged since, has a
        system (or developer) message; None for any other list (not known here)."""
        return self._first_system >= 0 if self._is_last(msgs) else None

    def marks(self, msgs: list[dict[str, Any]]) -> tuple[str, ...]:
        """The normalized kinds of ``msgs``, the list :meth:`messages` returned last and unchanged
        since (none for any other list): a message logged as several parts (given to the template
        as :attr:`parts` says)."""
        if not self._is_last(msgs) or self._first_parts < 0:
            return ()
        return (flattened_kind(self.parts.server),)

    def clear(self) -> None:
        self._source, self._dicts, self._returned, self._first_system = [], [], [], -1
        self._n_returned = 0
        self._first_parts = -1


def _tools_key(tools: list[dict[str, Any]] | None) -> bytes | None:
    """The tools' JSON text (None: not cacheable)."""
    key = json_key(tools)
    if key is None:
        return None
    if b"null" in key and _non_finite(tools):
        return None
    return key


def _non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


class RenderedPrefixes:
    """A native port's renders, each extended from the kept text whose messages begin the
    conversation, or else from the one that shares the most messages with it (see the module
    docstring)."""

    def __init__(self, port: NativeTemplate) -> None:
        self.port = port
        #: (template dicts, tools key, text without the generation prompt), newest last
        self._texts: list[tuple[list[dict[str, Any]], bytes, str]] = []

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
    ) -> str:
        """``port.render(messages, tools, gen)``; raises as the port does."""
        port = self.port
        if port.extend is None or not messages:
            return port.render(messages, tools, gen)
        key = _tools_key(tools)
        text = None
        if key is not None:
            best, shared = self._closest(messages, key)
            if best is not None:
                old, _, kept = best
                same = shared == len(old) == len(messages)
                text = kept if same else port.extend(kept, old, messages, shared, tools)
        if text is None:
            text = port.render(messages, tools, False)
        if key is not None:
            self._texts.append((list(messages), key, text))
            del self._texts[:-KEEP]
        return text + port.generation_prompt if gen else text

    def _closest(
        self, messages: list[dict[str, Any]], key: bytes
    ) -> tuple[tuple[list[dict[str, Any]], bytes, str] | None, int]:
        """The kept text (of the same tools) to extend, and how many messages it shares with
        ``messages``: the longest whose messages all begin ``messages`` (one identity check per
        text that fails, as its last message is checked first), else the one sharing the most
        (the fewest kept to cut at a tie); (None, 0) when none shares the first message."""
        same = [kept for kept in self._texts if kept[1] == key]
        for kept in sorted(same, key=lambda kept: len(kept[0]), reverse=True):
            if starts_with(messages, kept[0]):
                return kept, len(kept[0])
        best, shared = None, 0
        for kept in same:
            j = shared_prefix(messages, kept[0])
            if j > shared or (j == shared and best is not None and len(kept[0]) < len(best[0])):
                best, shared = kept, j
        return (best, shared) if shared else (None, 0)

    def clear(self) -> None:
        self._texts.clear()
