"""Cutting one large tree into connected parts that each fit a token budget.

Pass 2 of :mod:`treeprep.pack`: Kundu and Misra's bottom-up greedy for bounded-weight tree
partitions, adapted to depth-dependent capacities. Nodes are visited in reverse pre-order; a
node's residual is its own tokens plus its uncut children's residuals. A part whose top is a
child of ``v`` recomputes the path down to ``v``, so its capacity is ``budget - depth(child)``.
When a node's residual plus its depth exceeds the budget, its heaviest children are cut off,
fewest first, and the cut siblings are bundled into as few parts as fit (first-fit decreasing,
:func:`treeprep.binpack.first_fit_decreasing`), so siblings share one recomputed prefix. Every cut
makes a part that recomputes ``depth(child)`` tokens; cutting the fewest and highest children
keeps that recomputation, and hence ERR's gap to POR, small. Roots hang from a virtual root of
depth 0: a tree's roots are split across parts with no recomputation at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treeprep.binpack import first_fit_decreasing
from treeprep.treeindex import children, inherit_down


@dataclass
class TreeCut:
    """Parts of one tree: ``part_of_node[v]`` and, per part, the node whose path it recomputes
    (``-1``: no prefix)."""

    part_of_node: np.ndarray
    prefix_end: np.ndarray


def cut_tree(parent: np.ndarray, length: np.ndarray, depth: np.ndarray, budget: int) -> TreeCut:
    """Cut one tree (pre-order arrays) into connected parts of at most ``budget`` tokens each,
    prefix included. Every root-to-node path must fit in ``budget`` (checked by the caller)."""
    n = len(parent)
    parent = np.asarray(parent, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    depth = np.asarray(depth, dtype=np.int64)
    order, starts, ends = children(parent)  # slot 0 holds the roots
    resid = length.copy()
    top_bundle = np.full(n, -1, dtype=np.int64)
    bundle_prefix: list[int] = []  # per bundle: the node whose path it recomputes (-1 none)

    def settle(v: int) -> None:
        a, b = starts[v + 1], ends[v + 1]
        own = int(length[v]) if v >= 0 else 0
        if a == b:
            return
        kids = order[a:b]
        rs = resid[kids]
        total = own + int(rs.sum())
        cap = budget - (int(depth[v]) if v >= 0 else 0)
        if total > cap:
            o = np.argsort(-rs, kind="stable")
            removed = np.cumsum(rs[o])
            k = int(np.argmax(total - removed <= cap)) + 1  # fewest cuts that fit
            cut = o[:k]
            total -= int(removed[k - 1])
            child_cap = budget - (int(depth[v] + length[v]) if v >= 0 else 0)
            for bundle in first_fit_decreasing(rs[cut], child_cap):
                bid = len(bundle_prefix)
                bundle_prefix.append(v)
                top_bundle[kids[cut[bundle]]] = bid
        if v >= 0:
            resid[v] = total

    for v in range(n - 1, -2, -1):
        settle(v)

    # parts: the bundles plus the main part (uncut roots and what hangs from them)
    main = len(bundle_prefix)
    part = inherit_down(parent, top_bundle, main)
    prefix = np.array(bundle_prefix + [-1], dtype=np.int64)
    # renumber parts by their first node in pre-order
    first = np.full(main + 1, n, dtype=np.int64)
    np.minimum.at(first, part, np.arange(n))
    used = first < n
    ids = np.flatnonzero(used)
    ids = ids[np.argsort(first[ids], kind="stable")]
    new_id = np.full(main + 1, -1, dtype=np.int64)
    new_id[ids] = np.arange(len(ids))
    return TreeCut(part_of_node=new_id[part], prefix_end=prefix[ids])
