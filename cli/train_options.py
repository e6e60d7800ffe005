"""``treeprep train``'s help panels, ``--config`` and ``--report-to``, and the saved config.

``train`` has about 45 options; ``--help`` groups them in panels (:data:`PANELS`: data, model,
objective, RL, optimizer, parallelism, checkpoints, logging), set on the click command by
:class:`TrainCommand` so the shared option declarations (:mod:`treeprep.cli.options`, also used
by ``verify``) stay as they are. A new option of ``train`` gets its panel here
(tests/cli/test_train_help.py fails on one without).

``--config FILE`` (:mod:`treeprep.cli.config_file`) is eager: its values become the command's
defaults before the other options are read, so flags given on the command line win. At the start
of a run, :func:`write_run_config` saves the resolved options as ``RUN/config.toml``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from treeprep.atomic import write_atomic
from treeprep.cli import config_file
from treeprep.errors import TreeprepError
from treeprep.modes import ReportTo

DATA, MODEL, OBJECTIVE, RL = "Data", "Model", "Objective", "RL"
OPTIMIZER, PARALLEL, CHECKPOINTS, LOGGING = "Optimizer", "Parallelism", "Checkpoints", "Logging"
EVAL, DRY_RUN = "Evaluation", "Dry run (--dry-run)"

#: option (parameter name) -> its panel in ``train --help``
PANELS: dict[str, str] = {
    **dict.fromkeys(
        ["config", "plan", "layout", "budget", "cut", "steps_of", "share_prefixes"], DATA
    ),
    "group_by_prefix": DATA,
    **dict.fromkeys(["steps", "epochs", "seed", "prefetch"], DATA),
    **dict.fromkeys(["model", "attn", "precision", "device", "activation_checkpointing"], MODEL),
    **dict.fromkeys(["lora_r", "lora_alpha", "lora_targets", "no_probe", "chunk"], MODEL),
    "merge_lora": MODEL,
    **dict.fromkeys(["part_graph", "keep_tokens", "handoff_accumulate", "stores"], MODEL),
    **dict.fromkeys(["loss", "norm"], OBJECTIVE),
    **dict.fromkeys(["adv_norm", "clip_eps", "clip_eps_high", "kl_coef", "kl_estimator"], RL),
    **dict.fromkeys(["entropy_coef", "unrewarded"], RL),
    **dict.fromkeys(["optimizer", "lr", "min_lr_ratio", "warmup", "weight_decay"], OPTIMIZER),
    **dict.fromkeys(["lr_schedule", "warmup_ratio"], OPTIMIZER),
    **dict.fromkeys(["momentum", "grad_clip"], OPTIMIZER),
    **dict.fromkeys(["parallel", "cp"], PARALLEL),
    **dict.fromkeys(["out", "save_every", "save_minutes", "keep", "resume"], CHECKPOINTS),
    "overwrite": CHECKPOINTS,
    **dict.fromkeys(["report_to", "run_name", "as_json"], LOGGING),
    # issue 25 item 6 (evaluation), declared in train_cmd.py by its own change
    **dict.fromkeys(["val_fraction", "eval_data", "eval_every"], EVAL),
    **dict.fromkeys(["dry_run", "world_size", "gpu", "gpu_memory", "host_memory"], DRY_RUN),
}


class TrainCommand(TyperCommand):
    """``train``'s click command: each option in its :data:`PANELS` panel, the panels in the
    table's order (the order of the options changes only the help: typer passes them by name)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        order = list(dict.fromkeys(PANELS.values()))
        self.params.sort(key=lambda p: order.index(PANELS[p.name]) if p.name in PANELS else 0)
        for p in self.params:
            if p.name in PANELS:
                setattr(p, "rich_help_panel", PANELS[p.name])  # noqa: B010  (typer reads it)


#: options that name this invocation, not the run: not saved in ``RUN/config.toml``
NOT_SAVED = frozenset(
    {"config", "as_json", "resume", "overwrite", "dry_run", "world_size", "gpu", "gpu_memory"}
    | {"host_memory"}
)


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
    ),
]
ReportToOpt = Annotated[
    list[ReportTo] | None,
    typer.Option(
        "--report-to",
        help="Also send the metrics to this tracker (repeatable); each is an extra of the "
        "same name: pip install 'treeprep\\[wandb]'.",
        show_default=False,
    ),
]


def _absolute(value: Any) -> Any:
    return os.path.abspath(value) if value else value


def saved_options(params: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """The options of a run as ``RUN/config.toml`` holds them: plain values, paths absolute (so
    the file repeats the run from any folder), the resolved run folder, and none of
    :data:`NOT_SAVED`."""
    from treeprep.cli.options import plain

    out: dict[str, Any] = {}
    for k, v in params.items():
        if k in NOT_SAVED:
            continue
        v = [plain(x) for x in v] if isinstance(v, list | tuple) else plain(v)
        if k in ("build", "plan", "eval_data") or (k == "model" and os.path.isdir(str(v))):
            v = _absolute(v)
        out[k] = v
    out["out"] = os.path.abspath(run_dir)
    return out


def write_run_config(params: dict[str, Any], run_dir: str) -> str:
    """Write ``RUN/config.toml`` (atomically); its path."""
    path = os.path.join(run_dir, "config.toml")
    header = (
        "treeprep train options of this run; continue it: treeprep train --config FILE --resume "
        "auto; the same run in a new folder: treeprep train --config FILE -o NEW"
    )
    write_atomic(path, config_file.dumps_toml(saved_options(params, run_dir), header).encode())
    return path
