"""The packer's view of prefixes shared across trees: each tree's opening tokens
(:func:`treeprep.pack.forest.opening_lengths`) counted once per micro-batch, and the optional
order that puts trees with long common openings next to each other.

* :func:`shared_tokens`: the trainer merges the trees of a micro-batch into one forest
  (:mod:`treeprep.pack.share`), so a token that opens several of them is fed once. Per micro-batch,
  the whole trees' openings are merged with :func:`treeprep.pack.share.merged_tokens`; the tokens
  saved (openings' tokens minus the merged count) are the plan's ``tokens_shared``. Parts of cut or
  hand-off trees are left out (a hand-off row runs alone; a cut part's prefix is not counted), so
  the count is a lower bound of what the trainer saves, exact for trees that share only within
  their openings.
* :func:`prefix_order`: trees sorted by their opening tokens (ties in the seeded order), so
  consecutive trees, hence the trees of one step, share long openings.

Cost: one Python step per whole tree of a micro-batch holding several; never per token.
"""

from __future__ import annotations

import numpy as np

from treeprep.pack.forest import Forest
from treeprep.pack.share import merged_tokens


def shared_tokens(forest: Forest, trees: np.ndarray, slots: np.ndarray) -> int:
    """Tokens fed once instead of once per tree when the whole trees ``trees`` run in micro-batch
    ``slots`` (one slot id per tree; trees of one slot are merged)."""
    if forest.open_off is None or len(trees) < 2:
        return 0
    order = np.lexsort((trees, slots))
    trees, slots = trees[order], slots[order]
    bounds = np.flatnonzero(np.diff(slots)) + 1
    total = 0
    for group in np.split(trees, bounds):
        if len(group) < 2:
            continue
        ids = [forest.opening(int(t)) for t in group]
        lens = [np.array([len(x)], dtype=np.int64) for x in ids]
        nodes = [np.array([-1], dtype=np.int64)] * len(ids)
        zeros = [np.zeros(1, dtype=np.int64)] * len(ids)
        total += sum(len(x) for x in ids) - merged_tokens(ids, nodes, zeros, lens)
    return total


def prefix_order(forest: Forest, seeded: np.ndarray) -> np.ndarray:
    """The trees of ``seeded`` (a permutation of the trees) sorted by their opening tokens, trees
    with equal openings (or no opening read) in their seeded order."""
    if forest.open_off is None or forest.open_ids is None:
        return seeded
    rank = np.empty(len(seeded), dtype=np.int64)
    rank[seeded] = np.arange(len(seeded), dtype=np.int64)
    big = forest.open_ids.astype(">u4")  # big-endian: bytes compare as the token ids do
    keys = [big[forest.open_off[t] : forest.open_off[t + 1]].tobytes() for t in range(len(rank))]
    return np.array(sorted(range(len(rank)), key=lambda t: (keys[t], rank[t])), dtype=np.int64)
