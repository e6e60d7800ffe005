"""trainer/run/saver.py: what a checkpoint saves is what a resume restores, the float16 grad
scaler's state included (a resume goes on at the loss scale the run reached)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from treeprep.trainer import distributed as dist_mod  # noqa: E402
from treeprep.trainer import load_model  # noqa: E402
from treeprep.trainer.config import TrainConfig  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.saver import restore, save  # noqa: E402
from treeprep.trainer.run.step import LossModule, Schedule, make_optimizer  # noqa: E402

ALONE = dist_mod.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _state(cfg: TrainConfig):
    lm = load_model("tiny-qwen3", vocab_size=64, attn="dense", seed=3)
    module = LossModule(lm, {"loss": "sft", "attn": None})
    opt = make_optimizer(cfg, [p for p in module.parameters() if p.requires_grad], ALONE.device)
    return module, opt


def _scaler(scale: float) -> torch.amp.GradScaler:
    # CPU's GradScaler keeps the same state as CUDA's: the float16 path's bookkeeping
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=3)
    scaler.scale(torch.ones(()))  # starts it (a scaler's state is lazy until its first use)
    return scaler


@pytest.mark.parametrize("saved", [True, False])
def test_a_resume_restores_the_grad_scaler_it_saved(tmp_path: Path, saved: bool) -> None:
    cfg = TrainConfig(data="unused", model="tiny-qwen3", run_dir=str(tmp_path), optimizer="sgd")
    module, opt = _state(cfg)
    scaler = _scaler(2.0**10)
    scaler._growth_tracker.fill_(2)  # two clean steps towards the next growth  # type: ignore
    path = save(cfg, ALONE, module, opt, Schedule.of(cfg, 4), 1, 0, 1, None,
                scaler=scaler if saved else None)  # fmt: skip
    resume = ckpt_mod.open_checkpoint(path)
    assert (resume.scaler_state() is not None) == saved
    fresh = _scaler(2.0**16)
    module2, opt2 = _state(cfg)
    assert restore(resume, module2, opt2, cfg, ALONE, fresh) == (1, 0, 1)
    want = scaler.state_dict() if saved else _scaler(2.0**16).state_dict()
    assert fresh.state_dict() == want  # a checkpoint without one leaves the initial scale
