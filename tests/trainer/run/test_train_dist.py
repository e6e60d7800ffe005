"""Two processes on the CPU (gloo), DDP and FSDP2, launched by torchrun through the CLI: the same
losses and the same weights as one process running the same global batches.

The single-process reference runs a plan made for two ranks and executes both ranks'
micro-batches itself; the two-process runs split them. Every step's loss and the final weights
must agree to float32 rounding (SGD with momentum, so that an update is a linear function of the
gradient and a rounding difference cannot be amplified by Adam's normalisation near zero).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from test_train import BUDGET, write_rollouts  # noqa: E402

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import TrainConfig, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OPTS = dict(steps=3, steps_of=2, optimizer="sgd", lr=0.3, momentum=0.9, warmup_steps=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float], dict]:
    root = tmp_path_factory.mktemp("dist")
    write_rollouts(root / "rollouts.jsonl", seed=3)
    data = root / "build"
    build(BuildConfig(inputs=[str(root / "rollouts.jsonl")], out=str(data)))
    ref = train(
        TrainConfig(
            data=str(data),
            model="tiny-qwen3",
            run_dir=str(root / "ref"),
            budget=BUDGET,
            plan_world_size=2,
            device="cpu",
            attn="dense",
            **OPTS,
        )  # fmt: skip
    )
    weights = ckpt_mod.open_checkpoint(str(root / "ref")).model_state()
    return data, ref.losses, weights


def _torchrun(data: Path, run: Path, parallel: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "treeprep.cli", "train", str(data), "--model", "tiny-qwen3", "--out", str(run),
           "--budget", str(BUDGET), "--steps-of", "2", "--steps", "3", "--optimizer", "sgd",
           "--lr", "0.3", "--momentum", "0.9", "--warmup", "1", "--device", "cpu",
           "--attn", "dense", "--parallel", parallel, "--json"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.long)])
def test_two_processes_match_one(setup, tmp_path: Path, parallel: str) -> None:
    data, ref_losses, ref_weights = setup
    run = tmp_path / parallel
    r = _torchrun(data, run, parallel)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout[r.stdout.index("{") :])
    assert out["world_size"] == 2 and out["steps"] == 3
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    got = ckpt_mod.open_checkpoint(str(run)).model_state()
    assert got.keys() == ref_weights.keys()
    for k in ref_weights:
        torch.testing.assert_close(got[k], ref_weights[k], rtol=1e-5, atol=1e-6)
    st = json.loads((Path(ckpt_mod.latest_checkpoint(str(run))) / "state.json").read_text())
    assert st["world_size"] == 2 and st["parallel"] == parallel
    assert (Path(ckpt_mod.latest_checkpoint(str(run))) / "rng-rank1.pt").is_file()
