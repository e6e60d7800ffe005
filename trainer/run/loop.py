"""The training loop behind ``treeprep train``: set-up, then steps and checkpoints, top to bottom.

:func:`train` reads like nanochat's training script, in sections; each idea lives in its module:

1. **Set-up.** Join the process group (torchrun) or run alone; open the build; refuse shards of
   another schema version or built with another tokenizer than the model folder's own
   (:mod:`treeprep.trainer.data`); load the model (float32 master weights; bf16 autocast on CUDA,
   plain float32 on the CPU; float64 weights, coefficients and loss with ``precision="float64"``
   for verification runs), optionally with activation checkpointing and LoRA; wrap it for DDP or
   FSDP2 (:mod:`treeprep.trainer.distributed`); build AdamW or SGD and the learning-rate
   schedule (warmup, then cosine, linear or constant: :class:`~.step.Schedule`, a function of the
   step alone). The run is described by :class:`~.config.TrainConfig`.
2. **Data** (:mod:`treeprep.trainer.data`). An epoch is a plan: the one given with ``plan`` (the
   same order every epoch), or one made in memory with the packer and seed ``seed + epoch``. A
   step's micro-batches carry the step's *global* normalizers, so the sum of the micro-batch
   losses over all ranks is the linearized loss of the step's global batch. With ``prefetch`` (the
   default) the next step's batches are built in a background thread while the current step runs.
3. **Steps** (:mod:`treeprep.trainer.run.step`). Every rank runs its micro-batches (only the last
   synchronises gradients), the gradient is clipped, a non-finite loss or gradient norm stops the
   run with a clear error before the update, then the optimizer steps at its step's rate. Metrics go
   to a JSONL file, the ``report_to`` trackers (:mod:`.trackers`) and the caller's callback (the CLI
   draws a progress bar from it). Per step, beside the loss: ``clip_frac`` (clipped RL units over
   all units of the step, all micro-batches and ranks), ``approx_kl`` (k3 of the current against the
   old log-probs, per unit), ``entropy`` (per target), ``ref_kl`` (against the reference log-probs,
   per unit, when the rollouts carry them) and ``adv_mean`` / ``adv_std`` / ``adv_min`` /
   ``adv_max`` over the step's trained sequences (duplicates counted). RL steps whose advantages are
   all zero teach nothing; they are counted (``TrainResult.no_signal_steps``) and flagged to the
   callback. At the end ``RUN/train.png`` plots the loss, lr and throughput (:mod:`.plot`; not
   on a stop signal, whose grace time runs: the resumed run draws the whole run).
   With ``val_fraction`` or ``eval_data`` (:mod:`treeprep.trainer.run.evaluate`), held-out whole
   trees
   never reach a step, and ``val_loss`` (the same loss over every validation tree, no gradient)
   joins the step's metrics every ``eval_every`` steps and at the end.
4. **Checkpoints** (:mod:`treeprep.trainer.run.checkpoint`) every ``save_every`` steps, every
   ``save_minutes`` of wall time, at the end, and when a stop signal arrived
   (:mod:`treeprep.trainer.run.preemption`: SIGTERM, SIGINT, SIGUSR1 save at the next step boundary,
   all
   ranks together, and the run returns with ``stopped`` set), atomically. ``resume`` (a folder, or
   ``auto``: the run folder's newest checkpoint) is first checked against the run's identity
   (:mod:`treeprep.trainer.run.run_identity`: the build by content, the tokenizer, the model, the
   plan
   and every setting that changes the math), then restores weights, optimizer, data position and
   random state (the learning rate follows from the step and this run's settings: a resume with
   another step count says where the new schedule stands), so that the losses after resuming equal
   those of an uninterrupted run (tested exactly on CPU). The glue between the loop and the
   checkpoint files is :mod:`.saver` (:func:`save`, ``RUN/final``); the metrics log cut back to
   the resumed step stays here.
5. **A lost rank.** A rank that dies or hangs under torchrun fails the others' next collective
   (at once for a closed connection, after ``collective_timeout`` for a silent one); each
   survivor stops with an error naming the rank, the last whole checkpoint and ``--resume
   auto`` (:func:`~treeprep.trainer.distributed.rank_lost`), and saves nothing on the way out.

Single-process runs of a plan made for W ranks run every rank's micro-batches themselves: that is
the reference the multi-process test compares against.

Determinism on the CPU: seeded weights (presets), a deterministic plan, no dropout, and the same
operations in the same order; the run is bit-identical for the same thread count, with prefetch
on or off.

``TrainConfig``, ``StepMetrics``, ``TrainResult`` and ``lr_factor`` are re-exported here, where
the CLI, the benchmarks and the tests import them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import Any, cast

import numpy as np
import torch

from treeprep.atomic import make_dirs, write_atomic, writing
from treeprep.errors import TrainingError
from treeprep.io.paths import open_regular
from treeprep.trainer import distributed as dist_mod
from treeprep.trainer.config import (
    Callback,
    DataConfig,
    StepMetrics,
    TrainConfig,
    TrainResult,
    config_dict,
    precision,
)
from treeprep.trainer.context import (
    check_model,
    data_rank,
    data_world,
    new_context,
    refuse_early,
)
from treeprep.trainer.data.plans import Epochs
from treeprep.trainer.data.prefetch import Prefetch
from treeprep.trainer.data.reader import BuildReader, model_for_build
from treeprep.trainer.data.rewarded import rewarded_only
from treeprep.trainer.data.steps import step_work
from treeprep.trainer.models.guard import guard_model
from treeprep.trainer.models.lora import apply_lora
from treeprep.trainer.run import checkpoint as ckpt_mod
from treeprep.trainer.run import preemption, run_lock, trackers
from treeprep.trainer.run.evaluate import Evaluator, TrainSplit, held_out
from treeprep.trainer.run.metrics import no_learning_signal
from treeprep.trainer.run.plot import plot_run
from treeprep.trainer.run.preemption import StopSignals
from treeprep.trainer.run.run_identity import (
    ResumeNotes,
    check_optimizer_format,
    check_resume,
    run_identity,
)
from treeprep.trainer.run.saver import Saver, export_final, restore, save, saved_schedule
from treeprep.trainer.run.step import (
    LossModule,
    Schedule,
    Stepper,
    StepResult,
    grad_scaler,
    lr_factor,
    make_optimizer,
)

__all__ = [
    "Callback",
    "StepMetrics",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "lr_factor",
    "save",
    "train",
]


def train(cfg: TrainConfig, *, callback: Callback | None = None) -> TrainResult:
    """Run ``cfg`` (see the module docstring). ``callback(event, info)`` receives ``"start"``,
    ``"step"`` (a :class:`StepMetrics` dict), ``"checkpoint"``, ``"signal"`` and ``"warning"``
    (``{"message": ...}``: a tracker dropped mid-run) events on rank 0."""
    # --cp refusals before any process group work: one line on every rank, nothing waits
    refuse_early(cfg.cp, int(os.environ.get("WORLD_SIZE", "1")), str(cfg.model))
    info = dist_mod.init_distributed(cfg.device, cfg.collective_timeout)
    try:
        return _train(cfg, info, callback)
    except Exception as e:
        if not (info.distributed and dist_mod.collective_failed(e)):
            raise
        # another rank died or hung (docs/training.md): say which, and where to resume from
        info.broken = True
        last = ckpt_mod.latest_checkpoint(cfg.run_dir)
        raise dist_mod.rank_lost(e, info, cfg.collective_timeout, last) from e
    finally:
        run_lock.release_run_folder(cfg.run_dir)  # taken by _claim_run_folder
        dist_mod.shutdown(info)


def _resume_path(cfg: TrainConfig) -> str | None:
    """The checkpoint (or run folder) to resume: ``auto`` is the run folder's newest whole
    checkpoint, or None (a fresh start) when it has none."""
    if cfg.resume == "auto":
        return ckpt_mod.latest_checkpoint(cfg.run_dir)
    return cfg.resume or None


def _claim_run_folder(cfg: TrainConfig, info: dist_mod.DistInfo, resume: str | None) -> None:
    """One run at a time in a folder (:mod:`.run_lock`: rank 0 locks it, every rank hears the
    verdict), and a fresh run never lands on an earlier one: refused unless resumed or
    ``overwrite``, or ``resume="auto"`` found no checkpoint (the earlier run saved nothing)."""
    refusal = None
    if info.is_main:
        try:
            run_lock.lock_run_folder(cfg.run_dir)
        except TrainingError as e:
            refusal = str(e)
    refusal = dist_mod.broadcast_object(refusal, info)
    if refusal is not None:
        raise TrainingError(refusal)
    if resume:
        return
    found = ckpt_mod.earlier_run(cfg.run_dir)
    if found and not (cfg.overwrite or cfg.resume == "auto"):
        cps = ckpt_mod.list_checkpoints(cfg.run_dir)
        last = f", last checkpoint step {cps[-1][0]}" if cps else ""
        raise TrainingError(
            f"{cfg.run_dir} holds an earlier run ({', '.join(found)}{last}); continue it with "
            f"--resume auto, replace it with --overwrite, or pick another --out"
        )
    if found and info.is_main:
        ckpt_mod.clear_run(cfg.run_dir)
    dist_mod.barrier(info)


def _train(cfg: TrainConfig, info: dist_mod.DistInfo, callback: Callback | None) -> TrainResult:
    emit = callback if (callback is not None and info.is_main) else (lambda e, d: None)
    dev = info.device
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % (2**32))

    # ---- 1. set-up: the run folder, the build, the resume checks, the model, the optimizer
    if info.is_main:
        trackers.require(cfg.report_to)  # a missing extra is refused before anything loads
    reader = BuildReader(cfg.data)
    # RL on trees without rewards: refused before the run folder is touched (its lock included)
    rewards = rewarded_only(reader, cfg.loss, cfg.adv_norm, cfg.unrewarded)
    resume_path = _resume_path(cfg)
    _claim_run_folder(cfg, info, resume_path)
    skipped = rewards.unrewarded if rewards is not None else frozenset()
    prec, autocast = precision(cfg, dev)
    context = new_context(cfg.cp, info.rank, info.world_size)  # refuses a world cp cannot split
    ident = _identity(cfg, reader, info, prec)
    resume = ckpt_mod.open_checkpoint(resume_path) if resume_path else None
    notes = _check_resume(resume, ident, cfg, info) if resume is not None else None
    lm, wrapped, params, opt = _model_and_optimizer(cfg, reader, resume, info, autocast, context)

    # ---- 2. data: the epochs, the step count and schedule, the position (resumed or 0)
    epochs = _open_epochs(cfg, reader, lm, info, skipped)
    first = epochs.get(0)
    evaluator = _evaluator(cfg, reader, epochs, lm, first.budget)
    if cfg.steps is not None:
        total = cfg.steps
    else:
        total = sum(len(epochs.get(e).steps) for e in range(cfg.epochs or 1))
    sched = Schedule.of(cfg, total)
    step, epoch, epoch_step = 0, 0, 0
    scaler = grad_scaler(cfg, dev)
    resumed = None
    if resume is not None and notes is not None:
        step, epoch, epoch_step = restore(resume, wrapped, opt, cfg, info, scaler)
        resumed = _resumed(resume, notes, sched, step)
    log = _RunLog(cfg, info, step, fresh=resume is None, emit=emit)
    emit("start", {
        "total_steps": total, "start_step": step, "world_size": info.world_size,
        "plan": first.source, "plan_world_size": first.world_size, "device": str(dev),
        "precision": prec, "params": sum(p.numel() for p in lm.parameters()),
        "report_to": [str(r) for r in cfg.report_to], "resumed": resumed,
        "unrewarded": rewards.describe() if rewards is not None and skipped else None,
    })  # fmt: skip

    # ---- 3. steps, each fed by the data of section 2 (built one step ahead with prefetch)
    stepper = Stepper(cfg, info, wrapped, params, opt, sched, first.budget, step=step,
                      scaler=scaler)  # fmt: skip
    my_ranks = [data_rank(info.rank, cfg.cp)] if info.distributed else list(range(first.world_size))
    works = step_work(DataConfig.from_train(cfg), reader, epochs, start=(epoch, epoch_step),
                      count=total - step, ranks=my_ranks, budget=first.budget,
                      device=dev)  # fmt: skip
    saver = Saver(cfg, info, (wrapped, opt, sched), ident, resume.path if resume else None,
                  scaler)  # fmt: skip
    history: list[StepMetrics] = []
    try:

        def said(name: str, now: bool) -> None:
            emit("signal", {"signal": name, "now": now, "step": stepper.step,
                            "checkpoint": saver.last})  # fmt: skip

        with (
            StopSignals(said) as signals,
            Prefetch(works, enabled=cfg.prefetch, device=dev) as feed,
        ):
            step, stopped = _run_steps(cfg, info, feed, stepper, saver, signals, log, emit,
                                       step=step, total=total, history=history,
                                       evaluator=evaluator)  # fmt: skip
    except BaseException:
        # a fresh start that trained no step leaves nothing that would refuse its retry
        log.close(discard=resume is None and not history and saver.last is None)
        raise
    log.close()
    final = export_final(cfg, info, saver, step) if stopped is None else None
    return TrainResult(
        cfg.run_dir, step, history, saver.last, first.source, info.world_size, stopped,
        no_signal_steps=sum(no_learning_signal(cfg.loss, m.extra) for m in history),
        unrewarded_trees=len(skipped),
        unrewarded_sequences=rewards.unrewarded_sequences if rewards is not None else 0,
        plot=plot_run(cfg.run_dir) if info.is_main and stopped is None else None,
        final=final,
    )  # fmt: skip


def _model_and_optimizer(
    cfg: TrainConfig,
    reader: BuildReader,
    resume: ckpt_mod.Checkpoint | None,
    info: dist_mod.DistInfo,
    autocast: Any,
    context: Any,
) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.nn.Parameter], torch.optim.Optimizer]:
    """The model (:func:`_load_lm`), wrapped with its loss for DDP/FSDP2 (and the context
    group of ``--cp``), its trainable parameters and their optimizer."""
    lm = _load_lm(cfg, reader, resume, info)
    check_model(lm, cfg.cp)
    loss_kw = {"attn": None, **asdict(cfg.loss_config())}
    module = LossModule(lm, loss_kw, autocast, context)
    compute = None if autocast is None else autocast().fast_dtype  # FSDP2 gathers in it
    wrapped = dist_mod.wrap(module, info, cfg.parallel, compute)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    return lm, wrapped, params, make_optimizer(cfg, params, info.device)


def _resumed(
    resume: ckpt_mod.Checkpoint, notes: ResumeNotes, sched: Schedule, step: int
) -> dict[str, Any]:
    """What the ``start`` event says of a resume: from where, what changed, and where the
    learning-rate schedule stands when it differs from the checkpoint's."""
    return {
        "step": step,
        "path": resume.path,
        "changed": notes.changed,
        "warnings": notes.warnings,
        "schedule": sched.resumed_line(saved_schedule(resume), step),
    }


def _run_steps(
    cfg: TrainConfig,
    info: dist_mod.DistInfo,
    feed: Any,
    stepper: Stepper,
    saver: Saver,
    signals: StopSignals,
    log: _RunLog,
    emit: Callback,
    *,
    step: int,
    total: int,
    history: list[StepMetrics],
    evaluator: Evaluator | None = None,
) -> tuple[int, str | None]:
    """Sections 3 and 4: the steps, the validation loss (every ``eval_every`` steps and at the
    end, as ``val_loss`` in the step's metrics), and the checkpoints at step boundaries (every
    ``save_every`` steps, every ``save_minutes``, at the end, and on a stop signal). Returns the
    last step and the signal that stopped the run early (None: it ran to its end)."""
    while True:
        t0 = time.perf_counter()
        work = next(feed, None)
        if work is None:
            return step, None
        epoch, epoch_step = work.epoch, work.epoch_step
        where = f"step {step + 1} (epoch {epoch}, plan step {epoch_step})"
        res = stepper.run(work.batches, has_parts=work.has_parts, where=where, last_ckpt=saver.last)
        if info.device.type == "cuda":
            torch.cuda.synchronize(info.device)
        step, epoch_step = step + 1, epoch_step + 1
        m = _step_metrics(step, epoch, res, time.perf_counter() - t0)
        done = step >= total or (
            cfg.epochs is not None and epoch_step >= work.epoch_steps and epoch + 1 >= cfg.epochs
        )
        eval_due = cfg.eval_every is not None and step % cfg.eval_every == 0
        if evaluator is not None and (eval_due or done):
            m.extra["val_loss"] = evaluator.loss(stepper.wrapped, info)
        history.append(m)
        log.write(m)
        no_signal = no_learning_signal(cfg.loss, m.extra)
        emit("step", m.to_dict() | {"total_steps": total, "no_signal": no_signal})

        # ---- 4. checkpoints (a decision every rank takes together)
        stop, due = preemption.agree([signals.received is not None, saver.due()], info)
        stop = stop and not done
        every = cfg.save_every is not None and step % cfg.save_every == 0
        if every or due or stop or (done and cfg.save_final):
            saver.save(step, epoch, epoch_step, m)
            emit("checkpoint", {"step": step, "path": saver.last})
        if stop:
            return step, signals.received or "SIGTERM"  # a signal that reached another rank
        if done:
            return step, None


# --------------------------------------------------------------------------------------------
# set-up
# --------------------------------------------------------------------------------------------


def _load_lm(
    cfg: TrainConfig,
    reader: BuildReader,
    resume: ckpt_mod.Checkpoint | None,
    info: dist_mod.DistInfo,
) -> torch.nn.Module:
    """The model on the device in training mode: checked against the build, with LoRA, the
    resumed weights and activation checkpointing as configured, and refused by the guard when
    treeprep cannot train it exactly."""
    wdtype = torch.float64 if cfg.precision == "float64" else torch.float32
    lm = model_for_build(reader, cfg.model, dtype=wdtype, attn=cfg.attn, seed=cfg.seed,
                         vocab_size=cfg.vocab_size)  # fmt: skip
    if cfg.lora_r:
        lm = apply_lora(lm, r=cfg.lora_r, alpha=cfg.lora_alpha, targets=cfg.lora_targets,
                        dropout=cfg.lora_dropout)  # fmt: skip
    if resume is not None:
        ckpt_mod.load_model_weights(lm, resume)
    lm.to(info.device)
    guard_model(lm, run_probe=cfg.probe, seed=cfg.seed)  # refuses what is not exact on trees
    lm.train()
    if cfg.activation_checkpointing:
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x
            lm.activation_checkpointing_enable({"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return lm


def _open_epochs(
    cfg: TrainConfig,
    reader: BuildReader,
    lm: torch.nn.Module,
    info: dist_mod.DistInfo,
    skipped: frozenset[tuple[str, int]] = frozenset(),
) -> Epochs:
    """The epoch plans, for the process world size (or ``plan_world_size``), without the
    held-out trees of ``val_fraction`` and the ``skipped`` (unrewarded) ones, checked: the first
    has a step, and a plan folder was made for this many processes."""
    from treeprep.flops import from_config

    # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
    cost = from_config(cast(Any, lm).config.to_dict(), name=str(cfg.model))
    plan_world = data_world(info.world_size, cfg.cp)
    if not cfg.plan and cfg.plan_world_size:
        plan_world = cfg.plan_world_size
    data_cfg = DataConfig.from_train(cfg)
    if cfg.val_fraction:
        held = held_out(reader, cfg.val_fraction, cfg.seed)
        epochs: Epochs = TrainSplit(data_cfg, reader, plan_world, cost, skipped, held=held)
    else:
        epochs = Epochs(data_cfg, reader, plan_world, cost, skipped)
    first = epochs.get(0)
    if not first.steps:  # else the loop would look for a first step forever
        raise TrainingError(
            f"{cfg.data}: the build has no trainable target (its plan has no step: "
            f"{reader.manifest.counts.sequences} sequences); nothing to train"
        )
    if info.distributed and first.world_size != plan_world:
        cp = f" in context groups of {cfg.cp} ({plan_world} data ranks)" if cfg.cp > 1 else ""
        raise TrainingError(
            f"the plan {first.source} is for {first.world_size} ranks, this run has "
            f"{info.world_size} processes{cp}; re-run treeprep pack --world-size {plan_world}"
        )
    return epochs


def _evaluator(
    cfg: TrainConfig, reader: BuildReader, epochs: Epochs, lm: torch.nn.Module, budget: int
) -> Evaluator | None:
    """The run's validation set (:mod:`treeprep.trainer.run.evaluate`), or None without one."""
    if isinstance(epochs, TrainSplit):
        return Evaluator.of_split(cfg, epochs)
    if cfg.eval_data:
        # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
        vocab = int(cast(Any, lm).config.vocab_size)
        return Evaluator.of_build(cfg, reader, vocab, budget, epochs.cost)
    return None


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def _step_metrics(step: int, epoch: int, res: StepResult, dt: float) -> StepMetrics:
    s = res.sums
    return StepMetrics(
        step=step,
        epoch=epoch,
        loss=s.loss,
        lr=res.lr,
        grad_norm=res.grad_norm,
        tokens=s.tokens,
        tokens_linear=s.tokens_linear,
        targets=s.targets,
        micro_batches=s.micro_batches,
        seconds=dt,
        tokens_per_s=s.tokens / dt if dt > 0 else 0.0,
        linear_tokens_per_s=s.tokens_linear / dt if dt > 0 else 0.0,
        extra=s.extra,
    )


class _RunLog:
    """The run folder's ``config.json``, ``metrics.jsonl`` (cut back to ``step`` when resuming)
    and the ``report_to`` trackers (:mod:`.trackers`); written by the main rank only.

    A tracker that does not start stops the run on every rank with its one line (rank 0's
    verdict is broadcast), and a fresh run's files are removed, so that the retry is not refused
    as "an earlier run"; one that fails mid-run is dropped with a ``warning`` event."""

    def __init__(
        self,
        cfg: TrainConfig,
        info: dist_mod.DistInfo,
        step: int,
        *,
        fresh: bool = True,
        emit: Callback | None = None,
    ) -> None:
        self.main = info.is_main
        self.emit = emit
        self.run_dir = cfg.run_dir
        self.metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
        self.trackers: list[trackers.Tracker] = []
        refusal = None
        if self.main:
            make_dirs(cfg.run_dir)
            path = os.path.join(cfg.run_dir, "config.json")  # replaced whole: never opened
            write_atomic(path, json.dumps(config_dict(cfg), indent=2).encode())
            _trim_metrics(self.metrics_path, step)
            try:
                self.trackers = trackers.open_trackers(
                    cfg.report_to, cfg.run_dir, config_dict(cfg), run_name=cfg.run_name,
                    resumed=step > 0,
                )  # fmt: skip
            except TrainingError as e:
                refusal = str(e)
                if fresh:  # nothing trained: what this start wrote must not block its retry
                    ckpt_mod.clear_run(cfg.run_dir)
        refusal = dist_mod.broadcast_object(refusal, info)
        if refusal is not None:
            raise TrainingError(refusal)

    def write(self, m: StepMetrics) -> None:
        if not self.main:
            return
        with writing(self.metrics_path), open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(m.to_dict()) + "\n")
        self._warn(trackers.log_or_drop(self.trackers, m.to_dict(), m.step))

    def close(self, *, discard: bool = False) -> None:
        """End the trackers; ``discard``: also remove the run's files (a fresh start that
        trained nothing, so that its retry is not refused as an earlier run)."""
        self._warn(trackers.close_quietly(self.trackers))
        if discard and self.main:
            ckpt_mod.clear_run(self.run_dir)

    def _warn(self, warnings: list[str]) -> None:
        for w in warnings:
            if self.emit is not None:
                self.emit("warning", {"message": w})


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------


def _identity(
    cfg: TrainConfig, reader: BuildReader, info: dist_mod.DistInfo, prec: str
) -> dict[str, Any]:
    """This run's identity (:func:`.run_identity.run_identity`)."""
    tok = reader.manifest.tokenizer
    return run_identity(
        cfg,
        manifest_sha256=reader.manifest_sha256,
        tokenizer={"name": tok.name, "sha256": tok.sha256},
        plan_world_size=cfg.plan_world_size or data_world(info.world_size, cfg.cp),
        precision=prec,
    )


def _check_resume(
    ck: ckpt_mod.Checkpoint, ident: dict[str, Any], cfg: TrainConfig, info: dist_mod.DistInfo
) -> ResumeNotes:
    check_optimizer_format(ck.path, ck.state, cfg.parallel if info.distributed else "none")
    return check_resume(ck.path, ck.state, ident, cfg)


def _trim_metrics(path: str, step: int) -> None:
    """Keep the lines of steps up to ``step`` (a resumed run rewrites what came after)."""
    if not os.path.exists(path):
        return
    if step == 0:
        os.remove(path)
        return
    keep = []
    try:
        f = open_regular(path, "r", encoding="utf-8")  # never waits on a FIFO
    except OSError as e:
        raise TrainingError(
            f"{path}: cannot read the run's metrics to resume: {e.strerror or e} (move it away)"
        ) from e
    with f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError):
                continue
    with writing(path, path + ".tmp"):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
