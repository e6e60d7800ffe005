"""Trees merged into one forest (issue 29): every tree's root-to-token paths survive, shared
openings are stored once, trees sharing nothing keep their layout."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from treeprep.pack.share import MergedCount, merge_forest
from treeprep.sequence import Sequence
from treeprep.treeindex import path_offsets
from treeprep.trie import build_tree


def _tree(rng: np.random.Generator, opening: np.ndarray, n: int, g: int):
    seqs = []
    for i in range(n):
        toks = np.concatenate([opening, rng.integers(0, 4, int(rng.integers(1, 6)))])
        seqs.append(Sequence(f"g{g}", toks.astype(np.int32), [(len(toks) - 1, len(toks))]))
        _ = i
    return build_tree(seqs)


def _cols(trees):
    return (
        [t.input_ids for t in trees],
        [t.node_parent for t in trees],
        [t.node_offset for t in trees],
        [t.node_length for t in trees],
    )


def _forest_paths(f) -> dict[int, tuple[int, ...]]:
    """Per packed token, its root-to-token token path in the forest."""
    tok_node = np.repeat(np.arange(len(f.node_start)), f.node_length)
    out = {}
    for i in range(len(f.input_ids)):
        n, k, path = tok_node[i], i, []
        while True:
            path.extend(f.input_ids[f.node_start[n] : k + 1][::-1].tolist())
            if f.node_parent[n] < 0:
                break
            n = f.node_parent[n]
            k = f.node_start[n] + f.node_length[n] - 1
        out[i] = tuple(path[::-1])
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_trees=st.integers(1, 4))
def test_every_tree_token_keeps_its_path_and_depth(seed: int, n_trees: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 4, 8)
    trees = [
        _tree(rng, base[: int(rng.integers(0, 9))], int(rng.integers(1, 4)), g)
        for g in range(n_trees)
    ]
    f = merge_forest(*_cols(trees))
    paths = _forest_paths(f)
    assert len(set(paths.values())) == len(paths)  # a trie: every path once
    assert (f.node_last >= np.arange(len(f.node_last))).all()
    for t, m in zip(trees, f.token_map, strict=True):
        seqs = path_offsets(t.node_parent, t.node_offset, t.node_length, t.seq_node)
        for p in seqs:
            for d in range(len(p)):
                assert paths[int(m[p[d]])] == tuple(t.input_ids[p[: d + 1]].tolist())
                assert f.position_ids[m[p[d]]] == d
    count = MergedCount()  # counted tree by tree, without the layout
    for tree in zip(*_cols(trees), strict=True):
        count.add(*tree)
    assert count.tokens == len(f.input_ids)
    assert len(f.input_ids) <= sum(t.tokens_tree for t in trees)


def test_a_common_opening_is_stored_once() -> None:
    rng = np.random.default_rng(0)
    opening = np.arange(10, 30)
    trees = [_tree(rng, opening, 3, g) for g in range(4)]
    f = merge_forest(*_cols(trees))
    assert len(f.input_ids) <= sum(t.tokens_tree for t in trees) - 3 * 20  # suffixes may share too
    assert (f.node_parent < 0).sum() == 1


def test_trees_sharing_nothing_are_concatenated() -> None:
    rng = np.random.default_rng(1)
    a, b = _tree(rng, np.array([100, 101]), 3, 0), _tree(rng, np.array([200]), 2, 1)
    f = merge_forest(*_cols([a, b]))
    assert f.input_ids.tolist() == a.input_ids.tolist() + b.input_ids.tolist()
    assert f.node_parent.tolist() == a.node_parent.tolist() + [
        -1 if p < 0 else p + a.num_nodes for p in b.node_parent
    ]
