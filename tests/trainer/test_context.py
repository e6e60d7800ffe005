"""Context parallelism (:mod:`treeprep.trainer.context`): gloo processes on the CPU against one.

Gradients: four processes run, in turn, ``cp`` 2 (two context groups of two, data parallel over
them) and ``cp`` 4 (one group of four), with whole trees and with trees cut into hand-off parts
(each part padded to a multiple of the group, each rank storing its key/value heads' rows); each
rank takes its data rank's micro-batches (token counts not all multiples of the group size, so
that the padding runs), the model runs with activation checkpointing, wrapped over the whole
world (DDP at ``cp`` 2, FSDP2 at ``cp`` 4), and the gradients must equal one process running
every micro-batch (relative L2 under 1e-5, float32), for SFT and GRPO. The model has 8 query and
4 key/value heads, so that grouped queries are split too. Loss and metric sums over the ranks
must equal the one process's, and the per-batch counts must be counted once per group. The
processes are started directly (``RANK``/``WORLD_SIZE`` in the environment) running this file as
a script; the test reads what rank 0 wrote.

End to end: :func:`~treeprep.trainer.run.loop.train` with cp 2 on the same four processes (two
context groups, data parallel over them) gives every step's loss and the final weights of one
process running the plan made for two data ranks.
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
#: the world's cp runs, each with these losses
WORLD = 4
#: (cp, loss, wrapper over the whole world, hand-off part graph or None) runs, each a fresh
#: model and one step
#: (each loss, wrapper, group size and part graph at least once, in as few runs as cover them;
#: the float64 run is held to 1e-10)
RUNS = [
    (2, "grpo", "ddp", None),
    (4, "sft", "fsdp", None),
    (2, "sft", "ddp", "recompute:float64"),
    (4, "grpo", "fsdp", "keep"),
]
TOL64 = 1e-10
#: the hand-off runs' part budget: their trees run as several parts, most of them not a multiple
#: of the group's size (so that a part's padding runs)
BUDGET = 13


def data_batches(dp: int) -> list[list]:
    """``dp`` data ranks' micro-batches, two each."""
    from treeprep.trainer import TreeBatch

    return [
        [
            TreeBatch.from_trees(rows_of(group_tree(17 + 10 * r + k, n_seq=4 + k)),
                                 norm="sequence-mean")
            for k in range(2)
        ]
        for r in range(dp)
    ]  # fmt: skip


def handoff_batches(dp: int) -> list[list]:
    """``dp`` data ranks' micro-batches, each one tree cut into hand-off parts of
    :data:`BUDGET` tokens as the plan cuts them."""
    import numpy as np

    from treeprep.schemas.parts import part_cuts, part_parents
    from treeprep.trainer import TreeBatch

    out = []
    for r in range(dp):
        b = TreeBatch.from_trees(rows_of(group_tree(41 + r, n_seq=5 + r)), norm="sequence-mean")
        ln, par = b.node_length.numpy(), b.node_parent.numpy()
        cuts = part_cuts(ln, par, BUDGET)
        parents = part_parents(cuts, b.node_start.numpy(), par, ln)
        b.part_cuts = (np.asarray(cuts, dtype=np.int64), np.asarray(parents, dtype=np.int64))
        out.append([b])
    return out


def _graph_dtype(graph: str | None):
    """A run's part graph and model dtype (``"recompute:float64"``)."""
    name, _, dtype = (graph or "").partition(":")
    return name or None, getattr(torch, dtype or "float32")


def _model(dtype=None):
    from dataclasses import replace

    from treeprep.trainer.models.load import model_from_config
    from treeprep.trainer.models.presets import PRESETS

    shape = dict(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    hf = replace(PRESETS["tiny-qwen3"], **shape).hf_config(VOCAB)
    lm = model_from_config(hf, dtype=dtype or torch.float32, seed=1)
    lm.train()
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return lm


def _cfg(loss: str, cp: int, graph: str | None = None):
    from treeprep.trainer.config import TrainConfig

    return TrainConfig(
        data="unused", run_dir="unused", model="tiny-qwen3", loss=loss, attn="dense",
        norm="sequence-mean", device="cpu", cp=cp, activation_checkpointing=True,
        part_graph=graph or "recompute",
    )  # fmt: skip


def _module(cfg, context=None, dtype=None):
    from dataclasses import asdict

    from treeprep.trainer.run.step import LossModule

    kw = {"attn": None, **asdict(cfg.loss_config())}
    return LossModule(_model(dtype), kw, context=context)


def _step(module, batches, cfg, scale: float, info, has_parts: bool = False) -> dict:
    from treeprep.trainer.distributed import all_reduce_grads
    from treeprep.trainer.parts.sharded import ShardedHandOff
    from treeprep.trainer.run.step import micro_batches

    budget = BUDGET if has_parts else 10**6
    sharded = None
    if has_parts and info.distributed and cfg.parallel == "fsdp":
        from treeprep.trainer import TreeBatch
        from treeprep.trainer.data.rows import NULL_ROW

        sharded = ShardedHandOff(module, TreeBatch.from_trees([NULL_ROW], norm=cfg.norm), info)
    sums = micro_batches(module, batches, cfg, budget, scale, info, has_parts, sharded)
    if has_parts and info.distributed and sharded is None:
        all_reduce_grads([p for p in module.parameters() if p.requires_grad], info)
    return {"loss": float(sums.loss), "tokens": sums.tokens, "targets": sums.targets,
            "micro_batches": sums.micro_batches, "extra": sums.extra}  # fmt: skip


def _reference(loss: str, dp: int, graph: str | None = None) -> tuple[dict, dict]:
    from treeprep.trainer.distributed import DistInfo

    graph, dtype = _graph_dtype(graph)
    cfg = _cfg(loss, 1, graph)
    module = _module(cfg, dtype=dtype)
    info = DistInfo(0, 1, 0, torch.device("cpu"))
    batches = handoff_batches(dp) if graph else data_batches(dp)
    sums = _step(module, batches, cfg, 1.0, info, has_parts=graph is not None)
    return {n: p.grad.clone() for n, p in module.lm.named_parameters()}, sums


def _parallel(
    loss: str, cp: int, parallel: str, info, graph: str | None = None
) -> tuple[dict, dict]:
    from dataclasses import replace

    from treeprep.trainer.context import data_rank, data_world, new_context
    from treeprep.trainer.distributed import unwrap, wrap

    graph, dtype = _graph_dtype(graph)
    cfg = replace(_cfg(loss, cp, graph), parallel=parallel)
    cg = new_context(cp, info.rank, info.world_size)
    wrapped = wrap(_module(cfg, cg, dtype), info, parallel)
    make = handoff_batches if graph else data_batches
    mine = [make(data_world(info.world_size, cp))[data_rank(info.rank, cp)]]
    red = _step(wrapped, mine, cfg, float(info.world_size), info, has_parts=graph is not None)
    sums = {k: red[k] for k in ("tokens", "targets", "micro_batches")}
    from treeprep.trainer.distributed import all_reduce_sum

    red["loss"] = all_reduce_sum([red["loss"]], info)[0]
    red.update({f"sum_{k}": v for k, v in sums.items()})
    lm = unwrap(wrapped).lm
    return {n: _full(p.grad) for n, p in lm.named_parameters()}, red


def _full(grad):
    """A gradient as a plain tensor (FSDP2's are sharded DTensors)."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).double().norm() ** 2) for k in b) ** 0.5
    den = sum(float(b[k].double().norm() ** 2) for k in b) ** 0.5
    return num / den


def worker(out: str, data: str, runs: str) -> None:
    from treeprep.trainer.context import data_world
    from treeprep.trainer.distributed import all_reduce_sum, init_distributed, shutdown
    from treeprep.trainer.run.loop import train

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    res = []
    for cp, loss, parallel, graph in RUNS:
        grads, got = _parallel(loss, cp, parallel, info, graph)
        counts = [float(got[f"sum_{k}"]) for k in ("tokens", "targets", "micro_batches")]
        counts = all_reduce_sum(counts, info)
        if info.is_main:
            ref, want = _reference(loss, data_world(info.world_size, cp), graph)
            res.append({"cp": cp, "loss": loss, "graph": graph, "rel": _rel(grads, ref),
                        "got": got["loss"], "want": want["loss"], "counts": counts,
                        "want_counts": [want["tokens"], want["targets"],
                                        want["micro_batches"]],
                        "extra": got["extra"], "want_extra": want["extra"]})  # fmt: skip
    # tiny-qwen3's 2 key/value heads split 2 ways: two context groups of two
    train(_train_cfg(data, str(Path(runs) / "cp2"), cp=2))
    if info.is_main:
        Path(out).write_text(json.dumps(res))
    shutdown(info)


def _train_cfg(data: str, run_dir: str, **kw):
    """The end-to-end runs: SGD with momentum (an update linear in the gradient), checkpointing."""
    from treeprep.trainer.run.loop import TrainConfig

    return TrainConfig(data=data, model="tiny-qwen3", run_dir=run_dir, budget=512, steps=2,
                       steps_of=2, optimizer="sgd", lr=0.3, momentum=0.9, device="cpu",
                       attn="dense", activation_checkpointing=True, probe=False,
                       save_every=2, save_final=False,
                       **kw)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], world: int) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *args],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_train import write_rollouts

    from treeprep.build import BuildConfig, build

    root = tmp_path_factory.mktemp("context")
    write_rollouts(root / "rollouts.jsonl", seed=3)
    build(BuildConfig(inputs=[str(root / "rollouts.jsonl")], out=str(root / "build")))
    return root


@pytest.fixture(scope="module")
def results(built: Path) -> list[dict]:
    _spawn([str(built / "out.json"), str(built / "build"), str(built / "runs")], WORLD)
    return json.loads((built / "out.json").read_text())


def test_the_batches_need_padding() -> None:
    sizes = [b.num_tokens for mbs in data_batches(2) for b in mbs]
    assert any(n % 2 for n in sizes) and any(n % 4 for n in sizes), sizes


def test_the_hand_off_parts_need_padding() -> None:
    """Each data rank's tree runs as several parts, some of them not a multiple of 2 or 4
    tokens."""
    from treeprep.trainer.parts import part_layout

    for mbs in handoff_batches(2):
        sizes = [p.num_tokens for p in part_layout(mbs[0], BUDGET, mbs[0].part_cuts).parts]
        assert len(sizes) > 2 and any(n % 2 for n in sizes) and any(n % 4 for n in sizes), sizes


def test_gradients_equal_one_process(results: list[dict]) -> None:
    assert [(r["cp"], r["loss"], r["graph"]) for r in results] == [(c, x, g) for c, x, _, g in RUNS]
    for r in results:
        assert r["rel"] < (TOL64 if r["graph"] and "float64" in r["graph"] else TOL), r


def test_losses_and_counts_add_up_over_the_group(results: list[dict]) -> None:
    for r in results:
        assert abs(r["got"] - r["want"]) <= 1e-5 * max(1.0, abs(r["want"])), r
        assert r["counts"] == [float(x) for x in r["want_counts"]], r
        for k, v in r["want_extra"].items():
            assert abs(r["extra"][k] - v) <= 1e-5 * max(1.0, abs(v)), (k, r)


def test_train_matches_one_process(results: list[dict], built: Path) -> None:
    """``train`` with cp 2 on four processes (two context groups, data parallel over them):
    every step's loss and token count, and the final weights, of one process running the same
    plan (made for two data ranks)."""
    from treeprep.trainer.run import checkpoint as ckpt_mod
    from treeprep.trainer.run.loop import train

    ref_dir = built / "ref"
    ref = train(_train_cfg(str(built / "build"), str(ref_dir), plan_world_size=2))
    run = built / "runs" / "cp2"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in lines] == pytest.approx(ref.losses, rel=2e-6)
    assert [x["tokens"] for x in lines] == [m.tokens for m in ref.history]
    want = ckpt_mod.open_checkpoint(str(ref_dir)).model_state()
    got = ckpt_mod.open_checkpoint(str(run)).model_state()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_cp_refuses_what_it_cannot_split() -> None:
    from treeprep.errors import TrainingError
    from treeprep.trainer.context import check_model, new_context

    with pytest.raises(TrainingError, match="multiple of 2"):
        new_context(2, 0, 1)
    with pytest.raises(TrainingError, match="4 query and 2 key/value heads"):
        check_model(_tiny("tiny-qwen3"), 4)
    with pytest.raises(TrainingError, match="linear-attention"):
        check_model(_tiny("tiny-qwen3-5"), 2)
    with pytest.raises(TrainingError, match="gspo"):
        _cfg("gspo", 2)


def _tiny(name: str):
    from treeprep.trainer.models.load import model_from_config
    from treeprep.trainer.models.presets import PRESETS

    return model_from_config(PRESETS[name].hf_config(VOCAB), dtype=torch.float32, seed=1)


if __name__ == "__main__":
    worker(*sys.argv[1:])
