"""treeindex: path walks and sums on pre-order parent arrays, checked against a naive walk."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from treeprep.treeindex import (
    children,
    depths,
    inherit_down,
    members,
    path_offsets,
    path_sums,
    path_to_root,
    segment_sums,
)


@st.composite
def preorder_trees(draw):
    """Random forests in pre-order: each node's parent is an earlier node on the current path."""
    n = draw(st.integers(1, 40))
    parent = [-1]
    stack = [0]
    for v in range(1, n):
        pop = draw(st.integers(0, len(stack)))
        stack = stack[: len(stack) - pop]
        parent.append(stack[-1] if stack else -1)
        stack.append(v)
    values = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    return np.array(parent), np.array(values)


def _naive_path(parent: np.ndarray, v: int) -> list[int]:
    out = []
    while v >= 0:
        out.insert(0, v)
        v = int(parent[v])
    return out


@given(preorder_trees())
def test_paths_and_sums_match_a_naive_walk(tree) -> None:
    parent, values = tree
    sums = path_sums(parent, values)
    for v in range(len(parent)):
        path = _naive_path(parent, v)
        assert path_to_root(parent, v).tolist() == path
        assert sums[v] == sum(int(values[u]) for u in path)
    assert (depths(parent, values) == sums - values).all()


@given(preorder_trees(), st.data())
def test_path_offsets_are_the_tokens_of_the_naive_path(tree, data) -> None:
    parent, values = tree
    length = values + 1  # every node holds at least one token
    offset = np.concatenate([[0], np.cumsum(length)[:-1]])
    nodes = data.draw(st.lists(st.integers(0, len(parent) - 1), max_size=12))
    got = path_offsets(parent, offset, length, nodes)
    assert len(got) == len(nodes)
    for v, p in zip(nodes, got, strict=True):
        want = [o for u in _naive_path(parent, v) for o in range(offset[u], offset[u] + length[u])]
        assert p.dtype == np.int64 and p.tolist() == want


def test_path_to_root_of_no_node_is_empty() -> None:
    assert path_to_root(np.array([-1, 0]), -1).tolist() == []


@given(preorder_trees())
def test_children_csr_lists_every_child_once(tree) -> None:
    parent, _ = tree
    order, starts, ends = children(parent)
    assert order[starts[0] : ends[0]].tolist() == [v for v in range(len(parent)) if parent[v] < 0]
    for v in range(len(parent)):
        kids = order[starts[v + 1] : ends[v + 1]].tolist()
        assert kids == [u for u in range(len(parent)) if parent[u] == v]


def test_inherit_down_spreads_labels_until_a_node_has_its_own() -> None:
    parent = np.array([-1, 0, 1, 0, 3, -1])
    own = np.array([-1, 7, -1, -1, 4, -1])
    assert inherit_down(parent, own, 9).tolist() == [9, 7, 7, 9, 4, 9]


def test_members_and_segment_sums() -> None:
    assert [m.tolist() for m in members(np.array([1, 0, 1, 2, 0]), 4)] == [[1, 4], [0, 2], [3], []]
    off = np.array([0, 2, 2, 5])
    assert segment_sums(np.array([1, 2, 3, 4, 5]), off).tolist() == [3, 0, 12]
    assert segment_sums(np.zeros(0, dtype=np.int64), np.array([0, 0])).tolist() == [0]
    assert segment_sums(np.array([1]), np.array([0])).tolist() == []
