"""Issue 25 item 1: run folders. A fresh run never lands on an earlier one (refused unless
``--resume`` or ``--overwrite``), retention never drops the checkpoint just written, and a missing
``--out`` gets a new folder of its own instead of the shared ``runs/treeprep`` of before, where a
second run's keep-2 clean-up deleted the first run's final checkpoint."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_train import BUDGET, cfg, data  # noqa: E402, F401  (the module's build fixture)
from typer.testing import CliRunner  # noqa: E402

from treeprep.trainer import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.loop import TrainingError, train  # noqa: E402


def test_a_second_run_into_the_same_folder_is_refused(data: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    train(cfg(data, run, steps=2))
    before = sorted(os.listdir(run / "checkpoints"))
    with pytest.raises(TrainingError, match=r"holds an earlier run .*--resume .*--overwrite"):
        train(cfg(data, run, steps=2))
    assert sorted(os.listdir(run / "checkpoints")) == before  # nothing of it touched


def test_overwrite_replaces_the_earlier_run_and_nothing_else(data: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    train(cfg(data, run, steps=3, save_every=1, keep=None))
    (run / "notes.txt").write_text("mine")
    res = train(cfg(data, run, steps=1, overwrite=True))
    assert [s for s, _ in ckpt_mod.list_checkpoints(str(run))] == [1]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(res.history) == 1
    assert (run / "notes.txt").read_text() == "mine"


def test_retention_never_drops_the_checkpoint_just_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stale = Path(ckpt_mod.checkpoints_dir(str(run))) / ckpt_mod.step_dir_name(10)
    stale.mkdir(parents=True)
    (stale / ckpt_mod.STATE_FILE).write_text("{}")
    tmp = Path(ckpt_mod.checkpoints_dir(str(run))) / ".tmp-step-00000002"
    tmp.mkdir()
    (tmp / ckpt_mod.STATE_FILE).write_text("{}")
    final = ckpt_mod._publish(str(run), str(tmp), 2, keep=1)
    assert os.path.isdir(final) and final.endswith(ckpt_mod.step_dir_name(2))


def test_a_missing_out_gets_a_new_folder_each_time(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from treeprep.cli.app import app

    monkeypatch.chdir(tmp_path)
    args = ["train", str(data), "--model", "tiny-qwen3", "--steps", "1", "--budget", str(BUDGET),
            "--device", "cpu", "--attn", "dense", "--json"]  # fmt: skip
    for _ in range(2):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2, runs
    assert all(re.fullmatch(r"\d{8}-\d{6}-build-tiny-qwen3(-\d+)?", n) for n in runs), runs
    # resuming without --out continues the run in its own folder
    run = tmp_path / "runs" / runs[0]
    r = CliRunner().invoke(app, [*args[:5], "2", *args[6:], "--resume", str(run)])
    assert r.exit_code == 0, r.output
    assert [s for s, _ in ckpt_mod.list_checkpoints(str(run))][-1] == 2


def test_without_a_terminal_every_step_is_one_plain_line(data: Path, tmp_path: Path) -> None:  # noqa: F811
    """Issue 25 item 4, in part: under SLURM, nohup or a redirect the progress bar drew nothing,
    so no step was reported at all; now each step is one flushed line on stderr."""
    from treeprep.cli.app import app

    args = ["train", str(data), "--model", "tiny-qwen3", "--steps", "2", "--budget", str(BUDGET),
            "--device", "cpu", "--attn", "dense", "--out", str(tmp_path / "run")]  # fmt: skip
    r = CliRunner().invoke(app, args)  # CliRunner's streams are not terminals
    assert r.exit_code == 0, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["1/2", "2/2"], r.output
    assert all(re.search(r"loss \d+\.\d+ .* tok/s ERR \d\.\d{3} elapsed", x) for x in lines)


def test_tensorboard_without_the_package_is_refused_before_the_run(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed")
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"pip install 'treeprep\[tensorboard\]'"):
        train(cfg(data, run, steps=1, report_to=["tensorboard"]))
    assert not run.exists()  # nothing written: a rerun is not refused as an earlier run
