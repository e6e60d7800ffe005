"""The packer's view of prefixes shared across trees: what the trainer's merge of a micro-batch's
trees saves, counted exactly from their token ids, and the optional order that puts trees with
long common openings next to each other.

* :func:`shared_per_slot`: the trainer merges the trees of a micro-batch into one forest
  (:mod:`treeprep.pack.share`), so a token that opens several of them, or that they share past
  a branch, is fed once. Per micro-batch of several whole trees, the trees are merged with the
  same trie (:class:`treeprep.pack.share.MergedCount`) and the tokens saved (the trees' tokens
  minus the forest's) are the plan's ``tokens_shared``: what the assembler saves, token for
  token. Hand-off rows run alone, and in ``--cut prefix`` plans the parts of cut trees are left
  out (the count is then a lower bound).
* :func:`prefix_order`: trees sorted by their opening tokens (ties in the seeded order), so
  consecutive trees, hence the trees of one step, share long openings.

Cost: the trees' ids are read from the shards (:attr:`~treeprep.pack.forest.Forest.tree_ids`),
one shard at a time, in passes of at most :data:`PASS_TOKENS` tokens of micro-batches each (a
build that big is read once per pass); one Python step per tree node and per forest node walked,
as the trainer's merge; never per token.
"""

from __future__ import annotations

import numpy as np

from treeprep.pack.forest import Forest
from treeprep.pack.share import MergedCount

#: tree tokens of the micro-batches counted in one pass over the shards: the tries (int64 ids)
#: held at once are at most this many tokens
PASS_TOKENS = 1 << 25


def shared_per_slot(
    forest: Forest, trees: np.ndarray, slots: np.ndarray, pass_tokens: int = PASS_TOKENS
) -> np.ndarray:
    """Per slot id ``0..slots.max()``: the tokens fed once instead of once per tree when the
    whole trees ``trees`` run in micro-batches ``slots`` (one slot id per tree; the trees of a
    slot are merged). Zeros when the forest has no token ids."""
    trees, slots = np.asarray(trees, dtype=np.int64), np.asarray(slots, dtype=np.int64)
    n = int(slots.max()) + 1 if len(slots) else 0
    out = np.zeros(n, dtype=np.int64)
    if forest.tree_ids is None:
        return out
    many = np.bincount(slots, minlength=n)[slots] >= 2
    trees, slots = trees[many], slots[many]
    slot_tok = np.bincount(slots, weights=forest.tokens_tree()[trees], minlength=n).astype(np.int64)
    chunk = (np.cumsum(slot_tok) - slot_tok) // max(pass_tokens, 1)  # per slot, its pass
    for c in np.unique(chunk[slots]).tolist():
        sel = chunk[slots] == c
        slot_of = dict(zip(trees[sel].tolist(), slots[sel].tolist(), strict=True))
        merged = {s: MergedCount() for s in slot_of.values()}
        for t, ids in forest.tree_ids(trees[sel]):
            par, ln, _ = forest.nodes(t)
            off = np.cumsum(ln) - ln  # a tree's nodes are contiguous in pre-order
            merged[slot_of[t]].add(ids, par, off, ln)
        for s, m in merged.items():
            out[s] = slot_tok[s] - m.tokens
    return out


def shared_tokens(forest: Forest, trees: np.ndarray, slots: np.ndarray) -> int:
    """Tokens fed once instead of once per tree over every micro-batch
    (:func:`shared_per_slot`, summed)."""
    return int(shared_per_slot(forest, trees, slots).sum())


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
