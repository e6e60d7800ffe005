"""The training loop behind ``treeprep train``: plan, micro-batches, optimizer steps, checkpoints.

It reads top to bottom like nanochat's training script, in sections:

1. **Set-up.** Join the process group (torchrun) or run alone; open the build; refuse shards of
   another schema version or built with another tokenizer than the model folder's own; load the
   model (float32 master weights; bf16 autocast on CUDA, plain float32 on the CPU; float64 weights,
   coefficients and loss with ``precision="float64"`` for verification runs), optionally with
   activation checkpointing; wrap it for DDP or FSDP2 (:mod:`treeprep.trainer.distributed`); build
   AdamW or SGD and a warmup + cosine schedule.
2. **Data.** An epoch is a plan (:mod:`treeprep.trainer.plan_batches`): the one given with
   ``plan`` (the same order every epoch), or one made in memory with the packer and seed
   ``seed + epoch``. A step's micro-batches carry the step's *global* normalizers, so the sum of
   the micro-batch losses over all ranks is the linearized loss of the step's global batch.
3. **Steps.** Every rank runs its micro-batches (only the last synchronises gradients), the
   gradient is clipped, a non-finite loss or gradient norm stops the run with a clear error before
   the update, then the optimizer and the schedule step. Metrics go to a JSONL file, an optional
   TensorBoard folder and the caller's callback (the CLI draws a progress bar from it). Per step,
   beside the loss: ``clip_frac`` (clipped RL units over all units of the step, all micro-batches
   and ranks), ``approx_kl`` (k3 of the current against the old log-probs, per unit),
   ``entropy`` (per target), ``ref_kl`` (against the reference log-probs, per unit, when the
   rollouts carry them) and ``adv_mean`` / ``adv_std`` / ``adv_min`` / ``adv_max`` over the step's
   trained sequences (duplicates counted).
4. **Checkpoints** (:mod:`treeprep.trainer.checkpoint`) every ``save_every`` steps and at the end,
   atomically; ``resume`` restores weights, optimizer, schedule, data position and random state,
   so that the losses after resuming equal those of an uninterrupted run (tested exactly on CPU).

Single-process runs of a plan made for W ranks run every rank's micro-batches themselves: that is
the reference the multi-process test compares against.

Determinism on the CPU: seeded weights (presets), a deterministic plan, no dropout, and the same
operations in the same order; the run is bit-identical for the same thread count.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from treeprep.errors import ShardError, TrainingError, TreeprepError
from treeprep.trainer import checkpoint as ckpt_mod
from treeprep.trainer import distributed as dist_mod
from treeprep.trainer.advantages import ADV_NORMS
from treeprep.trainer.batch import LAYOUTS, NORMS, TreeBatch
from treeprep.trainer.loss import KL_ESTIMATORS, LOSSES, LossConfig
from treeprep.trainer.models import PRESETS, apply_lora, guard_model, load_model
from treeprep.trainer.plan_batches import (
    NULL_ROW,
    BuildReader,
    EpochPlan,
    load_plan,
    make_plan,
    step_batches,
)


@dataclass
class TrainConfig:
    """What ``treeprep train`` does. Validated in ``__post_init__``."""

    #: the build folder (OUT with manifest.json)
    data: str
    #: a preset name (random weights) or a local Hugging Face model folder
    model: str
    #: the run folder: metrics.jsonl, config.json, checkpoints/
    run_dir: str
    #: a plan folder from ``treeprep pack``; None plans in memory with ``budget``/``steps_of``
    plan: str | None = None
    #: sft, ppo, grpo or gspo
    loss: str = "sft"
    #: sum, token-mean, sequence-mean or trajectory-mean (over the step's global batch)
    norm: str = "token-mean"
    #: advantages from rewards, over each group's trajectories: grpo, dr-grpo, rloo or none
    adv_norm: str = "grpo"
    #: tree (packed tries) or linear (every sequence on its own: the baseline)
    layout: str = "tree"
    #: attention backend: auto, dense, nodes, flex, flash
    attn: str = "auto"
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
    optimizer: str = "adamw"
    lr: float = 3e-4
    #: the cosine schedule ends at lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    #: SGD momentum
    momentum: float = 0.0
    #: clip the global gradient norm to this (None or 0: no clipping, the norm is still logged)
    grad_clip: float | None = 1.0
    seed: int = 0
    #: auto (bf16 autocast on CUDA, float32 on CPU), float32, bfloat16 (autocast) or float64
    #: (weights, coefficients and loss: verification runs)
    precision: str = "auto"
    #: auto, cpu, cuda
    device: str = "auto"
    #: recompute each decoder layer in the backward pass (less memory, ~1/3 more compute)
    activation_checkpointing: bool = False
    #: ddp or fsdp when run under torchrun with more than one process
    parallel: str = "ddp"
    #: checkpoint every N optimizer steps (None: only at the end)
    save_every: int | None = None
    #: keep the newest N checkpoints (None: all)
    keep: int | None = 2
    #: save a checkpoint after the last step
    save_final: bool = True
    #: resume from this checkpoint folder or run folder ("" or None: start fresh)
    resume: str | None = None
    #: TensorBoard event files under RUN/tensorboard (skipped when tensorboard is absent)
    tensorboard: bool = False
    #: RL loss settings (:class:`~treeprep.trainer.loss.LossConfig`): the clip range
    #: [1 - clip_eps, 1 + clip_eps_high] (clip_eps_high None: clip_eps), the KL penalty against the
    #: rollouts' reference log-probs and its estimator (k3 or k1), the entropy bonus
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    #: LM-head chunk (rows) in the loss
    chunk: int = 4096
    #: a preset's vocabulary (None: the build tokenizer's); ignored for model folders
    vocab_size: int | None = None
    #: how a tree larger than the budget runs as hand-off parts: recompute (bounded memory,
    #: one extra forward of the inner parts) or keep (graphs of the depth-first stack kept)
    handoff: str = "recompute"
    #: in-memory plans: trees over the budget run as hand-off parts (handoff) or are cut with
    #: recomputed prefixes (recompute; every path must fit the budget)
    cut: str = "handoff"
    #: run the probe before training (tree vs linear layout on a small tree); the structural
    #: check of the token mixers always runs (:mod:`treeprep.trainer.models.guard`)
    probe: bool = True
    #: LoRA rank (0: train all weights); alpha (default 2 r) and target modules (default all
    #: linear layers) through peft; checkpoints then hold the adapter folder
    lora_r: int = 0
    lora_alpha: float | None = None
    lora_targets: list[str] | None = None

    def __post_init__(self) -> None:
        def bad(msg: str) -> TrainingError:
            return TrainingError(f"train config: {msg}")

        if self.loss not in LOSSES:
            raise bad(f"loss {self.loss!r}; expected one of {', '.join(LOSSES)}")
        if self.norm not in NORMS:
            raise bad(f"norm {self.norm!r}; expected one of {', '.join(NORMS)}")
        if self.layout not in LAYOUTS:
            raise bad(f"layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        if self.optimizer not in ("adamw", "sgd"):
            raise bad(f"optimizer {self.optimizer!r}; expected adamw or sgd")
        if self.precision not in ("auto", "float32", "bfloat16", "float64"):
            raise bad(f"precision {self.precision!r}; expected auto, float32, bfloat16 or float64")
        if self.adv_norm not in ADV_NORMS:
            raise bad(f"adv_norm {self.adv_norm!r}; expected one of {', '.join(ADV_NORMS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise bad(
                f"kl_estimator {self.kl_estimator!r}; expected one of {', '.join(KL_ESTIMATORS)}"
            )
        self.loss_config()  # validates the clip range and the chunk
        if self.parallel not in dist_mod.PARALLEL:
            raise bad(f"parallel {self.parallel!r}; expected ddp or fsdp")
        if self.steps is not None and self.epochs is not None:
            raise bad("give steps or epochs, not both")
        if self.steps is not None and self.steps < 1:
            raise bad(f"steps must be >= 1, got {self.steps}")
        if self.epochs is not None and self.epochs < 1:
            raise bad(f"epochs must be >= 1, got {self.epochs}")
        if self.budget < 1 or self.steps_of < 1:
            raise bad("budget and steps_of must be >= 1")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise bad("lr must be > 0, min_lr_ratio in [0, 1], warmup_steps >= 0")
        if self.cut not in ("handoff", "recompute"):
            raise bad(f"cut {self.cut!r}; expected handoff or recompute")
        if self.handoff not in ("recompute", "keep"):
            raise bad(f"handoff {self.handoff!r}; expected recompute or keep")
        if self.save_every is not None and self.save_every < 1:
            raise bad(f"save_every must be >= 1, got {self.save_every}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))

    def loss_config(self) -> LossConfig:
        """The objective of this run."""
        try:
            return LossConfig(
                self.loss,  # type: ignore[arg-type]
                clip_eps=self.clip_eps,
                clip_eps_high=self.clip_eps_high,
                kl_coef=self.kl_coef,
                entropy_coef=self.entropy_coef,
                chunk=self.chunk,
                kl_estimator=self.kl_estimator,  # type: ignore[arg-type]
            )
        except TreeprepError as e:
            raise TrainingError(f"train config: {e}") from e


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

    @property
    def losses(self) -> list[float]:
        return [m.loss for m in self.history]


Callback = Callable[[str, dict[str, Any]], None]


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------


def tokenizer_sha256(folder: str) -> str | None:
    """The identity hash :mod:`treeprep.render` records in a manifest, for a model folder's own
    tokenizer (None when the folder has no ``tokenizer.json``)."""
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return None
    from pathlib import Path

    from transformers import AutoTokenizer

    from treeprep.schemas.tokenizer import chat_template_of, folder_sha256

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainingError(f"{folder}: cannot load the model's tokenizer: {e}") from e
    template = chat_template_of(tok)
    if template is None:
        return None  # no chat template: the builds' identity cannot be compared; ids are checked
    return folder_sha256(Path(folder), template)


def check_compatible(reader: BuildReader, model_spec: str, vocab_size: int) -> None:
    """Refuse shards built with another tokenizer than the model folder's, or with token ids
    outside the model's vocabulary."""
    tok = reader.manifest.tokenizer
    if model_spec not in PRESETS and os.path.isdir(model_spec):
        sha = tokenizer_sha256(model_spec)
        if sha is not None and sha != tok.sha256:
            raise ShardError(
                f"{reader.out_dir}: shards were built with tokenizer {tok.name!r} (sha256 "
                f"{tok.sha256[:12]}), but the model folder {model_spec} has another tokenizer "
                f"(sha256 {sha[:12]}); rebuild with `treeprep build ... --tokenizer {model_spec}`"
            )
    top = reader.max_token_id()
    if top >= vocab_size:
        raise ShardError(
            f"{reader.out_dir}: token id {top} is outside the model's vocabulary ({vocab_size}); "
            f"the shards were built with tokenizer {tok.name!r} ({tok.vocab_size} tokens)"
        )


# --------------------------------------------------------------------------------------------
# schedule
# --------------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``.
    ``step`` counts updates already done (0 for the first)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------


class _Epochs:
    """Epoch plans, made on demand and kept (they are small)."""

    def __init__(self, cfg: TrainConfig, reader: BuildReader, world: int, cost: Any) -> None:
        self.cfg, self.reader, self.cost = cfg, reader, cost
        self._cache: dict[int, EpochPlan] = {}
        self.world = world

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
                )
            self._cache[epoch] = p
        return p


def _precision(cfg: TrainConfig, dev: torch.device) -> tuple[str, Any]:
    prec = cfg.precision
    if prec == "auto":
        prec = "bfloat16" if dev.type == "cuda" else "float32"
    if prec == "bfloat16":
        return prec, lambda: torch.autocast(dev.type, dtype=torch.bfloat16)
    return prec, None


def train(cfg: TrainConfig, *, callback: Callback | None = None) -> TrainResult:
    """Run ``cfg`` (see the module docstring). ``callback(event, info)`` receives ``"start"``,
    ``"step"`` (a :class:`StepMetrics` dict) and ``"checkpoint"`` events on rank 0."""
    info = dist_mod.init_distributed(cfg.device)
    try:
        return _train(cfg, info, callback)
    finally:
        dist_mod.shutdown(info)


def _train(cfg: TrainConfig, info: dist_mod.DistInfo, callback: Callback | None) -> TrainResult:
    emit = callback if (callback is not None and info.is_main) else (lambda e, d: None)
    dev = info.device
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % (2**32))

    # ---- 1. build, model, checks
    reader = BuildReader(cfg.data)
    resume = ckpt_mod.open_checkpoint(cfg.resume) if cfg.resume else None
    vocab = None
    if cfg.model in PRESETS:
        vocab = cfg.vocab_size or reader.manifest.tokenizer.vocab_size
        vocab = max(vocab, reader.max_token_id() + 1)
    wdtype = torch.float64 if cfg.precision == "float64" else torch.float32
    lm = load_model(cfg.model, dtype=wdtype, device="cpu", attn=cfg.attn, seed=cfg.seed,
                    vocab_size=vocab)  # fmt: skip
    check_compatible(reader, cfg.model, int(lm.config.vocab_size))
    if cfg.lora_r:
        lm = apply_lora(lm, r=cfg.lora_r, alpha=cfg.lora_alpha, targets=cfg.lora_targets)
    if resume is not None:
        _check_resume(resume, cfg, info)
        ckpt_mod.load_model_weights(lm, resume)
    lm.to(dev)
    guard_model(lm, run_probe=cfg.probe, seed=cfg.seed)  # refuses what is not exact on trees
    lm.train()
    if cfg.activation_checkpointing:
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x
            lm.activation_checkpointing_enable({"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prec, autocast = _precision(cfg, dev)
    lc = cfg.loss_config()
    loss_kw: dict[str, Any] = {
        "loss": lc.loss,
        "attn": None,
        "chunk": lc.chunk,
        "clip_eps": lc.clip_eps,
        "clip_eps_high": lc.clip_eps_high,
        "kl_coef": lc.kl_coef,
        "kl_estimator": lc.kl_estimator,
        "entropy_coef": lc.entropy_coef,
    }
    module = dist_mod.LossModule(lm, loss_kw, autocast)
    wrapped = dist_mod.wrap(module, info, cfg.parallel)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=dev.type == "cuda" or None,
        )
    else:
        opt = torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )

    # ---- 2. data
    from treeprep.flops import from_config

    cost = from_config(lm.config.to_dict(), name=str(cfg.model))
    plan_world = info.world_size
    if not cfg.plan and cfg.plan_world_size:
        plan_world = cfg.plan_world_size
    epochs = _Epochs(cfg, reader, plan_world, cost)
    first = epochs.get(0)
    if not first.steps:  # else the loop would look for a first step forever
        raise TrainingError(
            f"{cfg.data}: the build has no trainable target (its plan has no step: "
            f"{reader.manifest.counts.sequences} sequences); nothing to train"
        )
    if info.distributed and first.world_size != info.world_size:
        raise TrainingError(
            f"the plan {first.source} is for {first.world_size} ranks, this run has "
            f"{info.world_size} processes; re-run treeprep pack --world-size {info.world_size}"
        )
    my_ranks = list(range(first.world_size)) if not info.distributed else [info.rank]
    if cfg.steps is not None:
        total = cfg.steps
    else:
        total = sum(len(epochs.get(e).steps) for e in range(cfg.epochs or 1))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total, cfg.warmup_steps, cfg.min_lr_ratio)
    )

    step, epoch, epoch_step = 0, 0, 0
    if resume is not None:
        opt_state = resume.optimizer_state()
        dist_mod.load_optimizer_state(wrapped, opt, opt_state, cfg.parallel, info)
        sched.load_state_dict(resume.scheduler_state())
        step, epoch, epoch_step = (int(resume.state[k]) for k in ("step", "epoch", "epoch_step"))
        rng = resume.rng(info.rank)
        if rng is not None:
            ckpt_mod.set_rng_state(rng)
    if info.is_main:
        os.makedirs(cfg.run_dir, exist_ok=True)
        with open(os.path.join(cfg.run_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(_config_dict(cfg), f, indent=2)
    metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
    if info.is_main:
        _trim_metrics(metrics_path, step)
    writer = _tensorboard(cfg) if info.is_main else None

    emit(
        "start",
        {
            "total_steps": total,
            "start_step": step,
            "world_size": info.world_size,
            "plan": first.source,
            "plan_world_size": first.world_size,
            "device": str(dev),
            "precision": prec,
            "params": sum(p.numel() for p in lm.parameters()),
            "tensorboard": writer is not None,
        },
    )

    # ---- 3. steps
    history: list[StepMetrics] = []
    last_ckpt: str | None = resume.path if resume is not None else None
    world_scale = float(info.world_size) if info.distributed else 1.0
    budget = first.budget
    try:
        while step < total:
            plan = epochs.get(epoch)
            if epoch_step >= len(plan.steps):
                epoch, epoch_step = epoch + 1, 0
                continue
            if cfg.epochs is not None and epoch >= cfg.epochs:
                break
            sp = plan.steps[epoch_step]
            t0 = time.perf_counter()
            batches = step_batches(reader, sp, ranks=my_ranks, layout=cfg.layout, norm=cfg.norm,
                                   adv_norm=cfg.adv_norm, budget=budget, device=dev)  # fmt: skip
            handoff = any(p.handoff_cuts for p in sp.parts)
            if handoff and cfg.parallel == "fsdp" and info.distributed:
                null = TreeBatch.from_trees([NULL_ROW], norm=cfg.norm, device=dev)
                with dist_mod.fsdp_local(wrapped, null):
                    acc = _micro_batches(wrapped, batches, cfg, budget, world_scale, info, True)
            else:
                acc = _micro_batches(wrapped, batches, cfg, budget, world_scale, info, handoff)
                if handoff and info.distributed:
                    dist_mod.all_reduce_grads(params, info)
            loss_sum, tok, tok_lin, targets, real_mb, extra = acc
            red = dist_mod.all_reduce_sum(
                [loss_sum, float(tok), float(tok_lin), float(targets), float(real_mb)], info
            )
            loss_sum = red[0]
            tok, tok_lin, targets, real_mb = (int(x) for x in red[1:])
            clip = cfg.grad_clip if cfg.grad_clip else float("inf")
            gn = torch.nn.utils.clip_grad_norm_(params, clip)
            if hasattr(gn, "full_tensor"):
                gn = gn.full_tensor()
            grad_norm = float(gn)
            if not math.isfinite(loss_sum) or not math.isfinite(grad_norm):
                raise TrainingError(
                    f"step {step + 1} (epoch {epoch}, plan step {epoch_step}): loss {loss_sum} "
                    f"and gradient norm {grad_norm}; stopped before the update. Last good "
                    f"checkpoint: {last_ckpt or 'none'}. Lower the learning rate or check the data"
                )
            lr_now = float(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t0
            step += 1
            epoch_step += 1
            m = StepMetrics(
                step=step,
                epoch=epoch,
                loss=loss_sum,
                lr=lr_now,
                grad_norm=grad_norm,
                tokens=tok,
                tokens_linear=tok_lin,
                targets=targets,
                micro_batches=real_mb,
                seconds=dt,
                tokens_per_s=tok / dt if dt > 0 else 0.0,
                linear_tokens_per_s=tok_lin / dt if dt > 0 else 0.0,
                extra=extra,
            )
            history.append(m)
            if info.is_main:
                with open(metrics_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(m.to_dict()) + "\n")
                if writer is not None:
                    for k in ("loss", "lr", "grad_norm", "tokens_per_s", "linear_tokens_per_s"):
                        writer.add_scalar(f"train/{k}", getattr(m, k), step)
            emit("step", m.to_dict() | {"total_steps": total})
            done = step >= total or (
                cfg.epochs is not None and epoch_step >= len(plan.steps) and epoch + 1 >= cfg.epochs
            )
            if (cfg.save_every and step % cfg.save_every == 0) or (done and cfg.save_final):
                last_ckpt = save(cfg, info, wrapped, opt, sched, step, epoch, epoch_step, m)
                emit("checkpoint", {"step": step, "path": last_ckpt})
            if done:
                break
    finally:
        if writer is not None:
            writer.close()
    return TrainResult(cfg.run_dir, step, history, last_ckpt, first.source, info.world_size)


def _micro_batches(
    wrapped: torch.nn.Module,
    batches: list[list[Any]],
    cfg: TrainConfig,
    budget: int,
    world_scale: float,
    info: dist_mod.DistInfo,
    handoff: bool,
) -> tuple[float, int, int, int, int, dict[str, float]]:
    """Forward and backward of one step's micro-batches (gradients accumulate in ``.grad``).

    A micro-batch over the budget is one tree run as hand-off parts (:mod:`.parts`). Such a step
    accumulates every micro-batch locally and the caller all-reduces the gradients once (the
    parts' several backward passes per micro-batch do not fit DDP's one-backward hook)."""
    from treeprep.trainer.metrics import StepSums
    from treeprep.trainer.parts import run_parts

    inner = dist_mod.unwrap(wrapped)
    loss_cfg = cfg.loss_config()
    n_mb = len(batches[0])
    loss_sum: Any = 0.0
    sums = StepSums()
    tok = tok_lin = targets = real_mb = 0
    for rank_batches in batches:
        for i, b in enumerate(rank_batches):
            sync = i == n_mb - 1 and not handoff
            # a hand-off step bypasses the wrapper (its forward and hooks expect one backward per
            # forward) and all-reduces once at the end
            fwd = inner if handoff else wrapped
            with dist_mod.grad_sync(wrapped, cfg.parallel, sync):
                if b.handoff is not None:
                    mode: Any = cfg.handoff
                    out = run_parts(inner.lm, b, loss_cfg, budget=budget, mode=mode, attn=cfg.attn,
                                    autocast=inner.autocast, loss_scale=world_scale)  # fmt: skip
                    loss, mets = out.loss, out.metrics
                else:
                    loss, mets = fwd(b)
                    (loss * world_scale).backward()
            loss_sum = loss_sum + loss.detach()
            if b.num_sequences:
                real_mb += 1
                tok += b.num_tokens
                tok_lin += b.tokens_linear
                targets += b.num_targets
                sums.add(mets)
                sums.add_batch(b)
    return float(loss_sum), tok, tok_lin, targets, real_mb, sums.finish(info)


def save(
    cfg: TrainConfig,
    info: dist_mod.DistInfo,
    wrapped: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    step: int,
    epoch: int,
    epoch_step: int,
    last: StepMetrics | None,
) -> str:
    """Write a checkpoint atomically (every rank calls it); returns its final folder."""
    tmp = ckpt_mod.begin_save(cfg.run_dir, step, info.is_main)
    dist_mod.barrier(info)
    ckpt_mod.save_rng(tmp, info.rank)
    model_state = dist_mod.full_model_state(wrapped, cfg.parallel, info)
    opt_state = dist_mod.full_optimizer_state(wrapped, opt, cfg.parallel, info)
    final = ckpt_mod.step_dir_name(step)
    dist_mod.barrier(info)
    if info.is_main:
        lm = dist_mod.unwrap(wrapped).lm
        tok_dir = cfg.model if (cfg.model not in PRESETS and os.path.isdir(cfg.model)) else None
        assert opt_state is not None
        ckpt_mod.save_main(
            tmp,
            model=lm,
            model_state=model_state,
            optimizer_state=opt_state,
            scheduler_state=sched.state_dict(),
            state={
                "step": step,
                "epoch": epoch,
                "epoch_step": epoch_step,
                "world_size": info.world_size,
                "parallel": cfg.parallel if info.distributed else "none",
                "config": _config_dict(cfg),
                "metrics": last.to_dict() if last is not None else None,
            },
            tokenizer_dir=tok_dir,
        )
        final = ckpt_mod.finish_save(cfg.run_dir, tmp, step, cfg.keep)
    dist_mod.barrier(info)
    return os.path.join(ckpt_mod.checkpoints_dir(cfg.run_dir), os.path.basename(final))


def _check_resume(ck: ckpt_mod.Checkpoint, cfg: TrainConfig, info: dist_mod.DistInfo) -> None:
    st = ck.state
    fmt_then = st.get("parallel", "none")
    fmt_now = cfg.parallel if info.distributed else "none"
    if (fmt_then == "fsdp") != (fmt_now == "fsdp"):
        raise ckpt_mod.CheckpointError(
            f"{ck.path}: optimizer state saved under {fmt_then}, this run uses {fmt_now}; "
            "resume with the same parallelism"
        )
    then = st.get("config", {})
    for k in ("data", "loss", "norm", "adv_norm", "layout", "optimizer"):
        if k in then and then[k] != getattr(cfg, k):
            raise ckpt_mod.CheckpointError(
                f"{ck.path}: checkpoint was made with {k}={then[k]!r}, this run has "
                f"{k}={getattr(cfg, k)!r}"
            )


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["betas"] = list(cfg.betas)
    return d


def _trim_metrics(path: str, step: int) -> None:
    """Keep the lines of steps up to ``step`` (a resumed run rewrites what came after)."""
    if not os.path.exists(path):
        return
    if step == 0:
        os.remove(path)
        return
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError):
                continue
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def _tensorboard(cfg: TrainConfig) -> Any:
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(os.path.join(cfg.run_dir, "tensorboard"))
