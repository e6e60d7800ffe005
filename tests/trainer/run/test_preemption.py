"""Issue 25 item 3: preemption. SIGTERM (SLURM, Kubernetes), SIGINT (Ctrl-C) and SIGUSR1 save a
whole checkpoint at the next step boundary and stop with a line and the signal's exit status
(128 + n); a second signal exits at once; ``--resume auto`` then ends with the same weights as an
uninterrupted run, bit for bit on CPU. Checkpoints also come every ``save_minutes``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_train import BUDGET, cfg, data  # noqa: E402, F401  (the module's build fixture)

from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import train  # noqa: E402
from treeprep.trainer.run.preemption import StopSignals, exit_code  # noqa: E402

STEPS = 40  # far more steps than a signal takes to arrive: the run never ends before it


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return ckpt_mod.open_checkpoint(str(run)).model_state()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_exit_codes_follow_the_shell_convention() -> None:
    assert (exit_code("SIGTERM"), exit_code("SIGINT"), exit_code("SIGUSR1")) == (143, 130, 138)


def test_first_signal_is_a_request_second_exits_at_once() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), StopSignals() as s:
        signal.raise_signal(signal.SIGINT)
        assert s.received == "SIGINT"  # nothing raised: the loop reads it at the step boundary
        signal.raise_signal(signal.SIGINT)  # the second: Python's own handler, at once
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are put back
    with StopSignals() as s:
        signal.raise_signal(signal.SIGUSR1)
    assert s.received == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_saves_at_the_step_boundary_and_resume_continues_exactly(
    data: Path,  # noqa: F811
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    full = train(cfg(data, tmp_path / "full", steps=4))

    def send(event: str, d: dict) -> None:
        if event == "step" and d["step"] == 2:
            signal.raise_signal(sig)

    run = tmp_path / "run"
    res = train(cfg(data, run, steps=4), callback=send)
    assert (res.stopped, res.steps, [m.step for m in res.history]) == (sig.name, 2, [1, 2])
    assert [s for s, _ in ckpt_mod.list_checkpoints(str(run))] == [2]
    assert res.checkpoint is not None and res.checkpoint.endswith("step-00000002")
    resumed = train(cfg(data, run, steps=4, resume="auto"))
    assert resumed.stopped is None and [m.step for m in resumed.history] == [3, 4]
    assert resumed.losses == full.losses[2:]
    assert _same(_weights(run), _weights(tmp_path / "full"))


def test_save_minutes_checkpoints_on_wall_time(data: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    train(cfg(data, run, steps=3, save_minutes=1e-9, save_final=False))
    assert [s for s, _ in ckpt_mod.list_checkpoints(str(run))] == [1, 2, 3]
    train(cfg(data, tmp_path / "off", steps=3, save_minutes=None, save_final=False))
    assert ckpt_mod.list_checkpoints(str(tmp_path / "off")) == []


def _cli(data: Path, run: Path, *extra: str) -> list[str]:  # noqa: F811
    return [sys.executable, "-m", "treeprep.cli", "train", str(data), "--model", "tiny-qwen3",
            "--budget", str(BUDGET), "--steps-of", "2", "--lr", "3e-3", "--warmup", "2",
            "--device", "cpu", "--attn", "dense", "--keep", "0", "--steps", str(STEPS),
            "--out", str(run), *extra]  # fmt: skip


def test_kill_term_mid_run_then_resume_auto_ends_with_the_same_weights(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """As a user would: ``kill -TERM`` of a running ``treeprep train`` (no terminal: one line per
    step on stderr), then the same command with ``--resume auto``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # the uninterrupted run, beside the one that is stopped (its output read at the end)
    full = subprocess.Popen(_cli(data, tmp_path / "full"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    run = tmp_path / "run"
    proc = subprocess.Popen(_cli(data, run), env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("step 1/"):
            proc.send_signal(signal.SIGTERM)
            break
    err = "".join(seen) + proc.stderr.read()
    assert proc.wait(timeout=300) == 143, err
    (stop,) = [x for x in err.splitlines() if x.startswith("stopped by SIGTERM")]
    cps = ckpt_mod.list_checkpoints(str(run))
    assert len(cps) == 1 and 1 <= cps[0][0] < STEPS, (cps, err)
    assert f"after step {cps[0][0]}: checkpoint {cps[0][1]}; continue with --resume auto" in stop
    ckpt_mod.open_checkpoint(cps[0][1])  # whole: every file there and matching its sha256
    again = subprocess.run(
        _cli(data, run, "--resume", "auto"), env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert f"resumed from step {cps[0][0]} of {STEPS} (" in again.stderr
    full_err = full.communicate(timeout=300)[1]
    assert full.returncode == 0, full_err
    assert _same(_weights(run), _weights(tmp_path / "full"))


def test_each_signal_is_reported_and_the_second_names_the_last_whole_checkpoint(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 39 item 4: a second signal exited without saying which checkpoint is whole."""
    from treeprep.cli.train_progress import signal_line as _signal_line

    events: list[tuple[str, dict]] = []

    def cb(event: str, d: dict) -> None:
        events.append((event, d))
        if event == "step" and d["step"] == 2:  # step 2 is not saved yet: step 1 is the last
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(cfg(data, tmp_path / "run", steps=4, save_every=1), callback=cb)
    first, now = (d for e, d in events if e == "signal")
    assert (first["signal"], first["now"], now["signal"], now["now"]) == (
        "SIGINT", False, "SIGINT", True
    )  # fmt: skip
    last = str(tmp_path / "run" / "checkpoints" / "step-00000001")
    assert now["checkpoint"] == last
    assert _signal_line(now) == (
        f"SIGINT again: exiting now, without a checkpoint of the step in flight; the last whole "
        f"checkpoint is {last} (continue with --resume auto)"
    )
    assert _signal_line(first).startswith("SIGINT: saving a checkpoint at the end of the step")
