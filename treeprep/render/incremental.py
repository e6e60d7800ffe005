"""Incremental rendering: append the new messages' text to the cached render of the history.

Why
---
An agent session re-sends its whole history with every call, and a jinja chat template renders all
of it again each time: the cost per call grows with the session, and per session with its square.
Some templates are worse: gpt-oss scans the rest of the conversation for every assistant turn, so
one render is already quadratic. Native ports (:mod:`treeprep.render.native`) make rendering cheap
for the templates they cover; this module is the general speed-up for every other template.

How
---
Most templates are prefix-stable on most appends: the text of ``messages + new`` is the text of
``messages`` followed by the text of ``new``. The renderer keeps the text of recent non-generation
renders, keyed by a hash of (messages, tools, date). For a call whose messages start with a cached
history ``M[:p]`` (usually the previous call's prompt and completion), the new text is found by
rendering a small *window* instead of the whole conversation:

- the window is the head of the conversation (up to the first user message) plus some *blocks*
  of the history (a message and the tool results after it): the first and the last block of
  every distinct shape (role; with or without text, reasoning, tool calls, several calls, tool
  results) before the checkpoint, so that whatever an append does to a kind of earlier message
  it does to one in the window too, and every block since a checkpoint that moves every
  :data:`STEP` blocks (at least two), so that a call's window is the previous call's window plus
  what that call appended: its text is already cached, and each call costs two small renders
  (the prompt and the full sequence);
- the first block of a shape stands for rules about a kind's first message; the last one for
  rules that look ahead ("is there a final answer / a user message after this one?"): gpt-oss
  drops the text of every tool-call turn that a final answer follows, Qwen3 the reasoning of
  turns before the last user message. An append flips such a rule for an earlier message only
  if nothing after it had flipped it yet; then nothing after the last look-alike had either
  (it is no earlier), so the append changes that look-alike's text in the window too. The first
  block alone is not enough: it may already sit before a final answer while a later look-alike
  outside the tail does not, and the append rewrites the later one unseen;
- ``A = render(window)`` and ``B = render(window + new)``; the append is prefix-stable on the
  window when ``B`` starts with ``A``, and then ``B[len(A):]`` is the new text;
- the window must render the blocks since the checkpoint exactly as the full history did (the
  cached text ends with them) and its head as the full history starts;
- the result is ``cached text + new text``.

A call need not go on from a cached history: SWE-agent elides an old output in each call, Aider
sends the chat's files after the history, a retry goes back. Such a call is rendered from the
recent render that shares the most leading messages with it (the same dicts): the window is taken
over the shared messages, ``A`` holds the old conversation's tail after the checkpoint and ``B``
the new one's; both must start with the window's text without a tail, the cached text must end
with ``A``'s tail, and the result is the cached text with that tail cut off and ``B``'s appended.
The probe sessions check this too (:func:`_leavers`); a template that fails them renders such
calls whole, and a window that fails is not tried again for a few calls (:data:`SKIP_LEAVING`).

Any check that fails, or a window the template refuses, means a full render, so the fast path
only ever replaces a render whose result it can vouch for in these terms. Because these checks are
evidence, not a proof (an append could change a message outside the window that has no look-alike
inside it), the result is also compared with a full render on a deterministic sample of the
incremental renders (:mod:`treeprep.crosscheck`: the first 16, then every 64th, spaced
further apart as the text grows past 32k characters), and on probe sessions when the renderer is
built (a template that fails them is never rendered incrementally).
A difference at run time is :class:`~treeprep.errors.NativeTemplateMismatch`, as for the ports.

Cost: the window renders are small and the history's text is copied once per call (C speed). The
cache holds at most :data:`CACHE_CHARS` characters of text.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from treeprep.crosscheck import CrossCheck
from treeprep.errors import NativeTemplateMismatch, RenderError, TemplateLimitError
from treeprep.schemas.records import shared_prefix

if TYPE_CHECKING:
    from treeprep.render.template import ChatTemplate
    from treeprep.schemas import TokenizerIdentity

#: (messages, tools, add_generation_prompt, now) -> text, a full render
FullRender = Callable[[list[dict], list[dict] | None, bool, datetime | None], str]

CACHE_CHARS = 64 << 20
#: histories shorter than this many blocks are rendered in full (the window would be the same)
MIN_BLOCKS = 6
#: the window's tail starts at a block index that moves in steps of this many blocks
STEP = 4
#: calls rendered whole before a conversation that leaves a recent one is tried from it again
SKIP_LEAVING = 8


def _key(msgs: list[dict], tools: list[dict] | None, now: datetime | None) -> bytes:
    blob = orjson.dumps([msgs, tools, now.isoformat() if now else None])
    return hashlib.blake2b(blob, digest_size=16).digest()


def _blocks(msgs: list[dict], start: int, stop: int) -> list[tuple[int, int]]:
    """(begin, end) of each block in ``msgs[start:stop]``: a non-tool message and the tool
    messages after it (leading tool messages form a block of their own)."""
    out: list[tuple[int, int]] = []
    b = start
    for i in range(start + 1, stop):
        if msgs[i].get("role") != "tool":
            out.append((b, i))
            b = i
    if stop > start:
        out.append((b, stop))
    return out


def _shape(msgs: list[dict], block: tuple[int, int]) -> tuple:
    m = msgs[block[0]]
    calls = m.get("tool_calls") or []
    return (
        m.get("role"),
        bool(m.get("content")),
        bool(m.get("reasoning_content")),
        bool(calls),
        len(calls) > 1,
        block[1] - block[0] > 1,
    )


def _window(msgs: list[dict], stop: int) -> tuple[list[dict], list[dict], int] | None:
    """(head, body, start) of the window for the history ``msgs[:stop]``: the head (up to the
    first user message), the first and last block of each shape before the checkpoint, and
    where the tail starts (the checkpoint, which moves every :data:`STEP` blocks, at least two
    from the end, so that a call's window is the last call's plus what it appended: cached);
    None when the history has too few blocks to be worth a window."""
    u = next((i for i, m in enumerate(msgs[:stop]) if m.get("role") == "user"), -1)
    head_end = u + 1 if u >= 0 else 0
    blocks = _blocks(msgs, head_end, stop)
    if len(blocks) < MIN_BLOCKS:
        return None
    cp = ((len(blocks) - 2) // STEP) * STEP
    first: dict[tuple, tuple[int, int]] = {}
    last_of: dict[tuple, tuple[int, int]] = {}
    for b in blocks[:cp]:
        shape = _shape(msgs, b)
        first.setdefault(shape, b)
        last_of[shape] = b
    early = sorted({*first.values(), *last_of.values()})
    body = [m for b in early for m in msgs[b[0] : b[1]]]
    return msgs[:head_end], body, blocks[cp][0]


class IncrementalRenderer:
    """Renders through ``full`` or incrementally (see the module docstring)."""

    def __init__(self, full: FullRender, *, name: str = "the chat template") -> None:
        self.full = full
        self.name = name
        self.enabled = True
        #: whether a conversation that leaves a recent one is rendered from it (:meth:`_leaving`)
        self.leaving = True
        self._texts: OrderedDict[bytes, str] = OrderedDict()
        #: calls left before :meth:`_leaving` is tried again after it failed
        self._skip_leaving = 0
        #: the recent non-generation renders: (messages, key, tools' JSON, date)
        self._recent: deque[tuple[list[dict], bytes, bytes, datetime | None]] = deque(maxlen=4)
        self._chars = 0
        #: renders that fell back to a full render
        self.fallbacks = 0
        #: which incremental renders are compared with a full render (it counts them)
        self.cross_check = CrossCheck()

    # -- the cache -----------------------------------------------------------------------------

    def _get(self, key: bytes) -> str | None:
        text = self._texts.get(key)
        if text is not None:
            self._texts.move_to_end(key)
        return text

    def _put(self, key: bytes, text: str) -> None:
        if key in self._texts or len(text) > CACHE_CHARS // 4:
            return
        self._texts[key] = text
        self._chars += len(text)
        while self._chars > CACHE_CHARS:
            _, old = self._texts.popitem(last=False)
            self._chars -= len(old)

    def clear(self) -> None:
        self._texts.clear()
        self._recent.clear()
        self._skip_leaving = 0
        self._chars = 0

    def _plain(self, msgs: list[dict], tools: list[dict] | None, now: datetime | None) -> str:
        """A cached or full non-generation render."""
        key = _key(msgs, tools, now)
        text = self._get(key)
        if text is None:
            text = self.full(msgs, tools, False, now)
            self._put(key, text)
        return text

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self,
        msgs: list[dict],
        tools: list[dict] | None,
        gen: bool,
        now: datetime | None = None,
        *,
        where: str = "",
    ) -> str:
        """The text of ``msgs``, equal to ``full(msgs, tools, gen, now)``."""
        key = None
        if not gen:
            key = _key(msgs, tools, now)
            text = self._get(key)
            if text is not None:
                return text
        text = self._incremental(msgs, tools, gen, now) if self.enabled else None
        if text is None:
            text = self.full(msgs, tools, gen, now)
        else:
            if self.cross_check.due(len(text)):
                self._check(text, msgs, tools, gen, now, where)
        if key is not None:
            self._put(key, text)
            self._recent.append((list(msgs), key, orjson.dumps(tools), now))
        return text

    def _incremental(
        self, msgs: list[dict], tools: list[dict] | None, gen: bool, now: datetime | None
    ) -> str | None:
        n = len(msgs)
        # the cached history: up to the last assistant message before the end
        p = next((i for i in range(n - 2, -1, -1) if msgs[i].get("role") == "assistant"), -1) + 1
        if p <= 0:
            return None
        cached = self._get(_key(msgs[:p], tools, now))
        if cached is None:
            return self._leaving(msgs, tools, gen, now) if self.leaving else None
        return self._splice(msgs, tools, gen, now, msgs[:p], cached, p, going_on=True)

    def _leaving(
        self, msgs: list[dict], tools: list[dict] | None, gen: bool, now: datetime | None
    ) -> str | None:
        """The text of ``msgs`` from a recent render of a conversation it leaves after a shared
        start (an elided output, Aider's files after the history, a retry): that text with the
        old tail cut off and the new one appended, each the window's text of it (see the module
        docstring), or None."""
        if self._skip_leaving:
            self._skip_leaving -= 1
            return None
        found = self._closest(msgs, tools, now)
        if found is None:
            return None
        old, cached, shared = found
        text = self._splice(msgs, tools, gen, now, old, cached, shared)
        # a window that fails once (a template that renders the window's last turn apart, as
        # gpt-oss ends a final answer) mostly fails on the next calls too: try again later
        self._skip_leaving = 0 if text is not None else SKIP_LEAVING
        return text

    def _splice(
        self,
        msgs: list[dict],
        tools: list[dict] | None,
        gen: bool,
        now: datetime | None,
        old: list[dict],
        cached: str,
        shared: int,
        *,
        going_on: bool = False,
    ) -> str | None:
        """``cached``, the text of ``old``, whose first ``shared`` messages are those of
        ``msgs``, with the tail of ``old`` cut off and that of ``msgs`` appended, each as the
        window renders it; None where the window's checks fail. ``going_on``: ``msgs`` appends
        to ``old``, whose tail must then render in the window as it did (a prefix-stable
        append: ``cached`` is then extended as it stands)."""
        window = _window(msgs, shared)
        if window is None:
            self.fallbacks += 1
            return None
        head, body, start = window
        try:
            a2 = self._plain(head + body, tools, now)
            a = self._plain(head + body + old[start:], tools, now)
            if gen:
                b_text = self.full(head + body + msgs[start:], tools, True, now)
            else:  # cached: the next call's window is this one (see STEP)
                b_text = self._plain(head + body + msgs[start:], tools, now)
            h = self._plain(head, tools, now) if head else ""
        except TemplateLimitError:
            raise  # a full render would break it too: the call is a reject, probing stops
        except RenderError:
            self.fallbacks += 1
            return None
        old_tail = a[len(a2) :]
        ok = (
            a.startswith(a2)
            and b_text.startswith(a if going_on else a2)
            and cached.endswith(old_tail)
            and cached.startswith(h)
            and a2.startswith(h)
            and len(cached) - len(old_tail) >= len(h)
        )
        if not ok:
            self.fallbacks += 1
            return None
        return cached[: len(cached) - len(old_tail)] + b_text[len(a2) :]

    def _closest(
        self, msgs: list[dict], tools: list[dict] | None, now: datetime | None
    ) -> tuple[list[dict], str, int] | None:
        """Of the recent renders (same tools and date) whose text is still cached, the one whose
        messages begin as ``msgs`` does for the most messages (the same dicts: the renderer hands
        a session's shared history as the same objects): (its messages, its text, how many)."""
        best: tuple[list[dict], str, int] | None = None
        tools_json = orjson.dumps(tools)
        for old, key, tools_blob, when in reversed(self._recent):
            if when != now or tools_blob != tools_json:
                continue
            shared = shared_prefix(msgs, old)
            if best is not None and shared <= best[2]:
                continue
            text = self._texts.get(key)
            if text is not None:
                best = (old, text, shared)
        return best

    def _check(
        self,
        text: str,
        msgs: list[dict],
        tools: list[dict] | None,
        gen: bool,
        now: datetime | None,
        where: str,
    ) -> None:
        ref = self.full(msgs, tools, gen, now)
        if ref == text:
            return
        from treeprep.render.template import first_char_difference

        raise NativeTemplateMismatch(
            f"{where or 'a record'}: incremental rendering of {self.name} differs from rendering "
            f"it whole (add_generation_prompt={gen}; at character "
            f"{first_char_difference(text, ref)}): the template is not prefix-stable in a way the "
            "window checks did not see. Build with --no-native-templates to render every call "
            "whole."
        )

    def verify(self, sessions: list[tuple[list[dict], list[dict] | None]]) -> bool:
        """Render each session's growing prefixes incrementally and whole; on any difference, or
        at the first render that breaks a template limit (a hostile template: hundreds of probe
        renders at the time limit each would stall the build for hours), switch incremental
        rendering off. Then the same for conversations that leave the first session's prefixes
        (:func:`_leavers`), switching :attr:`leaving` off on a difference. Returns whether
        incremental rendering stays on."""
        try:
            self._verify(sessions)
            if self.enabled and sessions:
                self._verify_leaving(*sessions[0])
        except TemplateLimitError:
            self.enabled = False
        self.leaving = self.leaving and self.enabled
        self.clear()
        self.cross_check, self.fallbacks = CrossCheck(), 0
        return self.enabled

    def _verify_leaving(self, msgs: list[dict], tools: list[dict] | None) -> None:
        """Every sixth assistant turn of ``msgs``: its history rendered whole and kept as a
        recent render, then each of :func:`_leavers` rendered from it and whole."""
        turns = [i + 1 for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        for i in turns[MIN_BLOCKS::6]:
            self.clear()
            try:
                self.render(msgs[:i], tools, False)
            except RenderError:
                continue  # the template refuses the probe: nothing to render from
            for variant in _leavers(msgs, i):
                for gen in (False, True):
                    found = self._closest(variant, tools, None)
                    try:
                        got = (
                            None
                            if found is None
                            else self._splice(variant, tools, gen, None, *found)
                        )
                    except RenderError:
                        got = None
                    if got is None:
                        continue
                    try:
                        ref: str | None = self.full(variant, tools, gen, None)
                    except RenderError:
                        ref = None  # the template refuses what the window rendered
                    if got != ref:
                        self.leaving = False
                        return

    @property
    def incremental(self) -> int:
        """Renders done incrementally (since :meth:`verify`)."""
        return self.cross_check.renders

    def _verify(self, sessions: list[tuple[list[dict], list[dict] | None]]) -> None:
        for msgs, tools in sessions:
            self.clear()
            for i in range(1, len(msgs) + 1):
                for gen in (False, True):
                    try:
                        got = self._incremental(msgs[:i], tools, gen, None)
                    except TemplateLimitError:
                        raise
                    except RenderError:
                        got = None
                    if got is not None and got != self.full(msgs[:i], tools, gen, None):
                        self.enabled = False
                        return
                if msgs[i - 1].get("role") == "assistant":  # a history later calls start from
                    try:
                        self._put(
                            _key(msgs[:i], tools, None), self.full(msgs[:i], tools, False, None)
                        )
                    except TemplateLimitError:
                        raise
                    except RenderError:
                        pass


def _leavers(msgs: list[dict], i: int) -> list[list[dict]]:
    """Conversations that leave ``msgs[:i]`` after a shared start: an old tool output elided
    and the next turn appended (SWE-agent), the last turn asked again (a retry), and the files
    and their acknowledgement put before the last turn (Aider)."""
    outputs = [j for j in range(i) if msgs[j].get("role") == "tool"]
    out = [
        [*msgs[: i - 2], {"role": "user", "content": "Try again, differently."}],
        [
            *msgs[: i - 1],
            {"role": "user", "content": "Files: a.py"},
            {"role": "assistant", "content": "Ok."},
            msgs[i - 1],
        ],
    ]
    if len(outputs) > 6:
        j = outputs[-6]
        elided = [*msgs[: i + 2]]
        elided[j] = {**msgs[j], "content": "Old environment output: (3 lines omitted)"}
        out.append(elided)
    return out


def probe_sessions() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Agent-like sessions (a system prompt, a task, a long run of plain tool calls, tool-calling
    turns of several shapes, a final answer, a follow-up question, a text call that leaves the
    window's tail before the next final answer) on which incremental rendering must equal whole.
    The long run makes the window much smaller than the history, as in real sessions, so that a
    template reading the history's length is caught at any length from a dozen messages on."""
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a command",
                "parameters": {
                    "type": "object",
                    "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"],
                },
            },
        }
    ]

    def call(i: int, text: str = "", reasoning: str = "", n: int = 1) -> list[dict[str, Any]]:
        m: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": f"c{i}_{k}",
                    "type": "function",
                    "function": {"name": "run", "arguments": f'{{"cmd": "ls {i}"}}'},
                }
                for k in range(n)
            ],
        }
        if reasoning:
            m["reasoning_content"] = reasoning
        res = [
            {"role": "tool", "tool_call_id": f"c{i}_{k}", "content": f"out {i}.{k}"}
            for k in range(n)
        ]
        return [m, *res]

    session: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    shapes = [("", "", 1), ("Looking.", "", 1), ("", "think", 1), ("", "", 2), ("Two.", "", 2)]
    # a long run of one shape, as agents make: the window stays small while the history grows
    for i in range(20):
        session += call(i)
    for i in range(20, 30):
        text, reasoning, n = shapes[i % len(shapes)]
        session += call(i, text, reasoning, n)
    session += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Why?"},
        *call(99, "Checking."),
    ]
    # enough plain calls after the text call that it leaves the window's tail before the final
    # answer (which, in gpt-oss, drops its text): only a look-alike in the window shows that
    for i in range(100, 106):
        session += call(i)
    session.append({"role": "assistant", "content": "Because.", "reasoning_content": "r"})
    plain = [m for m in session if m["role"] != "system"]
    return [(session, tools), (session, None), (plain, tools)]


#: whether incremental rendering stayed on through the probe sessions, per template and
#: tokenizer, in this process: the probe renders each session's prefixes whole and
#: incrementally, seconds for a large template, and the answer depends on these alone
_VERIFIED: dict[tuple[Any, ...], tuple[bool, bool]] = {}


def verified_once(
    inc: IncrementalRenderer, template: ChatTemplate, identity: TokenizerIdentity,
    kwargs: bytes = b"",
) -> bool:  # fmt: skip
    """:meth:`IncrementalRenderer.verify` on the probe sessions, once per template, tokenizer
    and template kwargs (``kwargs``: their JSON, which ``inc``'s renders are given)."""
    key = (
        kwargs,
        template.source,
        template.limits,
        template.date,
        tuple(sorted(template.special_tokens.items())),
        identity.model_dump_json(),
    )
    if key not in _VERIFIED:
        _VERIFIED[key] = (inc.verify(probe_sessions()), inc.leaving)
    enabled, inc.leaving = _VERIFIED[key]
    return enabled
