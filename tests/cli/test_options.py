"""The CLI's mode Enums: the same choices as the trainer's Literal types, checked by typer."""

from __future__ import annotations

import typing

import pytest
from typer.testing import CliRunner

from treeprep.cli import options
from treeprep.cli.app import app


def test_enums_match_the_trainer_literals() -> None:
    pytest.importorskip("torch")
    from treeprep.trainer import attention, batch, distributed, loss

    def values(e: type) -> tuple[str, ...]:
        return tuple(m.value for m in e)

    assert values(options.Loss) == typing.get_args(loss.LossName)
    assert values(options.Norm) == typing.get_args(batch.Norm)
    assert values(options.Layout) == typing.get_args(batch.Layout)
    assert values(options.Attn) == ("auto", *typing.get_args(attention.Backend))
    assert values(options.Parallel) == typing.get_args(distributed.Parallel)


def test_typer_lists_and_refuses_choices() -> None:
    r = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    assert "sequence-mean" in r.stdout and "gspo" in r.stdout
    r = CliRunner().invoke(app, ["verify", "x", "--model", "m", "--loss", "nope"])
    assert r.exit_code == 2
    assert "nope" in r.output
