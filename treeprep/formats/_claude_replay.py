"""Claude Code: each call's prompt, replayed from its thread once per session, not once per call.

Why
---
A call's prompt is its thread: walk ``parentUuid`` from the line before the call's first line to
the root (a compaction boundary is a root), then replay the lines oldest first into messages
(:class:`Replay` says how). Done whole for every call, that is O(thread) Python per call and
O(N^2) per session: 800 turns took 10.2 s to build, 8.3x the time of 200 turns where linear is
4x (``bench/session_scaling.py``, 2026-12-06), most of it in the replay.

How
---
:class:`Threads` keeps each replay live at its thread's tip (the last line it replayed). The next
call whose thread runs through a tip replays only the lines after it, when the replay so far is
what a whole replay would make at the new call's cut (its first line: a prompt holds only what
was written before it). That holds unless a line written between the two calls changes the
history already replayed:

- a late line of an API response already replayed (a block streamed after the cut);
- a ``tool_result`` of one of its tool calls, or an ``isMeta`` context line hung off a replayed
  line, written after the cut;
- a context line attached off the thread before, that the new thread carries as its own line.

A :class:`Replay` records where the attached lines it took were written (the latest) and where
those it left out for being written at or after its cut were (the earliest): any cut between the
two attaches the same lines, so it sees the same history (:meth:`Replay.fits`, which also checks
the third case). Otherwise, and on a fork or a rewind (a thread that meets no live tip), the
thread is replayed whole, as every call was before. A retry (two calls off the same line) shares
one replay.

Checked: a whole replay runs beside the incremental one on the cross-check schedule
(:class:`~treeprep.crosscheck.CrossCheck`, with a thread's lines for a text's characters: every
call of a file's first 16, then every 64th, spaced further once threads pass
:data:`REFERENCE_LINES` lines). A difference is a bug here, never a bad record:
:class:`~treeprep.errors.ReplayMismatch` ends the file as one ``internal error in adapter``
reject.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from treeprep.crosscheck import CrossCheck
from treeprep.errors import ReplayMismatch
from treeprep.formats._claude_session import (
    Line,
    Pos,
    Session,
    attachment_sent,
    merged_user,
    sent_response,
    user_content,
)
from treeprep.formats._fields import content_parts
from treeprep.formats.anthropic import turn_messages

#: live replays kept per file: the main thread's, plus inline sidechains (Claude Code before
#: 1.0.x) and rewinds that may still go on
MAX_TIPS = 8
#: a thread's length in lines past which cross-checks are spaced out (the schedule's reference)
REFERENCE_LINES = 256


class ChainError(Exception):
    """A ``parentUuid`` link of a thread that cannot be followed (the message says which)."""


@dataclass
class _Turn:
    """The request's last user turn, while it may still grow: where its messages begin, the
    tool results it carries first, and the content of its user lines, merged."""

    at: int
    results: list[dict[str, Any]]
    user: Any = None


class Replay:
    """A thread replayed oldest first into the request Claude Code sends, as a call at ``cut``
    sees it, converted turn by turn into chat messages by the server's Messages endpoint
    (:func:`~treeprep.formats.anthropic.turn_messages`, ``--server``).

    - a compaction boundary (only ever the thread's root) adds no message and marks the thread
      compacted;
    - an assistant line adds its API response once (its lines written before the cut, merged),
      then opens the next user turn with each result of its tool calls written before the cut,
      in file order, once;
    - a user line adds its content (its tool results came with their assistant turn) to that
      turn, as Claude Code sends user messages in a row (one message, the tool results first:
      :func:`~treeprep.formats._claude_session.merged_user`). The turn's messages are made
      again as it grows: vLLM's endpoint puts its ``tool`` messages before its user message,
      llama.cpp's after;
    - after a line, and after each line of a response, come the ``isMeta`` context lines of the
      same file hung off it that are written before the cut and are not on the thread, each once.
      The compaction file's two hook reminders hang off main-session lines whose own thread never
      carries them; they are left out so that the summariser continues the pre-compaction prefix
      exactly.
    """

    def __init__(self, sess: Session, cut: Pos) -> None:
        self.sess = sess
        self.cut = cut
        #: the thread, oldest first
        self.chain: list[Line] = []
        self.messages: list[dict[str, Any]] = []
        #: the id of the last API response in the thread
        self.last_response: str | None = None
        #: the thread's root is a compaction boundary
        self.compacted = False
        #: the first ``isSidechain`` line of the thread
        self.first_sidechain: Line | None = None
        #: the thread's first attachment line that Claude Code sends to the model, and its type
        #: (not replayed yet: the call is rejected)
        self.unreplayed: tuple[Line, str] | None = None
        self._on_chain: set[int] = set()
        self._responses: set[tuple[bool, str | None]] = set()
        self._results: set[tuple[int, bool, str]] = set()
        self._metas: set[int] = set()
        self._turn: _Turn | None = None
        #: where the latest attached line taken was written, and the earliest one left out
        self._taken: Pos | None = None
        self._left: Pos | None = None

    @property
    def tip(self) -> Line | None:
        return self.chain[-1] if self.chain else None

    @property
    def boundary(self) -> str | None:
        """The uuid of the compaction boundary at the thread's root, if it has one."""
        return str(self.chain[0].rec.get("uuid", "")) if self.compacted else None

    def fits(self, cut: Pos, segment: list[Line]) -> bool:
        """Whether going on with ``segment`` at ``cut`` makes what a whole replay would."""
        if self._taken is not None and not self._taken < cut:
            return False
        if self._left is not None and self._left < cut:
            return False
        metas = self._metas
        return not any(id(x) in metas for x in segment)

    def extend(self, segment: list[Line], cut: Pos) -> None:
        """Replay ``segment`` (the lines after :attr:`tip`, oldest first) at ``cut``."""
        self.cut = cut
        self.chain.extend(segment)
        self._on_chain.update(map(id, segment))  # before any line: a later one is not attached
        for ln in segment:
            if self.first_sidechain is None and ln.rec.get("isSidechain"):
                self.first_sidechain = ln
            self._line(ln)

    def _take(self, ln: Line) -> bool:
        """Whether an attached line was written before the cut (and where, for :meth:`fits`)."""
        p = ln.pos
        if p < self.cut:
            if self._taken is None or self._taken < p:
                self._taken = p
            return True
        if self._left is None or p < self._left:
            self._left = p
        return False

    def _line(self, ln: Line) -> None:
        r = ln.rec
        t = r.get("type")
        if t == "system" and r.get("subtype") == "compact_boundary":
            self.compacted = True
            return
        if t == "assistant":
            self._response(ln)
            return
        if t == "attachment" and self.unreplayed is None and (kind := attachment_sent(r)):
            self.unreplayed = (ln, kind)
        if t == "user":
            self._user(user_content(ln), ln)
        self._attach(ln)  # progress/system lines: not seen by the model, but context may hang off

    def _response(self, ln: Line) -> None:
        key = (ln.own, ln.rec["message"].get("id"))
        if key in self._responses:
            self._attach(ln)
            return
        self._responses.add(key)
        sess = self.sess
        lines = [x for x in sess.responses.get(key, [ln]) if self._take(x)]  # type: ignore[arg-type]
        send = partial(sent_response, lines, sess.server, f"line {ln.no}")
        messages, call_ids = sess.made(("a", *map(id, lines)), send)
        self.messages.extend(messages)
        self.last_response = key[1]
        found: list[tuple[Line, dict[str, Any], str]] = []
        for tid in call_ids:
            for rl, blk in sess.results.get(tid, []):
                if self._take(rl):
                    found.append((rl, blk, tid))
        found.sort(key=lambda x: x[0].pos)
        results = []
        for rl, blk, tid in found:
            k = (rl.no, rl.own, tid)
            if k not in self._results:
                self._results.add(k)
                results.append(blk)
        self._turn = None
        if results:
            self._turn = _Turn(len(self.messages), results)
            self._convert(ln)
        for x in lines:
            self._attach(x)

    def _attach(self, ln: Line) -> None:
        u = ln.rec.get("uuid")
        if not isinstance(u, str):
            return
        for m in self.sess.meta_children.get(u, ()):
            if id(m) in self._on_chain or id(m) in self._metas or m.own != ln.own:
                continue
            if self._take(m):
                self._metas.add(id(m))
                self._user(user_content(m), m)

    def _user(self, content: Any, ln: Line) -> None:
        """Add a user line's ``content`` (None: nothing) to the last user turn, or open one."""
        if content is None:
            return
        t = self._turn
        if t is None:
            self._turn = _Turn(len(self.messages), [], content)
        else:
            t.user = content if t.user is None else merged_user(t.user, content)
        self._convert(ln)

    def _convert(self, ln: Line) -> None:
        """Make the last user turn's messages again (``ln``: the line that changed it)."""
        t = self._turn
        assert t is not None
        user = content_parts(t.user) if t.results else t.user  # a string alone stays one
        turn = {"role": "user", "content": [*t.results, *user] if t.results else user}
        where = f"the user turn at line {ln.no}"
        del self.messages[t.at :]
        self.messages.extend(turn_messages(turn, where, self.sess.server))


class Threads:
    """The live replays of one file's threads, by their tip line (see the module docstring)."""

    def __init__(self, sess: Session, file: str) -> None:
        self.sess = sess
        self.file = file
        self._tips: dict[int, Replay] = {}
        self.schedule = CrossCheck(reference=REFERENCE_LINES)
        #: calls whose thread was replayed on from a live tip, and whole
        self.incremental = 0
        self.whole = 0

    def replay(self, first: Line) -> Replay:
        """The replay of the thread before ``first`` (a call's first line), as that call sees it.

        Raises :class:`ChainError` naming a bad link. The replay stays live and goes on with later
        calls: copy what you keep of it."""
        segment, tip = self._walk(first.rec.get("parentUuid"))
        cut = first.pos
        if tip is not None:
            del self._tips[id(tip.tip)]  # it goes on below, or cuts after this one see more
        if tip is not None and tip.fits(cut, segment):
            tip.extend(segment, cut)
            r = tip
            self.incremental += 1
        else:
            r = Replay(self.sess, cut)
            r.extend(tip.chain + segment if tip is not None else segment, cut)
            self.whole += 1
        if self.schedule.due(len(r.chain)) and r is tip:
            self._check(r, first)
        if r.chain:
            self._tips[id(r.tip)] = r
            while len(self._tips) > MAX_TIPS:
                del self._tips[next(iter(self._tips))]
        return r

    def _walk(self, start: str | None) -> tuple[list[Line], Replay | None]:
        """The lines from ``start`` up to a live tip or the root, oldest first, and that tip."""
        out: list[Line] = []
        seen: set[str] = set()
        u = start
        child: Line | None = None
        sess, tips = self.sess, self._tips
        while u:
            if u in seen:
                raise ChainError(f"cycle in parentUuid: uuid {u} is reached twice")
            seen.add(u)
            ln = sess.by_uuid.get(u)
            if ln is None and u in sess.rejected:
                raise ChainError(f"parentUuid {u} is line {sess.rejected[u]}, which is rejected")
            if ln is None:
                where = f"line {child.no}" if child is not None else "the call's first line"
                raise ChainError(
                    f"broken parent chain: parentUuid {u} (from {where}) is not in {self.file}"
                    + (" or its parent session" if child is not None and not child.own else "")
                )
            tip = tips.get(id(ln))
            if tip is not None:
                out.reverse()
                return out, tip
            out.append(ln)
            child = ln
            if ln.rec.get("type") == "system" and ln.rec.get("subtype") == "compact_boundary":
                break  # the thread after a compaction is a new root
            p = ln.rec.get("parentUuid")
            u = p if isinstance(p, str) else None
        out.reverse()
        return out, None

    def _check(self, r: Replay, first: Line) -> None:
        whole = Replay(self.sess, r.cut)
        whole.extend(r.chain, r.cut)
        got = (r.messages, r.last_response, r.compacted, r.first_sidechain, r.unreplayed)
        want = (whole.messages, whole.last_response, whole.compacted, whole.first_sidechain,
                whole.unreplayed)  # fmt: skip
        if got != want:
            pairs = zip(r.messages, whole.messages, strict=False)
            at = next(
                (i for i, (a, b) in enumerate(pairs) if a != b),
                min(len(r.messages), len(whole.messages)),
            )
            raise ReplayMismatch(
                f"{self.file}:{first.no}: the incremental replay of the thread before this call "
                f"differs from a whole replay (first at message {at}): a bug in treeprep"
            )
