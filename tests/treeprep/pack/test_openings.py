"""Issue 29 items 3-4: the packer counts the tokens a micro-batch's trees share once, past their
first branch too (the plan's ``tokens_shared`` and ERR), ``group_by_prefix`` orders trees by
opening, and ``treeprep stats`` shows the cross-tree sharing. Exact counts on small constructed
forests."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from test_plan import _tree, forest_of, write_build
from typer.testing import CliRunner

from treeprep.cli.app import app
from treeprep.pack import PackConfig, load_forest, plan_forest
from treeprep.pack.forest import Forest, ShardIds, opening_lengths
from treeprep.pack.openings import prefix_order, shared_per_slot, shared_tokens
from treeprep.pack.share import MergedCount
from treeprep.schemas.plan import PlanSummary
from treeprep.trie import Tree


def with_openings(trees: list[Tree], cap: int = 16384) -> Forest:
    """forest_of with each tree's opening read from its own input_ids, and its ids on demand."""
    f = forest_of(trees)
    f.tree_ids = lambda ts: ((int(t), np.asarray(trees[t].input_ids)) for t in ts)
    lens = opening_lengths(f.node_off, f.node_parent, f.node_length, cap)
    f.open_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    f.open_ids = np.concatenate(
        [np.asarray(t.input_ids[:n], dtype=np.int32) for t, n in zip(trees, lens, strict=True)]
    )
    return f


def _merged(trees: list[Tree]) -> int:
    count = MergedCount()
    for t in trees:
        count.add(t.input_ids, t.node_parent, t.node_offset, t.node_length)
    return count.tokens


def test_opening_is_the_chain_from_the_root_to_the_first_branch() -> None:
    branch_at_root = _tree("a", [[1, 2, 3, 4], [1, 2, 3, 5]])  # [1 2 3] -> {4, 5}
    single = _tree("b", [[7, 8, 9]])
    chain_then_branch = _tree("c", [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8]])
    f = forest_of([branch_at_root, single, chain_then_branch])
    assert opening_lengths(f.node_off, f.node_parent, f.node_length).tolist() == [3, 3, 6]
    assert opening_lengths(f.node_off, f.node_parent, f.node_length, cap=2).tolist() == [2, 2, 2]
    assert with_openings([chain_then_branch]).opening(0).tolist() == [1, 2, 3, 4, 5, 6]


def test_shared_tokens_counts_each_micro_batch_once() -> None:
    trees = [
        _tree(g, [s])
        for g, s in zip("abcd", [[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 7], [8, 8]], strict=True)
    ]
    f = with_openings(trees)
    every = np.arange(4)
    # one micro-batch: the trie 1 2 -> {3 4 5, 3 9 9 -> (3) split, 7}, and 8 8: 15 tokens -> 10
    assert shared_tokens(f, every, np.zeros(4, dtype=np.int64)) == 15 - _merged(trees) == 5
    assert shared_tokens(f, every, np.array([0, 0, 1, 1])) == 3  # 1 2 3 once; 1 2 7 | 8 8 none
    assert shared_tokens(f, every, np.arange(4)) == 0
    assert shared_tokens(forest_of(trees), every, np.zeros(4, dtype=np.int64)) == 0  # no ids read


def test_sharing_past_the_first_branch_is_counted() -> None:
    """Two trees that branch after 3 tokens and share both branches' next tokens: the openings
    alone share 3 tokens, the merge saves 7 (what the trainer feeds less)."""
    a = _tree("a", [[1, 2, 3, 4, 5], [1, 2, 3, 6, 7]])
    b = _tree("b", [[1, 2, 3, 4, 5, 9], [1, 2, 3, 6, 7, 8]])
    f = with_openings([a, b])
    assert f.opening(0).tolist() == f.opening(1).tolist() == [1, 2, 3]
    both = np.arange(2)
    assert shared_tokens(f, both, np.zeros(2, dtype=np.int64)) == 16 - _merged([a, b]) == 7
    assert shared_per_slot(f, both, np.array([1, 1])).tolist() == [0, 7]
    # one pass per micro-batch gives the same counts
    assert shared_per_slot(f, np.arange(2), np.zeros(2, dtype=np.int64), pass_tokens=1)[0] == 7


def _family(n: int, sys_len: int = 20) -> list[Tree]:
    """Trees of two system prompts (A: 100.., B: 200..), alternating, each with its own task."""
    out = []
    for i in range(n):
        sys = list(range(100 if i % 2 == 0 else 200, (100 if i % 2 == 0 else 200) + sys_len))
        task = [1000 + i] * 6
        out.append(_tree(f"g{i}", [sys + task + [1, 2], sys + task + [3, 4, 5]]))
    return out


def _rows(plan) -> list[tuple]:
    t = plan.table.to_pydict()
    return sorted(zip(t["step"], t["rank"], t["micro_batch"], t["group_id"], strict=True))


def test_plan_rows_unchanged_by_the_sharing_count_and_err_counts_it() -> None:
    trees = _family(12)
    cfg = PackConfig(budget=120, world_size=2, steps_of=2, seed=5)
    counted, plain = plan_forest(with_openings(trees), cfg), plan_forest(forest_of(trees), cfg)
    assert counted.table.equals(plain.table)
    s, p = counted.summary, plain.summary
    assert p.tokens_shared == 0 and p.err == p.por
    # brute force: per micro-batch, the full trees merged (they share only in their openings)
    by_mb: dict[tuple, list[Tree]] = {}
    for step, rank, mb, gid in _rows(counted):
        by_mb.setdefault((step, rank, mb), []).append(trees[int(gid[1:])])
    brute = sum(sum(t.tokens_tree for t in ts) - _merged(ts) for ts in by_mb.values())
    assert s.tokens_shared == brute > 0
    assert s.err == 1 - (s.tokens_pack - brute) / s.tokens_linear
    assert s.model_dump()["tokens_shared"] == brute


def test_group_by_prefix_puts_like_openings_together_and_keeps_the_trees() -> None:
    trees = _family(16)
    f = with_openings(trees)
    seeded = np.random.default_rng(1).permutation(16)
    order = prefix_order(f, seeded).tolist()
    assert [int(i) % 2 for i in order] == [0] * 8 + [1] * 8  # A's prefix sorts first
    assert order == list(range(0, 16, 2)) + list(range(1, 16, 2))  # then by task token
    same = with_openings([_tree(g, [[5, 6, 7]]) for g in "abc"])  # equal openings: seeded order
    assert prefix_order(same, np.array([2, 0, 1])).tolist() == [2, 0, 1]
    base = PackConfig(budget=70, seed=1)  # two trees (~33 tokens each) per micro-batch
    plain = plan_forest(f, base)
    grouped = plan_forest(f, dataclasses.replace(base, group_by_prefix=True))
    assert grouped.summary.group_by_prefix and not plain.summary.group_by_prefix
    assert sorted(r[3] for r in _rows(grouped)) == sorted(r[3] for r in _rows(plain))
    by_mb: dict[tuple, set[int]] = {}
    for step, rank, mb, gid in _rows(grouped):
        by_mb.setdefault((step, rank, mb), set()).add(int(gid[1:]) % 2)
    assert all(len(v) == 1 for v in by_mb.values())
    assert grouped.summary.tokens_shared == 20 * 8  # every micro-batch: one 20-token prompt shared
    assert grouped.summary.tokens_shared > plain.summary.tokens_shared
    assert grouped.summary.err > plain.summary.err
    assert dataclasses.replace(base, group_by_prefix=True).plan_name == "b70-w1-n1-s1-prefix"


def test_old_plan_summaries_load_and_defaults_are_left_out() -> None:
    s = plan_forest(forest_of(_family(4)), PackConfig(budget=200)).summary
    d = json.loads(s.model_dump_json())
    assert "tokens_shared" not in d and "group_by_prefix" not in d  # old bytes kept
    old = PlanSummary.model_validate_json(json.dumps(d))
    assert old.tokens_shared == 0 and old.group_by_prefix is False


def test_stats_shows_cross_tree_sharing(tmp_path: Path) -> None:
    trees = _family(6)
    out = tmp_path / "out"
    write_build(out, trees)
    f = load_forest(str(out))
    assert f.open_off is not None and f.opening(0).tolist()[:20] == list(range(100, 120))
    assert isinstance(f.tree_ids, ShardIds) and f.tree_ids.held  # a small build is read once
    again = dataclasses.replace(f.tree_ids, held={})  # read from the shards
    for ids in (f.tree_ids, again):
        got = {t: v.tolist() for t, v in ids(np.arange(6)[::-1])}
        assert got == {t: list(trees[t].input_ids) for t in range(6)}
    r = CliRunner().invoke(app, ["stats", str(out), "--json", "--budget", "70"])
    assert r.exit_code == 0, r.output
    x = json.loads(r.output)["sharing"]
    tl, tt = sum(t.tokens_linear for t in trees), sum(t.tokens_tree for t in trees)
    assert x["tokens_tree"] == tt and x["tokens_shared_all"] == _merged(trees) == tt - 2 * 20 * 2
    assert x["por_tree"] == 1 - tt / tl and x["por_shared_all"] == 1 - _merged(trees) / tl
    assert x["budget"] == 70 and "por_shared_budget" in x
    plan = plan_forest(f, PackConfig(budget=70)).summary
    assert x["plan_tokens_shared"] == plan.tokens_shared
    assert x["plan_err"] == plan.err
    r = CliRunner().invoke(app, ["stats", str(out), "--budget", "70"])
    assert r.exit_code == 0 and "prefixes shared across trees" in r.output
