"""Hand-off parts: how a tree larger than the token budget is cut (shared by pack and train).

A tree's tokens are laid out in depth-first pre-order, each node contiguous. A *part* is a
contiguous range ``[a, b)`` of that order with at most ``budget`` tokens. Cuts fall on node
boundaries where a node fits (greedy: a node that does not fit in the current part starts the
next one) and at token boundaries inside a node longer than the budget, so no node or path length
is ever an error.

Why contiguous ranges work. Every token before ``a`` that is an ancestor of some token in the part
is an ancestor of token ``a`` itself (a node's subtree is contiguous in pre-order), so a part's
handed-over prefix is exactly the root-to-``a`` path before ``a``: the keys and values of one
path, ordered by depth. The part's *parent* is the part holding the predecessor of token ``a``
(the token before it in its node, or its parent node's last token); following parents from any
part visits every part that holds a prefix row of it, so executing parts depth-first over this
part tree (children in order) and running each part's backward after all of its descendants'
returns every handed-over gradient to its producer.
"""

from __future__ import annotations

import numpy as np


def handoff_cuts(node_length: np.ndarray, budget: int) -> np.ndarray:
    """Part boundaries ``[0, b1, ..., T]`` for a tree with these pre-order node lengths."""
    if budget < 1:
        raise ValueError("budget must be at least 1 token")
    cuts = [0]
    cur = 0  # tokens in the open part
    pos = 0
    for ln in np.asarray(node_length, dtype=np.int64).tolist():
        if cur + ln <= budget:
            cur += ln
            pos += ln
            continue
        if cur:
            cuts.append(pos)
            cur = 0
        # the node starts a part; cut it at token boundaries while it is too long
        while ln > budget:
            pos += budget
            ln -= budget
            cuts.append(pos)
        cur = ln
        pos += ln
    if cuts[-1] != pos:
        cuts.append(pos)
    return np.asarray(cuts, dtype=np.int64)


def part_parents(
    cuts: np.ndarray, node_start: np.ndarray, node_parent: np.ndarray, node_length: np.ndarray
) -> np.ndarray:
    """For each part, the index of its parent part (-1 for the first); see the module docstring."""
    starts = np.asarray(cuts[:-1], dtype=np.int64)
    ns = np.asarray(node_start, dtype=np.int64)
    node_of = np.searchsorted(ns, starts, side="right") - 1
    first = ns[node_of] == starts
    par = np.asarray(node_parent, dtype=np.int64)[node_of]
    pl = np.asarray(node_length, dtype=np.int64)
    pred = np.where(
        first,
        np.where(par >= 0, ns[np.maximum(par, 0)] + pl[np.maximum(par, 0)] - 1, -1),
        starts - 1,
    )
    out = np.searchsorted(starts, pred, side="right") - 1
    return np.where(pred >= 0, out, -1)
