"""The forest: every tree's planning columns from every shard, flat, in numpy arrays.

Pass 1 of :mod:`treeprep.pack`. Only the columns the planner and the statistics need are read
(node parents, lengths and depths, sequence end nodes, counts and lengths; of the token ids
only each tree's opening, and a reader that fetches whole trees' ids later), one shard at a
time, and concatenated with per-tree offsets. Per-tree totals (tokens, longest path, attention
pairs) are then segment sums (:func:`treeprep.treeindex.segment_sums`); no per-tree Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from treeprep.errors import ShardError
from treeprep.schemas.manifest import load_manifest
from treeprep.schemas.shard import TREE_SCHEMA, open_shard
from treeprep.treeindex import segment_sums


@dataclass
class Forest:
    """Planning columns of many trees, flattened. Node ids are per tree (pre-order)."""

    shard_names: list[str]
    #: per tree: index into shard_names, row in that shard, group id
    tree_shard: np.ndarray
    tree_row: np.ndarray
    group_id: list[str]
    #: n_trees + 1 offsets into the node arrays / the sequence arrays
    node_off: np.ndarray
    node_parent: np.ndarray
    node_length: np.ndarray
    node_depth: np.ndarray
    seq_off: np.ndarray
    seq_node: np.ndarray
    seq_count: np.ndarray
    seq_length: np.ndarray
    #: other shard columns asked for by the loader
    extra: dict[str, pa.ChunkedArray] = field(default_factory=dict)
    #: per tree, its opening's token ids (:func:`opening_lengths`): ``open_ids[open_off[t]:
    #: open_off[t + 1]]``; None when the loader read no tokens (nothing is counted as shared)
    open_off: np.ndarray | None = None
    open_ids: np.ndarray | None = None
    #: the trees' token ids, read on demand: ``tree_ids(trees)`` yields ``(tree, input_ids)`` for
    #: each of ``trees``, one shard at a time (:class:`ShardIds`); None: nothing is counted shared
    tree_ids: Callable[[np.ndarray], Iterator[tuple[int, np.ndarray]]] | None = None

    @property
    def num_trees(self) -> int:
        return len(self.tree_row)

    def __post_init__(self) -> None:
        self.node_off = np.asarray(self.node_off, dtype=np.int64)
        self.seq_off = np.asarray(self.seq_off, dtype=np.int64)
        for k in ("node_parent", "node_length", "node_depth", "seq_node", "seq_count"):
            setattr(self, k, np.asarray(getattr(self, k), dtype=np.int64))
        self.seq_length = np.asarray(self.seq_length, dtype=np.int64)
        if self.num_trees and (np.diff(self.node_off) < 1).any():
            raise ShardError("a tree with no nodes")
        if (self.open_off is None) != (self.open_ids is None):
            raise ShardError("open_off and open_ids go together")

    def opening(self, t: int) -> np.ndarray:
        """Tree ``t``'s opening tokens (empty when none were read)."""
        if self.open_off is None or self.open_ids is None:
            return np.zeros(0, dtype=np.int32)
        return self.open_ids[self.open_off[t] : self.open_off[t + 1]]

    # per-tree totals, all segment sums
    def node_pairs(self) -> np.ndarray:
        """Attention pairs of each node's tokens: sum over its tokens of (depth + 1)."""
        n, d = self.node_length, self.node_depth
        return n * d + n * (n + 1) // 2

    def tokens_tree(self) -> np.ndarray:
        """Per tree: its tokens (N_tree)."""
        return segment_sums(self.node_length, self.node_off)

    def tokens_linear(self) -> np.ndarray:
        """Per tree: the tokens of its sequences laid out one by one (N_flat)."""
        return segment_sums(self.seq_length * self.seq_count, self.seq_off)

    def pairs_tree(self) -> np.ndarray:
        """Per tree: attention (query, key) pairs of the tree layout."""
        return segment_sums(self.node_pairs(), self.node_off)

    def pairs_linear(self) -> np.ndarray:
        """Per tree: attention pairs of the linear layout."""
        L = self.seq_length
        return segment_sums(L * (L + 1) // 2 * self.seq_count, self.seq_off)

    def longest_path(self) -> np.ndarray:
        """Per tree: tokens on its longest root-to-node path."""
        if not self.num_trees:
            return np.zeros(0, dtype=np.int64)
        return np.maximum.reduceat(self.node_depth + self.node_length, self.node_off[:-1])

    def sequences(self) -> np.ndarray:
        """Per tree: its input sequences, duplicates counted."""
        return segment_sums(self.seq_count, self.seq_off)

    def nodes(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tree ``t``'s (parent, length, depth) arrays (views)."""
        a, b = int(self.node_off[t]), int(self.node_off[t + 1])
        return self.node_parent[a:b], self.node_length[a:b], self.node_depth[a:b]


#: tokens of a tree's opening kept for the sharing count: enough for a system prompt, tool schemas
#: and a policy; sharing past it is not counted (the count is then a lower bound)
OPENING_CAP = 16384


def opening_lengths(
    node_off: np.ndarray, node_parent: np.ndarray, node_length: np.ndarray, cap: int = OPENING_CAP
) -> np.ndarray:
    """Per tree: the tokens of its opening, the chain of nodes from node 0 down to the first node
    with no child or several (pre-order: node v's first child is v + 1), capped at ``cap``. Every
    tree of a micro-batch that shares tokens with another shares them in these chains unless it
    branches inside the shared part or has several roots; the count is exact otherwise."""
    node_off = np.asarray(node_off, dtype=np.int64)
    nt = len(node_off) - 1
    if nt <= 0:
        return np.zeros(0, dtype=np.int64)
    n = len(node_parent)
    tree_of = np.repeat(np.arange(nt), np.diff(node_off))
    has_parent = node_parent >= 0
    kids = np.bincount((node_parent + node_off[tree_of])[has_parent], minlength=n)
    # node i (not its tree's first) ends the chain unless node i - 1 has exactly one child
    prev_kids = np.concatenate([[1], kids[:-1]])
    stop = np.flatnonzero((prev_kids != 1) & (np.arange(n) != node_off[tree_of]))
    stop = np.append(stop, n)
    start, stop_tree = node_off[:-1], node_off[1:]
    end = np.minimum(stop[np.searchsorted(stop, start + 1)], stop_tree)
    cum = np.concatenate([[0], np.cumsum(node_length, dtype=np.int64)])
    return np.minimum(cum[end] - cum[start], cap).astype(np.int64)


@dataclass
class ShardIds:
    """A finished build's token ids, tree by tree, for :attr:`Forest.tree_ids`: the trees asked
    for are read shard by shard, each shard's ``input_ids`` once per call, one shard held at a
    time; each tree's ids are a copy (a caller may keep them without keeping the shard). The
    shards :func:`load_forest` read within :data:`HELD_TOKENS` tokens are kept in ``held``
    (shard -> offsets and ids) and not read again."""

    out_dir: str
    shard_names: list[str]
    tree_shard: np.ndarray
    tree_row: np.ndarray
    held: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __call__(self, trees: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        trees = np.asarray(trees, dtype=np.int64)
        shard = self.tree_shard[trees]
        for s in np.unique(shard).tolist():
            off, vals = self.held.get(s) or self._read(s)
            for t in trees[shard == s].tolist():
                r = int(self.tree_row[t])
                yield t, vals[off[r] : off[r + 1]].astype(np.int64)

    def _read(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        col = open_shard(os.path.join(self.out_dir, self.shard_names[s]), ["input_ids"])
        return _flat(col.column("input_ids"))


#: token ids of a build that :func:`load_forest` keeps for :class:`ShardIds` (a smaller build is
#: read once; a larger one's shards past it are read again when the sharing is counted)
HELD_TOKENS = 1 << 24


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    offs = np.asarray(arr.offsets, dtype=np.int64)
    return offs - offs[0], arr.flatten().to_numpy(zero_copy_only=False)


_PLAN_COLUMNS = [
    "group_id",
    "node_parent",
    "node_length",
    "node_depth",
    "seq_node",
    "seq_count",
    "seq_length",
]


def _openings(ioff: np.ndarray, vals: np.ndarray, noff: np.ndarray, par: np.ndarray,
              ln: np.ndarray) -> tuple:  # fmt: skip
    """One shard's trees' openings: (lengths, their tokens concatenated)."""
    lens = opening_lengths(noff, par, ln)
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    return lens, vals[np.repeat(ioff[:-1], lens) + within].astype(np.int32)


def load_forest(out_dir: str, *, extra: Sequence[str] = (), openings: bool = True) -> Forest:
    """The planning columns of every tree of a finished build; ``extra`` shard columns are kept
    as they are in ``Forest.extra`` (one ChunkedArray each, trees in forest order). With
    ``openings``, each tree's opening tokens too (:func:`opening_lengths`; the shard is read
    whole anyway, so this costs one gather of at most ``OPENING_CAP`` tokens per tree), and a
    :class:`ShardIds` reader of whole trees' ids (the sharing count reads them when it plans)."""
    names = [s.path for s in load_manifest(out_dir).shards]
    extras: dict[str, list] = {k: [] for k in extra}
    parts: dict[str, list] = {k: [] for k in ("shard", "row", "gid", "np", "nl", "nd", "sn", "sc")}
    parts["sl"], parts["ol"], parts["oi"] = [], [], []
    noff = [np.zeros(1, dtype=np.int64)]
    soff = [np.zeros(1, dtype=np.int64)]
    nbase = sbase = held_tokens = 0
    held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, name in enumerate(names):
        cols = _PLAN_COLUMNS + [k for k in extra if k not in _PLAN_COLUMNS]
        if openings and "input_ids" not in cols:
            cols.append("input_ids")
        t = open_shard(os.path.join(out_dir, name), cols)
        n = t.num_rows
        for k in extra:
            extras[k].extend(t.column(k).chunks)
        parts["shard"].append(np.full(n, i, dtype=np.int32))
        parts["row"].append(np.arange(n, dtype=np.int64))
        parts["gid"].extend(t.column("group_id").to_pylist())
        o, v = _flat(t.column("node_parent"))
        parts["np"].append(v)
        if openings:
            ioff, ivals = _flat(t.column("input_ids"))
            ol, oi = _openings(ioff, ivals, o, v, _flat(t.column("node_length"))[1])
            held_tokens += len(ivals)
            if held_tokens <= HELD_TOKENS:
                held[i] = (ioff, ivals)
            parts["ol"].append(ol)
            parts["oi"].append(oi)
        noff.append(o[1:] + nbase)
        nbase += int(o[-1])
        parts["nl"].append(_flat(t.column("node_length"))[1])
        parts["nd"].append(_flat(t.column("node_depth"))[1])
        o, v = _flat(t.column("seq_node"))
        parts["sn"].append(v)
        soff.append(o[1:] + sbase)
        sbase += int(o[-1])
        parts["sc"].append(_flat(t.column("seq_count"))[1])
        parts["sl"].append(_flat(t.column("seq_length"))[1])

    def cat(k: str, dtype: type = np.int64) -> np.ndarray:
        return np.concatenate(parts[k]) if parts[k] else np.zeros(0, dtype=dtype)

    f = Forest(
        shard_names=names,
        tree_shard=cat("shard", np.int32),
        tree_row=cat("row"),
        group_id=parts["gid"],
        node_off=np.concatenate(noff),
        node_parent=cat("np"),
        node_length=cat("nl"),
        node_depth=cat("nd"),
        seq_off=np.concatenate(soff),
        seq_node=cat("sn"),
        seq_count=cat("sc"),
        seq_length=cat("sl"),
    )
    if openings:
        f.open_off = np.concatenate([[0], np.cumsum(cat("ol"))]).astype(np.int64)
        f.open_ids = cat("oi", np.int32)
        f.tree_ids = ShardIds(out_dir, names, f.tree_shard, f.tree_row, held)
    for k in extra:
        typ = TREE_SCHEMA.field(k).type
        f.extra[k] = pa.chunked_array(extras[k], type=typ)
    return f
