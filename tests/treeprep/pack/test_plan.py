"""The packer: property tests on random forests, exact hand-checked cuts, the on-disk plan."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.pack import (
    Forest,
    PackConfig,
    PackError,
    cut_tree,
    load_forest,
    pack,
    plan_forest,
)
from treeprep.schemas import SCHEMA_VERSION, Manifest
from treeprep.schemas.manifest import Counts, ShardEntry, TokenizerIdentity
from treeprep.schemas.plan import PLAN_SCHEMA, read_plan
from treeprep.sequence import Sequence
from treeprep.shards import write_shard
from treeprep.trie import Tree, build_tree


def _tree(gid: str, seqs: list[list[int]], spans=None, counts=None) -> Tree:
    out = []
    for i, t in enumerate(seqs):
        sp = spans[i] if spans else [(len(t) // 2, len(t))]
        for _ in range((counts or [1] * len(seqs))[i]):
            out.append(Sequence(group_id=gid, tokens=np.array(t), loss_spans=sp))
    return build_tree(out)


def forest_of(trees: list[Tree], shard_names: list[str] | None = None) -> Forest:
    no, so = [0], [0]
    for t in trees:
        no.append(no[-1] + t.num_nodes)
        so.append(so[-1] + t.num_sequences)

    def cat(k: str) -> np.ndarray:
        return np.concatenate([getattr(t, k) for t in trees])

    return Forest(
        shard_names=shard_names or ["shards/s0.arrow"],
        tree_shard=np.zeros(len(trees), dtype=np.int32),
        tree_row=np.arange(len(trees)),
        group_id=[t.group_id for t in trees],
        node_off=np.array(no),
        node_parent=cat("node_parent"),
        node_length=cat("node_length"),
        node_depth=cat("node_depth"),
        seq_off=np.array(so),
        seq_node=cat("seq_node"),
        seq_count=cat("seq_count"),
        seq_length=cat("seq_length"),
    )


def write_build(out: Path, trees: list[Tree], per_shard: int = 3) -> None:
    """A finished build folder (shards + manifest) from ready trees, as a test fixture."""
    (out / "shards").mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(0, len(trees), per_shard):
        chunk = trees[i : i + per_shard]
        name = f"shards/shard-{i // per_shard:05d}.arrow"
        size, sha = write_shard(chunk, str(out / name))
        entries.append(
            ShardEntry(
                path=name,
                bytes=size,
                sha256=sha,
                trees=len(chunk),
                tokens_tree=sum(t.tokens_tree for t in chunk),
                tokens_linear=sum(t.tokens_linear for t in chunk),
            )
        )
    nseq = sum(int(t.seq_count.sum()) for t in trees)
    counts = Counts(
        records_read=nseq + 2,
        records_in_trees=nseq,
        records_rejected=2,
        trees=len(trees),
        sequences=nseq,
        nodes=sum(t.num_nodes for t in trees),
        tokens_linear=sum(t.tokens_linear for t in trees),
        tokens_tree=sum(t.tokens_tree for t in trees),
    )
    m = Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version="test",
        tokenizer=TokenizerIdentity(
            name="builtin-bytes", sha256="0", chat_template_sha256="0", vocab_size=256
        ),
        counts=counts,
        shards=entries,
        formats={"tokens": nseq + 2},
    )
    (out / "manifest.json").write_text(m.model_dump_json(indent=2))


# --------------------------------------------------------------------------------------------
# the invariants every plan must satisfy
# --------------------------------------------------------------------------------------------


def check_plan(trees: list[Tree], table: pa.Table, summary, budget: int, per_shard=None) -> None:
    """Every invariant of a plan. Trees are in forest order: tree i is (shard i // per_shard,
    row i % per_shard) when ``per_shard`` is given, else row i of the only shard."""
    rows = table.to_pylist()
    _check_slots(rows, summary, budget)
    by_tree: dict[int, list[dict]] = {}
    for r in rows:
        i = r["row"]
        if per_shard:
            i += per_shard * int(r["shard"].split("-")[-1].split(".")[0])
        by_tree.setdefault(i, []).append(r)
    assert sorted(by_tree) == list(range(len(trees)))
    tokens_pack = sum(_check_tree(tree, by_tree[ti]) for ti, tree in enumerate(trees))
    assert summary.tokens_pack == tokens_pack
    assert summary.tokens_tree == sum(t.tokens_tree for t in trees)
    assert summary.tokens_linear == sum(t.tokens_linear for t in trees)
    assert summary.err == pytest.approx(1 - tokens_pack / summary.tokens_linear)
    assert summary.err <= summary.por + 1e-12
    assert summary.parts == len(rows)
    # rows are in (step, rank, micro_batch, shard, row, part) order
    keys = [(r["step"], r["rank"], r["micro_batch"], r["shard"], r["row"], r["part"]) for r in rows]
    assert keys == sorted(keys)


def _check_slots(rows: list[dict], summary, budget: int) -> None:
    """No micro-batch over the budget; hand-off rows fill a slot alone, their parts in budget."""
    load: Counter = Counter()
    for r in rows:
        key = (r["step"], r["rank"], r["micro_batch"])
        if r["handoff_cuts"]:
            # a hand-off row fills its slot alone; each of its parts computes <= budget tokens
            cuts = r["handoff_cuts"]
            assert cuts[0] == 0 and cuts[-1] == r["tokens"] > budget
            assert all(0 < b - a <= budget for a, b in zip(cuts[:-1], cuts[1:], strict=True))
            assert len(r["handoff_parents"]) == len(cuts) - 1 and r["handoff_parents"][0] == -1
            assert all(-1 <= p < i for i, p in enumerate(r["handoff_parents"]))
            assert r["prefix_tokens"] == 0
            load[key] += budget
        else:
            assert not r["handoff_parents"]
            load[key] += r["tokens"] + r["prefix_tokens"]
    assert max(load.values()) <= budget
    per_rank = [s.micro_batches_per_rank for s in summary.step_info]
    for step, rank, mb in load:
        assert 0 <= rank < summary.world_size and 0 <= mb < per_rank[step]


def _trained(tree: Tree, seqs) -> Counter:
    """(sequence, position) -> duplicate count, over the trained tokens of ``seqs``."""
    out: Counter = Counter()
    for s in seqs:
        spans = tree.seq_loss_spans[s]
        for a, b in zip(spans[0::2], spans[1::2], strict=True):
            for pos in range(a, b):
                out[(s, pos)] += int(tree.seq_count[s])
    return out


def _check_tree(tree: Tree, parts: list[dict]) -> int:
    """One tree's parts: one step, connected, every node once, every sequence (and trained
    token) once in the part computing its end node. Returns the tokens fed."""
    assert {r["group_id"] for r in parts} == {tree.group_id}
    assert len({r["step"] for r in parts}) == 1  # one tree, one optimizer step
    assert sorted(r["part"] for r in parts) == list(range(len(parts)))
    assert all(r["num_parts"] == len(parts) for r in parts)
    par = tree.node_parent
    seen_nodes: Counter = Counter()
    seen_seqs: Counter = Counter()
    trained: Counter = Counter()
    fed_tokens = 0
    for r in parts:
        nodes, prefix = r["nodes"], r["prefix_nodes"]
        assert nodes == sorted(set(nodes)) and nodes
        # the prefix is the root-to-p path
        for k, v in enumerate(prefix):
            assert par[v] == (prefix[k - 1] if k else -1)
        # connected: every computed node hangs from the part or from the prefix's end
        have = set(nodes)
        for v in nodes:
            p = int(par[v])
            assert p in have or (p == (prefix[-1] if prefix else -1))
        assert r["tokens"] == int(tree.node_length[nodes].sum())
        assert r["prefix_tokens"] == int(tree.node_length[prefix].sum()) if prefix else True
        assert r["prefix_tokens"] == (int(tree.node_depth[nodes[0]]) if prefix else 0)
        fed = prefix + nodes
        n_pairs = sum(
            int(tree.node_length[v] * tree.node_depth[v])
            + int(tree.node_length[v] * (tree.node_length[v] + 1) // 2)
            for v in fed
        )
        assert r["attn_pairs"] == n_pairs
        fed_tokens += r["tokens"] + r["prefix_tokens"]
        seen_nodes.update(nodes)
        seen_seqs.update(r["seqs"])
        fed_set = set(fed)
        for s in r["seqs"]:
            end = int(tree.seq_node[s])
            assert end in have  # the loss goes to the part computing the end node
            assert set(tree.path_nodes(end)) <= fed_set  # the whole sequence is fed here
        trained.update(_trained(tree, r["seqs"]))  # with its duplicate count, lands here
    assert seen_nodes == Counter(range(tree.num_nodes))  # every node computed exactly once
    assert seen_seqs == Counter(range(tree.num_sequences))  # every sequence exactly once
    assert trained == _trained(tree, range(tree.num_sequences))
    return fed_tokens


# --------------------------------------------------------------------------------------------
# random forests
# --------------------------------------------------------------------------------------------


@st.composite
def forests(draw) -> list[Tree]:
    trees = []
    for g in range(draw(st.integers(1, 6))):
        seqs: list[list[int]] = []
        spans = []
        for _ in range(draw(st.integers(1, 8))):
            if seqs and draw(st.booleans()):
                base = draw(st.sampled_from(seqs))
                cut = draw(st.integers(0, len(base)))
                tail = draw(st.lists(st.integers(0, 3), min_size=0 if cut else 1, max_size=12))
                toks = base[:cut] + tail
            else:
                toks = draw(st.lists(st.integers(0, 3), min_size=1, max_size=25))
            seqs.append(toks)
            a = draw(st.integers(0, len(toks)))
            b = draw(st.integers(a, len(toks)))
            spans.append([(a, b)])
        counts = draw(st.lists(st.integers(1, 3), min_size=len(seqs), max_size=len(seqs)))
        trees.append(_tree(f"g{g}", seqs, spans, counts))
    return trees


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trees=forests(),
    slack=st.integers(0, 60),
    world=st.integers(1, 3),
    steps_of=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_plan_properties_on_random_forests(trees, slack, world, steps_of, seed) -> None:
    f = forest_of(trees)
    budget = int(f.longest_path().max()) + slack
    cfg = PackConfig(budget=budget, world_size=world, steps_of=steps_of, seed=seed, cut="prefix")
    plan = plan_forest(f, cfg)
    check_plan(trees, plan.table, plan.summary, budget)
    again = plan_forest(forest_of(trees), cfg)  # deterministic for a seed
    assert again.table.equals(plan.table)
    assert again.summary == plan.summary


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trees=forests(),
    budget=st.integers(1, 40),
    world=st.integers(1, 3),
    steps_of=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_handoff_plan_properties_at_any_budget(trees, budget, world, steps_of, seed) -> None:
    """Hand-off plans (the default) at budgets down to one token, under the longest path too:
    every invariant holds, nothing is recomputed and ERR equals POR."""
    f = forest_of(trees)
    cfg = PackConfig(budget=budget, world_size=world, steps_of=steps_of, seed=seed)
    plan = plan_forest(f, cfg)
    check_plan(trees, plan.table, plan.summary, budget)
    assert plan.summary.tokens_recomputed == 0
    assert plan.summary.err == pytest.approx(plan.summary.por, abs=1e-12)
    big = [t for t in trees if t.tokens_tree > budget]
    assert plan.summary.handoff_trees == len(big) == plan.summary.split_trees


# --------------------------------------------------------------------------------------------
# exact cases
# --------------------------------------------------------------------------------------------


def test_cut_sibling_fan_recomputes_the_shared_prefix_once_per_part() -> None:
    # root of 10 tokens, three children of 6: 28 tokens; budget 22 fits root + 2 children
    root = list(range(10))
    seqs = [root + [10 + c] * 6 for c in range(3)]
    tree = _tree("fan", seqs)
    assert tree.num_nodes == 4 and tree.tokens_tree == 28
    cut = cut_tree(tree.node_parent, tree.node_length, tree.node_depth, 22)
    # one child (the first of the heaviest, ties in pre-order) moves to its own part
    assert cut.part_of_node.tolist() == [0, 1, 0, 0]
    assert cut.prefix_end.tolist() == [-1, 0]
    plan = plan_forest(forest_of([tree]), PackConfig(budget=22, cut="prefix"))
    s = plan.summary
    assert (s.tokens_tree, s.tokens_pack, s.tokens_recomputed) == (28, 38, 10)
    assert s.tokens_linear == 48
    assert s.err == pytest.approx(1 - 38 / 48) and s.por == pytest.approx(1 - 28 / 48)
    check_plan([tree], plan.table, s, 22)


def test_cut_siblings_share_one_part_when_they_fit_together() -> None:
    # root 10, four children of 6 (34 tokens), budget 22: root keeps two, the other two children
    # go together into one part with the root recomputed once (10 + 12 = 22)
    seqs = [list(range(10)) + [10 + c] * 6 for c in range(4)]
    tree = _tree("fan4", seqs)
    cut = cut_tree(tree.node_parent, tree.node_length, tree.node_depth, 22)
    assert sorted(Counter(cut.part_of_node.tolist()).values()) == [2, 3]
    assert len(cut.prefix_end) == 2
    plan = plan_forest(forest_of([tree]), PackConfig(budget=22, cut="prefix"))
    assert plan.summary.tokens_pack == 34 + 10
    check_plan([tree], plan.table, plan.summary, 22)


def test_long_chain_with_side_branches_cuts_at_the_deepest_fork() -> None:
    # an agent session: calls k = 1..4 each extend the previous by 5 tokens, and each call also
    # has a 3-token side branch (a dropped-reasoning copy of its completion)
    seqs, chain = [], []
    for k in range(4):
        chain = chain + [k + 1] * 5
        seqs.append(chain)
        seqs.append(chain + [9, 9, 9])
    tree = _tree("chain", seqs)
    f = forest_of([tree])
    assert int(f.longest_path()[0]) == 23 and tree.tokens_tree == 32
    plan = plan_forest(f, PackConfig(budget=24, cut="prefix"))
    check_plan([tree], plan.table, plan.summary, 24)
    # cheapest: split off the deepest node whose removal fits: err stays close to por
    assert plan.summary.tokens_pack < 2 * tree.tokens_tree


def test_multiple_roots_split_without_recomputation() -> None:
    seqs = [[1] * 8, [2] * 8, [3] * 8]
    tree = _tree("roots", seqs)
    plan = plan_forest(forest_of([tree]), PackConfig(budget=16, cut="prefix"))
    assert plan.summary.tokens_recomputed == 0
    assert plan.summary.parts == 2
    check_plan([tree], plan.table, plan.summary, 16)


def test_path_longer_than_budget_names_the_group_and_length() -> None:
    tree = _tree("too-long", [[1] * 30, [1] * 10 + [2] * 5])
    with pytest.raises(PackError, match=r"'too-long'.*30 tokens.*budget of 20"):
        plan_forest(forest_of([tree]), PackConfig(budget=20, cut="prefix"))


def test_small_trees_fill_micro_batches_and_ranks_balance_by_cost() -> None:
    trees = [_tree(f"g{i}", [[i % 7] * (3 + i % 5)]) for i in range(40)]
    plan = plan_forest(forest_of(trees), PackConfig(budget=64, world_size=4, steps_of=2))
    s = plan.summary
    check_plan(trees, plan.table, s, 64)
    assert s.split_trees == 0 and s.err == pytest.approx(s.por)
    # every step fully occupies its slots while there is data, and predicted loads are close
    assert s.steps == 1 and s.micro_batches == 8
    assert s.imbalance_max < 0.1


def test_tree_needing_more_slots_than_a_step_gets_a_longer_step() -> None:
    seqs = [[r] * 10 for r in range(6)]  # six 10-token roots
    tree = _tree("wide", seqs)
    plan = plan_forest(
        forest_of([tree]), PackConfig(budget=10, world_size=2, steps_of=1, cut="prefix")
    )
    s = plan.summary
    assert s.steps == 1 and s.step_info[0].micro_batches_per_rank == 3
    check_plan([tree], plan.table, s, 10)


def test_different_seeds_shuffle_tree_order() -> None:
    trees = [_tree(f"g{i}", [[i] * 5]) for i in range(30)]
    f = forest_of(trees)
    a = plan_forest(f, PackConfig(budget=10, seed=1)).table.column("group_id").to_pylist()
    b = plan_forest(f, PackConfig(budget=10, seed=2)).table.column("group_id").to_pylist()
    assert sorted(a) == sorted(b) and a != b


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(PackError, match="budget"):
        PackConfig(budget=0)
    with pytest.raises(PackError, match="world_size"):
        PackConfig(budget=8, world_size=0)
    with pytest.raises(PackError, match="plan name"):
        PackConfig(budget=8, name="../x")


# --------------------------------------------------------------------------------------------
# on disk
# --------------------------------------------------------------------------------------------


def test_pack_writes_a_plan_the_trainer_can_read_with_pyarrow(tmp_path: Path) -> None:
    trees = [
        _tree("a", [list(range(12)) + [50 + c] * 7 for c in range(5)]),
        _tree("b", [[1, 2, 3], [1, 2, 4, 5]]),
        _tree("c", [[7] * 9, [7] * 4 + [8] * 6]),
        _tree("d", [[9] * 20]),
    ]
    write_build(tmp_path, trees, per_shard=2)
    f = load_forest(str(tmp_path))
    assert f.shard_names == ["shards/shard-00000.arrow", "shards/shard-00001.arrow"]
    assert f.tree_row.tolist() == [0, 1, 0, 1]
    plan_dir, plan = pack(str(tmp_path), PackConfig(budget=26, world_size=2, seed=3))
    assert plan_dir == str(tmp_path / "plans" / "b26-w2-n1-s3")
    table, summary = read_plan(plan_dir)
    assert table.schema.equals(PLAN_SCHEMA, check_metadata=True)
    assert table.equals(plan.table) and summary == plan.summary
    assert not list(Path(plan_dir).glob("*.tmp"))
    summary_json = json.loads((Path(plan_dir) / "summary.json").read_text())
    assert summary_json["budget"] == 26 and summary_json["trees"] == 4
    # the rows point at the right trees: rebuild every part from the shard and compare tokens
    from treeprep.schemas.shard import read_shard

    for r in table.to_pylist():
        shard = read_shard(str(tmp_path / r["shard"]))
        tree = Tree.from_row(shard.slice(r["row"], 1).to_pylist()[0])
        assert tree.group_id == r["group_id"]
        assert r["tokens"] == sum(len(tree.node_tokens(v)) for v in r["nodes"])
    check_plan(trees, table, summary, 26, per_shard=2)


def test_pack_on_a_folder_without_manifest_is_a_clear_error(tmp_path: Path) -> None:
    from treeprep.errors import TreeprepError

    with pytest.raises(TreeprepError, match="manifest.json"):
        pack(str(tmp_path), PackConfig(budget=10))
