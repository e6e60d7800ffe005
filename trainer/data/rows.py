"""Rows: a planned part, or one sequence, as a small tree in the shard's row format.

* :func:`part_row` rebuilds a part as a small tree: its recomputed prefix nodes plus its own nodes
  (pre-order ids ascending, so parents still precede children), node ids renumbered,
  ``node_last`` recomputed, and only the part's ``seqs``. Depths are kept, so positions are those
  of the whole tree.
* :func:`sequence_rows` lays every copy of some sequences out as its own one-node tree: the items
  of the linear layout (the baseline).
* :data:`NULL_ROW` is the row of an empty slot: one token, no sequence, so no target and a zero
  loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from treeprep.errors import ShardError
from treeprep.trainer.data.plans import PartRef
from treeprep.trainer.data.reader import ROW_COLUMNS, SEQ_COLUMNS
from treeprep.treeindex import path_to_root

#: per-sequence columns a part or a single sequence carries over from its tree: the shard's, and
#: the one :func:`~treeprep.trainer.batch.advantages.prepare_row` adds
_SEQ_LISTS = (*SEQ_COLUMNS, "seq_trajectory_tokens")

#: a micro-batch for an empty slot: one token, no sequence, so no target and a zero loss
NULL_ROW: dict[str, Any] = {k: [] for k in ROW_COLUMNS} | {
    "group_id": "<empty slot>",
    "input_ids": [0],
    "node_parent": [-1],
    "node_offset": [0],
    "node_length": [1],
    "node_depth": [0],
    "node_last": [0],
}


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def part_row(tree: dict, part: PartRef) -> dict:
    """The part as a small tree in the shard row format (see the module docstring)."""
    parent = _arr(tree["node_parent"])
    nn = len(parent)
    keep = np.unique(np.concatenate([_arr(part.prefix_nodes), _arr(part.nodes)]))
    seqs = _arr(part.seqs)
    if tree["group_id"] != part.group_id:
        raise ShardError(
            f"{part.shard} row {part.row}: group {tree['group_id']!r}, the plan expects "
            f"{part.group_id!r}; the plan does not match the build"
        )
    if len(keep) and (keep[0] < 0 or keep[-1] >= nn):
        raise ShardError(f"{part.shard} row {part.row}: plan names a node outside the tree")
    n_seq = len(tree["seq_node"])
    if len(seqs) and (seqs.min() < 0 or seqs.max() >= n_seq):
        raise ShardError(f"{part.shard} row {part.row}: plan names a sequence outside the tree")
    if len(keep) == nn and len(seqs) == n_seq:
        return tree
    new_id = np.full(nn, -1, dtype=np.int64)
    new_id[keep] = np.arange(len(keep))
    p_old = parent[keep]
    p_new = np.where(p_old >= 0, new_id[np.maximum(p_old, 0)], -1)
    if ((p_old >= 0) & (p_new < 0)).any():
        raise ShardError(
            f"{part.shard} row {part.row}: plan part {part.nodes[:4]}... is not connected to its "
            "prefix; the plan does not match the build"
        )
    offset, length = _arr(tree["node_offset"]), _arr(tree["node_length"])
    ids = np.asarray(tree["input_ids"], dtype=np.int64)
    ln = length[keep]
    idx = np.repeat(offset[keep] - np.concatenate([[0], np.cumsum(ln)[:-1]]), ln) + np.arange(
        int(ln.sum())
    )
    last = np.arange(len(keep))
    pl = p_new.tolist()
    ll = last.tolist()
    for v in range(len(keep) - 1, -1, -1):
        p = pl[v]
        if p >= 0 and ll[v] > ll[p]:
            ll[p] = ll[v]
    seq_node = new_id[_arr(tree["seq_node"])[seqs]] if len(seqs) else np.zeros(0, np.int64)
    if (seq_node < 0).any():
        raise ShardError(
            f"{part.shard} row {part.row}: a sequence of the part ends outside it; the plan "
            "does not match the build"
        )
    sl = seqs.tolist()
    return {
        "group_id": tree["group_id"],
        "input_ids": ids[idx],
        "node_parent": p_new,
        "node_offset": np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64),
        "node_length": ln,
        "node_depth": _arr(tree["node_depth"])[keep],
        "node_last": np.asarray(ll, dtype=np.int64),
        "seq_node": seq_node,
        "seq_count": _arr(tree["seq_count"])[seqs] if len(seqs) else np.zeros(0, np.int64),
        **{k: [tree[k][s] for s in sl] for k in _SEQ_LISTS if k in tree},
        **({"advantage_error": tree["advantage_error"]} if "advantage_error" in tree else {}),
    }


def sequence_rows(tree: dict, seqs: Sequence[int]) -> list[dict]:
    """Every copy of the given sequences as its own one-node tree (the linear layout's items)."""
    parent = _arr(tree["node_parent"])
    offset, length = _arr(tree["node_offset"]), _arr(tree["node_length"])
    ids = np.asarray(tree["input_ids"], dtype=np.int64)
    out = []
    for s in seqs:
        path = path_to_root(parent, int(tree["seq_node"][s])).tolist()
        toks = np.concatenate([ids[offset[v] : offset[v] + length[v]] for v in path])
        row = {
            "group_id": tree["group_id"],
            "input_ids": toks,
            "node_parent": [-1],
            "node_offset": [0],
            "node_length": [len(toks)],
            "node_depth": [0],
            "node_last": [0],
            "seq_node": [0],
            "seq_count": [1],
            **{k: [tree[k][s]] for k in _SEQ_LISTS if k in tree},
            **({"advantage_error": tree["advantage_error"]} if "advantage_error" in tree else {}),
        }
        out.extend([row] * int(tree["seq_count"][s]))
    return out
