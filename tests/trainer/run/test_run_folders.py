"""Issue 25 item 1: run folders. A fresh run never lands on an earlier one (refused unless
``--resume`` or ``--overwrite``), retention never drops the checkpoint just written, and a missing
``--out`` gets a new folder of its own instead of the shared ``runs/treeprep`` of before, where a
second run's keep-2 clean-up deleted the first run's final checkpoint."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_train import BUDGET, cfg, data  # noqa: E402, F401  (the module's build fixture)
from typer.testing import CliRunner  # noqa: E402

from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import TrainingError, train  # noqa: E402


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
    assert all(re.search(r"loss \d+\.\d+ .* tok/s reuse \d\.\d{3} elapsed", x) for x in lines)


def test_tensorboard_without_the_package_is_refused_before_the_run(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed")
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r'pip install -e "\.\[tensorboard\]"'):
        train(cfg(data, run, steps=1, report_to=["tensorboard"]))
    assert not run.exists()  # nothing written: a rerun is not refused as an earlier run


# ---- issue 41 item 3: one run at a time in a run folder ----------------------------------------


def _try_lock(run: Path) -> subprocess.CompletedProcess[str]:
    """Another process (no torch: fast) taking the run folder's lock as a second run would."""
    code = (
        "import sys\nfrom treeprep.errors import FolderLocked\n"
        "from treeprep.locks import take_lock\n"
        f"try:\n    take_lock({str(run / '.run.lock')!r}, what='busy')\n"
        "except FolderLocked as e:\n    sys.exit(str(e))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_running_train_holds_its_folder_and_a_second_is_refused_naming_its_pid(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Before: two runs started together both ran; one died at its first save with a misleading
    "free space or fix the permissions", and metrics.jsonl got step 1 twice."""
    run = tmp_path / "run"
    seen: list[subprocess.CompletedProcess[str]] = []

    def second_run_at_step_1(event: str, d: dict) -> None:
        if event == "step" and d["step"] == 1:
            seen.append(_try_lock(run))

    res = train(cfg(data, run, steps=1), callback=second_run_at_step_1)
    (second,) = seen
    assert second.returncode == 1, second.stderr
    assert f"held by pid {os.getpid()} on host {socket.gethostname()}" in second.stderr
    steps = (run / "metrics.jsonl").read_text().splitlines()
    assert len(steps) == len(res.history) == 1
    assert _try_lock(run).returncode == 0  # given back when the run ended


def test_a_run_killed_with_the_lock_does_not_block_the_next(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    hold = (
        "import sys, time\nfrom treeprep.locks import take_lock\n"
        f"take_lock({str(run / '.run.lock')!r}, what='x')\nprint('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        who = f"held by pid {holder.pid} on host {socket.gethostname()}"
        with pytest.raises(TrainingError, match=who):
            train(cfg(data, run, steps=1))
        assert not (run / "metrics.jsonl").exists()  # refused before anything was written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert len(train(cfg(data, run, steps=1)).history) == 1  # its lock died with it
