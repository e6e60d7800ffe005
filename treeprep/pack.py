"""``treeprep pack``: cut and bin-pack trees into micro-batches, steps and ranks.

The plan's on-disk contract (columns, the meaning of a part, how the trainer rebuilds a
micro-batch) is documented in :mod:`treeprep.schemas.plan`. This module makes it, in four passes,
each linear in the number of nodes (plus sorts over trees and parts):

1. **Load** the columns the planner needs (node parents, lengths and depths, sequence end nodes and
   counts) from every shard into one flat :class:`Forest` of numpy arrays. Per-tree totals (tokens,
   longest path, attention pairs) are segment sums with ``np.add.reduceat``; no per-tree Python.
   A tree with a root-to-node path longer than the budget cannot be trained under that budget by
   recomputation: :class:`PackError` names the group and the length.
2. **Cut** each tree larger than the budget into connected parts (Kundu and Misra's bottom-up
   greedy for bounded-weight tree partitions, adapted to depth-dependent capacities). Nodes are
   visited in reverse pre-order; a node's residual is its own tokens plus its uncut children's
   residuals. A part whose top is a child of ``v`` recomputes the path down to ``v``, so its
   capacity is ``budget - depth(child)``. When a node's residual plus its depth exceeds the budget,
   its heaviest children are cut off, fewest first, and the cut siblings are bundled into as few
   parts as fit (first-fit decreasing), so siblings share one recomputed prefix. Every cut makes a
   part that recomputes ``depth(child)`` tokens; cutting the fewest and highest children keeps
   that recomputation, and hence ERR's gap to POR, small. Roots hang from a virtual root of
   depth 0: a tree's roots are split across parts with no recomputation at all.
3. **Steps**: trees are shuffled with ``seed`` (the epoch's data order), then taken in that order
   into optimizer steps of ``world_size * steps_of`` micro-batch slots of ``budget`` tokens. A
   step's parts are placed first cost-balanced (heaviest part into the cheapest micro-batch with
   room), falling back to first-fit decreasing by tokens; a tree any of whose parts does not fit
   moves whole to the next step, so every sequence of a tree is trained in one step. A tree that
   needs more slots than a step has gets a step of its own with more micro-batches per rank.
4. **Ranks**: a step's micro-batches go to ranks by longest-processing-time first under the cost
   model of :mod:`treeprep.flops` (linear + LM-head FLOPs per fed token, attention FLOPs per
   (query, key) pair), each rank taking the same number of micro-batches. The predicted imbalance
   (max rank cost / mean - 1) is reported per step.

The plan is deterministic: only the seeded shuffle is random, and every sort is stable.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.errors import ShardError, TreeprepError
from treeprep.flops import DEFAULT_MODEL, ModelShape, load_model
from treeprep.schemas.plan import PLAN_SCHEMA, CostModel, PlanSummary, StepInfo
from treeprep.schemas.shard import TREE_SCHEMA
from treeprep.shards import load_manifest


class PackError(TreeprepError):
    """The trees cannot be packed under the given settings (a path longer than the budget)."""


@dataclass
class PackConfig:
    """What ``treeprep pack`` does."""

    #: tokens per micro-batch (computed plus recomputed)
    budget: int
    #: data-parallel ranks
    world_size: int = 1
    #: micro-batches per rank per optimizer step (gradient accumulation)
    steps_of: int = 1
    #: seed of the epoch's tree order
    seed: int = 0
    #: cost model for balancing ranks: a preset name or a config.json path
    model: str = DEFAULT_MODEL
    #: plan folder name under OUT/plans/ (default from the settings)
    name: str | None = None

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise PackError(f"budget must be >= 1 token, got {self.budget}")
        if self.world_size < 1:
            raise PackError(f"world_size must be >= 1, got {self.world_size}")
        if self.steps_of < 1:
            raise PackError(f"steps_of must be >= 1, got {self.steps_of}")
        if self.name is not None and (not self.name or "/" in self.name or self.name[0] == "."):
            raise PackError(f"plan name {self.name!r}: expected a plain folder name")

    @property
    def plan_name(self) -> str:
        if self.name:
            return self.name
        return f"b{self.budget}-w{self.world_size}-n{self.steps_of}-s{self.seed}"


# --------------------------------------------------------------------------------------------
# 1. the forest: every tree's planning columns, flat
# --------------------------------------------------------------------------------------------


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
    def _segsum(self, values: np.ndarray, off: np.ndarray) -> np.ndarray:
        if len(off) < 2:
            return np.zeros(0, dtype=np.int64)
        out = np.add.reduceat(values, off[:-1]) if len(values) else np.zeros(len(off) - 1)
        out = np.asarray(out, dtype=np.int64)
        out[np.diff(off) == 0] = 0
        return out

    def node_pairs(self) -> np.ndarray:
        """Attention pairs of each node's tokens: sum over its tokens of (depth + 1)."""
        n, d = self.node_length, self.node_depth
        return n * d + n * (n + 1) // 2

    def tokens_tree(self) -> np.ndarray:
        return self._segsum(self.node_length, self.node_off)

    def tokens_linear(self) -> np.ndarray:
        return self._segsum(self.seq_length * self.seq_count, self.seq_off)

    def pairs_tree(self) -> np.ndarray:
        return self._segsum(self.node_pairs(), self.node_off)

    def pairs_linear(self) -> np.ndarray:
        L = self.seq_length
        return self._segsum(L * (L + 1) // 2 * self.seq_count, self.seq_off)

    def longest_path(self) -> np.ndarray:
        if not self.num_trees:
            return np.zeros(0, dtype=np.int64)
        return np.maximum.reduceat(self.node_depth + self.node_length, self.node_off[:-1])


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


def manifest_sha256(out_dir: str) -> str:
    path = os.path.join(out_dir, "manifest.json")
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise ShardError(f"{out_dir}: no readable manifest.json; not a finished build ({e})") from e


def shard_names(out_dir: str) -> list[str]:
    """Shard paths relative to the build folder, in manifest order."""
    return [s.path for s in load_manifest(out_dir).shards]


def read_table(out_dir: str, name: str, columns: list[str]) -> pa.Table:
    """Some columns of one shard (pyarrow; the file is memory-mapped)."""
    from treeprep.schemas.shard import read_shard
    from treeprep.shards import check_schema

    path = os.path.join(out_dir, name)
    try:
        table = read_shard(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise ShardError(f"{path}: unreadable shard ({e})") from e
    check_schema(table, path)
    return table.select(columns)


def load_forest(out_dir: str, *, extra: Sequence[str] = ()) -> Forest:
    """The planning columns of every tree of a finished build; ``extra`` shard columns are kept
    as they are in ``Forest.extra`` (one ChunkedArray each, trees in forest order)."""
    names = shard_names(out_dir)
    extras: dict[str, list] = {k: [] for k in extra}
    parts: dict[str, list] = {k: [] for k in ("shard", "row", "gid", "np", "nl", "nd", "sn", "sc")}
    parts["sl"] = []
    noff = [np.zeros(1, dtype=np.int64)]
    soff = [np.zeros(1, dtype=np.int64)]
    nbase = sbase = 0
    for i, name in enumerate(names):
        t = read_table(out_dir, name, _PLAN_COLUMNS + [k for k in extra if k not in _PLAN_COLUMNS])
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


# --------------------------------------------------------------------------------------------
# 2. cutting one large tree into connected parts
# --------------------------------------------------------------------------------------------


@dataclass
class TreeCut:
    """Parts of one tree: ``part_of_node[v]`` and, per part, the node whose path it recomputes
    (``-1``: no prefix)."""

    part_of_node: np.ndarray
    prefix_end: np.ndarray


def _ffd_bundles(sizes: np.ndarray, cap: int) -> list[list[int]]:
    """First-fit decreasing of a few sibling residuals (indices into ``sizes``)."""
    order = np.argsort(-sizes, kind="stable")
    free: list[int] = []
    bundles: list[list[int]] = []
    for i in order.tolist():
        s = int(sizes[i])
        for b, f in enumerate(free):
            if s <= f:
                free[b] -= s
                bundles[b].append(i)
                break
        else:
            free.append(cap - s)
            bundles.append([i])
    return bundles


def cut_tree(parent: np.ndarray, length: np.ndarray, depth: np.ndarray, budget: int) -> TreeCut:
    """Cut one tree (pre-order arrays) into connected parts of at most ``budget`` tokens each,
    prefix included. Every root-to-node path must fit in ``budget`` (checked by the caller)."""
    n = len(parent)
    parent = np.asarray(parent, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    depth = np.asarray(depth, dtype=np.int64)
    # children in CSR form; key -1 collects the roots
    order = np.argsort(parent, kind="stable")
    keys = parent[order]
    starts = np.searchsorted(keys, np.arange(-1, n), side="left")
    ends = np.searchsorted(keys, np.arange(-1, n), side="right")
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
            for bundle in _ffd_bundles(rs[cut], child_cap):
                bid = len(bundle_prefix)
                bundle_prefix.append(v)
                top_bundle[kids[cut[bundle]]] = bid
        if v >= 0:
            resid[v] = total

    for v in range(n - 1, -2, -1):
        settle(v)

    # parts: the bundles plus the main part (uncut roots and what hangs from them)
    main = len(bundle_prefix)
    part = np.empty(n, dtype=np.int64)
    pl = parent.tolist()
    tb = top_bundle.tolist()
    pt = [0] * n
    for v in range(n):
        b = tb[v]
        pt[v] = b if b >= 0 else (pt[pl[v]] if pl[v] >= 0 else main)
    part[:] = pt
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


# --------------------------------------------------------------------------------------------
# 3-4. steps, micro-batches, ranks
# --------------------------------------------------------------------------------------------


def _place(
    sizes: np.ndarray, costs: np.ndarray, nbins: int, budget: int, balanced: bool
) -> np.ndarray:
    """Bin of each item (-1 where it does not fit). ``balanced``: heaviest item first into the
    cheapest bin with room; else first-fit decreasing by tokens."""
    free = np.full(nbins, budget, dtype=np.int64)
    load = np.zeros(nbins, dtype=np.float64)
    where = np.full(len(sizes), -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(sizes)), -(costs if balanced else sizes)))
    inf = np.inf
    for i in order.tolist():
        s = sizes[i]
        room = free >= s
        if not room.any():
            continue
        b = int(np.where(room, load, inf).argmin()) if balanced else int(room.argmax())
        free[b] -= s
        load[b] += costs[i]
        where[i] = b
    return where


def _assign_ranks(bin_cost: np.ndarray, world: int, per_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """LPT: each bin (cost desc) to the least loaded rank with a free slot."""
    rank = np.empty(len(bin_cost), dtype=np.int64)
    slot = np.empty(len(bin_cost), dtype=np.int64)
    load = np.zeros(world, dtype=np.float64)
    used = np.zeros(world, dtype=np.int64)
    for b in np.lexsort((np.arange(len(bin_cost)), -bin_cost)).tolist():
        r = int(np.where(used < per_rank, load, np.inf).argmin())
        rank[b], slot[b] = r, used[r]
        used[r] += 1
        load[r] += bin_cost[b]
    return rank, slot


@dataclass
class Plan:
    table: pa.Table
    summary: PlanSummary


def plan_forest(
    forest: Forest, cfg: PackConfig, *, manifest_sha: str = "", model: ModelShape | None = None
) -> Plan:
    """Plan a forest (see the module docstring). Pure: reads nothing, writes nothing."""
    budget = cfg.budget
    shape = model or load_model(cfg.model)
    fpt, fpp = shape.flops_per_token, shape.flops_per_pair
    nt = forest.num_trees
    tok_tree = forest.tokens_tree()
    longest = forest.longest_path()
    over = np.flatnonzero(longest > budget)
    if over.size:
        i = int(over[np.argmax(longest[over])])
        raise PackError(
            f"group {forest.group_id[i]!r} (shard {forest.shard_names[forest.tree_shard[i]]}, "
            f"row {forest.tree_row[i]}) has a root-to-node path of {longest[i]} tokens, over the "
            f"budget of {budget}; {len(over)} tree(s) need --budget >= {int(longest.max())}"
        )
    pairs_node = forest.node_pairs()
    pairs_tree = forest._segsum(pairs_node, forest.node_off)

    # ---- parts: whole small trees, cut large ones
    it_tree: list[np.ndarray] = []  # per item: tree, part index, tokens, prefix tokens, pairs
    it_part: list[np.ndarray] = []
    it_tok: list[np.ndarray] = []
    it_pre: list[np.ndarray] = []
    it_pairs: list[np.ndarray] = []
    cuts: dict[int, TreeCut] = {}
    small = np.flatnonzero(tok_tree <= budget)
    it_tree.append(small)
    it_part.append(np.zeros(len(small), dtype=np.int64))
    it_tok.append(tok_tree[small])
    it_pre.append(np.zeros(len(small), dtype=np.int64))
    it_pairs.append(pairs_tree[small])
    for t in np.flatnonzero(tok_tree > budget).tolist():
        a, b = int(forest.node_off[t]), int(forest.node_off[t + 1])
        par, ln, dp = forest.node_parent[a:b], forest.node_length[a:b], forest.node_depth[a:b]
        cut = cut_tree(par, ln, dp, budget)
        cuts[t] = cut
        k = len(cut.prefix_end)
        tok = np.bincount(cut.part_of_node, weights=ln, minlength=k).astype(np.int64)
        prs = np.bincount(cut.part_of_node, weights=pairs_node[a:b], minlength=k).astype(np.int64)
        # prefix tokens and pairs: along the path to prefix_end
        cum_tok = dp + ln
        cum_pairs = np.zeros(b - a, dtype=np.int64)
        pn = pairs_node[a:b].tolist()
        pl = par.tolist()
        cp = [0] * (b - a)
        for v in range(b - a):
            cp[v] = pn[v] + (cp[pl[v]] if pl[v] >= 0 else 0)
        cum_pairs[:] = cp
        pe = cut.prefix_end
        has = pe >= 0
        pre_tok = np.where(has, cum_tok[np.maximum(pe, 0)], 0)
        pre_pairs = np.where(has, cum_pairs[np.maximum(pe, 0)], 0)
        it_tree.append(np.full(k, t, dtype=np.int64))
        it_part.append(np.arange(k, dtype=np.int64))
        it_tok.append(tok)
        it_pre.append(pre_tok)
        it_pairs.append(prs + pre_pairs)
    item_tree = np.concatenate(it_tree)
    item_part = np.concatenate(it_part)
    item_tok = np.concatenate(it_tok)
    item_pre = np.concatenate(it_pre)
    item_pairs = np.concatenate(it_pairs)
    # items grouped by tree, parts in order
    o = np.lexsort((item_part, item_tree))
    item_tree, item_part, item_tok, item_pre, item_pairs = (
        x[o] for x in (item_tree, item_part, item_tok, item_pre, item_pairs)
    )
    item_size = item_tok + item_pre
    item_cost = (item_size * fpt + item_pairs * fpp).astype(np.float64)
    tstart = np.searchsorted(item_tree, np.arange(nt), side="left")
    tend = np.searchsorted(item_tree, np.arange(nt), side="right")
    tree_size = forest._segsum(item_size, np.append(tstart, len(item_tree)))

    # ---- steps
    W, m = cfg.world_size, cfg.steps_of
    slots = W * m
    cap = slots * budget
    rng = np.random.default_rng(cfg.seed)
    pending = deque(rng.permutation(nt).tolist())
    item_step = np.full(len(item_tree), -1, dtype=np.int64)
    item_bin = np.full(len(item_tree), -1, dtype=np.int64)  # bin within the step
    step_bins: list[int] = []

    def fit(trees: list[int], nbins: int) -> tuple[list[int], np.ndarray, list[int]]:
        """Place the trees' items in nbins bins; returns (placed trees, their items' bins,
        deferred trees)."""
        deferred: list[int] = []
        while trees:
            idx = np.concatenate([np.arange(tstart[t], tend[t]) for t in trees])
            for balanced in (True, False):
                where = _place(item_size[idx], item_cost[idx], nbins, budget, balanced)
                if (where >= 0).all():
                    return trees, where, deferred
            failed = set(item_tree[idx[where < 0]].tolist())
            deferred.extend(t for t in trees if t in failed)
            trees = [t for t in trees if t not in failed]
        return [], np.zeros(0, dtype=np.int64), deferred

    while pending:
        chosen: list[int] = []
        total = 0
        while pending and total + tree_size[pending[0]] <= cap:
            t = pending.popleft()
            chosen.append(t)
            total += int(tree_size[t])
        placed: list[int] = []
        deferred: list[int] = []
        nbins = slots
        if chosen:
            placed, where, deferred = fit(chosen, nbins)
        if not placed:
            # the first tree alone needs more slots than a step has: a longer step of its own
            t = chosen[0] if chosen else pending.popleft()
            deferred = [x for x in deferred if x != t]
            idx = np.arange(tstart[t], tend[t])
            nbins = W * max(m, -(-len(idx) // W))
            while True:
                where = _place(item_size[idx], item_cost[idx], nbins, budget, False)
                if (where >= 0).all():
                    break
                nbins += W
            placed = [t]
        pending.extendleft(reversed(deferred))
        s = len(step_bins)
        idx = np.concatenate([np.arange(tstart[t], tend[t]) for t in placed])
        item_step[idx] = s
        item_bin[idx] = where
        step_bins.append(nbins)

    # ---- ranks
    n_items = len(item_tree)
    item_rank = np.zeros(n_items, dtype=np.int64)
    item_mb = np.zeros(n_items, dtype=np.int64)
    step_info: list[StepInfo] = []
    by_step = np.argsort(item_step, kind="stable")
    sb = np.searchsorted(item_step[by_step], np.arange(len(step_bins) + 1), side="left")
    empty = 0
    for s, nb in enumerate(step_bins):
        idx = by_step[sb[s] : sb[s + 1]]
        bcost = np.bincount(item_bin[idx], weights=item_cost[idx], minlength=nb)
        per_rank = nb // W
        rank, slot = _assign_ranks(bcost, W, per_rank)
        item_rank[idx] = rank[item_bin[idx]]
        item_mb[idx] = slot[item_bin[idx]]
        empty += nb - len(np.unique(item_bin[idx]))
        rc = np.bincount(rank, weights=bcost, minlength=W)
        mean = rc.mean()
        imb = float(rc.max() / mean - 1) if mean > 0 else 0.0
        step_info.append(
            StepInfo(micro_batches_per_rank=per_rank, rank_cost=rc.tolist(), imbalance=imb)
        )

    table = _plan_table(
        forest, cuts, item_tree, item_part, item_tok, item_pre, item_pairs, item_cost,
        item_step, item_rank, item_mb,
    )  # fmt: skip

    tl = int(forest.tokens_linear().sum())
    tt = int(tok_tree.sum())
    tp = int(item_size.sum())
    n_slots = int(sum(step_bins))
    imbs = [x.imbalance for x in step_info]
    summary = PlanSummary(
        manifest_sha256=manifest_sha,
        budget=budget,
        world_size=W,
        steps_of=m,
        seed=cfg.seed,
        cost_model=CostModel(model=shape.name, flops_per_token=fpt, flops_per_pair=fpp),
        trees=nt,
        split_trees=len(cuts),
        parts=n_items,
        sequences=int(forest.seq_count.sum()),
        micro_batches=n_slots - empty,
        empty_micro_batches=empty,
        steps=len(step_bins),
        tokens_linear=tl,
        tokens_tree=tt,
        tokens_pack=tp,
        tokens_recomputed=tp - tt,
        por=1 - tt / tl if tl else 0.0,
        err=1 - tp / tl if tl else 0.0,
        padding_waste=1 - tp / (n_slots * budget) if n_slots else 0.0,
        attn_pairs_linear=int(forest.pairs_linear().sum()),
        attn_pairs_pack=int(item_pairs.sum()),
        imbalance_mean=float(np.mean(imbs)) if imbs else 0.0,
        imbalance_max=float(np.max(imbs)) if imbs else 0.0,
        step_info=step_info,
    )
    return Plan(table=table, summary=summary)


def _list_array(chunks: Sequence[np.ndarray]) -> pa.ListArray:
    lens = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    offs = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lens, out=offs[1:])
    vals = np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offs), pa.array(vals, type=pa.int32()))


def _plan_table(
    forest: Forest,
    cuts: dict[int, TreeCut],
    item_tree: np.ndarray,
    item_part: np.ndarray,
    item_tok: np.ndarray,
    item_pre: np.ndarray,
    item_pairs: np.ndarray,
    item_cost: np.ndarray,
    item_step: np.ndarray,
    item_rank: np.ndarray,
    item_mb: np.ndarray,
) -> pa.Table:
    shard = forest.tree_shard[item_tree]
    row = forest.tree_row[item_tree]
    order = np.lexsort((item_part, row, shard, item_mb, item_rank, item_step))
    num_parts = np.ones(forest.num_trees, dtype=np.int64)
    # per cut tree: nodes and sequences of each part, grouped once
    split: dict[int, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for t, cut in cuts.items():
        k = len(cut.prefix_end)
        num_parts[t] = k
        pon = cut.part_of_node
        o = np.argsort(pon, kind="stable")
        nb = np.searchsorted(pon[o], np.arange(k + 1))
        nodes = [o[nb[p] : nb[p + 1]] for p in range(k)]
        sa, sbnd = int(forest.seq_off[t]), int(forest.seq_off[t + 1])
        sp = pon[forest.seq_node[sa:sbnd]]
        so = np.argsort(sp, kind="stable")
        sbk = np.searchsorted(sp[so], np.arange(k + 1))
        seqs = [so[sbk[p] : sbk[p + 1]] for p in range(k)]
        a = int(forest.node_off[t])
        pl = forest.node_parent[a : int(forest.node_off[t + 1])]
        prefixes = []
        for p in range(k):
            v = int(cut.prefix_end[p])
            path = []
            while v >= 0:
                path.append(v)
                v = int(pl[v])
            prefixes.append(np.array(path[::-1], dtype=np.int64))
        split[t] = (nodes, prefixes, seqs)
    empty = np.zeros(0, dtype=np.int64)
    nodes_c, prefix_c, seqs_c = [], [], []
    for i in order.tolist():
        t = int(item_tree[i])
        if t in split:
            p = int(item_part[i])
            nodes, prefixes, seqs = split[t]
            nodes_c.append(nodes[p])
            prefix_c.append(prefixes[p])
            seqs_c.append(seqs[p])
        else:
            nodes_c.append(np.arange(forest.node_off[t + 1] - forest.node_off[t]))
            prefix_c.append(empty)
            seqs_c.append(np.arange(forest.seq_off[t + 1] - forest.seq_off[t]))
    names = np.array(forest.shard_names, dtype=object)
    gids = np.array(forest.group_id, dtype=object)
    cols = {
        "step": pa.array(item_step[order], type=pa.int32()),
        "rank": pa.array(item_rank[order], type=pa.int32()),
        "micro_batch": pa.array(item_mb[order], type=pa.int32()),
        "shard": pa.array(names[shard[order]].tolist() if len(order) else [], type=pa.string()),
        "row": pa.array(row[order], type=pa.int64()),
        "group_id": pa.array(
            gids[item_tree[order]].tolist() if len(order) else [], type=pa.string()
        ),
        "part": pa.array(item_part[order], type=pa.int32()),
        "num_parts": pa.array(num_parts[item_tree[order]], type=pa.int32()),
        "nodes": _list_array(nodes_c),
        "prefix_nodes": _list_array(prefix_c),
        "seqs": _list_array(seqs_c),
        "tokens": pa.array(item_tok[order], type=pa.int64()),
        "prefix_tokens": pa.array(item_pre[order], type=pa.int64()),
        "attn_pairs": pa.array(item_pairs[order], type=pa.int64()),
        "cost": pa.array(item_cost[order], type=pa.float64()),
    }
    return pa.Table.from_pydict(cols, schema=PLAN_SCHEMA)


# --------------------------------------------------------------------------------------------
# on disk
# --------------------------------------------------------------------------------------------


def plan_build(out_dir: str, cfg: PackConfig) -> Plan:
    """Plan a finished build in memory (``treeprep stats --budget`` uses this)."""
    sha = manifest_sha256(out_dir)
    return plan_forest(load_forest(out_dir), cfg, manifest_sha=sha)


def write_plan(plan: Plan, plan_dir: str) -> None:
    """Write ``plan.arrow`` then ``summary.json``, each atomically (temporary name, rename); an
    older summary is removed first so a half-replaced plan is never taken for a whole one."""
    os.makedirs(plan_dir, exist_ok=True)
    summary_path = os.path.join(plan_dir, "summary.json")
    if os.path.exists(summary_path):
        os.remove(summary_path)
    path = os.path.join(plan_dir, "plan.arrow")
    with pa.OSFile(path + ".tmp", "wb") as sink, ipc.new_file(sink, PLAN_SCHEMA) as w:
        w.write_table(plan.table)
    os.replace(path + ".tmp", path)
    with open(summary_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(plan.summary.model_dump_json(indent=2))
    os.replace(summary_path + ".tmp", summary_path)


def pack(out_dir: str, cfg: PackConfig) -> tuple[str, Plan]:
    """Plan a build and write the plan to ``OUT/plans/<name>/``. Returns (plan folder, plan)."""
    plan = plan_build(out_dir, cfg)
    plan_dir = os.path.join(out_dir, "plans", cfg.plan_name)
    write_plan(plan, plan_dir)
    return plan_dir, plan


def read_plan_summary(plan_dir: str) -> PlanSummary:
    path = os.path.join(plan_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            return PlanSummary.model_validate_json(f.read())
    except OSError as e:
        raise ShardError(f"{plan_dir}: no readable summary.json; not a finished plan ({e})") from e
    except ValueError as e:
        raise ShardError(f"{path}: not a treeprep plan summary ({e})") from e
