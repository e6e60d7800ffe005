"""Issue 25 item 8: ``train --help`` panels, ``--version``, and ordinary mistakes as one clear
line without a traceback (a wrong path, a missing extra with its pip command, a model that does
not load, a LoRA shape mismatch on resume); ``--tensorboard`` refused with its new spelling."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer" / "run"))

from test_train import BUDGET, data  # noqa: E402, F401  (the module's build fixture)

from treeprep.cli import app as app_mod  # noqa: E402
from treeprep.cli.app import app  # noqa: E402


def test_every_train_option_has_a_panel_and_the_panels_come_in_order() -> None:
    import typer.main

    cmd = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    options = [p for p in cmd.params if p.param_type_name == "option"]
    assert [p.name for p in options if not getattr(p, "rich_help_panel", None)] == []
    panels = ["Data", "Model", "Objective", "RL", "Optimizer", "Parallelism", "Checkpoints",
              "Logging", "Evaluation", "Dry run (--dry-run)"]  # fmt: skip
    # the signature lists them panel by panel, so each panel is one run of options
    assert list(dict.fromkeys(p.rich_help_panel for p in options)) == panels
    out = CliRunner().invoke(app, ["train", "--help"], terminal_width=200).output
    at = [out.index(f"─ {panel} ─") for panel in panels]
    assert at == sorted(at)


def test_version() -> None:
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"treeprep {version('treeprep')}"


def test_tensorboard_flag_is_refused_with_its_new_spelling() -> None:
    r = CliRunner().invoke(app, ["train", "b", "--model", "tiny-qwen3", "--tensorboard"])
    assert r.exit_code == 2 and "use --report-to tensorboard" in r.output


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``treeprep ARGS`` through the console script's ``main``: exit status 1 and stderr."""
    monkeypatch.setattr(sys, "argv", ["treeprep", *args])
    with pytest.raises(SystemExit) as e:
        app_mod.main()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # one line
    return err


def _train(data: Path, run: Path, *extra: str) -> list[str]:  # noqa: F811
    return ["train", str(data), "--model", "tiny-qwen3", "--steps", "1", "--budget", str(BUDGET),
            "--device", "cpu", "--attn", "dense", "-o", str(run), "--json", *extra]  # fmt: skip


def test_a_missing_extra_is_one_line_with_its_pip_command(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    err = _main(monkeypatch, capsys, *_train(data, tmp_path / "run", "--report-to", "wandb"))
    assert 'pip install -e ".[wandb]"' in err  # the brackets are not eaten as markup


def test_a_wrong_build_path_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _main(monkeypatch, capsys, *_train(tmp_path / "nope", tmp_path / "run"))
    assert "nope" in err and "manifest.json" in err


def test_a_model_that_does_not_load_is_one_line(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    args = _train(data, tmp_path / "run")
    args[args.index("tiny-qwen3")] = str(bad)
    err = _main(monkeypatch, capsys, *args)
    assert "cannot load the model" in err


def test_a_lora_change_on_resume_is_one_line(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    r = CliRunner().invoke(app, _train(data, run, "--lora-r", "2", "--cut", "prefix"))
    assert r.exit_code == 0, r.output
    args = _train(data, run, "--lora-r", "4", "--cut", "prefix", "--resume", "auto")
    args[args.index("--steps") + 1] = "2"
    err = _main(monkeypatch, capsys, *args)
    assert "lora_r was 2 in the checkpoint, is 4" in err


def test_a_lora_shape_mismatch_in_the_weights_is_a_checkpoint_error(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Past the identity check (a checkpoint from before it), the adapter's shapes are named."""
    from test_train import cfg

    from treeprep.errors import CheckpointError
    from treeprep.trainer.models.load import load_model
    from treeprep.trainer.models.lora import apply_lora
    from treeprep.trainer.run import checkpoint as ckpt_mod
    from treeprep.trainer.run.loop import train

    res = train(cfg(data, tmp_path / "run", steps=1, lora_r=2, cut="prefix"))
    assert res.checkpoint is not None
    lm = apply_lora(load_model("tiny-qwen3", vocab_size=265), r=4, alpha=8, targets=None)
    with pytest.raises(CheckpointError, match=r"adapter's shapes do not match.*--lora-r"):
        ckpt_mod.load_model_weights(lm, ckpt_mod.open_checkpoint(res.checkpoint))
