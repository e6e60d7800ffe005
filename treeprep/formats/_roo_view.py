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


def _blocks(content: Any) -> list[Any]:
    """A message's content as blocks (``normalizeContentToBlocks``): a string is one text block,
    null none."""
    if isinstance(content, list):
        return content
    return [] if content is None else [{"type": "text", "text": str(content)}]


def _summary_at(history: list[Any], i: int) -> int | None:
    """The index of the last summary before ``i``."""
    return next((j for j in range(i - 1, -1, -1) if history[j].get("isSummary") is True), None)


def _why_not(history: list[Any], start: int, i: int) -> str | None:
    """Why the view from ``start`` to ``i`` cannot be rebuilt (None: it can)."""
    if start and (
        history[start].get("role") != "user"
        or not all(m.get("condenseParent") for m in history[:start])
    ):
        return (
            f"Roo Code condensed the history before this call ([{start}] is its summary), in a "
            "form an earlier Roo Code wrote (a summary from the assistant, or messages before it "
            "left untagged), whose view is not rebuilt"
        )
    marker = next((j for j in range(start, i) if history[j].get("isTruncationMarker")), None)
    if marker is not None:
        return (
            f"Roo Code truncated the history before this call ([{marker}] is its sliding-window "
            "marker): the marker does not record when it was made, so the messages it hid from "
            "this call are not known"
        )
    return None


def _tool_uses(history: list[Any], start: int, i: int) -> set[str]:
    """The ids of the ``tool_use`` blocks from ``start`` to ``i``."""
    return {
        b["id"]
        for m in history[start:i]
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    }


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
        if out and m.get("role") == "user" == out[-1][1].get("role") and not m.get("isSummary"):
            held, prev = out[-1]
            merged = [*_blocks(prev.get("content")), *_blocks(content)]
            out[-1] = ((*held, j), {**prev, "content": merged})
        else:
            out.append(((j,), {**m, "content": content}))
    return View(start, out)
