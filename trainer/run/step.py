"""One optimizer step: every micro-batch's forward and backward, the reductions over ranks, the
clip, the non-finite guard and the update; plus the optimizer and its learning-rate schedule.

:class:`Stepper` holds what a step needs (the wrapped model, its trainable parameters, the
optimizer and the schedule) and :meth:`Stepper.run` does one step on this process's micro-batches,
in this order:

1. **Micro-batches** (:func:`micro_batches`). Each rank runs its micro-batches; gradients
   accumulate in ``.grad``. Under DDP only the last micro-batch synchronises them (``no_sync``
   on the others); under FSDP2 every one reduce-scatters into the sharded gradients, so that
   no rank holds an unsharded gradient between them. A micro-batch over the budget is one tree
   run as hand-off parts (:mod:`treeprep.trainer.parts`). Under DDP such a step bypasses the wrapper
   (its hooks expect one backward per forward) and all-reduces the gradients once at the end.
   Under FSDP2 the parameters stay sharded: every part's forward and backward gathers and frees
   them layer by layer, the ranks run their passes in lockstep and each backward
   reduce-scatters (:class:`~treeprep.trainer.parts.sharded.ShardedHandOff`).
2. **Reductions.** The loss and the token counts are summed over ranks, the metric sums are
   reduced and divided (:class:`~treeprep.trainer.run.metrics.StepMetricSums`).
3. **Clip and guard.** The global gradient norm is clipped (``grad_clip``; always logged); a
   non-finite loss or norm raises before the update, naming the step and the last good checkpoint.
4. **Update.** The learning rate of this update's index is set (:class:`Schedule`: a function
   of the step alone, so a resume with another step count needs no scheduler state), the
   optimizer steps, the gradients are dropped.

Losses stay on the device as 0-dim tensors until the step's end, and the batches carry their
input checks as host-side facts (:mod:`treeprep.trainer.batch`), so nothing inside the micro-batch
loop waits for the device; the reduction of the step is the one synchronisation point.

Single-process runs of a plan made for W ranks run every rank's micro-batches themselves, with
the same normalizers, which is the reference the multi-process test compares against.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from treeprep.errors import TrainingError
from treeprep.modes import LOSS_FACTS, LrSchedule
from treeprep.trainer import distributed as dist_mod
from treeprep.trainer.batch.tree_batch import TreeBatch
from treeprep.trainer.config import TrainConfig
from treeprep.trainer.context import context_loss
from treeprep.trainer.data.rows import NULL_ROW
from treeprep.trainer.objective.loss import tree_loss
from treeprep.trainer.parts.host import HostPoolExhausted
from treeprep.trainer.parts.schedule import run_parts
from treeprep.trainer.parts.sharded import ShardedHandOff
from treeprep.trainer.run.metrics import StepMetricSums


class LossModule(torch.nn.Module):
    """The Hugging Face causal LM and the tree loss as one module: ``forward(batch) -> (loss,
    metrics)``: the micro-batch forward. Wrappers (DDP, FSDP2,
    :func:`~treeprep.trainer.distributed.wrap`) see the whole forward pass through it."""

    def __init__(
        self,
        lm: torch.nn.Module,
        loss_kw: dict[str, Any],
        autocast: Any = None,
        context: Any = None,
    ):
        super().__init__()
        self.lm = lm
        self.loss_kw = dict(loss_kw)
        self.autocast = autocast
        #: this rank's context group (:mod:`treeprep.trainer.context`): the forward computes
        #: this rank's share of the micro-batch's loss; None: the whole loss
        self.context = context

    def forward(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        ctx = self.autocast() if self.autocast is not None else contextlib.nullcontext()
        with ctx:
            if self.context is not None:
                out = context_loss(self.lm, batch, self.context, **self.loss_kw)
            else:
                out = tree_loss(self.lm, batch, **self.loss_kw)
        loss = out.loss if out.loss.dtype == torch.float64 else out.loss.float()
        return loss, out.metrics


def loss_module(wrapped: torch.nn.Module) -> LossModule:
    """The :class:`LossModule` inside ``wrapped`` (:func:`~treeprep.trainer.distributed.unwrap`)."""
    inner = dist_mod.unwrap(wrapped)
    assert isinstance(inner, LossModule)
    return inner


def lr_factor(
    step: int, total: int, warmup: int, min_ratio: float, kind: str = LrSchedule.cosine
) -> float:
    """The learning rate of update ``step`` (0 for the first) over the peak rate: a linear warmup
    over ``warmup`` updates, then ``kind`` (cosine or linear from 1 to ``min_ratio`` at
    ``total``, or constant 1). A function of its arguments alone: no state, so a resume with
    another ``total`` is on the new schedule from its first step.

    >>> [round(lr_factor(s, 10, 0, 0.1), 4) for s in (0, 5, 10)]
    [1.0, 0.55, 0.1]
    >>> [lr_factor(s, 4, 2, 0.0, "linear") for s in range(4)]
    [0.5, 1.0, 1.0, 0.5]
    """
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == LrSchedule.constant:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == LrSchedule.linear:
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Schedule:
    """A run's learning-rate schedule over ``total`` optimizer steps (:func:`lr_factor`).

    The rate is set on the optimizer before every update from the update's index, never carried
    by a scheduler's state, so a checkpoint stores this description for information only and a
    resumed run uses the schedule of its own settings."""

    peak: float
    total: int
    warmup: int
    min_ratio: float
    kind: str

    @classmethod
    def of(cls, cfg: TrainConfig, total: int) -> Schedule:
        """``cfg``'s schedule over ``total`` steps (``warmup_ratio`` rounded up to whole steps)."""
        warmup = cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total)
        return cls(cfg.lr, total, warmup, cfg.min_lr_ratio, str(cfg.lr_schedule))

    def lr(self, step: int) -> float:
        """The rate of update ``step`` (0 for the first)."""
        return self.peak * lr_factor(step, self.total, self.warmup, self.min_ratio, self.kind)

    def set(self, opt: torch.optim.Optimizer, step: int) -> float:
        """Put the rate of update ``step`` on every parameter group of ``opt``; that rate."""
        lr = self.lr(step)
        for group in opt.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resumed_line(self, saved: dict[str, Any], step: int) -> str | None:
        """One line when the schedule differs from the checkpoint's ``saved`` one (a resume with
        another step count, warmup, ...): where the run continues. None when it is the same."""
        if {k: saved.get(k) for k in self.state_dict()} == self.state_dict():
            return None
        lr = f"{self.lr(step):.2e}".replace("e-0", "e-").replace("e+0", "e+")
        return f"lr schedule now over {self.total} steps; step {step + 1} at {lr}"


def grad_scaler(cfg: TrainConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """A float16 run's dynamic loss scale (gradients scaled by it in backward, unscaled before
    the clip; a step whose gradients overflow is skipped and the scale halves); None otherwise.
    Checkpoints save its state, so that a resume goes on at the scale it reached."""
    if cfg.precision != "float16":
        return None
    return torch.amp.GradScaler(device.type)


def make_optimizer(
    cfg: TrainConfig, params: list[torch.nn.Parameter], dev: torch.device
) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA) or SGD over ``params``."""
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=dev.type == "cuda" or None,
        )
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


@dataclass
class StepLossAndCounts:
    """What a step ran, summed over its micro-batches on one rank (then, after :meth:`reduce`,
    over every rank): the loss, and the work counts (tokens fed, their linear equivalent, trained
    targets, real micro-batches). Not the loss normalizers (those are planned before the step:
    :class:`~treeprep.trainer.data.steps.StepNormalizers`) nor the metric sums
    (:class:`~treeprep.trainer.run.metrics.StepMetricSums`), whose finished values land in
    ``extra``."""

    loss: Any = 0.0  # a 0-dim tensor on the device until reduced
    tokens: int = 0
    tokens_linear: int = 0
    targets: int = 0
    micro_batches: int = 0  # real ones: null micro-batches of empty slots excluded
    extra: dict[str, float] = field(default_factory=dict)

    def reduce(self, info: dist_mod.DistInfo) -> StepLossAndCounts:
        """The sums over all ranks (the loss as a float)."""
        counts = [self.tokens, self.tokens_linear, self.targets, self.micro_batches]
        red = dist_mod.all_reduce_sum([float(self.loss)] + [float(x) for x in counts], info)
        tok, tok_lin, targets, mbs = (int(x) for x in red[1:])
        return StepLossAndCounts(red[0], tok, tok_lin, targets, mbs, self.extra)


@dataclass
class StepResult:
    """What a step did, for the step's metrics."""

    sums: StepLossAndCounts  # reduced over ranks
    grad_norm: float
    lr: float  # the learning rate the update used


def micro_batches(
    wrapped: torch.nn.Module,
    batches: list[list[TreeBatch]],
    cfg: TrainConfig,
    budget: int,
    world_scale: float,
    info: dist_mod.DistInfo,
    has_parts: bool,
    sharded: ShardedHandOff | None = None,
) -> StepLossAndCounts:
    """Forward and backward of one step's micro-batches (gradients accumulate in ``.grad``).

    A micro-batch over the budget is one tree run as hand-off parts (:mod:`.parts`). Such a step
    accumulates every micro-batch locally and the caller all-reduces the gradients once (the
    parts' several backward passes per micro-batch do not fit DDP's one-backward hook), unless
    ``sharded`` (FSDP2) runs every pass in lockstep and reduce-scatters after each backward."""
    inner = loss_module(wrapped)
    n_mb = len(batches[0])
    out = StepLossAndCounts()
    mets_sums = StepMetricSums()
    # the lockstep of a sharded step ends (every rank done, the root reduced) before the
    # metrics' own collectives
    with sharded.step() if sharded is not None else contextlib.nullcontext():
        for rank_batches in batches:
            for i, b in enumerate(rank_batches):
                sync = i == n_mb - 1 and not has_parts
                # a hand-off step bypasses the wrapper (its forward and hooks expect one backward
                # per forward) and all-reduces once at the end; the FSDP2 root is the module
                fwd = inner if has_parts else wrapped
                if sharded is not None:
                    loss, mets = _forward_backward(fwd, b, cfg, budget, world_scale, sharded)
                else:
                    with dist_mod.grad_sync(wrapped, sync):
                        loss, mets = _forward_backward(fwd, b, cfg, budget, world_scale, None)
                out.loss = out.loss + loss.detach()
                if b.num_sequences:
                    mets_sums.add(mets)  # a context group's ranks each add their share
                if b.num_sequences and (inner.context is None or inner.context.counts):
                    out.micro_batches += 1
                    out.tokens += b.num_tokens
                    out.tokens_linear += b.tokens_linear
                    out.targets += b.num_targets
                    mets_sums.add_batch(b)
    out.extra = mets_sums.finish(info, rl=LOSS_FACTS[cfg.loss].rl)
    return out


def _forward_backward(
    fwd: torch.nn.Module,
    b: TreeBatch,
    cfg: TrainConfig,
    budget: int,
    world_scale: float,
    sharded: ShardedHandOff | None,
) -> tuple[torch.Tensor, Any]:
    """One micro-batch: as hand-off parts when it has them, else one forward and backward;
    ``sharded`` is told before each pass."""
    gate = sharded.before_pass if sharded is not None else None
    if b.part_cuts is not None:
        inner = loss_module(fwd)
        res = run_parts(
            inner.lm,
            b,
            cfg.loss_config(),
            budget=budget,
            mode=cfg.part_graph,
            attn=cfg.attn,
            autocast=inner.autocast,
            loss_scale=world_scale,
            accumulate=cfg.handoff_accumulate,
            keep_tokens=cfg.keep_tokens,
            before_pass=gate,
            stores=cfg.stores,
            context=inner.context,
        )
        return res.loss, res.metrics
    if gate is not None:
        gate("forward")
    loss, mets = fwd(b)
    if gate is not None:
        gate("backward")
    (loss * world_scale).backward()
    return loss, mets


class Stepper:
    """The model, optimizer and schedule of a run, stepped one optimizer step at a time."""

    def __init__(
        self,
        cfg: TrainConfig,
        info: dist_mod.DistInfo,
        wrapped: torch.nn.Module,
        params: list[torch.nn.Parameter],
        opt: torch.optim.Optimizer,
        schedule: Schedule,
        budget: int,
        *,
        step: int = 0,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.cfg, self.info, self.wrapped, self.params = cfg, info, wrapped, params
        self.opt, self.schedule, self.budget = opt, schedule, budget
        #: updates done (the resumed step): the index of the next update in the schedule
        self.step = step
        self.world_scale = float(info.world_size) if info.distributed else 1.0
        #: FSDP2's lockstep for hand-off steps, made on the first one
        self.sharded: ShardedHandOff | None = None
        #: float16 runs: the dynamic loss scale (:func:`grad_scaler`)
        self.scaler = scaler if scaler is not None else grad_scaler(cfg, info.device)
        #: updates skipped for an overflowing float16 gradient
        self.skipped = 0

    def run(
        self, batches: list[list[TreeBatch]], *, has_parts: bool, where: str, last_ckpt: str | None
    ) -> StepResult:
        """One optimizer step on this process's micro-batches (module docstring). ``has_parts``:
        some micro-batch of the step (on any rank) runs as hand-off parts; ``where`` names the
        step in the error a non-finite loss raises."""
        try:
            sums = self._forward_backward(batches, has_parts).reduce(self.info)
        except HostPoolExhausted as e:
            raise TrainingError(
                f"{where}: {e}. See what a run needs with --dry-run --host-memory SIZE; lower "
                "--budget (smaller parts), spread the path over ranks with --cp N, or keep the "
                "stores on the GPU with --stores gpu"
            ) from e
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        grad_norm = self._clip()
        if self.scaler is not None and math.isfinite(sums.loss) and not math.isfinite(grad_norm):
            return self._skip(sums, grad_norm)  # a float16 overflow: a smaller scale next step
        if not math.isfinite(sums.loss) or not math.isfinite(grad_norm):
            raise TrainingError(
                f"{where}: loss {sums.loss} and gradient norm {grad_norm}; stopped before the "
                f"update. Last good checkpoint: {last_ckpt or 'none'}. Lower the learning rate "
                "or check the data"
            )
        lr_now = self.schedule.set(self.opt, self.step)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.step += 1
        self.opt.zero_grad(set_to_none=True)
        return StepResult(sums, grad_norm, lr_now)

    def _skip(self, sums: StepLossAndCounts, grad_norm: float) -> StepResult:
        """A float16 step whose scaled gradients overflowed: no update, the scale shrinks (as
        torch's GradScaler and the Hugging Face Trainer do); the step still counts."""
        assert self.scaler is not None
        lr_now = self.schedule.set(self.opt, self.step)
        self.scaler.step(self.opt)  # skips: unscale_ found the infinities
        self.scaler.update()
        self.step += 1
        self.skipped += 1
        self.opt.zero_grad(set_to_none=True)
        return StepResult(sums, grad_norm, lr_now)

    def _forward_backward(
        self, batches: list[list[TreeBatch]], has_parts: bool
    ) -> StepLossAndCounts:
        cfg, info, wrapped = self.cfg, self.info, self.wrapped
        scale = self.world_scale
        if self.scaler is not None:
            # scale() of a one starts the scaler and gives its scale, a power of two: exact
            scale *= float(self.scaler.scale(torch.ones((), device=info.device)))
        args = (wrapped, batches, cfg, self.budget, scale, info)
        if has_parts and cfg.parallel == "fsdp" and info.distributed:
            if self.sharded is None:
                null = TreeBatch.from_trees([NULL_ROW], norm=cfg.norm, device=info.device)
                self.sharded = ShardedHandOff(wrapped, null, info)
            return micro_batches(*args, True, self.sharded)
        sums = micro_batches(*args, has_parts)
        if has_parts and info.distributed:
            dist_mod.all_reduce_grads(self.params, info)
        return sums

    def _clip(self) -> float:
        """Clip the global gradient norm to ``grad_clip`` (no clip when unset); the norm before."""
        clip = self.cfg.grad_clip if self.cfg.grad_clip else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(self.params, clip)
        if hasattr(gn, "full_tensor"):
            gn = gn.full_tensor()
        return float(gn)
