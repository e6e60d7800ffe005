"""Index arithmetic on trees stored as pre-order parent arrays (numpy only).

A tree here is what a shard row holds: ``parent[v]`` is node v's parent (``-1`` for a root) and
nodes are numbered in DFS pre-order, so every parent comes before its children. Every walk the
pipeline and the trainer need is one of the few below: a root-to-node path (of nodes, or of token
offsets), a sum of per-node values along paths (depths are path sums of lengths, prefix attention
pairs are path sums of pairs), a value inherited down from the nearest labelled ancestor, children
in CSR form, members of each label, and per-tree sums over flat forests. They take plain numpy
arrays (any integer dtype) and return int64 arrays, so a caller with torch tensors converts once at
its boundary.

Trade-off: the downward passes (:func:`path_sums`, :func:`inherit_down`) are one Python loop over
plain lists (a node needs its parent's finished value, which numpy cannot express without a
level-by-level loop); on lists that costs about 0.1 us a node, below a shard read.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def path_to_root(parent: np.ndarray, node: int) -> np.ndarray:
    """Pre-order ids of the path from the root down to ``node`` (root first; empty for -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parent[node])
    return np.array(path[::-1], dtype=np.int64)


def path_offsets(
    parent: np.ndarray, offset: np.ndarray, length: np.ndarray, nodes: Iterable[int]
) -> list[np.ndarray]:
    """Per node of ``nodes``, the offsets of the tokens on its root-to-node path, root first:
    where in the tree's ``input_ids`` the sequence ending at that node lies (node v's tokens are
    ``offset[v]:offset[v] + length[v]``). Memoised over the nodes' shared ancestors, so each
    node's path is built once from its parent's; results may share memory: read-only.

    >>> par, off, ln = np.array([-1, 0, 0]), np.array([0, 2, 3]), np.array([2, 1, 2])
    >>> [p.tolist() for p in path_offsets(par, off, ln, [1, 2])]
    [[0, 1, 2], [0, 1, 3, 4]]
    """
    cache: dict[int, np.ndarray] = {}
    out = []
    for node in nodes:
        chain = []
        v = int(node)
        while v >= 0 and v not in cache:
            chain.append(v)
            v = int(parent[v])
        path = cache[v] if v >= 0 else np.zeros(0, dtype=np.int64)
        for u in reversed(chain):
            o = int(offset[u])
            path = np.concatenate([path, np.arange(o, o + int(length[u]), dtype=np.int64)])
            cache[u] = path
        out.append(path)
    return out


def path_sums(parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per node, the sum of ``values`` over its root-to-node path, the node included.

    >>> path_sums(np.array([-1, 0, 1, 0]), np.array([2, 3, 4, 5])).tolist()
    [2, 5, 9, 7]
    """
    pl = np.asarray(parent).tolist()
    vl = np.asarray(values).tolist()
    out = [0] * len(pl)
    for v, p in enumerate(pl):
        out[v] = vl[v] + (out[p] if p >= 0 else 0)
    return np.array(out, dtype=np.int64)


def depths(parent: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Per node, the tokens above it on its path (its first token's position)."""
    length = np.asarray(length, dtype=np.int64)
    return path_sums(parent, length) - length


def inherit_down(parent: np.ndarray, own: np.ndarray, root_value: int) -> np.ndarray:
    """Per node, ``own[v]`` where it is >= 0, else its parent's result (``root_value`` above a
    root): a label spread down to every node below it, until a node has a label of its own."""
    pl = np.asarray(parent).tolist()
    ol = np.asarray(own).tolist()
    out = [0] * len(pl)
    for v, p in enumerate(pl):
        o = ol[v]
        out[v] = o if o >= 0 else (out[p] if p >= 0 else root_value)
    return np.array(out, dtype=np.int64)


def children(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Children in CSR form: ``order[starts[v + 1]:ends[v + 1]]`` are node v's children in
    ascending id order, and ``order[starts[0]:ends[0]]`` the roots (slot 0 is the virtual root)."""
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    order = np.argsort(parent, kind="stable")
    keys = parent[order]
    starts = np.searchsorted(keys, np.arange(-1, n), side="left")
    ends = np.searchsorted(keys, np.arange(-1, n), side="right")
    return order, starts, ends


def members(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """For each label 0..k-1, the indices holding it, ascending."""
    labels = np.asarray(labels)
    o = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[o], np.arange(k + 1))
    return [o[bounds[p] : bounds[p + 1]] for p in range(k)]


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment ``values[offsets[i]:offsets[i + 1]]``, its sum (0 for an empty segment): the
    per-tree totals of a forest stored flat."""
    if len(offsets) < 2:
        return np.zeros(0, dtype=np.int64)
    if len(values):
        out = np.asarray(np.add.reduceat(values, offsets[:-1]), dtype=np.int64)
    else:
        out = np.zeros(len(offsets) - 1, dtype=np.int64)
    out[np.diff(offsets) == 0] = 0
    return out
