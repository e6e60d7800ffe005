"""What a training run is: :class:`TrainConfig`, and what it reports (:class:`StepMetrics`,
:class:`TrainResult`).

The config is one flat dataclass, torchtitan style: a comment under each field says what it
does, and ``__post_init__`` refuses a bad value with a :class:`~treeprep.errors.TrainingError`
naming the field and what was expected, before anything is loaded. The CLI builds one from its
options, ``config.json`` of a run folder is its :func:`config_dict`, and a resumed run checks the
fields that must not change against the checkpoint's copy.

Flat rather than nested (model / data / optimizer sub-configs): every field maps one to one to a
``treeprep train`` option, and the RL knobs are turned into the loss's own :class:`LossConfig`
by :meth:`TrainConfig.loss_config`, validated once here. A component below the run takes its own
settings, not the whole config: the data room's :class:`DataConfig`
(:meth:`DataConfig.from_train`), the loss's :class:`LossConfig`.

This module is low in the trainer's ladder (it imports only :mod:`~treeprep.trainer.models`'
presets): the loss and context parallelism are checked with the loss's facts
(:data:`~treeprep.modes.LOSS_FACTS`, :func:`check_loss`), not by importing the objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from treeprep.errors import TrainingError, TreeprepError
from treeprep.io.hub import local_folder
from treeprep.modes import (
    CLIP_EPS,
    LOSS_FACTS,
    Accumulate,
    AdvNorm,
    Attn,
    Cut,
    KlEstimator,
    Layout,
    Loss,
    LrSchedule,
    Norm,
    Optimizer,
    Parallel,
    PartGraph,
    Precision,
    ReportTo,
    Stores,
    Unrewarded,
    coerce_modes,
    reads_prefix_in_place,
)
from treeprep.trainer.models.presets import PRESETS


@dataclass(frozen=True)
class LossConfig:
    """The objective and its knobs (:mod:`treeprep.trainer.objective.loss` says what each does).

    Torch-free, so that the config, the CLI and the online API name an objective without the
    loss's module; ``treeprep.trainer.objective.loss.LossConfig`` (and the facade's) is this one."""

    loss: Loss = Loss.sft
    #: eps_low of the clip range [1 - clip_eps, 1 + clip_eps_high]
    clip_eps: float = CLIP_EPS
    #: eps_high (DAPO's decoupled clip); None: clip_eps
    clip_eps_high: float | None = None
    #: weight of the KL penalty against the rollouts' reference log-probs
    kl_coef: float = 0.0
    #: weight of the entropy bonus
    entropy_coef: float = 0.0
    #: LM-head rows per chunk
    chunk: int = 4096
    #: k3 or k1 (module docstring)
    kl_estimator: KlEstimator = KlEstimator.k3

    def __post_init__(self) -> None:
        coerce_modes(self, TreeprepError)
        if not 0.0 <= self.clip_eps < 1.0:
            raise TreeprepError(f"clip_eps must be in [0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high < 0.0:
            raise TreeprepError(f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
        if self.chunk < 1:
            raise TreeprepError(f"chunk must be >= 1, got {self.chunk}")


def check_loss(loss: str, cp: int) -> None:
    """Refuse a loss that is not a sum over targets (``gspo``'s sequence ratio) under ``cp > 1``:
    its :data:`~treeprep.modes.LOSS_FACTS` row says whether ``--cp`` may split a sequence."""
    if cp > 1 and not LOSS_FACTS[loss].context_parallel:
        others = "/".join(name for name, f in LOSS_FACTS.items() if f.context_parallel)
        raise TrainingError(
            f"--cp {cp}: {loss}'s sequence-level ratio needs every target of a sequence on one "
            f"rank; use {others}, or --cp 1"
        )


@dataclass
class TrainConfig:
    """What ``treeprep train`` does. Validated in ``__post_init__``."""

    #: the build folder (OUT with manifest.json)
    data: str
    #: a preset name (random weights), a local Hugging Face model folder, or a hub id whose
    #: snapshot is in the local HF cache (replaced by that folder)
    model: str
    #: the run folder: metrics.jsonl, config.json, checkpoints/
    run_dir: str
    #: a plan folder from ``treeprep pack``; None plans in memory with ``budget``/``steps_of``
    plan: str | None = None
    #: sft, ppo, grpo or gspo
    loss: Loss = Loss.sft
    #: sum, token-mean, sequence-mean or trajectory-mean (over the step's global batch)
    norm: Norm = Norm.token_mean
    #: advantages from rewards, over each group's trajectories: grpo, dr-grpo, rloo or none
    adv_norm: AdvNorm = AdvNorm.grpo
    #: an RL loss on trees without advantages or rewards (formats that record none): refuse the
    #: run, or skip those trees, counted (:mod:`treeprep.trainer.data.rewarded`); SFT ignores
    # it
    unrewarded: Unrewarded = Unrewarded.refuse
    #: tree (packed tries) or linear (every sequence on its own: the baseline)
    layout: Layout = Layout.tree
    #: merge the common prefixes of the trees of a micro-batch into one forest (fed once; the
    #: same sequences, coefficients and loss: :mod:`treeprep.pack.share`)
    share_prefixes: bool = True
    #: attention backend: auto, dense, nodes, flex, flash
    attn: Attn = Attn.auto
    #: optimizer steps to run (cycling through epochs); None: ``epochs`` epochs
    steps: int | None = None
    #: epochs to run when ``steps`` is None (default 1)
    epochs: int | None = None
    #: tokens per micro-batch for an in-memory plan
    budget: int = 4096
    #: micro-batches per rank per optimizer step for an in-memory plan (gradient accumulation)
    steps_of: int = 1
    #: ranks the in-memory plan is made for (default: the process world size); a single process
    #: runs every rank's micro-batches
    plan_world_size: int | None = None
    #: adamw or sgd
    optimizer: Optimizer = Optimizer.adamw
    #: the peak learning rate (after the warmup)
    lr: float = 3e-4
    #: the shape after the warmup: cosine or linear down to lr * min_lr_ratio, or constant. The
    #: rate of a step is a function of (step, total steps, warmup, min ratio) alone, so a resume
    #: with another step count continues on the new schedule (:class:`~.step.Schedule`)
    lr_schedule: LrSchedule = LrSchedule.cosine
    #: the cosine or linear schedule ends at lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    #: linear warmup over this many optimizer steps
    warmup_steps: int = 0
    #: or over this fraction of the run's steps (rounded up), as TRL's ``warmup_ratio``
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    #: SGD momentum
    momentum: float = 0.0
    #: clip the global gradient norm to this (None or 0: no clipping, the norm is still logged)
    grad_clip: float | None = 1.0
    seed: int = 0
    #: auto (bf16 autocast on CUDA, float32 on CPU), float32, bfloat16 (autocast), float16
    #: (autocast and a dynamic grad scaler, for CUDA cards without bf16; checkpoints keep its
    #: scale) or float64 (weights, coefficients and loss: verification runs)
    precision: Precision = Precision.auto
    #: auto, cpu, cuda
    device: str = "auto"
    #: recompute each decoder layer in the backward pass (less memory, ~1/3 more compute)
    activation_checkpointing: bool = False
    #: ddp or fsdp when run under torchrun with more than one process
    parallel: Parallel = Parallel.ddp
    #: context parallelism: groups of this many consecutive ranks share each micro-batch, Ulysses
    #: over attention heads (:mod:`~treeprep.trainer.context`); data parallel over world / cp
    cp: int = 1
    #: under torchrun: seconds a rank waits in a collective for the others before it stops with
    #: an error naming the rank that did not answer (a rank that dies outright is noticed at
    #: once; one that hangs, after this). Longer than the slowest step or save; None: torch's
    #: default (30 minutes for gloo, 10 for NCCL)
    collective_timeout: float | None = 600.0
    #: checkpoint every N optimizer steps (None: only at the end)
    save_every: int | None = None
    #: also checkpoint when this many minutes of wall time passed since the last checkpoint (or
    #: the start): a preempted or crashed run loses at most this much (None or 0: off)
    save_minutes: float | None = 30.0
    #: keep the newest N checkpoints (None: all)
    keep: int | None = 2
    #: the run's name in the trackers (default: the run folder's name; WANDB_NAME wins for W&B)
    run_name: str | None = None
    #: save a checkpoint after the last step, and its model as a standalone Hugging Face folder
    #: in RUN/final (:mod:`~treeprep.trainer.run.export`)
    save_final: bool = True
    #: a LoRA run's RUN/final holds the base with the adapter merged, not the adapter
    merge_lora: bool = False
    #: resume from this checkpoint folder or run folder; "auto": the newest whole checkpoint of
    #: ``run_dir``, or a fresh start when it has none ("" or None: start fresh)
    resume: str | None = None
    #: start fresh in a run folder that holds an earlier run, deleting that run's checkpoints,
    #: metrics and config (refused without it: the earlier run is never lost by accident)
    overwrite: bool = False
    #: experiment trackers each step's metrics go to: tensorboard (RUN/tensorboard), wandb,
    #: mlflow, trackio (:mod:`.trackers`; a missing extra is refused before the run starts)
    report_to: list[str] = field(default_factory=list)
    #: RL loss settings (:class:`~treeprep.trainer.objective.loss.LossConfig`): the clip range
    #: [1 - clip_eps, 1 + clip_eps_high] (clip_eps_high None: clip_eps), the KL penalty against the
    #: rollouts' reference log-probs and its estimator (k3 or k1), the entropy bonus
    clip_eps: float = CLIP_EPS
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: KlEstimator = KlEstimator.k3
    entropy_coef: float = 0.0
    #: LM-head chunk (rows) in the loss
    chunk: int = 4096
    #: a preset's vocabulary (None: the build tokenizer's); ignored for model folders
    vocab_size: int | None = None
    #: what a hand-off part keeps of its graph: recompute (bounded memory, one extra forward of
    #: the inner parts) or keep (graphs of the depth-first stack kept)
    part_graph: PartGraph = PartGraph.recompute
    #: keep: the most tokens whose graphs the stack holds at once (None: each tree's longest
    #: path less one part, the linear trainer's graph; the parts beyond recompute)
    keep_tokens: int | None = None
    #: gradient accumulators of the handed-over keys and values: model (the stored value's
    #: dtype) or float32 (bf16 runs only: more memory, float32 sums)
    handoff_accumulate: Accumulate = Accumulate.model
    #: where hand-off parts keep their stored keys and values and their accumulators: gpu (the
    #: device), host (a host pool, pinned on CUDA, read a window at a time: the device memory no
    #: longer grows with the path) or auto (host where a tree's stores would not fit the device)
    stores: Stores = Stores.gpu
    #: in-memory plans: trees over the budget run as hand-off parts (handoff) or are cut into
    #: parts that recompute their prefixes (prefix; every path must fit the budget)
    cut: Cut = Cut.handoff
    #: in-memory plans: order each epoch's trees by their opening tokens (the steps, then, in the
    #: epoch's seeded order), as ``treeprep pack --group-by-prefix``: a step's trees share long
    #: openings (fewer tokens fed), its trees are less random (it changes sampling)
    group_by_prefix: bool = False
    #: run the probe before training (tree vs linear layout on a small tree); the structural
    #: check of the token mixers always runs (:mod:`treeprep.trainer.models.guard`)
    probe: bool = True
    #: LoRA rank (0: train all weights); alpha (default 2 r) and target modules (default all
    #: linear layers) through peft; checkpoints then hold the adapter folder. ``lora_dropout``:
    #: dropout on the adapter's input while training (0: off, the exact default; the guard's
    #: probe runs with it off)
    lora_r: int = 0
    lora_alpha: float | None = None
    lora_targets: list[str] | None = None
    lora_dropout: float = 0.0
    #: build the next step's micro-batches (read shards, assemble, copy to the device) in a
    #: background thread while the current step runs (:mod:`treeprep.trainer.data`); the batches
    #: and so the results are the same with it off
    prefetch: bool = True
    #: evaluation (:mod:`treeprep.trainer.run.evaluate`): hold out this fraction of the build's
    # whole
    #: trees (seeded by ``seed``; 0: none), or evaluate on the trees of another build
    #: ``eval_data``; ``val_loss`` is logged every ``eval_every`` steps (None: at the end only)
    #: and at the end
    val_fraction: float = 0.0
    eval_data: str | None = None
    eval_every: int | None = None

    def __post_init__(self) -> None:
        def bad(msg: str) -> TrainingError:
            return TrainingError(f"train config: {msg}")

        coerce_modes(self, TrainingError, "train config: ")  # plain strings from Python callers
        self.loss_config()  # validates the clip range and the chunk
        if self.steps is not None and self.epochs is not None:
            raise bad("give steps or epochs, not both")
        if self.steps is not None and self.steps < 1:
            raise bad(f"steps must be >= 1, got {self.steps}")
        if self.epochs is not None and self.epochs < 1:
            raise bad(f"epochs must be >= 1, got {self.epochs}")
        if self.group_by_prefix and self.plan:
            raise bad(
                "group_by_prefix orders an in-memory plan; a plan folder has its own order "
                "(make it with treeprep pack --group-by-prefix)"
            )
        if self.budget < 1 or self.steps_of < 1:
            raise bad("budget and steps_of must be >= 1")
        if self.cp < 1:
            raise bad(f"cp must be >= 1, got {self.cp}")
        check_loss(self.loss, self.cp)  # gspo's sequence ratio is not a sum over the ranks
        if self.keep_tokens is not None and self.keep_tokens < 0:
            raise bad(f"keep_tokens must be >= 0, got {self.keep_tokens}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise bad(f"lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise bad("min_lr_ratio must be in [0, 1] and warmup_steps >= 0")
        if not 0 <= self.warmup_ratio < 1:
            raise bad(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_ratio and self.warmup_steps:
            raise bad("give warmup_steps or warmup_ratio, not both")
        if self.stores != "gpu" and not reads_prefix_in_place(self.attn):
            raise bad(
                f"stores {self.stores} streams the prefix to a backend that reads it in place "
                f"(auto or nodes), not {self.attn}"
            )
        if self.handoff_accumulate == "float32" and self.precision in ("float32", "float64"):
            raise bad(f"handoff_accumulate float32 is for bf16 runs; precision is {self.precision}")
        if not 0 <= self.lora_dropout < 1 or (self.lora_dropout and not self.lora_r):
            raise bad(f"lora_dropout must be in [0, 1), with lora_r; got {self.lora_dropout}")
        if self.precision == "float16" and self.parallel == "fsdp":
            raise bad("precision float16's grad scaler runs with ddp; under fsdp use bfloat16")
        if self.save_every is not None and self.save_every < 1:
            raise bad(f"save_every must be >= 1, got {self.save_every}")
        if self.collective_timeout is not None and not (
            math.isfinite(self.collective_timeout) and self.collective_timeout > 0
        ):
            raise bad(f"collective_timeout must be a number of seconds > 0, got "
                      f"{self.collective_timeout}")  # fmt: skip
        if self.save_minutes is not None and not self.save_minutes >= 0:
            raise bad(f"save_minutes must be >= 0, got {self.save_minutes}")
        if not 0 <= self.val_fraction < 1:
            raise bad(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.val_fraction and self.eval_data:
            raise bad("give val_fraction or eval_data, not both")
        if self.eval_every is not None and (self.eval_every < 1 or not self.evaluates):
            raise bad("eval_every must be >= 1, with val_fraction or eval_data")
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        # a list of modes (coerce_modes takes single values): each checked here
        self.report_to = [ReportTo.of(r, "report_to", TrainingError, "train config: ")
                          for r in self.report_to or []]  # fmt: skip
        if self.model not in PRESETS:
            self.model = local_folder(self.model, "--model")  # a hub id: its cached snapshot

    @property
    def evaluates(self) -> bool:
        """The run has a validation set (``val_fraction`` or ``eval_data``)."""
        return bool(self.val_fraction or self.eval_data)

    def loss_config(self) -> LossConfig:
        """The objective of this run."""
        try:
            return LossConfig(
                self.loss,
                clip_eps=self.clip_eps,
                clip_eps_high=self.clip_eps_high,
                kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef,
                chunk=self.chunk,
                kl_estimator=self.kl_estimator,
            )
        except TreeprepError as e:
            raise TrainingError(f"train config: {e}") from e


@dataclass(frozen=True)
class DataConfig:
    """What the data room (:mod:`treeprep.trainer.data`) reads of a run: its plans, epochs and
    micro-batches. Each field is the :class:`TrainConfig` field of the same name (documented
    there, validated there); :meth:`from_train` copies them, so ``data/`` never sees the rest."""

    plan: str | None
    budget: int
    steps_of: int
    seed: int
    cut: Cut
    group_by_prefix: bool
    epochs: int | None
    layout: Layout
    norm: Norm
    adv_norm: AdvNorm
    share_prefixes: bool

    @classmethod
    def from_train(cls, cfg: TrainConfig) -> DataConfig:
        """The data settings of the run ``cfg``."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


@dataclass
class StepMetrics:
    """One optimizer step, as logged (one JSON line of metrics.jsonl)."""

    step: int
    epoch: int
    loss: float
    lr: float
    grad_norm: float
    tokens: int  # tokens fed (all ranks), null micro-batches excluded
    tokens_linear: int  # what a linearizing trainer needed for the same sequences
    targets: int
    micro_batches: int
    seconds: float
    tokens_per_s: float
    linear_tokens_per_s: float
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


@dataclass
class TrainResult:
    run_dir: str
    steps: int  # the last optimizer step done (global count)
    history: list[StepMetrics]
    checkpoint: str | None
    plan_source: str
    world_size: int
    #: the signal that stopped the run early (after a checkpoint), e.g. "SIGTERM"; None: it ran
    #: to its end
    stopped: str | None = None
    #: RL steps of this run without a learning signal (every trained advantage zero)
    no_signal_steps: int = 0
    #: RL runs with ``unrewarded="skip"``: the trees (and their sequences) left out for having no
    #: advantages or rewards (:mod:`treeprep.trainer.data.rewarded`)
    unrewarded_trees: int = 0
    unrewarded_sequences: int = 0
    #: the loss, lr and throughput plot (RUN/train.png), when matplotlib is installed
    plot: str | None = None
    #: the last step's model as a standalone Hugging Face folder (RUN/final), when the run
    #: reached its end and saved it (:mod:`~treeprep.trainer.run.export`)
    final: str | None = None

    @property
    def losses(self) -> list[float]:
        return [m.loss for m in self.history]


#: ``callback(event, info)``: "start", "step" (a :class:`StepMetrics` dict) and "checkpoint"
Callback = Callable[[str, dict[str, Any]], None]


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready values (``config.json``, a checkpoint's ``state.json``)."""
    d = asdict(cfg)
    d["betas"] = list(cfg.betas)
    return d


def precision(cfg: TrainConfig, dev: torch.device) -> tuple[str, Any]:
    """The run's precision name and its autocast factory (None: no autocast)."""
    prec: str = cfg.precision
    if prec == "auto":
        prec = "bfloat16" if dev.type == "cuda" else "float32"
    if prec == "bfloat16":
        return prec, bf16_autocast(dev)
    if prec == "float16":
        if dev.type != "cuda":
            raise TrainingError(
                f"--precision float16 needs a CUDA GPU (fp16 autocast with a grad scaler, for "
                f"cards without bf16); this run is on {dev.type}: use float32"
            )
        return prec, lambda: torch.autocast("cuda", dtype=torch.float16, cache_enabled=False)
    return prec, None


def bf16_autocast(dev: torch.device) -> Callable[[], Any]:
    """The autocast factory of a bfloat16 run on ``dev``'s device type. No weight cache: it
    would hold a bf16 copy of every weight until the autocast region (one part's whole forward)
    ends, 2 bytes per parameter on top of sharded weights."""
    return lambda: torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=False)
