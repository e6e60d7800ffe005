"""Issue 25 item 5: ``train --config FILE``; flags override it; ``RUN/config.toml`` repeats the
run (the same TrainConfig); an unknown key is refused naming the key and the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer" / "run"))

from test_train import BUDGET, data  # noqa: E402, F401  (the module's build fixture)

import treeprep.cli.train_cmd as train_cmd  # noqa: E402
from treeprep.cli.app import app  # noqa: E402


class _Stop(Exception):
    pass


def _capture(monkeypatch: pytest.MonkeyPatch, real: bool = False) -> list[Any]:
    seen: list[Any] = []
    run = train_cmd._train_with_progress

    def capture(cfg, main, **kw):  # type: ignore[no-untyped-def]
        seen.append(cfg)
        if real:
            return run(cfg, main, **kw)
        raise _Stop

    monkeypatch.setattr(train_cmd, "_train_with_progress", capture)
    if not real:  # folders made empty stand in for builds
        monkeypatch.setattr(train_cmd, "_check_inputs", lambda *a: None)
    return seen


def test_the_saved_config_repeats_the_run(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _capture(monkeypatch, real=True)
    run = tmp_path / "run"
    args = ["train", str(data), "--model", "tiny-qwen3", "--steps", "1", "--budget", str(BUDGET),
            "--device", "cpu", "--attn", "dense", "--lr", "0.002", "--loss", "grpo",
            "--unrewarded", "skip", "--lora-targets", "q_proj", "--lora-targets", "v_proj",
            "--save-every", "3",
            "--grad-clip", "0", "-o", str(run), "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    saved = run / "config.toml"
    assert json.loads(r.stdout)["config"] == str(saved)
    seen2 = _capture(monkeypatch)
    r = CliRunner().invoke(app, ["train", "--config", str(saved)])
    assert isinstance(r.exception, _Stop), r.output
    assert seen2[0] == seen[0]  # the same TrainConfig, field by field
    # what its comment says works: a new folder with -o (the run's own folder holds the run)
    assert "--config FILE -o NEW" in saved.read_text().splitlines()[0]
    r = CliRunner().invoke(app, ["train", "--config", str(saved), "-o", str(tmp_path / "new")])
    assert isinstance(r.exception, _Stop), r.output
    assert seen2[1].run_dir == str(tmp_path / "new")
    assert {**vars(seen2[1]), "run_dir": ""} == {**vars(seen[0]), "run_dir": ""}


def _write(path: Path, values: dict[str, Any]) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(values))
    elif path.suffix == ".yaml":
        path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    else:
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
def test_flags_override_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    seen = _capture(monkeypatch)
    build = tmp_path / "build"
    build.mkdir()
    conf = _write(tmp_path / f"run{suffix}", {"build": str(build), "model": "tiny-qwen3",
                  "lr": 0.01, "save-every": 5, "loss": "grpo", "report_to": ["wandb"],
                  "out": str(tmp_path / "r")})  # fmt: skip
    r = CliRunner().invoke(app, ["train", "--config", str(conf), "--lr", "0.02"])
    assert isinstance(r.exception, _Stop), r.output
    c = seen[0]
    assert (c.lr, c.save_every, c.loss, c.report_to) == (0.02, 5, "grpo", ["wandb"])
    assert c.data == str(build)


def test_an_unknown_key_is_refused_naming_the_key_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _capture(monkeypatch)
    conf = _write(tmp_path / "run.toml", {"model": "tiny-qwen3", "learning_rate": 0.01})
    r = CliRunner().invoke(app, ["train", str(tmp_path), "--config", str(conf)],
                           env={"COLUMNS": "1000"})  # one line, whatever the terminal  # fmt: skip
    assert r.exit_code == 2
    assert "unknown key 'learning_rate'" in r.output and "run.toml" in r.output


def test_a_config_file_that_does_not_parse_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _capture(monkeypatch)
    conf = tmp_path / "run.toml"
    conf.write_text("lr = = 1\n")
    r = CliRunner().invoke(app, ["train", str(tmp_path), "--config", str(conf)])
    assert r.exit_code == 2 and "not valid TOML" in " ".join(r.output.replace("│", " ").split())
