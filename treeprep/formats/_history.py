"""A session's history converted to chat messages once, however many calls send it again.

An agent sends its whole history with every call, so a reader that converts every call's history
afresh does O(N^2) work over a session of N calls, and hands :func:`~treeprep.formats._fields.
make_call` new dicts each time, so each message is validated again and the renderer cannot tell
that the history is shared (Codex: 800 generated turns took 34.8 CPU-seconds, 15.4x the time of
200 turns; ``bench/session_scaling.py``).

:class:`ConvertedHistory` keeps what it converted and, at each call, converts only the entries the
history gained. The history must begin with the very entries converted last time (by identity,
:func:`~treeprep.schemas.records.starts_with`, in C); any other history (a compaction replaced
it, a rewind cut it, an entry went in before its end) is converted afresh. Entries at the end
whose message later entries may still change (an assistant turn that may go on) are converted
again together with the next ones: the converter says how many (:class:`Converted`).

A converter that makes one message of each entry from that entry alone, leaving none open, may
say so (``per_entry``): then a history that leaves the converted one keeps the messages of the
entries both begin with (:func:`~treeprep.schemas.records.shared_prefix`) and converts only the
rest. Aider's requests need it: each sends the history, then the files and a reminder that the
next one sends after more history.

The messages are the same dicts call after call and are never changed once made (the readers'
contract of :func:`~treeprep.formats._fields.make_call`), so make_call validates each once and
the renderer knows the shared history by identity. A converter that raises leaves what was
converted as it was: a call whose history cannot be converted is rejected, and so is the next
one, as when each converted its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import compress
from operator import is_not
from typing import Any, Generic, NamedTuple, TypeVar

from treeprep.io.jsonparse import json_keys
from treeprep.schemas.records import shared_prefix, starts_with

T = TypeVar("T")


class Converted(NamedTuple):
    """What a converter made of some entries of a history: their messages, and how many of the
    last entries made the last ``open_messages`` messages that later entries may change."""

    messages: list[dict[str, Any]]
    open_entries: int = 0
    open_messages: int = 0


#: a converter: (entries, the index of the first of them in the history) -> what it made of them
Convert = Callable[[list[T], int], Converted]


class ConvertedHistory(Generic[T]):
    """The chat messages of a growing history (module docstring).

    >>> h = ConvertedHistory(lambda xs, at: Converted([{"role": "user", "content": x} for x in xs]))
    >>> history = ["a", "b"]
    >>> [m["content"] for m in h.update(history)]
    ['a', 'b']
    >>> first = h.messages[0]
    >>> history.append("c")
    >>> [m["content"] for m in h.update(history)], h.messages[0] is first, h.roles["user"]
    (['a', 'b', 'c'], True, 3)
    """

    def __init__(self, convert: Convert[T], *, per_entry: bool = False) -> None:
        self._convert = convert
        #: the converter makes one message of each entry from that entry alone (module docstring)
        self.per_entry = per_entry
        self.entries: list[T] = []
        self.messages: list[dict[str, Any]] = []
        #: how many messages have each role
        self.roles: Counter[Any] = Counter()
        self._open = Converted([])

    def reset(self) -> None:
        self.entries, self.messages, self.roles = [], [], Counter()
        self._open = Converted([])

    def update(self, history: list[T]) -> list[dict[str, Any]]:
        """The messages of ``history``, converting what it gained since the last update; raises
        what the converter raises. Returns :attr:`messages`, which the next update changes: copy
        what you keep."""
        if self.entries and not starts_with(history, self.entries):
            if self.per_entry:
                self._keep(shared_prefix(history, self.entries))
            else:
                self.reset()
        r = len(self.entries) - self._open.open_entries
        made = self._convert(history[r:], r)
        if self.per_entry and (len(made.messages) != len(history) - r or made.open_entries):
            raise ValueError("a per_entry converter makes one closed message of each entry")
        drop = self._open.open_messages
        if drop:
            self.roles.subtract(m.get("role") for m in self.messages[-drop:])
            del self.messages[-drop:]
        self.messages.extend(made.messages)
        self.roles.update(m.get("role") for m in made.messages)
        self.entries.extend(history[len(self.entries) :])
        self._open = made
        return self.messages

    def _keep(self, n: int) -> None:
        """Forget all but the first ``n`` entries and their messages (``per_entry`` only)."""
        self.roles.subtract(m.get("role") for m in self.messages[n:])
        del self.entries[n:], self.messages[n:]


class ParsedHistory:
    """Each call's prompt messages when every call's entries are parsed apart (new objects each
    time), converting only those it does not share with the last call's.

    A SWE-agent ``.traj`` holds every step's messages whole, and a Gemini CLI telemetry record
    every request's contents: converting each call's afresh is quadratic in the session (400
    SWE-agent steps: 168k messages converted). An entry that is the last prompt's at its
    position (the same object, or one of the same JSON text) stands as that one, and
    :class:`ConvertedHistory` keeps the messages of the entries both prompts begin with.
    ``convert(entries, at, where)`` makes the messages of ``entries``, the first at index ``at``
    of the list named ``where`` (its errors name both)."""

    def __init__(
        self, convert: Callable[[list[Any], int, str], Converted], *, per_entry: bool = False
    ) -> None:
        self._raw: list[Any] = []
        self._blobs: list[bytes | None] = []
        self._where = ""
        self._history: ConvertedHistory[Any] = ConvertedHistory(
            lambda entries, at: convert(entries, at, self._where), per_entry=per_entry
        )

    def messages(self, raw: list[Any], where: str) -> list[dict[str, Any]]:
        """``raw`` converted; raises what the converter raises."""
        blobs = json_keys(raw, self._raw, self._blobs)
        same = list(raw)
        for i in compress(range(min(len(raw), len(self._raw))), map(is_not, raw, self._raw)):
            if blobs[i] is not None and blobs[i] == self._blobs[i]:
                same[i] = self._raw[i]
        self._raw, self._blobs, self._where = same, blobs, where
        return list(self._history.update(same))
