"""Prefixes shared across the trees of one micro-batch: the trees merged into one forest.

Trees packed into one micro-batch often open with the same tokens (the agent's system prompt, the
tool schemas, a domain policy). Laid out one after the other, every tree recomputes them. Merged,
the micro-batch is one forest: a token trie over every tree's root-to-node paths, in which a node
is split at the first token where two trees differ, so each shared opening is fed once::

    tree A:  [SYS TOOLS] -> [task a ...]            forest:  [SYS TOOLS] -> [task a ...]
    tree B:  [SYS TOOLS] -> [task b ...]                                 -> [task b ...]

A token's logits depend only on its root-to-token path (depth positions, the ancestor mask), so a
merged token has the logits it had in each tree. Nothing else changes: the sequences stay the
trees' sequences with their own coefficients, trajectories and advantages (the trainer's
assembler computes them per sequence entry); only their target indices point into the forest, so a
shared target's weight is the sum over every tree's sequences through it, exactly as
for a prefix shared inside one tree (NOTES section 4).

The forest keeps the trees' order: children in first-seen order, so trees that share nothing are
laid out exactly as without merging (each tree's nodes in its own pre-order, trees one after the
other).

Cost: one Python step per tree node and per forest node it walks through, one numpy comparison
per step; never per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Node:
    """A forest node being built: its token values, their token ids (stable under splits) and its
    children by first token, in first-seen order."""

    vals: np.ndarray
    uids: np.ndarray
    parent: int
    children: dict[int, int] = field(default_factory=dict)


@dataclass
class Forest:
    """The merged layout: packed tokens in pre-order, the forest's nodes, and per input tree the
    packed index of each of its tokens (``token_map[t][i]``: token i of tree t)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    node_start: np.ndarray
    node_length: np.ndarray
    node_parent: np.ndarray
    node_last: np.ndarray
    token_map: list[np.ndarray]


class _Builder:
    """The trie of forest nodes; :meth:`insert` adds one tree node's tokens below a forest node."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.roots: dict[int, int] = {}
        self.next_uid = 0

    def _children(self, m: int) -> dict[int, int]:
        return self.roots if m < 0 else self.nodes[m].children

    def _new(self, vals: np.ndarray, parent: int) -> int:
        uids = np.arange(self.next_uid, self.next_uid + len(vals), dtype=np.int64)
        self.next_uid += len(vals)
        self.nodes.append(_Node(vals, uids, parent))
        self._children(parent)[int(vals[0])] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def _split(self, c: int, at: int) -> int:
        """Cut node ``c`` after ``at`` tokens; the head becomes a new node, ``c`` keeps the tail
        (so that what ends at ``c``'s last token still does). Returns the head."""
        node = self.nodes[c]
        head = _Node(node.vals[:at], node.uids[:at], node.parent, {int(node.vals[at]): c})
        self.nodes.append(head)
        h = len(self.nodes) - 1
        self._children(node.parent)[int(node.vals[0])] = h  # same key: same place in the order
        node.vals, node.uids, node.parent = node.vals[at:], node.uids[at:], h
        return h

    def insert(self, seg: np.ndarray, below: int, out: np.ndarray) -> int:
        """Add the tokens ``seg`` after forest node ``below`` (-1: a root); write each token's id
        into ``out``; return the forest node whose last token is ``seg``'s last."""
        pos, cur, n = 0, below, len(seg)
        while pos < n:
            c = self._children(cur).get(int(seg[pos]))
            if c is None:
                cur = self._new(seg[pos:], cur)
                out[pos:] = self.nodes[cur].uids
                return cur
            vals = self.nodes[c].vals
            k = min(len(vals), n - pos)
            eq = vals[:k] == seg[pos : pos + k]
            common = k if bool(eq.all()) else int(np.argmin(eq))
            if common < len(vals):
                c = self._split(c, common)
            out[pos : pos + common] = self.nodes[c].uids
            pos += common
            cur = c
        return cur

    def add_tree(
        self, ids: np.ndarray, parent: np.ndarray, offset: np.ndarray, length: np.ndarray
    ) -> np.ndarray:
        """Insert one tree's nodes (in pre-order, its nodes' tokens contiguous); its tokens'
        ids in the forest."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty(len(ids), dtype=np.int64)
        end = np.full(len(parent), -1, dtype=np.int64)
        for v in range(len(parent)):
            a, n = int(offset[v]), int(length[v])
            below = -1 if parent[v] < 0 else int(end[parent[v]])
            end[v] = self.insert(ids[a : a + n], below, out[a : a + n]) if n else below
        return out

    def layout(self, maps: list[np.ndarray]) -> Forest:
        """Pre-order over the forest, children in first-seen order."""
        order: list[int] = []
        depth: list[int] = []
        stack = [(r, 0) for r in reversed(list(self.roots.values()))]
        while stack:
            m, d = stack.pop()
            order.append(m)
            depth.append(d)
            kids = list(self.nodes[m].children.values())
            stack.extend((k, d + len(self.nodes[m].vals)) for k in reversed(kids))
        pre = np.empty(len(self.nodes), dtype=np.int64)
        pre[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
        nodes = [self.nodes[m] for m in order]
        length = np.array([len(x.vals) for x in nodes], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        parent = np.array([-1 if x.parent < 0 else pre[x.parent] for x in nodes], dtype=np.int64)
        last = np.arange(len(nodes), dtype=np.int64)
        for i in range(len(nodes) - 1, -1, -1):  # children come after their parent
            if parent[i] >= 0:
                last[parent[i]] = max(last[parent[i]], last[i])
        uids = np.concatenate([x.uids for x in nodes])
        packed = np.empty(self.next_uid, dtype=np.int64)
        packed[uids] = np.arange(len(uids), dtype=np.int64)
        d0 = np.asarray(depth, dtype=np.int64)
        return Forest(
            input_ids=np.concatenate([x.vals for x in nodes]).astype(np.int64),
            position_ids=np.repeat(d0 - start, length) + np.arange(len(uids), dtype=np.int64),
            node_start=start,
            node_length=length,
            node_parent=parent,
            node_last=last,
            token_map=[packed[m] for m in maps],
        )


def merge_forest(
    input_ids: Sequence[np.ndarray],
    node_parent: Sequence[np.ndarray],
    node_offset: Sequence[np.ndarray],
    node_length: Sequence[np.ndarray],
) -> Forest:
    """Merge trees (each in pre-order, its nodes' tokens contiguous) into one :class:`Forest`."""
    b = _Builder()
    trees = zip(input_ids, node_parent, node_offset, node_length, strict=True)
    return b.layout([b.add_tree(*tree) for tree in trees])


class MergedCount:
    """The token count of a forest that trees join one at a time: after each :meth:`add`, the
    tokens of :func:`merge_forest` of the trees added so far (what a micro-batch holding them
    feeds with shared prefixes), without laying it out or merging them all again."""

    def __init__(self) -> None:
        self._b = _Builder()

    @property
    def tokens(self) -> int:
        return self._b.next_uid

    def add(
        self,
        input_ids: np.ndarray,
        node_parent: np.ndarray,
        node_offset: np.ndarray,
        node_length: np.ndarray,
    ) -> int:
        """Merge one more tree in; the forest's tokens now."""
        self._b.add_tree(input_ids, node_parent, node_offset, node_length)
        return self.tokens
