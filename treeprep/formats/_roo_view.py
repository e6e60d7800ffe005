"""Roo Code's view of a task history: the stored messages it sends for a call.

Roo Code keeps every message in ``api_conversation_history.json`` and marks instead of deleting
(read from Roo Code 3.52.1, ``src/core/condense/index.ts`` ``getEffectiveApiHistory`` and
``summarizeConversation``, ``src/core/task/mergeConsecutiveApiMessages.ts``, ``Task.ts``
``attemptApiRequest``):

- **Condensing** appends a summary at the end, a ``user`` message with ``isSummary`` and a
  ``condenseId``, and tags every earlier message that has no ``condenseParent`` with that id. A
  request then starts at the last summary ("fresh start"): what precedes it is not sent, and the
  ``tool_result`` blocks whose ``tool_use`` lies before it are left out (a user message left
  with no block is dropped).
- **Truncating** (the fallback when condensing is off or fails) tags the oldest messages with a
  ``truncationParent`` and *inserts* a marker (``isTruncationMarker``) before the first message
  it keeps. Where the marker lands says nothing of when it was made (the kept messages around it
  were there before it), so which calls it hid messages from is not known: a call with a marker
  in its view is not rebuilt (:func:`sent` gives the reason).
- **Merging:** consecutive ``user`` messages are sent as one, their blocks in order (a later one
  merges into a summary, a summary into nothing, a marker never).

Because a summary is appended, the stored history before a call (``history[:i]``) is the
history Roo Code had when it made that call, tags added later aside; the view of that prefix is
what it sent. A summary that is an ``assistant`` message, or one before which a message is not
tagged, was written by an earlier Roo Code (or a fork) whose view differs; such a call is not
rebuilt either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treeprep.formats._fields import content_parts

#: the fields Roo Code adds to a stored message when it condenses or truncates
MARKS = (
    "isSummary",
    "condenseId",
    "condenseParent",
    "isTruncationMarker",
    "truncationId",
    "truncationParent",
)


def roo_marked(history: list[Any]) -> bool:
    """Whether a stored history carries Roo Code's condense or truncation fields."""
    return any(isinstance(m, dict) and any(k in m for k in MARKS) for m in history)


def _summary_at(history: list[Any], i: int) -> int | None:
    """The index of the last summary before ``i``."""
    return next((j for j in range(i - 1, -1, -1) if history[j].get("isSummary") is True), None)


def _form_why(history: list[Any], start: int) -> str | None:
    """Why a view from the summary at ``start`` is not rebuilt: an earlier Roo Code wrote it
    (None: Roo Code 3.52.1's form, or no summary)."""
    if start and (
        history[start].get("role") != "user"
        or not all(m.get("condenseParent") for m in history[:start])
    ):
        return (
            f"Roo Code condensed the history before this call ([{start}] is its summary), in a "
            "form an earlier Roo Code wrote (a summary from the assistant, or messages before it "
            "left untagged), whose view is not rebuilt"
        )
    return None


def _marker_why(marker: int) -> str:
    """Why a view that holds the truncation marker ``history[marker]`` is not rebuilt."""
    return (
        f"Roo Code truncated the history before this call ([{marker}] is its sliding-window "
        "marker): the marker does not record when it was made, so the messages it hid from "
        "this call are not known"
    )


def _why_not(history: list[Any], start: int, i: int) -> str | None:
    """Why the view from ``start`` to ``i`` cannot be rebuilt (None: it can)."""
    if why := _form_why(history, start):
        return why
    marker = next((j for j in range(start, i) if history[j].get("isTruncationMarker")), None)
    return None if marker is None else _marker_why(marker)


def _uses_in(m: dict[str, Any]) -> set[str]:
    """The ids of the ``tool_use`` blocks of stored message ``m``."""
    if m.get("role") != "assistant" or not isinstance(m.get("content"), list):
        return set()
    return {
        b["id"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    }


def _tool_uses(history: list[Any], start: int, i: int) -> set[str]:
    """The ids of the ``tool_use`` blocks from ``start`` to ``i``."""
    return set().union(*(_uses_in(m) for m in history[start:i]))


def _orphan(block: Any, uses: set[str]) -> bool:
    """Whether ``block`` is a ``tool_result`` whose call is not among ``uses``."""
    if not (isinstance(block, dict) and block.get("type") == "tool_result"):
        return False
    cid = block.get("tool_use_id")
    return not (isinstance(cid, str) and cid in uses)


@dataclass(frozen=True)
class View:
    """The messages Roo Code sent for one call."""

    #: the summary the view starts from (0: none, the whole history)
    start: int
    #: each sent message with the indices of the stored messages it holds (merged: several)
    messages: list[tuple[tuple[int, ...], dict[str, Any]]]
    #: how many leading messages are the very ones of the last view :class:`Views` gave (the
    #: same start); 0 from :func:`sent`, which knows of no other view
    kept: int = 0


def _add(
    out: list[tuple[tuple[int, ...], dict[str, Any]]], j: int, m: dict[str, Any], content: Any
) -> bool:
    """Add stored message ``j`` (``m``, its content filtered) to the view ``out``: merged into
    the last sent message when both are the user's and ``m`` is no summary. True: merged."""
    if out and m.get("role") == "user" == out[-1][1].get("role") and not m.get("isSummary"):
        held, prev = out[-1]
        out[-1] = (
            (*held, j),
            {**prev, "content": [*content_parts(prev.get("content")), *content_parts(content)]},
        )
        return True
    out.append(((j,), {**m, "content": content}))
    return False


def sent(history: list[Any], i: int) -> View | str:
    """What Roo Code sent for the call that stored message ``i`` answers, or why that is not
    known. ``history``'s messages are dicts up to ``i``."""
    summary = _summary_at(history, i)
    start = 0 if summary is None else summary
    if why := _why_not(history, start, i):
        return why
    uses = _tool_uses(history, start, i) if summary is not None else None
    out: list[tuple[tuple[int, ...], dict[str, Any]]] = []
    for j in range(start, i):
        m = history[j]
        content = m.get("content")
        if uses is not None and m.get("role") == "user" and isinstance(content, list):
            content = [b for b in content if not _orphan(b, uses)]
            if not content:
                continue  # only orphaned results: the message is dropped
        _add(out, j, m, content)
    return View(start, out)


class Views:
    """:func:`sent` for the calls of one history in order, each view built on from the last.

    A view grows with the calls, and rebuilding it per call cost time quadratic in the
    history. Here each stored message is taken in once: the tool use ids seen since the last
    summary are kept, and a user message's orphaned results are left out as it arrives. That
    is the view's own rule except for a result stored before its ``tool_use``: Roo Code leaves
    it out until the use arrives, then sends it. When a use arrives whose result was left out,
    the view is rebuilt whole (:func:`sent`) for that call."""

    def __init__(self, history: list[Any]) -> None:
        self.history = history
        self.pos = 0  # the stored messages before it are taken in
        self._begin(0, summary=False)

    def _begin(self, start: int, *, summary: bool) -> None:
        self.start = start
        self.out: list[tuple[tuple[int, ...], dict[str, Any]]] = []
        self.uses: set[str] | None = set() if summary else None
        self.left_out: set[str] = set()  # the ids of the results left out as orphans
        self.stale = False  # a left-out result's use arrived: the view is rebuilt whole
        self.marker: int | None = None
        self.form = _form_why(self.history, start)
        self.kept = 0

    def _take(self, j: int) -> None:
        m = self.history[j]
        if m.get("isSummary") is True:
            self._begin(j, summary=True)
        if self.marker is None and m.get("isTruncationMarker"):
            self.marker = j
        content = m.get("content")
        if self.uses is not None:
            ids = _uses_in(m)
            self.stale = self.stale or bool(ids & self.left_out)
            self.uses |= ids
            if m.get("role") == "user" and isinstance(content, list):
                content = [b for b in content if not _orphan(b, self.uses)]
                self.left_out.update(
                    b["tool_use_id"]
                    for b in m["content"]
                    if _orphan(b, self.uses) and isinstance(b.get("tool_use_id"), str)
                )
                if not content:
                    return
        if _add(self.out, j, m, content):
            self.kept = min(self.kept, len(self.out) - 1)

    def at(self, i: int) -> View | str:
        """What Roo Code sent for the call answered by stored message ``i`` (``i`` never less
        than the last call's), or why that is not known."""
        if i < self.pos:
            raise ValueError(f"views are built in order: {i} comes before {self.pos}")
        for j in range(self.pos, i):
            self._take(j)
        self.pos = i
        if why := self.form or (None if self.marker is None else _marker_why(self.marker)):
            return why
        if self.stale:
            view = sent(self.history, i)
            assert isinstance(view, View)  # the reasons are the ones told above
            self.out, self.stale, self.kept = list(view.messages), False, 0
            self.left_out -= self.uses or set()
        view = View(self.start, list(self.out), self.kept)
        self.kept = len(self.out)
        return view
