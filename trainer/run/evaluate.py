"""Evaluation: a validation split of whole trees (or a second build), and its loss.

* :func:`held_out` picks ``val_fraction`` of a build's trees, whole, by a generator seeded with
  the run's ``seed``: the same build, fraction and seed always hold out the same trees (so a
  resumed run keeps its split; both settings are part of the run's identity,
  :mod:`treeprep.trainer.run.run_identity`).
* :class:`TrainSplit` is the training side: the epochs of :class:`~.data.plans.Epochs` with every
  part of a held-out tree removed (steps left empty are dropped), so no training step ever sees
  a held-out tree.
* :class:`Evaluator` computes the validation loss: the same restored tree loss as training (the
  run's ``loss``, ``norm`` and ``adv_norm``), over every held-out tree at once, with no
  gradient. Its normalizers (``token-mean``'s N, ...) are those of the whole validation set, so
  ``val_loss`` under ``token-mean`` is the mean over every validation target, the number a plain
  per-sequence evaluation gives. The micro-batches are the plan's (the held-out trees' parts of
  the first epoch's plan, or a plan of ``eval_data``), each built on its own, its loss scaled
  from its own normalizer to the whole set's, so memory stays that of one micro-batch; a tree
  planned as hand-off parts runs whole (no gradient: no activations are kept). Every rank runs
  every micro-batch (FSDP2 needs its ranks in lockstep), so the value is the same on all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treeprep.errors import ShardError, TrainingError
from treeprep.trainer import distributed as dist_mod
from treeprep.trainer.config import TrainConfig
from treeprep.trainer.data.plans import (
    EpochPlan,
    Epochs,
    PartRef,
    StepPlan,
    keep_parts,
    make_plan,
    without_trees,
)
from treeprep.trainer.data.reader import BuildReader, check_compatible
from treeprep.trainer.data.steps import StepNormalizers, step_batches, step_normalizers
from treeprep.trainer.run.step import loss_module

Tree = tuple[str, int]


def held_out(reader: BuildReader, fraction: float, seed: int) -> frozenset[Tree]:
    """``fraction`` of the build's trees (at least one, never all), as (shard, row), chosen by a
    generator seeded with ``seed``."""
    trees = [(s, r) for s in reader.shard_names for r in range(reader.table(s).num_rows)]
    k = max(1, round(fraction * len(trees)))
    if k >= len(trees):
        raise TrainingError(
            f"--val-fraction {fraction}: the build has {len(trees)} tree(s), holding out {k} "
            "leaves nothing to train on"
        )
    pick = np.random.default_rng([seed, 0x5EED]).choice(len(trees), size=k, replace=False)
    return frozenset(trees[int(i)] for i in pick)


@dataclass(eq=False)
class TrainSplit(Epochs):
    """:class:`Epochs` without the held-out trees."""

    held: frozenset[Tree] = field(kw_only=True)
    _split: dict[int, EpochPlan] = field(default_factory=dict, init=False, repr=False)

    def whole(self, epoch: int) -> EpochPlan:
        """The epoch's plan over every tree, the held-out ones included."""
        return super().get(epoch)

    def get(self, epoch: int) -> EpochPlan:
        p = self._split.get(epoch)
        if p is None:
            p = without_trees(self.whole(epoch), self.held)
            self._split[epoch] = p
        return p


def _flat(steps: list[StepPlan]) -> list[list[PartRef]]:
    return [mb for st in steps for rank in st.slots for mb in rank if mb]


def _denominator(norm: str, n: StepNormalizers) -> float:
    """What the loss under ``norm`` is divided by (``sum``: nothing)."""
    return {"token-mean": n.tokens, "sequence-mean": n.sequences,
            "trajectory-mean": n.trajectories}.get(str(norm), 1.0)  # fmt: skip


class Evaluator:
    """The validation set of a run, and :meth:`loss` over it."""

    def __init__(self, cfg: TrainConfig, reader: BuildReader, micro: list[list[PartRef]]) -> None:
        self.cfg, self.reader, self.micro = cfg, reader, micro
        whole = step_normalizers(reader, StepPlan(0, [micro]))
        self.total = _denominator(cfg.norm, whole)
        if self.total <= 0:
            raise TrainingError(
                f"the validation set of {reader.out_dir} has no trained target; nothing to evaluate"
            )

    @classmethod
    def of_split(cls, cfg: TrainConfig, split: TrainSplit) -> Evaluator:
        """The held-out trees of ``split``, as micro-batches of its first epoch's plan."""
        steps = keep_parts(split.whole(0), lambda part: (part.shard, part.row) in split.held)
        return cls(cfg, split.reader, _flat(steps))

    @classmethod
    def of_build(
        cls, cfg: TrainConfig, train_reader: BuildReader, vocab_size: int, budget: int, cost: Any
    ) -> Evaluator:
        """``cfg.eval_data``, checked against the model (:func:`check_compatible`) and the
        training build's tokenizer, planned in memory with the run's budget."""
        assert cfg.eval_data is not None
        reader = BuildReader(cfg.eval_data)
        check_compatible(reader, cfg.model, vocab_size)
        mine, theirs = train_reader.manifest.tokenizer, reader.manifest.tokenizer
        if mine.identity != theirs.identity and mine.sha256 != theirs.sha256:
            raise ShardError(
                f"--eval-data {cfg.eval_data}: built with tokenizer {theirs.name!r}, the training "
                f"build {cfg.data} with {mine.name!r}; build both with the same --tokenizer"
            )
        plan = make_plan(reader, budget=budget, seed=cfg.seed, cost_model=cost, cut=cfg.cut)
        return cls(cfg, reader, _flat(plan.steps))

    def loss(self, wrapped: torch.nn.Module, info: dist_mod.DistInfo) -> float:
        """The loss over the whole validation set at the current weights (no gradient)."""
        cfg = self.cfg
        lm = loss_module(wrapped).lm
        was_training = lm.training
        lm.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for mb in self.micro:
                    step = StepPlan(0, [[mb]])
                    scale = _denominator(cfg.norm, step_normalizers(self.reader, step))
                    (b,) = step_batches(self.reader, step, ranks=[0], layout=cfg.layout,
                                        norm=cfg.norm, adv_norm=cfg.adv_norm,
                                        budget=10**12, device=info.device)[0]  # fmt: skip
                    b.part_cuts = None  # no gradient: the whole tree in one forward
                    loss, _ = wrapped(b)
                    total += float(loss) * scale / self.total
        finally:
            lm.train(was_training)
        context = loss_module(wrapped).context  # each rank of a context group: its share
        return context.sum(total) if context is not None else total
