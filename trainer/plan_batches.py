"""Plans to micro-batches: what each rank feeds the model at each optimizer step.

A plan (:mod:`treeprep.schemas.plan`) says, per optimizer step, which *parts* (connected pieces of
trees) go into which micro-batch of which rank. This module turns it into :class:`TreeBatch`
objects, with pyarrow and numpy only (never polars):

* :class:`BuildReader` opens a finished build: it checks the manifest and every shard's schema
  version, memory-maps shards on first use and hands out tree rows by (shard, row).
* :func:`load_plan` reads a plan folder written by ``treeprep pack`` (refusing one made for another
  build); :func:`make_plan` plans in memory with the same planner (:mod:`treeprep.pack`, which
  imports neither polars nor torch), so training without ``--plan`` runs exactly what ``treeprep
  pack`` would have written. Both give an :class:`EpochPlan`.
* :func:`part_row` rebuilds a part as a small tree in the shard's row format: its recomputed
  prefix nodes plus its own nodes (pre-order ids ascending, so parents still precede children),
  node ids renumbered, ``node_last`` recomputed, and only the part's ``seqs``. Depths are kept, so
  positions are those of the whole tree.
* :func:`step_batches` builds one optimizer step for some ranks. The normalizers of the loss are
  *global*: ``token-mean``'s N, ``sequence-mean``'s S and ``trajectory-mean``'s Tr are counted over
  every sequence of the step on every rank (each rank reads the plan, so it can count without
  communicating), and passed as ``total_tokens`` / ``total_sequences`` / ``total_trajectories`` to
  every micro-batch. Each tree is prepared whole first
  (:func:`treeprep.trainer.advantages.prepare_row`): advantages from rewards over its trajectories,
  and each trajectory's trained targets, so a part keeps its tree's numbers. The sum of all
  micro-batch losses of all ranks is then exactly the linearized loss of the step's global batch,
  however it is split. Empty slots get a null micro-batch (one token, no target, zero loss) so every
  rank runs the same number of forward/backward passes, which DDP and FSDP need.

The linear layout (the baseline) trains the same steps: the step's sequences, every copy on its
own, first-fit-decreasing into micro-batches of the plan's budget, spread over the ranks
longest-first by a linear-plus-attention cost. Same sequences per step, same normalizers, same
loss; only the layout differs, which is what the benchmark compares.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from treeprep.binpack import first_fit_decreasing, longest_processing_time
from treeprep.errors import ShardError, TreeprepError
from treeprep.modes import Cut
from treeprep.schemas import SCHEMA_VERSION, Manifest
from treeprep.schemas.plan import PLAN_VERSION, PlanSummary
from treeprep.schemas.shard import read_shard
from treeprep.trainer.advantages import prepare_row, trained_targets
from treeprep.trainer.batch import TreeBatch
from treeprep.treeindex import path_to_root

#: per-sequence columns a part or a single sequence carries over from its tree
_SEQ_LISTS = (
    "seq_loss_spans",
    "seq_logprobs",
    "seq_advantage",
    "seq_reward",
    "seq_trajectory_id",
    "seq_ref_logprobs",
    "seq_trajectory_tokens",
)

#: a micro-batch for an empty slot: one token, no sequence, so no target and a zero loss
NULL_ROW: dict[str, Any] = {
    "group_id": "<empty slot>",
    "input_ids": [0],
    "node_parent": [-1],
    "node_offset": [0],
    "node_length": [1],
    "node_depth": [0],
    "node_last": [0],
    "seq_node": [],
    "seq_count": [],
    "seq_loss_spans": [],
    "seq_logprobs": [],
    "seq_advantage": [],
    "seq_reward": [],
    "seq_trajectory_id": [],
    "seq_ref_logprobs": [],
}

#: the shard columns a tree row is read with: those of the null row
_ROW_COLUMNS = list(NULL_ROW)


# --------------------------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------------------------


class BuildReader:
    """A finished build: its manifest, and tree rows by (shard, row), shards opened lazily."""

    def __init__(self, out_dir: str, *, cache_trees: int = 256) -> None:
        self.out_dir = out_dir
        path = os.path.join(out_dir, "manifest.json")
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except OSError as e:
            raise ShardError(
                f"{out_dir}: no readable manifest.json; not a finished treeprep build ({e})"
            ) from e
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ShardError(f"{path}: not JSON ({e})") from e
        v = data.get("schema_version") if isinstance(data, dict) else None
        if v != SCHEMA_VERSION:
            raise ShardError(
                f"{path}: shards of schema version {v!r}, this treeprep trains version "
                f"{SCHEMA_VERSION}; rebuild them with this treeprep (treeprep build)"
            )
        try:
            self.manifest = Manifest.model_validate(data)
        except ValueError as e:
            raise ShardError(f"{path}: not a treeprep manifest ({e})") from e
        import hashlib

        self.manifest_sha256 = hashlib.sha256(raw.encode("utf-8")).hexdigest()
        self._tables: dict[str, pa.Table] = {}
        self._rows: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self._cache = cache_trees

    @property
    def shard_names(self) -> list[str]:
        return [s.path for s in self.manifest.shards]

    def table(self, shard: str) -> pa.Table:
        t = self._tables.get(shard)
        if t is None:
            path = os.path.join(self.out_dir, shard)
            try:
                t = read_shard(path)
            except (OSError, pa.ArrowInvalid) as e:
                raise ShardError(f"{path}: unreadable shard ({e})") from e
            v = (t.schema.metadata or {}).get(b"treeprep.schema_version")
            if v is None or int(v) != SCHEMA_VERSION:
                raise ShardError(
                    f"{path}: shard schema version {v.decode() if v else 'missing'}, this "
                    f"treeprep trains version {SCHEMA_VERSION}; rebuild the shards"
                )
            t = t.select(_ROW_COLUMNS)
            self._tables[shard] = t
        return t

    def tree(self, shard: str, row: int) -> dict:
        """One tree row as a dict of Python lists (cached, least recently used dropped)."""
        key = (shard, row)
        hit = self._rows.get(key)
        if hit is not None:
            self._rows.move_to_end(key)
            return hit
        t = self.table(shard)
        if not 0 <= row < t.num_rows:
            raise ShardError(f"{shard}: row {row} out of range ({t.num_rows} trees)")
        r = t.slice(row, 1).to_pylist()[0]
        self._rows[key] = r
        if len(self._rows) > self._cache:
            self._rows.popitem(last=False)
        return r

    def max_token_id(self) -> int:
        """The largest token id in any shard (pyarrow compute; no rows materialised)."""
        import pyarrow.compute as pc

        top = -1
        for name in self.shard_names:
            col = self.table(name).column("input_ids")
            m = pc.max(pc.list_flatten(col)).as_py()
            if m is not None:
                top = max(top, int(m))
        return top


# --------------------------------------------------------------------------------------------
# plans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartRef:
    """One plan row: a connected part of one tree."""

    shard: str
    row: int
    group_id: str
    nodes: tuple[int, ...]
    prefix_nodes: tuple[int, ...]
    seqs: tuple[int, ...]
    tokens: int
    prefix_tokens: int
    #: a hand-off row: part boundaries and part parents (empty for an ordinary part)
    handoff_cuts: tuple[int, ...] = ()
    handoff_parents: tuple[int, ...] = ()


@dataclass
class StepPlan:
    """One optimizer step: ``slots[rank][micro_batch]`` lists the parts of that micro-batch."""

    index: int
    slots: list[list[list[PartRef]]]

    @property
    def parts(self) -> list[PartRef]:
        return [p for rank in self.slots for mb in rank for p in mb]


@dataclass
class EpochPlan:
    """The steps of one pass over the data, for ``world_size`` ranks."""

    world_size: int
    budget: int
    steps: list[StepPlan]
    summary: PlanSummary
    source: str  # the plan folder, or "in memory"


def _epoch_from_table(table: pa.Table, summary: PlanSummary, source: str) -> EpochPlan:
    w = summary.world_size
    nsteps = summary.steps
    if len(summary.step_info) != nsteps:
        raise ShardError(f"{source}: summary lists {len(summary.step_info)} steps, not {nsteps}")
    steps = []
    for s in range(nsteps):
        per_rank = summary.step_info[s].micro_batches_per_rank
        steps.append(StepPlan(s, [[[] for _ in range(per_rank)] for _ in range(w)]))
    cols = table.to_pydict()
    for i in range(table.num_rows):
        s, r, m = cols["step"][i], cols["rank"][i], cols["micro_batch"][i]
        if not (0 <= s < nsteps and 0 <= r < w and 0 <= m < len(steps[s].slots[r])):
            raise ShardError(
                f"{source}: plan row {i} has step {s}, rank {r}, micro-batch {m}, outside the "
                f"summary's {nsteps} steps of {w} ranks"
            )
        steps[s].slots[r][m].append(
            PartRef(
                shard=cols["shard"][i],
                row=int(cols["row"][i]),
                group_id=cols["group_id"][i],
                nodes=tuple(cols["nodes"][i]),
                prefix_nodes=tuple(cols["prefix_nodes"][i]),
                seqs=tuple(cols["seqs"][i]),
                tokens=int(cols["tokens"][i]),
                prefix_tokens=int(cols["prefix_tokens"][i]),
                handoff_cuts=tuple(cols["handoff_cuts"][i]),
                handoff_parents=tuple(cols["handoff_parents"][i]),
            )
        )
    return EpochPlan(w, summary.budget, steps, summary, source)


def load_plan(reader: BuildReader, plan_dir: str) -> EpochPlan:
    """A plan folder written by ``treeprep pack`` for this build."""
    import pyarrow.ipc as ipc

    spath = os.path.join(plan_dir, "summary.json")
    try:
        with open(spath, encoding="utf-8") as f:
            summary = PlanSummary.model_validate_json(f.read())
    except OSError as e:
        raise ShardError(f"{plan_dir}: no readable summary.json; not a finished plan ({e})") from e
    except ValueError as e:
        raise ShardError(f"{spath}: not a treeprep plan summary ({e})") from e
    if summary.plan_version != PLAN_VERSION:
        raise ShardError(
            f"{spath}: plan version {summary.plan_version}, expected {PLAN_VERSION}; re-run pack"
        )
    if summary.manifest_sha256 != reader.manifest_sha256:
        raise ShardError(
            f"{plan_dir}: plan was made for another build (manifest sha256 "
            f"{summary.manifest_sha256[:12]}, {reader.out_dir} has "
            f"{reader.manifest_sha256[:12]}); re-run treeprep pack"
        )
    try:
        with pa.memory_map(os.path.join(plan_dir, "plan.arrow"), "r") as src:
            table = ipc.open_file(src).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise ShardError(f"{plan_dir}: unreadable plan.arrow ({e})") from e
    plan = _epoch_from_table(table, summary, plan_dir)
    validate_plan(reader, plan)
    return plan


def validate_plan(reader: BuildReader, plan: EpochPlan) -> None:
    """Refuse a plan file that does not describe this build exactly (a damaged or tampered plan):
    every part names a shard of the build, every tree of the build is planned and each of its
    sequences exactly once, and no micro-batch computes more than the budget at once (counted
    from the trees' own node lengths, not the plan's token columns; a hand-off row sits alone in
    its micro-batch and each of its parts is within the budget)."""
    src = plan.source
    known = set(reader.shard_names)
    seen: dict[tuple[str, int], list[int]] = {}
    n_seq: dict[tuple[str, int], int] = {}
    for st in plan.steps:
        for r, rank in enumerate(st.slots):
            for m, mb in enumerate(rank):
                where = f"{src}: step {st.index}, rank {r}, micro-batch {m}"
                fed = 0
                for p in mb:
                    if p.shard not in known:
                        raise ShardError(f"{where}: shard {p.shard!r} is not part of this build")
                    tree = reader.tree(p.shard, p.row)
                    n_seq[(p.shard, p.row)] = len(tree["seq_node"])
                    ln = np.asarray(tree["node_length"], dtype=np.int64)
                    nodes = np.asarray(p.nodes + p.prefix_nodes, dtype=np.int64)
                    if len(nodes) and (nodes.min() < 0 or nodes.max() >= len(ln)):
                        raise ShardError(f"{where}: a part names a node outside its tree")
                    if p.handoff_cuts:
                        cuts = np.asarray(p.handoff_cuts, dtype=np.int64)
                        if len(mb) > 1 or int(np.diff(cuts).max()) > plan.budget:
                            raise ShardError(
                                f"{where}: a hand-off row must sit alone and cut its tree into "
                                f"parts of at most {plan.budget} tokens"
                            )
                        continue
                    fed += int(ln[nodes].sum())
                if fed > plan.budget:
                    raise ShardError(
                        f"{where}: {fed} tokens computed at once, over the budget of {plan.budget}"
                    )
                for p in mb:
                    seen.setdefault((p.shard, p.row), []).extend(p.seqs)
    for shard in reader.shard_names:
        for row in range(reader.table(shard).num_rows):
            seqs = sorted(seen.pop((shard, row), []))
            if (shard, row) not in n_seq:
                raise ShardError(f"{src}: {shard} row {row} is a tree of the build the plan omits")
            if seqs != list(range(n_seq[(shard, row)])):
                raise ShardError(
                    f"{src}: {shard} row {row}: the plan trains sequences {seqs[:8]}"
                    f"{'...' if len(seqs) > 8 else ''} of {n_seq[(shard, row)]}; every sequence "
                    "exactly once"
                )
    if seen:
        (shard, row), _ = next(iter(seen.items()))
        raise ShardError(f"{src}: {shard} row {row} is not a tree of this build")


def make_plan(
    reader: BuildReader,
    *,
    budget: int,
    world_size: int = 1,
    steps_of: int = 1,
    seed: int = 0,
    cost_model: Any = None,
    cut: Cut | str = Cut.handoff,
) -> EpochPlan:
    """Plan in memory with :mod:`treeprep.pack` (what ``treeprep pack`` would write).

    ``cost_model`` is a :class:`treeprep.flops.ModelShape` (default: the packer's default)."""
    from treeprep.pack import PackConfig, load_forest, plan_forest

    cut = Cut.of(cut, "cut", TreeprepError)
    cfg = PackConfig(budget=budget, world_size=world_size, steps_of=steps_of, seed=seed, cut=cut)
    plan = plan_forest(
        load_forest(reader.out_dir), cfg, manifest_sha=reader.manifest_sha256, model=cost_model
    )
    return _epoch_from_table(plan.table, plan.summary, "in memory")


# --------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------


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


@dataclass
class StepTotals:
    """The global normalizers of a step, duplicates counted: N trained targets, S sequences,
    Tr trajectories with a trained target."""

    tokens: float
    sequences: float
    trajectories: float = 0.0


def step_totals(reader: BuildReader, step: StepPlan) -> StepTotals:
    n_tok = 0
    n_seq = 0
    trajs: set[tuple[str, int, str]] = set()
    for p in step.parts:
        tree = reader.tree(p.shard, p.row)
        tids = tree.get("seq_trajectory_id")
        for s in p.seqs:
            n = trained_targets(tree["seq_loss_spans"][s])
            c = int(tree["seq_count"][s])
            n_tok += c * n
            n_seq += c if n > 0 else 0
            if n > 0:
                trajs.add((p.shard, p.row, str(tids[s]) if tids is not None else str(s)))
    return StepTotals(float(n_tok), float(n_seq), float(len(trajs)))


def _linear_slots(whole: Any, step: StepPlan, world: int, budget: int) -> list[list[list[dict]]]:
    """The step's sequence copies packed into micro-batches of ``budget`` tokens, per rank
    (``whole(part)`` gives the part's prepared tree)."""
    items: list[dict] = []
    for p in step.parts:
        items.extend(sequence_rows(whole(p), p.seqs))
    sizes = np.array([len(r["input_ids"]) for r in items], dtype=np.int64)
    if len(sizes) and sizes.max() > budget:
        i = int(sizes.argmax())
        raise TreeprepError(
            f"group {items[i]['group_id']!r}: a sequence of {sizes[i]} tokens is over the budget "
            f"of {budget}; the linear layout cannot train it"
        )
    bins = first_fit_decreasing(sizes, budget)
    # longest-processing-time first over ranks; cost = tokens + attention pairs / budget-ish
    cost = np.array(
        [sum(int(sizes[i]) * (1 + int(sizes[i]) / max(budget, 1)) for i in b) for b in bins]
    )
    per_rank = -(-len(bins) // world) if bins else 0
    rank, slot = longest_processing_time(cost, world, per_rank)
    ranks: list[list[list[dict]]] = [
        [[] for _ in range(int((rank == r).sum()))] for r in range(world)
    ]
    for b in range(len(bins)):
        ranks[int(rank[b])][int(slot[b])] = [items[i] for i in sorted(bins[b])]
    return ranks


def step_batches(
    reader: BuildReader,
    step: StepPlan,
    *,
    ranks: Sequence[int],
    layout: str = "tree",
    norm: str = "token-mean",
    adv_norm: str = "grpo",
    budget: int,
    device: str | torch.device = "cpu",
) -> list[list[TreeBatch]]:
    """The micro-batches of ``step`` for each rank in ``ranks`` (every rank the same count;
    empty slots hold a null micro-batch). Normalizers are the step's global totals; advantages
    from rewards are normalized by ``adv_norm`` over each whole tree's trajectories."""
    totals = step_totals(reader, step)
    world = len(step.slots)
    kw: dict[str, Any] = {
        "norm": norm,
        "layout": layout,
        "total_tokens": totals.tokens,
        "total_sequences": totals.sequences,
        "total_trajectories": totals.trajectories,
        "adv_norm": adv_norm,
        "device": device,
    }
    prepared: dict[tuple[str, int], dict] = {}

    def whole(p: PartRef) -> dict:
        key = (p.shard, p.row)
        if key not in prepared:
            prepared[key] = prepare_row(reader.tree(p.shard, p.row), adv_norm)
        return prepared[key]

    handoff: dict[tuple[int, int], PartRef] = {}
    if layout == "tree":
        per_rank: list[list[list[dict]]] = [
            [[part_row(whole(p), p) for p in mb] for mb in step.slots[r]] for r in range(world)
        ]
        for r in range(world):
            for m, mb in enumerate(step.slots[r]):
                h = [p for p in mb if p.handoff_cuts]
                if h and len(mb) > 1:
                    raise ShardError(
                        f"plan step {step.index}, rank {r}, micro-batch {m}: a hand-off row "
                        "shares its micro-batch; the plan is damaged"
                    )
                if h:
                    handoff[(r, m)] = h[0]
    elif layout == "linear":
        per_rank = _linear_slots(whole, step, world, budget)
    else:
        raise TreeprepError(f"unknown layout {layout!r}; expected tree or linear")
    slots = max((len(x) for x in per_rank), default=0)
    slots = max(slots, 1)
    out: list[list[TreeBatch]] = []
    for r in ranks:
        mbs = per_rank[r] + [[] for _ in range(slots - len(per_rank[r]))]
        row_batches = []
        for m, rows in enumerate(mbs):
            if not rows:
                row_batches.append(TreeBatch.from_trees([NULL_ROW], **{**kw, "layout": "tree"}))
                continue
            b = TreeBatch.from_trees(rows, **kw)
            h = handoff.get((r, m))
            if h is not None:
                b.handoff = (
                    np.asarray(h.handoff_cuts, dtype=np.int64),
                    np.asarray(h.handoff_parents, dtype=np.int64),
                )
            row_batches.append(b)
        out.append(row_batches)
    return out
