"""The cross-check schedule: which fast results are compared with the slow reference they stand for.

Its first users were the renderers: which fast renders are compared with a whole jinja render
(below). Claude Code's incremental replay (:mod:`treeprep.formats._claude_replay`) uses the same
schedule with a thread's length in lines for a text's length in characters: a replayed prompt is
compared with a whole replay of its thread.

Why
---
A native port (:mod:`treeprep.render.native`) and the incremental jinja renderer
(:mod:`treeprep.render.incremental`) each stand in for a whole render of the chat template, and
each is compared with one on a deterministic sample of its renders (a difference is
:class:`~treeprep.errors.NativeTemplateMismatch`, naming the record). The sample used to be the
first 16 renders and every 64th after. In an agent session every render holds the whole history,
so its length grows with the turns, and a fixed every-64th check re-renders O(N^2) characters of
jinja over a session of N turns: at 1,600 Pi turns the checks were 3 s of a 12 s build.

The rule
--------
:class:`CrossCheck` checks the first :data:`CHECK_FIRST` renders, then spaces the checks by
length: a check is due once the renders since the last spaced check reach :data:`CHECK_EVERY`
times ``L / REFERENCE_CHARS`` (at least :data:`CHECK_EVERY`), where ``L`` is the smaller of this
render's length and the last checked render's. Texts no longer than :data:`REFERENCE_CHARS` are
checked exactly as before (renders 0-15, then 64, 128, ...).

- In a growing session the interval grows with the text: after a check of ``L`` characters the
  next comes ``CHECK_EVERY * L / REFERENCE_CHARS`` renders later, so the checks fall at lengths
  in a geometric series (ratio ``1 + CHECK_EVERY * u / REFERENCE_CHARS`` for ``u`` characters a
  turn), and a session's checks re-render about ``L_N + N * REFERENCE_CHARS / CHECK_EVERY``
  characters in all: linear in its unique text, where the old rule's were quadratic.
- The smaller of the two lengths, not this render's alone: spacing by this render's length,
  a session growing by more than ``REFERENCE_CHARS / CHECK_EVERY`` characters a turn would outrun
  its own interval and never be checked again; spacing by the last checked length alone, one
  long render would mute the short sessions after it for thousands of renders.

What it keeps: a port bug in one message shows in every later render that holds the message, and
a session's later renders hold all of its history, so the sparser checks of long texts still
re-render every message of a session up to its last check, which is at most the ratio above
from its end (the turns after it go unchecked, as the 63 renders after a check did before). What
it gives up: fewer chances per message, so a construct that is rare in a long session is caught
later, or, near a session's end, not at all. A rare construct in one short session is still
covered by the first :data:`CHECK_FIRST` renders, which count per renderer (per worker process,
not per file) as before. Deterministic: the same renders in the same order are checked on every
run. Sessions interleaved in one stream share one schedule: a short render due before a long one
takes the check, as with the old rule.

``REFERENCE_CHARS`` is 32,768 characters (about 8k tokens): longer than most plain chat calls and
the first turns of an agent session, which keep the old schedule, and small enough that the
spaced checks cost about ``REFERENCE_CHARS / CHECK_EVERY`` = 512 characters of jinja a render on
top of the text's growth, about one short message. Measured on a Pi session of 1,600 turns
(``bench/session_scaling.py``'s shapes, built-in ChatML port): 30 checks of 2.9 M characters in
all, 0.13 CPU-seconds, where the old rule made 90 checks of 29.6 M characters, 1.46 s.
"""

from __future__ import annotations

#: the first renders of a renderer are all checked
CHECK_FIRST = 16
#: then every CHECK_EVERY-th render, for texts no longer than REFERENCE_CHARS
CHECK_EVERY = 64
#: beyond this length the interval between checks grows with the text
REFERENCE_CHARS = 32_768


class CrossCheck:
    """Decides, render by render, whether to compare the render with a whole jinja render.

    >>> c = CrossCheck()
    >>> [k for k in range(200) if c.due(100)]
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 64, 128, 192]
    """

    def __init__(
        self,
        *,
        first: int = CHECK_FIRST,
        every: int = CHECK_EVERY,
        reference: int = REFERENCE_CHARS,
    ) -> None:
        if first < 0 or every < 1 or reference < 1:
            raise ValueError(f"CrossCheck(first={first}, every={every}, reference={reference})")
        self.first = first
        self.every = every
        self.reference = reference
        #: renders seen, renders checked, and the characters of the checked renders
        self.renders = 0
        self.checks = 0
        self.checked_chars = 0
        #: renders since the last spaced check (this one included), and that check's length
        self._since = 0
        self._last_chars = 0

    def due(self, n_chars: int) -> bool:
        """Whether this render, of ``n_chars`` characters, is to be checked (see the module
        docstring). Call it once per render, in order."""
        k = self.renders
        self.renders = k + 1
        self._since += 1
        span = max(min(n_chars, self._last_chars), self.reference)
        spaced = k == 0 or self._since * self.reference >= self.every * span
        if spaced:
            self._since = 0
            self._last_chars = n_chars
        if not (spaced or k < self.first):
            return False
        self.checks += 1
        self.checked_chars += n_chars
        return True
