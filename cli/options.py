"""Mode options of the commands, as Enums so that typer lists the choices in ``--help`` and
refuses anything else before a command runs.

The values mirror the trainer's ``Literal`` types (``LossName``, ``Norm``, ``Layout``, the
attention ``Backend``, ``Parallel``); they are repeated here, not imported, because the CLI imports
the trainer (and torch) only inside the commands that train. ``tests/cli/test_options.py`` checks
that both lists agree. ``--device`` stays a string: it takes any torch device (``cuda:1``).
"""

from __future__ import annotations

from enum import StrEnum


class Loss(StrEnum):
    sft = "sft"
    ppo = "ppo"
    grpo = "grpo"
    gspo = "gspo"


class Norm(StrEnum):
    sum = "sum"
    sequence_mean = "sequence-mean"
    token_mean = "token-mean"


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


class Head(StrEnum):
    """Where the FLOP estimate runs the LM head."""

    targets = "targets"
    all = "all"
