"""A rendered training sequence: what one call or rollout becomes before it enters a trie."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Sequence:
    """Token ids of one call (prompt + completion) and what is trained in it.

    ``loss_spans`` are half-open ``(start, end)`` spans of trained tokens (offsets in ``tokens``).
    ``logprobs`` are the sampler's log-probs of the trained tokens, in order, or None.
    """

    group_id: str
    tokens: np.ndarray  # int32, 1-D
    loss_spans: list[tuple[int, int]]
    logprobs: np.ndarray | None = None  # float32, one per trained token
    reward: float | None = None
    advantage: float | None = None
    agent_id: str = "main"
    call_id: str = ""
    source: str = ""  # "file:line"
    source_format: str = ""
    branch_reason: str | None = None
    order: int = 0  # input order within the group (set by the builder)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = np.ascontiguousarray(self.tokens, dtype=np.int32)
        n = len(self.tokens)
        for a, b in self.loss_spans:
            if not 0 <= a <= b <= n:
                raise ValueError(f"loss span ({a}, {b}) outside a sequence of {n} tokens")
        if self.logprobs is not None:
            self.logprobs = np.ascontiguousarray(self.logprobs, dtype=np.float32)
            k = sum(b - a for a, b in self.loss_spans)
            if len(self.logprobs) != k:
                raise ValueError(f"{len(self.logprobs)} log-probs for {k} trained tokens")

    def key(self) -> tuple:
        """Identity for merging exact duplicates: tokens, spans, reward, advantage, log-probs."""
        lp = None if self.logprobs is None else self.logprobs.tobytes()
        return (
            self.tokens.tobytes(),
            tuple(self.loss_spans),
            self.reward,
            self.advantage,
            lp,
        )
