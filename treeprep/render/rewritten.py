"""The ``reasoning-dropped`` hint: whether the chat template rewrote a call's history.

A call's previous turn is its history up to the last assistant message, rendered as that call's
own training sequence. When it is not a token prefix of this call's sequence, the template
rendered history differently from how it rendered the completion (Qwen3 drops earlier reasoning
after a new user query, and renders the last completion with an empty think block that its copy
in history lacks), and the trie can say why the sequences branch there
(:mod:`treeprep.render.renderer`).

The previous turn's ids come from the last few calls' sequences, looked up by a hash of their
messages, tools and date (jinja renders cost milliseconds); otherwise they are rendered again (a
native port: tens of microseconds, the encoder reusing the cut of the texts before it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

import numpy as np
import orjson

from treeprep.sequence import is_prefix

__all__ = ["PreviousTurns"]


def _fingerprint(msgs: list[dict], tools: list[dict] | None, now: datetime | None) -> bytes:
    blob = orjson.dumps(
        [msgs, tools, now.isoformat() if now else None], option=orjson.OPT_SORT_KEYS
    )
    return hashlib.blake2b(blob, digest_size=16).digest()


class PreviousTurns:
    """The last ``size`` calls' sequences by fingerprint, and the test of a call against the
    previous turn of its history."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._recent: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def clear(self) -> None:
        self._recent.clear()

    def remember(
        self, msgs: list[dict], tools: list[dict] | None, now: datetime | None, ids: np.ndarray
    ) -> None:
        """A call's whole sequence (``msgs`` with its completion) rendered to ``ids``."""
        key = _fingerprint(msgs, tools, now)
        self._recent[key] = ids
        self._recent.move_to_end(key)
        while len(self._recent) > self.size:
            self._recent.popitem(last=False)

    def rewritten(
        self,
        msgs: list[dict],
        tools: list[dict] | None,
        now: datetime | None,
        full_ids: np.ndarray,
        render: Callable[[list[dict]], np.ndarray | None],
        *,
        look_up: bool,
    ) -> bool:
        """Is the previous turn of ``msgs`` not a token prefix of ``full_ids``? ``render`` gives
        a history's ids (None where it does not render: then there is no hint to give);
        ``look_up`` first looks among the remembered sequences."""
        last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] == "assistant"), -1)
        if last < 0:
            return False
        prev_msgs = msgs[: last + 1]
        prev_ids = self._recent.get(_fingerprint(prev_msgs, tools, now)) if look_up else None
        if prev_ids is None:
            prev_ids = render(prev_msgs)
            if prev_ids is None:
                return False
        return not is_prefix(prev_ids, full_ids)
