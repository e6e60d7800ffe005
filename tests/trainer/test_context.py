"""Context parallelism (:mod:`treeprep.trainer.context`): gloo processes on the CPU against one.

Four processes run, in turn, ``cp`` 2 (two context groups, data parallel over them) and ``cp`` 4
(one group), and two processes run ``cp`` 2 alone; each rank takes its data rank's micro-batches
(odd token counts, so that the padding runs), the model runs with activation checkpointing under
DDP over the whole world, and the gradients must equal one process running every micro-batch
(relative L2 under 1e-5, float32), for SFT and GRPO. The model has 8 query and 4 key/value heads,
so that grouped queries are split too. Loss and metric sums over the ranks must equal the one
process's, and the per-batch counts must be counted once per group.

The processes are started directly (``RANK``/``WORLD_SIZE`` in the environment) running this file
as a script; the test reads what rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from trainer_fixtures import VOCAB, group_tree, rows_of  # noqa: E402

TOL = 1e-5
#: (world size, cp) runs, each with these losses
WORLDS = {4: [2, 4], 2: [2]}
LOSSES = ["sft", "grpo"]


def data_batches(dp: int) -> list[list]:
    """``dp`` data ranks' micro-batches: two each, of odd token counts."""
    from treeprep.trainer import TreeBatch

    out = []
    for r in range(dp):
        mbs = []
        for k in range(2):
            rows = rows_of(group_tree(17 + 10 * r + k, n_seq=4 + k))
            b = TreeBatch.from_trees(rows, norm="sequence-mean")
            if b.num_tokens % 2 == 0:  # odd: every cp pads
                rows = rows_of(group_tree(17 + 10 * r + k, n_seq=4 + k, root_len=13))
                b = TreeBatch.from_trees(rows, norm="sequence-mean")
            mbs.append(b)
        out.append(mbs)
    return out


def _model():
    from dataclasses import replace

    from treeprep.trainer.models.load import model_from_config
    from treeprep.trainer.models.presets import PRESETS

    shape = dict(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    hf = replace(PRESETS["tiny-qwen3"], **shape).hf_config(VOCAB)
    lm = model_from_config(hf, dtype=torch.float32, seed=1)
    lm.train()
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return lm


def _cfg(loss: str, cp: int):
    from treeprep.trainer.config import TrainConfig

    return TrainConfig(
        data="unused", run_dir="unused", model="tiny-qwen3", loss=loss, attn="dense",
        norm="sequence-mean", device="cpu", cp=cp, activation_checkpointing=True,
    )  # fmt: skip


def _module(cfg, context=None):
    from dataclasses import asdict

    from treeprep.trainer.distributed import LossModule

    return LossModule(_model(), {"attn": None, **asdict(cfg.loss_config())}, context=context)


def _step(module, batches, cfg, scale: float, info) -> dict:
    from treeprep.trainer.step import micro_batches

    sums = micro_batches(module, batches, cfg, 10**6, scale, info, False)
    return {"loss": float(sums.loss), "tokens": sums.tokens, "targets": sums.targets,
            "micro_batches": sums.micro_batches, "extra": sums.extra}  # fmt: skip


def _reference(loss: str, dp: int) -> tuple[dict, dict]:
    from treeprep.trainer.distributed import DistInfo

    cfg = _cfg(loss, 1)
    module = _module(cfg)
    info = DistInfo(0, 1, 0, torch.device("cpu"))
    sums = _step(module, data_batches(dp), cfg, 1.0, info)
    return {n: p.grad.clone() for n, p in module.lm.named_parameters()}, sums


def _parallel(loss: str, cp: int, info) -> tuple[dict, dict]:
    from treeprep.trainer.context import data_rank, data_world, new_context
    from treeprep.trainer.distributed import wrap

    cfg = _cfg(loss, cp)
    cg = new_context(cp, info.rank, info.world_size)
    wrapped = wrap(_module(cfg, cg), info, "ddp")
    mine = [data_batches(data_world(info.world_size, cp))[data_rank(info.rank, cp)]]
    red = _step(wrapped, mine, cfg, float(info.world_size), info)
    sums = {k: red[k] for k in ("tokens", "targets", "micro_batches")}
    from treeprep.trainer.distributed import all_reduce_sum

    red["loss"] = all_reduce_sum([red["loss"]], info)[0]
    red.update({f"sum_{k}": v for k, v in sums.items()})
    return {n: p.grad for n, p in wrapped.module.lm.named_parameters()}, red


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).double().norm() ** 2) for k in b) ** 0.5
    den = sum(float(b[k].double().norm() ** 2) for k in b) ** 0.5
    return num / den


def worker(out: str) -> None:
    from treeprep.trainer.context import data_world
    from treeprep.trainer.distributed import all_reduce_sum, init_distributed, shutdown

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    runs = []
    for cp in WORLDS[info.world_size]:
        for loss in LOSSES:
            grads, got = _parallel(loss, cp, info)
            counts = [float(got[f"sum_{k}"]) for k in ("tokens", "targets", "micro_batches")]
            counts = all_reduce_sum(counts, info)
            if info.is_main:
                ref, want = _reference(loss, data_world(info.world_size, cp))
                runs.append({"cp": cp, "loss": loss, "rel": _rel(grads, ref),
                             "got": got["loss"], "want": want["loss"], "counts": counts,
                             "want_counts": [want["tokens"], want["targets"],
                                             want["micro_batches"]],
                             "extra": got["extra"], "want_extra": want["extra"]})  # fmt: skip
    if info.is_main:
        Path(out).write_text(json.dumps(runs))
    shutdown(info)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out: Path, world: int) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(out)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=sorted(WORLDS))
def results(request, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _spawn(tmp_path_factory.mktemp("context") / "out.json", request.param)


def test_gradients_equal_one_process(results: list[dict]) -> None:
    assert {(r["cp"], r["loss"]) for r in results} >= {(2, "sft"), (2, "grpo")}
    for r in results:
        assert r["rel"] < TOL, r


def test_losses_and_counts_add_up_over_the_group(results: list[dict]) -> None:
    for r in results:
        assert abs(r["got"] - r["want"]) <= 1e-5 * max(1.0, abs(r["want"])), r
        assert r["counts"] == [float(x) for x in r["want_counts"]], r
        for k, v in r["want_extra"].items():
            assert abs(r["extra"][k] - v) <= 1e-5 * max(1.0, abs(v)), (k, r)


if __name__ == "__main__":
    worker(sys.argv[1])
