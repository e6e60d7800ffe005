"""The glue between the training loop and the checkpoint files: :class:`Saver` writes the run's
checkpoints (:func:`save`: every rank takes part, rank 0 writes the folder) and keeps the clock of
``save_minutes``; :func:`restore` loads what a resumed run continues from (the optimizer and the
random state; the weights are loaded with the model, and the learning rate follows from the step:
:class:`~treeprep.trainer.run.step.Schedule`); :func:`saved_schedule` reads the schedule a
checkpoint
was on, so that a resume can say where the new one stands; :func:`export_final` writes
``RUN/final`` (:mod:`treeprep.trainer.run.export`) after the last step's checkpoint.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from treeprep.trainer import distributed as dist_mod
from treeprep.trainer.config import StepMetrics, TrainConfig, config_dict
from treeprep.trainer.models.presets import PRESETS
from treeprep.trainer.run import checkpoint as ckpt_mod
from treeprep.trainer.run.export import FINAL_DIR, export_model
from treeprep.trainer.run.step import Schedule, loss_module


def restore(
    resume: ckpt_mod.Checkpoint,
    wrapped: torch.nn.Module,
    opt: torch.optim.Optimizer,
    cfg: TrainConfig,
    info: dist_mod.DistInfo,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[int, int, int]:
    """Load the optimizer, the float16 grad scaler and the random state of ``resume``; its (step,
    epoch, step in the epoch). The learning rate is not restored: the run's own
    :class:`~.step.Schedule` sets it from the step before every update. A checkpoint without a
    scaler state (saved before checkpoints held it) leaves ``scaler`` at its initial scale."""
    opt_state = resume.optimizer_state()
    dist_mod.load_optimizer_state(wrapped, opt, opt_state, cfg.parallel, info)
    scaler_state = resume.scaler_state() if scaler is not None else None
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    step, epoch, epoch_step = (int(resume.state[k]) for k in ("step", "epoch", "epoch_step"))
    rng = resume.rng(info.rank)
    if rng is not None:
        ckpt_mod.set_rng_state(rng)
    return step, epoch, epoch_step


def export_final(cfg: TrainConfig, info: dist_mod.DistInfo, saver: Saver, step: int) -> str | None:
    """``RUN/final/``: the last step's model as a standalone Hugging Face folder
    (:mod:`treeprep.trainer.run.export`), written by rank 0 when the run saved its last step."""
    if (
        not info.is_main
        or saver.last is None
        or not saver.last.endswith(ckpt_mod.step_dir_name(step))
    ):
        return None
    out = os.path.join(cfg.run_dir, FINAL_DIR)
    return export_model(cfg.run_dir, out, step=step, merge=cfg.merge_lora)


def saved_schedule(resume: ckpt_mod.Checkpoint) -> dict[str, Any]:
    """The schedule the checkpoint's run was on (``scheduler.pt``). Checkpoints made before the
    schedule was a function of the step hold a torch scheduler's state there instead: their
    schedule is rebuilt from their config (the step count it ran for)."""
    saved = resume.scheduler_state()
    if "total" in saved:
        return saved
    old = resume.state.get("config") or {}
    return {"peak": old.get("lr"), "total": old.get("steps"), "warmup": old.get("warmup_steps"),
            "min_ratio": old.get("min_lr_ratio"), "kind": "cosine"}  # fmt: skip


class Saver:
    """Writes the run's checkpoints (every rank calls :meth:`save`) and keeps the clock of
    ``save_minutes``; :attr:`last` is the newest checkpoint of the run."""

    def __init__(
        self,
        cfg: TrainConfig,
        info: dist_mod.DistInfo,
        state: tuple[torch.nn.Module, torch.optim.Optimizer, Schedule],
        identity: dict[str, Any],
        last: str | None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.cfg, self.info, self.state, self.identity, self.last = cfg, info, state, identity, last
        self.scaler = scaler
        self.since = time.monotonic()

    def due(self) -> bool:
        """``save_minutes`` of wall time have passed since the last checkpoint (or the start)."""
        mins = self.cfg.save_minutes
        return bool(mins) and time.monotonic() - self.since >= 60 * float(mins or 0)

    def save(self, step: int, epoch: int, epoch_step: int, m: StepMetrics | None) -> str:
        wrapped, opt, sched = self.state
        self.last = save(self.cfg, self.info, wrapped, opt, sched, step, epoch, epoch_step, m,
                         identity=self.identity, scaler=self.scaler)  # fmt: skip
        self.since = time.monotonic()
        return self.last


def save(
    cfg: TrainConfig,
    info: dist_mod.DistInfo,
    wrapped: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Schedule,
    step: int,
    epoch: int,
    epoch_step: int,
    last: StepMetrics | None,
    *,
    identity: dict[str, Any] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> str:
    """Write a checkpoint atomically (every rank calls it); returns its final folder. The run's
    ``identity`` (:mod:`.run_identity`) is what a resume is checked against; a float16 run's
    ``scaler`` is saved so that a resume goes on at the scale it reached."""
    tmp = ckpt_mod.begin_save(cfg.run_dir, step, info.is_main)
    dist_mod.barrier(info)
    ckpt_mod.save_rng(tmp, info.rank)
    model_state = dist_mod.full_model_state(wrapped, cfg.parallel, info)
    opt_state = dist_mod.full_optimizer_state(wrapped, opt, cfg.parallel, info)
    final = ckpt_mod.step_dir_name(step)
    dist_mod.barrier(info)
    if info.is_main:
        lm = loss_module(wrapped).lm
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
                "config": config_dict(cfg),
                "identity": identity,
                "metrics": last.to_dict() if last is not None else None,
            },
            tokenizer_dir=tok_dir,
            scaler_state=scaler.state_dict() if scaler is not None else None,
        )
        final = ckpt_mod.finish_save(cfg.run_dir, tmp, step, cfg.keep)
    dist_mod.barrier(info)
    return os.path.join(ckpt_mod.checkpoints_dir(cfg.run_dir), os.path.basename(final))
