"""The forest: every tree's planning columns from every shard, flat, in numpy arrays.

Pass 1 of :mod:`treeprep.pack`. Only the columns the planner and the statistics need are read
(node parents, lengths and depths, sequence end nodes, counts and lengths; no token ids), one
shard at a time, and concatenated with per-tree offsets. Per-tree totals (tokens, longest path,
attention pairs) are then segment sums (:func:`treeprep.treeindex.segment_sums`); no per-tree
Python.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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


def load_forest(out_dir: str, *, extra: Sequence[str] = ()) -> Forest:
    """The planning columns of every tree of a finished build; ``extra`` shard columns are kept
    as they are in ``Forest.extra`` (one ChunkedArray each, trees in forest order)."""
    names = [s.path for s in load_manifest(out_dir).shards]
    extras: dict[str, list] = {k: [] for k in extra}
    parts: dict[str, list] = {k: [] for k in ("shard", "row", "gid", "np", "nl", "nd", "sn", "sc")}
    parts["sl"] = []
    noff = [np.zeros(1, dtype=np.int64)]
    soff = [np.zeros(1, dtype=np.int64)]
    nbase = sbase = 0
    for i, name in enumerate(names):
        cols = _PLAN_COLUMNS + [k for k in extra if k not in _PLAN_COLUMNS]
        t = open_shard(os.path.join(out_dir, name), cols)
        n = t.num_rows
        for k in extra:
            extras[k].extend(t.column(k).chunks)
        parts["shard"].append(np.full(n, i, dtype=np.int32))
        parts["row"].append(np.arange(n, dtype=np.int64))
        parts["gid"].extend(t.column("group_id").to_pylist())
        o, v = _flat(t.column("node_parent"))
        parts["np"].append(v)
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
    for k in extra:
        typ = TREE_SCHEMA.field(k).type
        f.extra[k] = pa.chunked_array(extras[k], type=typ)
    return f
