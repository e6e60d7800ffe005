"""Mode options of the commands, as Enums so that typer lists the choices in ``--help`` and
refuses anything else before a command runs.

The values mirror the trainer's ``Literal`` types (``LossName``, ``Norm``, ``Layout``, the attention
``Backend``, ``Parallel``, ``AdvNorm``, ``KlEstimator``); they are repeated here, not imported,
because the CLI imports the trainer (and torch) only inside the commands that train.
``tests/cli/test_options.py`` checks that both lists agree. ``--device`` stays a string: it takes
any torch device (``cuda:1``).

Options that several commands share are declared here once (``Annotated`` aliases: the build
folder, the model, the attention backend, the objective). Typer needs every option in each
command's signature, so a command still lists them; what it does not repeat is their help, their
defaults and their translation: :func:`objective` picks the objective's options out of a
command's parameters as the trainer's keyword arguments, and :func:`plain` turns one option value
into what the library takes (an Enum's value, a path's string).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


class Loss(StrEnum):
    sft = "sft"
    ppo = "ppo"
    grpo = "grpo"
    gspo = "gspo"


class Norm(StrEnum):
    sum = "sum"
    sequence_mean = "sequence-mean"
    token_mean = "token-mean"
    trajectory_mean = "trajectory-mean"


class AdvNorm(StrEnum):
    """How rewards become advantages over a group's trajectories."""

    grpo = "grpo"
    dr_grpo = "dr-grpo"
    rloo = "rloo"
    none = "none"


class KlEstimator(StrEnum):
    k1 = "k1"
    k3 = "k3"


class Layout(StrEnum):
    tree = "tree"
    linear = "linear"


class Attn(StrEnum):
    auto = "auto"
    dense = "dense"
    nodes = "nodes"
    flex = "flex"
    flash = "flash"


class Optimizer(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


class Precision(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float64 = "float64"


class Parallel(StrEnum):
    ddp = "ddp"
    fsdp = "fsdp"


class Cut(StrEnum):
    """How ``pack`` runs a tree larger than the budget."""

    handoff = "handoff"
    recompute = "recompute"


class Handoff(StrEnum):
    """How ``train``/``verify`` run hand-off parts (see treeprep.trainer.parts.schedule)."""

    recompute = "recompute"
    keep = "keep"


class HandoffAccumulate(StrEnum):
    """Gradient accumulators of the handed-over keys and values (treeprep.trainer.config)."""

    model = "model"
    float32 = "float32"


class Gpu(StrEnum):
    """The GPU ``train --dry-run`` predicts for (treeprep.memory.GPUS)."""

    h100 = "h100"
    h200 = "h200"


class Head(StrEnum):
    """Where the FLOP estimate runs the LM head."""

    targets = "targets"
    all = "all"


# --------------------------------------------------------------------------------------------
# the model options, shared by ``train`` and ``verify``
# --------------------------------------------------------------------------------------------

BuildArg = Annotated[Path, typer.Argument(help="A build folder (OUT with manifest.json).")]
ModelOpt = Annotated[str, typer.Option(help="A preset name or a local Hugging Face model folder.")]
AttnOpt = Annotated[Attn, typer.Option(help="Attention backend.")]

# --------------------------------------------------------------------------------------------
# the objective's options, shared by ``train`` and ``verify`` so that both have the same defaults
# --------------------------------------------------------------------------------------------

LossOpt = Annotated[Loss, typer.Option(help="The loss.")]
NormOpt = Annotated[
    Norm,
    typer.Option(
        help="Loss aggregation: sum; token-mean (every trained token weighs 1/N, N over the "
        "step); sequence-mean (each call's token mean, averaged over calls); trajectory-mean "
        "(each trajectory's token mean, averaged over trajectories)."
    ),
]
AdvNormOpt = Annotated[
    AdvNorm,
    typer.Option(
        help="Advantages from rewards over each group's trajectories: grpo (r - mean) / std, "
        "dr-grpo r - mean, rloo r - mean of the others, none r."
    ),
]
ClipEpsOpt = Annotated[float, typer.Option(help="Clip range low side: ratio >= 1 - eps.")]
ClipEpsHighOpt = Annotated[
    float | None,
    typer.Option(help="Clip range high side: ratio <= 1 + eps_high (DAPO); default --clip-eps."),
]
KlCoefOpt = Annotated[
    float, typer.Option(help="KL penalty against the rollouts' reference log-probs.")
]
KlEstimatorOpt = Annotated[KlEstimator, typer.Option(help="KL estimator: k3 or k1.")]
EntropyCoefOpt = Annotated[float, typer.Option(help="Entropy bonus coefficient.")]
ChunkOpt = Annotated[int, typer.Option(help="LM-head rows per chunk in the loss.")]

#: the defaults of those options (the trainer's LossConfig and TrainConfig defaults)
DEFAULT_LOSS = Loss.sft
DEFAULT_NORM = Norm.token_mean
DEFAULT_ADV_NORM = AdvNorm.grpo
DEFAULT_CLIP_EPS = 0.2
DEFAULT_KL_ESTIMATOR = KlEstimator.k3
DEFAULT_CHUNK = 4096

#: the objective's options by name: the same names in ``TrainConfig`` and ``verify_gradients``
OBJECTIVE = (
    "loss",
    "norm",
    "adv_norm",
    "clip_eps",
    "clip_eps_high",
    "kl_coef",
    "kl_estimator",
    "entropy_coef",
    "chunk",
)


def plain(value: Any) -> Any:
    """An option's value as the library takes it: an Enum's value, a path's string."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def objective(params: Mapping[str, Any]) -> dict[str, Any]:
    """The objective's options among a command's parameters, as the trainer's keyword arguments."""
    return {name: plain(params[name]) for name in OBJECTIVE}
