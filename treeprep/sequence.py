"""A rendered training sequence: what one call or rollout becomes before it enters a trie."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Sequence:
    """Token ids of one call (prompt + completion) and what is trained in it.

    ``loss_spans`` are half-open ``(start, end)`` spans of trained tokens (offsets in the whole
    sequence).
    ``logprobs`` are the sampler's log-probs of the trained tokens, in order, or None;
    ``ref_logprobs`` likewise the reference policy's. ``trajectory_id`` names the sample (one
    agent run) the call belongs to, within its group.

    Shared prefixes: a sequence may hold only the tokens after the first ``prefix_len`` tokens of
    an earlier sequence of its group, ``prefix`` (a row of the same work file in a work file, a
    position in the list :func:`treeprep.trie.build_tree` gets). The turns of one conversation
    share their history, so a record of N turns costs its work file O(N) tokens, not O(N^2).
    ``prefix == -1`` (the default): ``tokens`` is the whole sequence.
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
    trajectory_id: str = ""
    ref_logprobs: np.ndarray | None = None  # float32, one per trained token
    order: int = 0  # input order within the group (set by the builder)
    extra: dict = field(default_factory=dict)
    prefix: int = -1  # the sequence whose first prefix_len tokens come before tokens (-1: none)
    prefix_len: int = 0

    def __post_init__(self) -> None:
        self.tokens = np.ascontiguousarray(self.tokens, dtype=np.int32)
        n = self.length
        for a, b in self.loss_spans:
            if not 0 <= a <= b <= n:
                raise ValueError(f"loss span ({a}, {b}) outside a sequence of {n} tokens")
        if self.logprobs is not None:
            self.logprobs = np.ascontiguousarray(self.logprobs, dtype=np.float32)
            k = sum(b - a for a, b in self.loss_spans)
            if len(self.logprobs) != k:
                raise ValueError(f"{len(self.logprobs)} log-probs for {k} trained tokens")
        if self.ref_logprobs is not None:
            self.ref_logprobs = np.ascontiguousarray(self.ref_logprobs, dtype=np.float32)
            k = sum(b - a for a, b in self.loss_spans)
            if len(self.ref_logprobs) != k:
                raise ValueError(f"{len(self.ref_logprobs)} reference log-probs for {k} tokens")

    @property
    def length(self) -> int:
        """Tokens in the whole sequence (its shared prefix included)."""
        return self.prefix_len + len(self.tokens)

    def key(self) -> tuple:
        """Identity for merging exact duplicates: tokens, spans, reward, advantage, log-probs,
        reference log-probs and trajectory (copies from two samples stay two entries, so each
        sample keeps its share of a group's advantage normalization)."""
        lp = None if self.logprobs is None else self.logprobs.tobytes()
        ref = None if self.ref_logprobs is None else self.ref_logprobs.tobytes()
        return (
            self.tokens.tobytes(),
            tuple(self.loss_spans),
            self.reward,
            self.advantage,
            lp,
            ref,
            self.trajectory_id,
        )


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many first ids two token arrays share.

    Two views of the same memory from the same first id hold the same ids over their common
    length, so that answer costs O(1): the encoder hands out a session's sequences as views of
    one buffer (:mod:`treeprep.render.encoder`), and comparing each call's whole history with the
    last one's, id by id, made a build's CPU quadratic in a session's length. Other arrays are
    compared in one vectorized pass.

    >>> ids = np.arange(6, dtype=np.int32)
    >>> common_prefix(ids, ids[:4]), common_prefix(ids, np.array([0, 1, 7], np.int32))
    (4, 2)
    """
    m = min(len(a), len(b))
    if m and _same_memory(a, b):
        return m
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def is_prefix(head: np.ndarray, ids: np.ndarray) -> bool:
    """Whether ``ids`` starts with ``head`` (the same memory: O(1); see :func:`common_prefix`)."""
    k = len(head)
    if k > len(ids):
        return False
    return k == 0 or _same_memory(head, ids) or bool(np.array_equal(ids[:k], head))


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` read the same memory from their first element on, alike."""
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.dtype == b.dtype
        and a.strides == b.strides
    )
