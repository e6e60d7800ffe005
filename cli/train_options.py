"""``treeprep train``'s options: each declared here once, with its help and its panel.

``train`` has about 60 options; ``--help`` groups them in panels (data, model, objective, RL,
optimizer, parallelism, checkpoints, logging, evaluation, dry run): each option names its own
(``rich_help_panel=``, the names in :class:`treeprep.cli.options.Panel`), and the command's
signature lists them panel by panel, each with its default (tests/cli/test_train_help.py fails on
an option without a panel). The options that ``train`` shares with ``verify`` (the model, the
attention backend, the objective) are declared in :mod:`treeprep.cli.options`; every other one
here.

An option sets the ``TrainConfig`` field of its name, with the field's default
(tests/cli/test_train_defaults.py holds the two equal and checks that every option reaches its
field), but for the few that say otherwise where they are declared below:

* ``--out`` sets ``run_dir``, ``--warmup`` ``warmup_steps`` and ``BUILD`` ``data``;
* ``--no-probe`` sets ``probe`` to False;
* ``--grad-clip 0``, ``--save-minutes 0``, ``--keep 0`` and no ``--lora-targets`` are the
  config's None (off, all, the default targets): :func:`none_if_off`. That is no typer callback:
  ``RUN/config.toml`` saves the value given (``grad-clip = 0``), which a reread must repeat;
* ``--dry-run``, ``--world-size``, ``--gpu``, ``--gpu-memory`` and ``--host-memory`` are the dry
  run's (:mod:`treeprep.cli.dry_run`; a run's world is torchrun's, its memory its GPU's),
  ``--config`` and ``--json`` the invocation's: they set no field.

``--config FILE`` (:mod:`treeprep.cli.config_file`) is eager: its values become the command's
defaults before the other options are read, so flags given on the command line win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from treeprep.cli import config_file
from treeprep.cli import options as opt
from treeprep.errors import TreeprepError
from treeprep.modes import (
    Accumulate,
    Cut,
    Gpu,
    Layout,
    LrSchedule,
    Optimizer,
    Parallel,
    Precision,
    ReportTo,
    Stores,
    Unrewarded,
)

_T = TypeVar("_T")


def none_if_off(value: _T) -> _T | None:
    """The config's value of an option whose 0 (or empty list) means off or all: None.

    >>> none_if_off(0.0), none_if_off(1.5), none_if_off([]), none_if_off(["q_proj"])
    (None, 1.5, None, ['q_proj'])
    """
    return value or None


def _load_config(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """The eager ``--config`` callback: the file's options become the command's defaults."""
    if value is None:
        return None
    names = {p.name: p.opts for p in ctx.command.params if p.name and p.name != "config"}
    try:
        options = config_file.option_keys(names, config_file.read(value), value, "train")
    except TreeprepError as e:
        raise typer.BadParameter(str(e), ctx, param_hint="--config") from None
    ctx.default_map = {**(ctx.default_map or {}), **options}
    return value


def values(ctx: typer.Context) -> dict[str, Any]:
    """The command's option values by name, in its signature's order (``RUN/config.toml``'s)."""
    return {p.name: ctx.params[p.name] for p in ctx.command.params if p.name in ctx.params}


def given(ctx: typer.Context) -> frozenset[str]:
    """The names of the options set on the command line, in ``--config``'s file or the
    environment: not left at their defaults."""
    out = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT":
            out.add(name)
    return frozenset(out)


def command_line(ctx: typer.Context) -> dict[str, list[str]]:
    """The options given on the command line itself, each spelled back as its words
    (``{"lr": ["--lr", "0.01"], "prefetch": ["--no-prefetch"]}``), in the signature's order."""
    words: dict[str, list[str]] = {}
    for param in ctx.command.params:
        name = param.name or ""
        source = ctx.get_parameter_source(name)
        if param.param_type_name != "option" or source is None:
            continue
        if source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        value = ctx.params.get(name)
        if getattr(param, "is_flag", False):
            flags = param.opts[:1] if value else param.secondary_opts[:1]
            words[name] = list(flags)
            continue
        words[name] = []
        for v in value if isinstance(value, list | tuple) else [value]:
            words[name] += [param.opts[0], str(getattr(v, "value", v))]
    return words


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A TOML, YAML or JSON file of train options (keys as the options without the "
        "dashes); flags given here override it. A run saves its own as RUN/config.toml.",
        is_eager=True,
        callback=_load_config,
        exists=True,
        dir_okay=False,
        show_default=False,
        rich_help_panel=opt.Panel.data,
    ),
]
PlanOpt = Annotated[
    Path | None,
    typer.Option(
        help="A plan folder from `treeprep pack` (default: plan now).",
        rich_help_panel=opt.Panel.data,
    ),
]
LayoutOpt = Annotated[
    Layout, typer.Option(help="tree, or linear (the baseline).", rich_help_panel=opt.Panel.data)
]
SharePrefixesOpt = Annotated[
    bool,
    typer.Option(
        help="Feed the common openings of a micro-batch's trees once.",
        rich_help_panel=opt.Panel.data,
    ),
]
StepsOpt = Annotated[
    int | None, typer.Option(help="Optimizer steps to run.", rich_help_panel=opt.Panel.data)
]
EpochsOpt = Annotated[
    int | None, typer.Option(help="Epochs to run (default 1).", rich_help_panel=opt.Panel.data)
]
BudgetOpt = Annotated[
    int,
    typer.Option(
        help="Tokens computed at once per micro-batch (without --plan); a tree over it runs as "
        "hand-off parts. --dry-run suggests one unless it is given.",
        rich_help_panel=opt.Panel.data,
    ),
]
CutOpt = Annotated[Cut, opt.in_panel(opt.CutOpt, opt.Panel.data)]
GroupByPrefixOpt = Annotated[
    bool,
    typer.Option(
        help="Order each epoch's trees by their opening tokens (steps still in seeded order; "
        "without --plan), so a micro-batch's trees share long openings: fewer tokens fed, but it "
        "changes sampling (a step's trees are less random).",
        rich_help_panel=opt.Panel.data,
    ),
]
StepsOfOpt = Annotated[
    int,
    typer.Option(
        help="Gradient accumulation: micro-batches per rank per optimizer step (without --plan).",
        rich_help_panel=opt.Panel.data,
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(help="Seed (weights of presets, data order).", rich_help_panel=opt.Panel.data),
]
PrefetchOpt = Annotated[
    bool,
    typer.Option(
        help="Build the next step's batches in a background thread.", rich_help_panel=opt.Panel.data
    ),
]

# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------

KeepTokensOpt = Annotated[
    int | None,
    typer.Option(
        help="With --part-graph keep: the most tokens whose graphs are kept at once (default: "
        "each tree's longest path less one part, what the linear trainer holds); deeper parts "
        "recompute.",
        min=0,
        rich_help_panel=opt.Panel.model,
    ),
]
HandoffAccumulateOpt = Annotated[
    Accumulate,
    typer.Option(
        help="Gradient accumulators of the handed-over keys and values: in their own dtype "
        "(model), or float32 (bf16 runs).",
        rich_help_panel=opt.Panel.model,
    ),
]
StoresOpt = Annotated[
    Stores,
    typer.Option(
        help="Where hand-off parts keep their stored keys and values: gpu, host (a host pool, "
        "read a window at a time: GPU memory no longer grows with the session; host RAM does), "
        "or auto (host where a tree's stores would not fit the GPU).",
        rich_help_panel=opt.Panel.model,
    ),
]
PrecisionOpt = Annotated[
    Precision,
    typer.Option(
        help="auto: bf16 autocast on GPU, fp32 on CPU; float16 (grad scaler) for GPUs without "
        "bf16; float64 for verification.",
        rich_help_panel=opt.Panel.model,
    ),
]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.", rich_help_panel=opt.Panel.model)]
CheckpointingOpt = Annotated[
    bool,
    typer.Option(
        help="Recompute decoder layers in backward (saves memory).", rich_help_panel=opt.Panel.model
    ),
]
#: sets ``probe`` to its negation
NoProbeOpt = Annotated[
    bool,
    typer.Option(
        "--no-probe",
        help="Skip the exactness probe before training.",
        rich_help_panel=opt.Panel.model,
    ),
]
LoraROpt = Annotated[
    int, typer.Option(help="LoRA rank (0: train all weights).", rich_help_panel=opt.Panel.model)
]
LoraAlphaOpt = Annotated[
    float | None, typer.Option(help="LoRA alpha (default 2 r).", rich_help_panel=opt.Panel.model)
]
#: none given: the config's None (:func:`none_if_off`)
LoraTargetsOpt = Annotated[
    list[str] | None,
    typer.Option(help="LoRA target modules (default all linear).", rich_help_panel=opt.Panel.model),
]
LoraDropoutOpt = Annotated[
    float,
    typer.Option(
        help="Dropout on the LoRA adapter's input while training (0: off, exact).",
        rich_help_panel=opt.Panel.model,
    ),
]
MergeLoraOpt = Annotated[
    bool,
    typer.Option(
        help="RUN/final holds the base with the LoRA adapter merged in.",
        rich_help_panel=opt.Panel.model,
    ),
]

# --------------------------------------------------------------------------------------------
# RL (the objective's own options are shared with verify: treeprep.cli.options)
# --------------------------------------------------------------------------------------------

UnrewardedOpt = Annotated[
    Unrewarded,
    typer.Option(
        help="RL losses on trees with no advantages or rewards (formats that record none): "
        "refuse the run, or skip those trees (counted in the log and the summary).",
        rich_help_panel=opt.Panel.rl,
    ),
]

# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

OptimizerOpt = Annotated[
    Optimizer, typer.Option(help="The optimizer.", rich_help_panel=opt.Panel.optimizer)
]
LrOpt = Annotated[
    float,
    typer.Option(
        help="Peak learning rate.", callback=opt.in_range(gt=0), rich_help_panel=opt.Panel.optimizer
    ),
]
LrScheduleOpt = Annotated[
    LrSchedule,
    typer.Option(
        help="After the warmup: cosine or linear down to lr x min-lr-ratio, or constant.",
        rich_help_panel=opt.Panel.optimizer,
    ),
]
MinLrRatioOpt = Annotated[
    float,
    typer.Option(help="Final lr / peak lr (cosine, linear).", rich_help_panel=opt.Panel.optimizer),
]
#: sets ``warmup_steps``
WarmupOpt = Annotated[
    int,
    typer.Option(
        "--warmup", "--warmup-steps", help="Linear warmup steps.",
        rich_help_panel=opt.Panel.optimizer,
    ),
]  # fmt: skip
WarmupRatioOpt = Annotated[
    float,
    typer.Option(
        help="Or warm up over this fraction of the steps (rounded up).",
        rich_help_panel=opt.Panel.optimizer,
    ),
]
WeightDecayOpt = Annotated[
    float,
    typer.Option(
        help="Weight decay.", callback=opt.in_range(ge=0), rich_help_panel=opt.Panel.optimizer
    ),
]
MomentumOpt = Annotated[
    float,
    typer.Option(
        help="SGD momentum.",
        callback=opt.in_range(ge=0, lt=1),
        rich_help_panel=opt.Panel.optimizer,
    ),
]
#: 0: the config's None (:func:`none_if_off`)
GradClipOpt = Annotated[
    float,
    typer.Option(
        help="Clip the gradient norm (0: off).",
        callback=opt.in_range(ge=0),
        rich_help_panel=opt.Panel.optimizer,
    ),
]

# --------------------------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------------------------

ParallelOpt = Annotated[
    Parallel,
    typer.Option(
        help="Under torchrun: ddp or fsdp (--dry-run, unless it is given: ddp where it fits, "
        "else fsdp).",
        rich_help_panel=opt.Panel.parallel,
    ),
]
CpOpt = Annotated[
    int,
    typer.Option(
        "--cp",
        help="Context parallelism under torchrun: groups of N ranks share each micro-batch, "
        "attention heads split N ways (data parallel over world / N).",
        rich_help_panel=opt.Panel.parallel,
    ),
]
CollectiveTimeoutOpt = Annotated[
    float,
    typer.Option(
        help="Under torchrun: seconds a rank waits for the others in a collective before it "
        "stops, naming the rank that did not answer (one that dies is noticed at once).",
        callback=opt.in_range(gt=0),
        rich_help_panel=opt.Panel.parallel,
    ),
]

# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

#: sets ``run_dir``; none given: a new folder (:func:`treeprep.cli.train_cmd.fresh_run_dir`)
RunDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="The run folder (metrics, checkpoints); default: a new runs/<date>-<build>-<model>.",
        rich_help_panel=opt.Panel.checkpoints,
    ),
]
SaveEveryOpt = Annotated[
    int | None,
    typer.Option(help="Checkpoint every N steps.", rich_help_panel=opt.Panel.checkpoints),
]
#: 0: the config's None (:func:`none_if_off`)
SaveMinutesOpt = Annotated[
    float,
    typer.Option(
        help="Also checkpoint every N minutes of wall time (0: off).",
        rich_help_panel=opt.Panel.checkpoints,
    ),
]
#: 0: the config's None (:func:`none_if_off`)
KeepOpt = Annotated[
    int,
    typer.Option(
        help="Keep the newest N checkpoints (0: all).", rich_help_panel=opt.Panel.checkpoints
    ),
]
ResumeOpt = Annotated[
    str | None,
    typer.Option(
        help="auto: the newest whole checkpoint in --out (a fresh start if none); or a checkpoint "
        "folder, or a run folder (its newest). Refused when the data, plan or math changed.",
        rich_help_panel=opt.Panel.checkpoints,
    ),
]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        help="Start fresh in an --out that holds an earlier run, deleting it.",
        rich_help_panel=opt.Panel.checkpoints,
    ),
]

# --------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------

ReportToOpt = Annotated[
    list[ReportTo] | None,
    typer.Option(
        "--report-to",
        help="Also send the metrics to this tracker (repeatable); each is an extra of the "
        "same name: pip install 'treeprep\\[wandb]'.",
        show_default=False,
        rich_help_panel=opt.Panel.logging,
    ),
]
RunNameOpt = Annotated[
    str | None,
    typer.Option(
        help="The run's name in the trackers (default: the run folder's name).",
        rich_help_panel=opt.Panel.logging,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print the summary as JSON.", rich_help_panel=opt.Panel.logging),
]

# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

ValFractionOpt = Annotated[
    float,
    typer.Option(
        help="Hold out this fraction of the build's whole trees (seeded) for val_loss.",
        rich_help_panel=opt.Panel.evaluation,
    ),
]
EvalDataOpt = Annotated[
    Path | None,
    typer.Option(
        help="Another build to compute val_loss on (same tokenizer).",
        rich_help_panel=opt.Panel.evaluation,
    ),
]
EvalEveryOpt = Annotated[
    int | None,
    typer.Option(
        help="Log val_loss every N steps (always at the end).", rich_help_panel=opt.Panel.evaluation
    ),
]

# --------------------------------------------------------------------------------------------
# Dry run (no TrainConfig fields)
# --------------------------------------------------------------------------------------------

DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Predict the peak memory per rank and the step time (no weights loaded, nothing "
        "written); suggest the largest budget that fits.",
        rich_help_panel=opt.Panel.dry_run,
    ),
]
WorldSizeOpt = Annotated[
    int,
    typer.Option(help="--dry-run: the ranks to predict for.", rich_help_panel=opt.Panel.dry_run),
]
GpuOpt = Annotated[
    Gpu,
    typer.Option(
        help="--dry-run: the GPU (memory and peak FLOP/s).", rich_help_panel=opt.Panel.dry_run
    ),
]
GpuMemoryOpt = Annotated[
    str | None,
    typer.Option(
        help="--dry-run: memory per GPU, e.g. 80GiB, 141GB (default: the GPU's).",
        rich_help_panel=opt.Panel.dry_run,
    ),
]
HostMemoryOpt = Annotated[
    str | None,
    typer.Option(
        help="--dry-run: host RAM per node, e.g. 1TiB (shared by up to 8 ranks): the longest "
        "path that fits with host stores.",
        rich_help_panel=opt.Panel.dry_run,
    ),
]
