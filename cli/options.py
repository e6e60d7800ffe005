"""The options that several commands share, and the one grammar of the command line.

Grammar: a command that reads an existing build takes it as its one positional argument, ``BUILD``
(:data:`BuildArg`); what a command writes is ``-o/--out``; everything else is a named option
(keyword-only in the command's signature). Mode options are the StrEnums of
:mod:`treeprep.modes`, the same the trainer's config is typed with, so typer lists the choices in
``--help`` and refuses anything else before a command runs. ``--device`` stays a string: it takes
any torch device (``cuda:1``).

Options that several commands share are declared here once (``Annotated`` aliases: the build
folder, the model, the attention backend, the objective), with their defaults (``DEFAULT_*``):
typer needs every option in each command's signature, so a command still lists them, but not
their help. The options of ``train`` alone are in :mod:`treeprep.cli.train_options`. Each command
builds its config with explicit keywords; :func:`plain` turns one option value into what a
library takes that wants no Enum or path (an Enum's value, a path's string).
"""

from __future__ import annotations

import copy
import math
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from treeprep.modes import CLIP_EPS, AdvNorm, Attn, Cut, KlEstimator, Loss, Norm, PartGraph

# --------------------------------------------------------------------------------------------
# the help panels (``rich_help_panel=`` on an option; ``--help`` shows the panels in the order
# their first options come in the command's signature)
# --------------------------------------------------------------------------------------------


class Panel:
    """The panels of ``--help`` (``train``'s; ``verify`` shares the model and objective ones)."""

    data = "Data"
    model = "Model"
    objective = "Objective"
    rl = "RL"
    optimizer = "Optimizer"
    parallel = "Parallelism"
    checkpoints = "Checkpoints"
    logging = "Logging"
    evaluation = "Evaluation"
    dry_run = "Dry run (--dry-run)"


# --------------------------------------------------------------------------------------------
# the model options, shared by ``train`` and ``verify``
# --------------------------------------------------------------------------------------------

BuildArg = Annotated[
    Path,
    typer.Argument(
        metavar="BUILD", help="A build folder (treeprep build -o BUILD).", show_default=False
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        help="A preset name, a local Hugging Face model folder, or a hub id in the local HF cache.",
        rich_help_panel=Panel.model,
    ),
]
AttnOpt = Annotated[Attn, typer.Option(help="Attention backend.", rich_help_panel=Panel.model)]
CutOpt = Annotated[
    Cut,
    typer.Option(
        help="Trees over the budget: handoff (one slot; parts hand keys/values over, nothing "
        "recomputed, no path limit) or prefix (cut into parts that each recompute their prefix; "
        "paths must fit)."
    ),
]
PartGraphOpt = Annotated[
    PartGraph,
    typer.Option(
        help="What a hand-off part keeps of its graph: recompute (the part is recomputed for "
        "its backward) or keep (the graphs of the parts on the depth-first stack, up to the "
        "tree's longest path).",
        rich_help_panel=Panel.model,
    ),
]

# --------------------------------------------------------------------------------------------
# the objective's options, shared by ``train`` and ``verify`` so that both have the same defaults
# --------------------------------------------------------------------------------------------

LossOpt = Annotated[Loss, typer.Option(help="The loss.", rich_help_panel=Panel.objective)]
NormOpt = Annotated[
    Norm,
    typer.Option(
        help="Loss aggregation: sum; token-mean (every trained token weighs 1/N, N over the "
        "step); sequence-mean (each call's token mean, averaged over calls); trajectory-mean "
        "(each trajectory's token mean, averaged over trajectories).",
        rich_help_panel=Panel.objective,
    ),
]
AdvNormOpt = Annotated[
    AdvNorm,
    typer.Option(
        help="Advantages from rewards over each group's trajectories: grpo (r - mean) / std, "
        "dr-grpo r - mean, rloo r - mean of the others, none r.",
        rich_help_panel=Panel.rl,
    ),
]
ClipEpsOpt = Annotated[
    float, typer.Option(help="Clip range low side: ratio >= 1 - eps.", rich_help_panel=Panel.rl)
]
ClipEpsHighOpt = Annotated[
    float | None,
    typer.Option(
        help="Clip range high side: ratio <= 1 + eps_high (DAPO); default --clip-eps.",
        rich_help_panel=Panel.rl,
    ),
]
KlCoefOpt = Annotated[
    float,
    typer.Option(
        help="KL penalty against the rollouts' reference log-probs.", rich_help_panel=Panel.rl
    ),
]
KlEstimatorOpt = Annotated[
    KlEstimator, typer.Option(help="KL estimator: k3 or k1.", rich_help_panel=Panel.rl)
]
EntropyCoefOpt = Annotated[
    float, typer.Option(help="Entropy bonus coefficient.", rich_help_panel=Panel.rl)
]
ChunkOpt = Annotated[
    int, typer.Option(help="LM-head rows per chunk in the loss.", rich_help_panel=Panel.model)
]

#: the defaults of those options (the trainer's LossConfig and TrainConfig defaults: held equal
#: by tests/cli/test_train_defaults.py and tests/cli/test_options.py)
DEFAULT_LOSS = Loss.sft
DEFAULT_NORM = Norm.token_mean
DEFAULT_ADV_NORM = AdvNorm.grpo
DEFAULT_CLIP_EPS = CLIP_EPS
DEFAULT_KL_ESTIMATOR = KlEstimator.k3
DEFAULT_CHUNK = 4096

# --------------------------------------------------------------------------------------------
# numbers by range: NaN, infinity or a value out of range is a usage error (exit code 2)
# --------------------------------------------------------------------------------------------


def in_range(
    *, gt: float | None = None, ge: float | None = None, lt: float | None = None
) -> Callable[[float | None], float | None]:
    """A typer ``callback`` refusing a number that is not finite or not in the range (``gt`` <
    value, ``ge`` <= value, value < ``lt``), before the command runs: click's own ranges let
    NaN through (every comparison with it is false). None (an option left out) passes.

    >>> in_range(gt=0)(16.0)
    16.0
    >>> try:
    ...     in_range(gt=0)(float("nan"))
    ... except typer.BadParameter as e:
    ...     print(e)
    nan is not a finite number > 0
    """
    parts = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else ""]
    parts.append(f"< {lt:g}" if lt is not None else "")
    want = " and ".join(p for p in parts if p) or "at all"

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        ok = math.isfinite(value)
        ok = ok and (gt is None or value > gt) and (ge is None or value >= ge)
        if not (ok and (lt is None or value < lt)):
            raise typer.BadParameter(f"{value:g} is not a finite number {want}")
        return value

    return check


def in_panel(alias: Any, panel: str) -> Any:
    """The ``typer.Option`` of the ``Annotated`` option ``alias``, shown in ``panel`` (a copy: an
    option that several commands share keeps its panel, or none, in the others).

    >>> in_panel(CutOpt, Panel.data).rich_help_panel, typing.get_args(CutOpt)[1].rich_help_panel
    ('Data', None)
    """
    info = copy.copy(typing.get_args(alias)[1])
    info.rich_help_panel = panel
    return info


def plain(value: Any) -> Any:
    """An option's value as the library takes it: an Enum's value, a path's string."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
