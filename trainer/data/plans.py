"""Plans: which parts of which trees each rank feeds at each optimizer step.

A plan (:mod:`treeprep.schemas.plan`) says, per optimizer step, which *parts* (connected pieces of
trees) go into which micro-batch of which rank: :class:`PartRef` per part, :class:`StepPlan` per
step, :class:`EpochPlan` per pass over the data.

* :func:`load_plan` reads a plan folder written by ``treeprep pack`` (refusing one made for another
  build, and, :func:`validate_plan`, one that does not describe the build exactly);
  :func:`make_plan` plans in memory with the same planner (:mod:`treeprep.pack`, which imports
  neither polars nor torch), so training without ``--plan`` runs exactly what ``treeprep pack``
  would have written.
* :class:`Epochs`: an epoch is a plan: the one given with ``plan`` (the same order every epoch),
  or one made in memory with the packer and seed ``seed + epoch`` (with ``group_by_prefix``, the
  trees ordered by opening and the steps in that seed's order: as deterministic); plans are made on
  first use and kept (they are small).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from treeprep.errors import ShardError, TreeprepError
from treeprep.modes import Cut
from treeprep.schemas.plan import PlanSummary, load_summary
from treeprep.trainer.config import DataConfig
from treeprep.trainer.data.reader import BuildReader


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

    summary = load_summary(plan_dir, manifest_sha256=reader.manifest_sha256,
                           build=reader.out_dir, version=True)  # fmt: skip
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
    group_by_prefix: bool = False,
) -> EpochPlan:
    """Plan in memory with :mod:`treeprep.pack` (what ``treeprep pack`` would write).

    ``cost_model`` is a :class:`treeprep.flops.ModelShape` (default: the packer's default)."""
    from treeprep.pack import PackConfig, load_forest, plan_forest

    cut = Cut.of(cut, "cut", TreeprepError)
    cfg = PackConfig(
        budget=budget,
        world_size=world_size,
        steps_of=steps_of,
        seed=seed,
        cut=cut,
        group_by_prefix=group_by_prefix,
    )
    plan = plan_forest(
        load_forest(reader.out_dir), cfg, manifest_sha=reader.manifest_sha256, model=cost_model
    )
    return _epoch_from_table(plan.table, plan.summary, "in memory")


# --------------------------------------------------------------------------------------------
# epochs
# --------------------------------------------------------------------------------------------


def keep_parts(plan: EpochPlan, keep: Any) -> list[StepPlan]:
    """The plan's steps with only the parts ``keep(part)`` accepts; empty micro-batches and
    steps dropped, steps renumbered."""
    steps: list[StepPlan] = []
    for st in plan.steps:
        slots = [[[p for p in mb if keep(p)] for mb in rank] for rank in st.slots]
        slots = [[mb for mb in rank if mb] for rank in slots]
        if any(slots):
            steps.append(StepPlan(len(steps), slots))
    return steps


def without_trees(plan: EpochPlan, trees: frozenset[tuple[str, int]]) -> EpochPlan:
    """``plan`` without any part of the ``trees`` ((shard, row)); see :func:`keep_parts`."""
    return replace(plan, steps=keep_parts(plan, lambda part: (part.shard, part.row) not in trees))


@dataclass(eq=False)
class Epochs:
    """Epoch plans, made on demand and kept (they are small), without the ``excluded`` trees
    ((shard, row); an RL run's unrewarded ones, :mod:`treeprep.trainer.data.rewarded`)."""

    cfg: DataConfig
    reader: BuildReader
    #: the number of data ranks a step is planned for
    world: int
    #: the packer's cost model (:class:`treeprep.flops.ModelShape`)
    cost: Any
    excluded: frozenset[tuple[str, int]] = frozenset()
    _cache: dict[int, EpochPlan] = field(default_factory=dict, init=False, repr=False)

    def get(self, epoch: int) -> EpochPlan:
        p = self._cache.get(epoch)
        if p is None:
            if self.cfg.plan:
                p = self._cache.get(0) or load_plan(self.reader, self.cfg.plan)
            else:
                p = make_plan(
                    self.reader,
                    budget=self.cfg.budget,
                    world_size=self.world,
                    steps_of=self.cfg.steps_of,
                    seed=self.cfg.seed + epoch,
                    cost_model=self.cost,
                    cut=self.cfg.cut,
                    group_by_prefix=self.cfg.group_by_prefix,
                )
            if self.excluded:
                p = without_trees(p, self.excluded)
            self._cache[epoch] = p
        return p
