"""The CLI's mode Enums: the same choices as the trainer's Literal types, checked by typer."""

from __future__ import annotations

import typing

import pytest
from typer.testing import CliRunner

from treeprep.cli import options
from treeprep.cli.app import app


def test_enums_match_the_trainer_literals() -> None:
    pytest.importorskip("torch")
    from treeprep.trainer import advantages, attention, batch, distributed, loss

    def values(e: type) -> tuple[str, ...]:
        return tuple(m.value for m in e)

    assert values(options.Loss) == typing.get_args(loss.LossName)
    assert values(options.Norm) == typing.get_args(batch.Norm)
    assert values(options.Layout) == typing.get_args(batch.Layout)
    assert values(options.Attn) == ("auto", *typing.get_args(attention.Backend))
    assert values(options.Parallel) == typing.get_args(distributed.Parallel)
    assert values(options.AdvNorm) == typing.get_args(advantages.AdvNorm)
    assert values(options.KlEstimator) == typing.get_args(loss.KlEstimator)


def test_train_and_verify_share_the_objective_defaults() -> None:
    """Issue 16: verify defaulted to sequence-mean while train used token-mean."""
    import inspect

    pytest.importorskip("torch")
    from treeprep.cli.train_cmd import train_cmd
    from treeprep.cli.verify_cmd import verify_cmd
    from treeprep.trainer.loop import TrainConfig
    from treeprep.trainer.loss import LossConfig

    shared = ("loss", "norm", "adv_norm", "clip_eps", "clip_eps_high", "kl_coef",
              "kl_estimator", "entropy_coef", "chunk")  # fmt: skip
    t = inspect.signature(train_cmd).parameters
    v = inspect.signature(verify_cmd).parameters
    for name in shared:
        assert t[name].default == v[name].default, name
        assert t[name].annotation == v[name].annotation, name
    tc = TrainConfig(data="d", model="m", run_dir="r")
    lc = LossConfig()
    for name in shared:
        want = getattr(tc, name)
        assert t[name].default == want, name
        if hasattr(lc, name):
            assert getattr(lc, name) == want, name


def test_typer_lists_and_refuses_choices() -> None:
    r = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    assert "sequence-mean" in r.stdout and "gspo" in r.stdout
    r = CliRunner().invoke(app, ["verify", "x", "--model", "m", "--loss", "nope"])
    assert r.exit_code == 2
    assert "nope" in r.output
