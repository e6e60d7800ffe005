"""``treeprep train``: train a causal LM on a build, tree (or linear) layout, one or many processes.

One process::

    treeprep train BUILD --model tiny-qwen3 --steps 20 -o runs/tiny

Many (DDP, or FSDP2 with ``--parallel fsdp``), ranks taking the plan's balanced assignment::

    treeprep pack BUILD --budget 16384 --world-size 8 --steps-of 4
    torchrun --nproc-per-node 8 -m treeprep.cli train BUILD --model DIR \\
        --plan BUILD/plans/b16384-w8-n4-s0 -o runs/big

The command builds a :class:`~treeprep.trainer.config.TrainConfig` with explicit keywords (each
option declared once, in :mod:`treeprep.cli.train_options` or, shared with ``verify``, in
:mod:`treeprep.cli.options`), calls :func:`~treeprep.trainer.run.loop.train` and renders: a rich
progress bar on stderr (rank 0 only), a summary table on stdout (or ``--json``). torch and the
trainer are imported inside the command. ``--dry-run`` builds the memory model's setup instead
(:mod:`treeprep.cli.dry_run`): it imports neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from treeprep.cli import options as opt
from treeprep.cli import train_options as topt
from treeprep.cli import train_progress as show
from treeprep.cli.config_file import write_run_config
from treeprep.errors import TreeprepError
from treeprep.modes import (
    Accumulate,
    Attn,
    Cut,
    Gpu,
    Layout,
    LrSchedule,
    Optimizer,
    Parallel,
    PartGraph,
    Precision,
    Stores,
    Unrewarded,
)


def train_cmd(
    ctx: typer.Context,
    build: opt.BuildArg,
    *,
    config: topt.ConfigOpt = None,
    plan: topt.PlanOpt = None,
    layout: topt.LayoutOpt = Layout.tree,
    share_prefixes: topt.SharePrefixesOpt = True,
    steps: topt.StepsOpt = None,
    epochs: topt.EpochsOpt = None,
    budget: topt.BudgetOpt = 4096,
    cut: topt.CutOpt = Cut.handoff,
    group_by_prefix: topt.GroupByPrefixOpt = False,
    steps_of: topt.StepsOfOpt = 1,
    seed: topt.SeedOpt = 0,
    prefetch: topt.PrefetchOpt = True,
    model: opt.ModelOpt,
    chunk: opt.ChunkOpt = opt.DEFAULT_CHUNK,
    attn: opt.AttnOpt = Attn.auto,
    part_graph: opt.PartGraphOpt = PartGraph.recompute,
    keep_tokens: topt.KeepTokensOpt = None,
    handoff_accumulate: topt.HandoffAccumulateOpt = Accumulate.model,
    stores: topt.StoresOpt = Stores.gpu,
    precision: topt.PrecisionOpt = Precision.auto,
    device: topt.DeviceOpt = "auto",
    activation_checkpointing: topt.CheckpointingOpt = False,
    no_probe: topt.NoProbeOpt = False,
    lora_r: topt.LoraROpt = 0,
    lora_alpha: topt.LoraAlphaOpt = None,
    lora_targets: topt.LoraTargetsOpt = None,
    lora_dropout: topt.LoraDropoutOpt = 0.0,
    merge_lora: topt.MergeLoraOpt = False,
    loss: opt.LossOpt = opt.DEFAULT_LOSS,
    norm: opt.NormOpt = opt.DEFAULT_NORM,
    adv_norm: opt.AdvNormOpt = opt.DEFAULT_ADV_NORM,
    unrewarded: topt.UnrewardedOpt = Unrewarded.refuse,
    clip_eps: opt.ClipEpsOpt = opt.DEFAULT_CLIP_EPS,
    clip_eps_high: opt.ClipEpsHighOpt = None,
    kl_coef: opt.KlCoefOpt = 0.0,
    kl_estimator: opt.KlEstimatorOpt = opt.DEFAULT_KL_ESTIMATOR,
    entropy_coef: opt.EntropyCoefOpt = 0.0,
    optimizer: topt.OptimizerOpt = Optimizer.adamw,
    lr: topt.LrOpt = 3e-4,
    lr_schedule: topt.LrScheduleOpt = LrSchedule.cosine,
    min_lr_ratio: topt.MinLrRatioOpt = 0.1,
    warmup: topt.WarmupOpt = 0,
    warmup_ratio: topt.WarmupRatioOpt = 0.0,
    weight_decay: topt.WeightDecayOpt = 0.0,
    momentum: topt.MomentumOpt = 0.0,
    grad_clip: topt.GradClipOpt = 1.0,
    parallel: topt.ParallelOpt = Parallel.ddp,
    cp: topt.CpOpt = 1,
    collective_timeout: topt.CollectiveTimeoutOpt = 600.0,
    out: topt.RunDirOpt = None,
    save_every: topt.SaveEveryOpt = None,
    save_minutes: topt.SaveMinutesOpt = 30.0,
    keep: topt.KeepOpt = 2,
    resume: topt.ResumeOpt = None,
    overwrite: topt.OverwriteOpt = False,
    report_to: topt.ReportToOpt = None,
    run_name: topt.RunNameOpt = None,
    as_json: topt.JsonOpt = False,
    val_fraction: topt.ValFractionOpt = 0.0,
    eval_data: topt.EvalDataOpt = None,
    eval_every: topt.EvalEveryOpt = None,
    dry_run: topt.DryRunOpt = False,
    world_size: topt.WorldSizeOpt = 1,
    gpu: topt.GpuOpt = Gpu.h100,
    gpu_memory: topt.GpuMemoryOpt = None,
    host_memory: topt.HostMemoryOpt = None,
) -> None:
    """Train on the trees of a build with exactly restored losses; checkpoint and resume."""
    if dry_run:
        check_model_name(model)
        from treeprep.cli import dry_run as dr

        setup = dr.memory_setup(
            precision=precision, optimizer=optimizer, momentum=momentum, world_size=world_size,
            activation_checkpointing=activation_checkpointing,
            handoff_accumulate=handoff_accumulate, part_graph=part_graph,
            keep_tokens=keep_tokens, chunk=chunk, entropy_coef=entropy_coef, stores=stores, cp=cp,
            attn=attn,
        )  # fmt: skip
        dr.dry_run_cmd(
            setup, build=str(build), model=model, budget=budget, parallel=parallel, gpu=gpu,
            gpu_memory=gpu_memory, host_memory=host_memory, given=topt.given(ctx),
            command_line=topt.command_line(ctx), as_json=as_json,
        )  # fmt: skip
        return
    if world_size != 1 or gpu_memory is not None or host_memory is not None:
        raise TreeprepError("--world-size, --gpu-memory and --host-memory are --dry-run options")
    _check_inputs(build, plan, eval_data)  # before the model's name: its check imports torch
    check_model_name(model)
    from treeprep.trainer.config import TrainConfig

    cfg = TrainConfig(
        data=str(build), model=model, run_dir=str(out or fresh_run_dir(build, model, resume)),
        plan=opt.plain(plan), loss=loss, norm=norm, adv_norm=adv_norm, unrewarded=unrewarded,
        layout=layout, share_prefixes=share_prefixes, attn=attn, steps=steps, epochs=epochs,
        budget=budget, steps_of=steps_of, optimizer=optimizer, lr=lr, lr_schedule=lr_schedule,
        min_lr_ratio=min_lr_ratio, warmup_steps=warmup, warmup_ratio=warmup_ratio,
        weight_decay=weight_decay, momentum=momentum, grad_clip=topt.none_if_off(grad_clip),
        seed=seed, precision=precision, device=device,
        activation_checkpointing=activation_checkpointing, parallel=parallel, cp=cp,
        collective_timeout=collective_timeout, save_every=save_every,
        save_minutes=topt.none_if_off(save_minutes), keep=topt.none_if_off(keep),
        run_name=run_name, merge_lora=merge_lora, resume=resume, overwrite=overwrite,
        report_to=list(report_to or []), clip_eps=clip_eps, clip_eps_high=clip_eps_high,
        kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef, chunk=chunk,
        part_graph=part_graph, keep_tokens=keep_tokens, handoff_accumulate=handoff_accumulate,
        stores=stores, cut=cut, group_by_prefix=group_by_prefix, probe=not no_probe,
        lora_r=lora_r, lora_alpha=lora_alpha, lora_targets=topt.none_if_off(lora_targets),
        lora_dropout=lora_dropout, prefetch=prefetch, val_fraction=val_fraction,
        eval_data=opt.plain(eval_data), eval_every=eval_every,
    )  # fmt: skip
    main = int(os.environ.get("RANK", "0")) == 0
    res = _train_with_progress(cfg, main, warn_no_probe=no_probe, options=topt.values(ctx))
    if main:
        summary = _summary(res, layout.value)
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        else:
            _print_summary(summary, res.run_dir)
        if res.no_signal_steps:
            _no_signal_warning(res)
    if res.stopped is not None:
        _stopped(res, main)


def _check_inputs(build: Path, plan: Path | None, eval_data: Path | None) -> None:
    """A missing or unfinished build, and a plan made for another build, are refused before
    torch and the model load (seconds, not the minute a large model takes)."""
    from treeprep.schemas.manifest import load_manifest, manifest_sha256
    from treeprep.schemas.plan import load_summary

    load_manifest(str(build))
    if plan is not None:
        sha = manifest_sha256(str(build))
        load_summary(str(plan), manifest_sha256=sha, build=str(build), version=True)
    if eval_data is not None:
        load_manifest(str(eval_data))


def check_model_name(model: str) -> None:
    """Refuse a ``--model`` that is no folder and no ``owner/name`` hub id but is close to a
    preset's name (``tiny-qwen4``): a typo, answered with the preset, not with the download
    command of a hub id that does not exist."""
    from treeprep.cli.renames import did_you_mean
    from treeprep.flops import PRESETS as SHAPES

    if "/" in model or model in SHAPES or os.path.exists(model):
        return
    from treeprep.trainer.models.presets import PRESETS

    if model not in PRESETS and (hint := did_you_mean(model, [*PRESETS, *SHAPES])):
        raise TreeprepError(f"--model {model}: not a preset, a folder or a hub id{hint}")


def _no_signal_warning(res: Any) -> None:
    from rich.console import Console

    Console(stderr=True).print(
        f"warning: {res.no_signal_steps} of {len(res.history)} steps had no learning signal "
        "(every advantage zero: each group's rewards were equal); they changed nothing but the "
        "penalties",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


def _stopped(res: Any, main: bool) -> None:
    """A run stopped by a signal, after its checkpoint: one line, and the signal's exit status
    (128 + its number, the shell's convention; :mod:`treeprep.trainer.run.preemption`)."""
    from treeprep.trainer.run.preemption import exit_code

    if main:
        from rich.console import Console

        Console(stderr=True).print(
            f"stopped by {res.stopped} after step {res.steps}: checkpoint {res.checkpoint}; "
            f"continue with --resume auto --out {res.run_dir}",
            soft_wrap=True,
            highlight=False,
        )
    raise typer.Exit(exit_code(res.stopped))


def fresh_run_dir(data: Path, model: str, resume: Path | str | None) -> Path:
    """A new run folder, ``runs/<date>-<build>-<model>`` (``-2``, ``-3``... when taken), never a
    shared default; with ``--resume RUN`` the run resumed. Under torchrun every rank takes the
    folder that the first rank to ask named (:func:`agreed_run_dir`)."""
    if resume == "auto":
        raise TreeprepError("--resume auto needs --out: the run folder to continue")
    if resume:
        r = Path(resume)
        return r.parent.parent if r.parent.name == "checkpoints" else r
    path = _new_run_dir(data, model)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return agreed_run_dir(path, os.environ)
    return path


def agreed_run_dir(candidate: Path, env: Any) -> Path:
    """The run folder of a multi-process run without ``--out``: the ranks' own candidates differ
    (the clock), so they agree through torchrun's store (its agent's, at ``MASTER_ADDR``:
    ``MASTER_PORT``): the first rank to ask sets its candidate, every rank reads it back; a
    restart of the job (``TORCHELASTIC_RESTART_COUNT``) names a new one. Other launchers give
    no such store: there ``--out`` is required."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise TreeprepError(
            "more than one process outside torchrun: name the run folder with --out (every "
            "rank the same)"
        )
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=300))  # fmt: skip
    key = f"treeprep/run_dir/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return Path(store.compare_set(key, "", str(candidate)).decode())


def _new_run_dir(data: Path, model: str) -> Path:
    """``runs/<date>-<build>-<model>``, with ``-2``, ``-3``... where that is taken."""
    import re
    import time

    def slug(p: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(p.rstrip("/")).name).strip("-") or "run"

    base = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug(str(data))}-{slug(model)}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _train_with_progress(
    cfg: Any, main: bool, *, warn_no_probe: bool, options: dict[str, Any] | None = None
) -> Any:
    """Run ``train`` with a progress bar on stderr (rank 0 only: ``main``); ``options``, the
    command's, are saved as ``RUN/config.toml`` when the run starts."""
    from rich.console import Console

    err = Console(stderr=True)
    import transformers

    from treeprep.trainer.run.loop import train

    transformers.utils.logging.disable_progress_bar()  # our own bar; no tqdm lines on save
    if warn_no_probe and main:
        err.print("[yellow]warning: --no-probe: the model is not checked for exactness on trees[/]")
    progress, cb = (None, None)
    if main:
        progress, cb = show.progress(err) if err.is_terminal else (None, show.plain_lines(err))
        if options is not None:
            cb = _saving_config(cb, options, cfg.run_dir)
        cb = _warning_at_start(cb, cfg, err)
    try:
        if progress is not None:
            progress.start()
        return train(cfg, callback=cb)
    finally:
        if progress is not None:
            progress.stop()


def _warning_at_start(cb: Any, cfg: Any, err: Any) -> Any:
    """``cb``, first saying once the run started (a refused run says only why) what its settings
    do that a user may not expect (:func:`.train_progress.setting_warnings`)."""
    import torch

    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    lines = show.setting_warnings(
        budget=cfg.budget, plan=cfg.plan, stores=str(cfg.stores), on_cpu=on_cpu
    )

    def wrapped(event: str, d: dict[str, Any]) -> None:
        if event == "start":
            for line in lines:
                err.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)
        cb(event, d)

    return wrapped


def _saving_config(cb: Any, params: dict[str, Any], run_dir: str) -> Any:
    """``cb``, writing ``RUN/config.toml`` first on the ``start`` event (after the run folder is
    claimed and the resume checked: a refused run leaves the earlier run's file alone)."""

    def wrapped(event: str, d: dict[str, Any]) -> None:
        if event == "start":
            write_run_config(params, run_dir)
        cb(event, d)

    return wrapped


def _summary(res: Any, layout: str) -> dict[str, Any]:
    """The run's totals, for ``--json`` and the table."""
    hist = res.history
    tot_t = sum(m.seconds for m in hist)
    return {
        "run_dir": res.run_dir,
        "steps": res.steps,
        "steps_this_run": len(hist),
        "world_size": res.world_size,
        "plan": res.plan_source,
        "layout": layout,
        "first_loss": hist[0].loss if hist else None,
        "last_loss": hist[-1].loss if hist else None,
        "tokens": sum(m.tokens for m in hist),
        "tokens_linear": sum(m.tokens_linear for m in hist),
        "seconds": tot_t,
        "tokens_per_s": sum(m.tokens for m in hist) / tot_t if tot_t else 0.0,
        "linear_tokens_per_s": sum(m.tokens_linear for m in hist) / tot_t if tot_t else 0.0,
        "checkpoint": res.checkpoint,
        "stopped": res.stopped,
        "no_signal_steps": res.no_signal_steps,
        "unrewarded_trees": res.unrewarded_trees,
        "unrewarded_sequences": res.unrewarded_sequences,
        "metrics": os.path.join(res.run_dir, "metrics.jsonl"),
        "config": os.path.join(res.run_dir, "config.toml"),
        "plot": res.plot,
        "final": res.final,
    }


def _print_summary(summary: dict[str, Any], run_dir: str) -> None:
    from rich.console import Console

    from treeprep.cli.tables import metrics_table

    t = metrics_table(f"treeprep train -> {run_dir}")
    for k, v in summary.items():
        if v is None:
            continue  # not run, not made, not stopped: no row (``--json`` keeps it as null)
        if isinstance(v, float):
            v = f"{v:,.4g}" if "loss" in k else f"{v:,.1f}"
        elif isinstance(v, int):
            v = f"{v:,}"
        t.add_row(k, str(v))
    Console().print(t)
