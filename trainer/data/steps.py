"""Steps: a plan's optimizer steps walked in order, each built into its micro-batches.

* :func:`step_plans` walks the steps from a position (epoch, step in the epoch) the way the loop
  counts them; :func:`step_work` builds each one for this process's ranks.
* :func:`step_batches` builds one optimizer step for some ranks: read the shards, assemble every
  :class:`~treeprep.trainer.batch.TreeBatch`, copy it to the device. The normalizers of the loss
  are *global* (:class:`StepNormalizers`): ``token-mean``'s N, ``sequence-mean``'s S and
  ``trajectory-mean``'s Tr are counted over every sequence of the step on every rank (each rank
  reads the plan, so it can count without communicating), and passed as ``total_tokens`` /
  ``total_sequences`` / ``total_trajectories`` to every micro-batch. Each tree is prepared whole
  first (:func:`treeprep.trainer.batch.advantages.prepare_row`): advantages from rewards over
  its
  trajectories, and each trajectory's trained targets, so a part keeps its tree's numbers. The sum
  of all micro-batch losses of all ranks is then exactly the linearized loss of the step's global
  batch, however it is split. Empty slots get a null micro-batch (one token, no target, zero loss)
  so every rank runs the same number of forward/backward passes, which DDP and FSDP need.

The linear layout (the baseline) trains the same steps: the step's sequences, every copy on its
own, first-fit-decreasing into micro-batches of the plan's budget, spread over the ranks
longest-first by a linear-plus-attention cost. Same sequences per step, same normalizers, same
loss; only the layout differs, which is what the benchmark compares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from treeprep.binpack import first_fit_decreasing, longest_processing_time
from treeprep.errors import ShardError, TreeprepError
from treeprep.trainer.batch.advantages import prepare_row, trained_targets
from treeprep.trainer.batch.tree_batch import TreeBatch
from treeprep.trainer.config import DataConfig
from treeprep.trainer.data.plans import EpochPlan, Epochs, PartRef, StepPlan
from treeprep.trainer.data.reader import BuildReader
from treeprep.trainer.data.rows import NULL_ROW, part_row, sequence_rows


@dataclass
class StepNormalizers:
    """The global normalizers of a step's loss, counted from the plan over every rank's parts,
    duplicates counted: N trained targets, S sequences and Tr trajectories with a trained target
    (what ``token-mean``, ``sequence-mean`` and ``trajectory-mean`` divide by)."""

    tokens: float
    sequences: float
    trajectories: float = 0.0


def step_normalizers(reader: BuildReader, step: StepPlan) -> StepNormalizers:
    """The :class:`StepNormalizers` of ``step``, from the trees its parts name."""
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
    return StepNormalizers(float(n_tok), float(n_seq), float(len(trajs)))


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
    share_prefixes: bool = True,
) -> list[list[TreeBatch]]:
    """The micro-batches of ``step`` for each rank in ``ranks`` (every rank the same count;
    empty slots hold a null micro-batch). Normalizers are the step's global totals; advantages
    from rewards are normalized by ``adv_norm`` over each whole tree's trajectories.
    ``share_prefixes`` merges the common prefixes of a tree micro-batch's trees into one forest
    (a hand-off row is alone in its micro-batch, so it is never merged)."""
    totals = step_normalizers(reader, step)
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
    whole = _prepared_trees(reader, adv_norm)
    part_refs: list[dict[int, PartRef]] = [{} for _ in range(world)]
    if layout == "tree":
        per_rank, part_refs = _tree_slots(whole, step)
    elif layout == "linear":
        per_rank = _linear_slots(whole, step, world, budget)
    else:
        raise TreeprepError(f"unknown layout {layout!r}; expected tree or linear")
    slots = max(max((len(x) for x in per_rank), default=0), 1)
    return [_rank_batches(per_rank[r], slots, kw, share_prefixes, part_refs[r]) for r in ranks]


def _prepared_trees(reader: BuildReader, adv_norm: str) -> Callable[[PartRef], dict]:
    """``whole(part)``: the part's tree prepared whole (:func:`prepare_row`), once per tree."""
    prepared: dict[tuple[str, int], dict] = {}

    def whole(p: PartRef) -> dict:
        key = (p.shard, p.row)
        if key not in prepared:
            prepared[key] = prepare_row(reader.tree(p.shard, p.row), adv_norm)
        return prepared[key]

    return whole


def _tree_slots(
    whole: Callable[[PartRef], dict], step: StepPlan
) -> tuple[list[list[list[dict]]], list[dict[int, PartRef]]]:
    """The tree layout: each rank's micro-batches as the plan slots them, one row per part, and
    per rank the hand-off row of each micro-batch that runs as parts (alone in it, or the plan
    is damaged)."""
    world = len(step.slots)
    per_rank = [[[part_row(whole(p), p) for p in mb] for mb in step.slots[r]] for r in range(world)]
    part_refs: list[dict[int, PartRef]] = [{} for _ in range(world)]
    for r in range(world):
        for m, mb in enumerate(step.slots[r]):
            h = [p for p in mb if p.handoff_cuts]
            if h and len(mb) > 1:
                raise ShardError(
                    f"plan step {step.index}, rank {r}, micro-batch {m}: a hand-off row "
                    "shares its micro-batch; the plan is damaged"
                )
            if h:
                part_refs[r][m] = h[0]
    return per_rank, part_refs


def _rank_batches(
    mbs: list[list[dict]],
    slots: int,
    kw: dict[str, Any],
    share_prefixes: bool,
    part_refs: dict[int, PartRef],
) -> list[TreeBatch]:
    """One rank's ``slots`` micro-batches from its rows (``mbs[m]``: micro-batch m's), a
    null micro-batch in each empty slot; ``part_refs[m]``: micro-batch m's hand-off row, whose
    batch gets the plan's part cuts."""
    out: list[TreeBatch] = []
    for m in range(slots):
        rows = mbs[m] if m < len(mbs) else []
        if not rows:
            out.append(TreeBatch.from_trees([NULL_ROW], **{**kw, "layout": "tree"}))
            continue
        ref = part_refs.get(m)
        b = TreeBatch.from_trees(rows, **kw, share_prefixes=share_prefixes and ref is None)
        if ref is not None:
            b.part_cuts = (
                np.asarray(ref.handoff_cuts, dtype=np.int64),
                np.asarray(ref.handoff_parents, dtype=np.int64),
            )
        out.append(b)
    return out


def step_plans(
    epochs: Epochs, epoch: int, epoch_step: int, count: int, max_epochs: int | None
) -> Iterator[tuple[int, int, EpochPlan, StepPlan]]:
    """Up to ``count`` steps from (``epoch``, ``epoch_step``), as (epoch, step in the epoch, the
    epoch's plan, the step), stopping before epoch ``max_epochs`` (None: no epoch limit)."""
    for _ in range(count):
        while True:
            if max_epochs is not None and epoch >= max_epochs:
                return
            plan = epochs.get(epoch)
            if epoch_step < len(plan.steps):
                break
            epoch, epoch_step = epoch + 1, 0
        yield epoch, epoch_step, plan, plan.steps[epoch_step]
        epoch_step += 1


@dataclass
class StepWork:
    """One optimizer step's input: where it sits in the data, and this process's micro-batches
    (``batches[i][m]``: micro-batch m of the i-th rank this process runs)."""

    epoch: int
    epoch_step: int
    epoch_steps: int  # steps in this epoch
    has_parts: bool  # some micro-batch of the step, on any rank, runs as hand-off parts
    batches: list[list[TreeBatch]]


def step_work(
    cfg: DataConfig,
    reader: BuildReader,
    epochs: Epochs,
    *,
    start: tuple[int, int],
    count: int,
    ranks: list[int],
    budget: int,
    device: torch.device,
) -> Iterator[StepWork]:
    """The steps :func:`step_plans` walks, each with its micro-batches built for ``ranks``."""
    for epoch, epoch_step, plan, sp in step_plans(epochs, *start, count, cfg.epochs):
        batches = step_batches(reader, sp, ranks=ranks, layout=cfg.layout, norm=cfg.norm,
                               adv_norm=cfg.adv_norm, budget=budget, device=device,
                               share_prefixes=cfg.share_prefixes)  # fmt: skip
        has_parts = any(p.handoff_cuts for p in sp.parts)
        yield StepWork(epoch, epoch_step, len(plan.steps), has_parts, batches)
