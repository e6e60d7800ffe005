"""Issue 37: hand-off stores in a host pool, read a window at a time (``stores="host"``).

* Exact: the same loss and gradients as ``stores="gpu"`` and as the whole tree (1e-5 float32,
  1e-10 float64), for plain, sliding-window, sink (gpt-oss) and hybrid (Qwen3.5) layers, both
  part graphs, activation checkpointing, LoRA and GRPO / GSPO; windows are cut to 3 rows so every
  prefix is read in many windows, and the written-out block kernel (what CUDA runs) is checked
  on the CPU too.
* Held in the pool: every store and accumulator is one of the pool's storages; the
  linear-attention states stay on the device.
* Bounded: with the pool left out of the live-bytes count, the device peak grows with the path
  by no more than the part's mask vectors (against twice the path's K/V with device stores).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import VOCAB, group_tree, rows_of  # noqa: E402

from treeprep.errors import TrainingError, TreeprepError  # noqa: E402
from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trainer import TreeBatch, load_model, verify_gradients  # noqa: E402
from treeprep.trainer.attention import stream  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig, tree_loss  # noqa: E402
from treeprep.trainer.parts import KVStore, LinearState, host, run_parts, schedule  # noqa: E402
from treeprep.trainer.parts.host import HostPool  # noqa: E402
from treeprep.trainer.run.memtrack import LiveBytes  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

TOL = 1e-5
_MODELS: dict[str, torch.nn.Module] = {}


def _model(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = load_model(name, vocab_size=VOCAB, attn="nodes", seed=1)
    return _MODELS[name]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
        for n, p in model.named_parameters()
    }


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).double().norm() ** 2) for k in a) ** 0.5
    den = sum(float(b[k].double().norm() ** 2) for k in b) ** 0.5
    return num / den if den > 0 else num


def _run(model: torch.nn.Module, b: TreeBatch, loss: str, **kw: object) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    out = run_parts(model, b, LossConfig(loss), attn="nodes", **kw)  # type: ignore[arg-type]
    return float(out.loss), _grads(model)


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefix windows of 3 rows: every prefix is read in several."""
    monkeypatch.setattr(stream, "PREFIX_WINDOW", 3)


@pytest.mark.usefixtures("small_windows")
@pytest.mark.parametrize(
    ("name", "mode", "loss"),
    [
        ("tiny-qwen3", "recompute", "gspo"),
        ("tiny-qwen3", "keep", "grpo"),
        ("tiny-gemma3", "recompute", "sft"),  # sliding-window layers
        ("tiny-gpt-oss", "keep", "sft"),  # sinks and windows
        ("tiny-qwen3-5", "recompute", "sft"),  # linear attention
    ],
)
def test_host_stores_equal_gpu_stores_and_the_whole_tree(name: str, mode: str, loss: str) -> None:
    model = _model(name)
    n_seq = 4 if name == "tiny-qwen3-5" else 6  # (its linear attention runs in plain torch)
    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=n_seq)), norm="token-mean")
    model.zero_grad(set_to_none=True)
    whole = tree_loss(model, b, loss=loss)  # type: ignore[arg-type]
    whole.loss.backward()
    lw, gw = float(whole.loss.detach()), _grads(model)
    mass = float(whole.metrics["loss_mass"])
    for budget in (3,) if name == "tiny-qwen3-5" else (3, 11):  # (many parts, then a few)
        lg, gg = _run(model, b, loss, budget=budget, mode=mode, stores="gpu")
        lh, gh = _run(model, b, loss, budget=budget, mode=mode, stores="host")
        assert abs(lh - lw) <= TOL * max(mass, 1e-6) and abs(lh - lg) <= TOL * max(mass, 1e-6)
        assert _rel(gh, gw) < TOL, (budget, _rel(gh, gw))
        assert _rel(gh, gg) < TOL, (budget, _rel(gh, gg))


@pytest.mark.usefixtures("small_windows")
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gpt-oss"])
def test_the_written_out_block_kernel_is_exact(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block product written out (what the windowed layers run, and float64 or a CUDA kernel
    that failed its check; long device blocks cut to a window) against the whole tree, with
    checkpointing (the layer and its windows read again in the backward)."""
    from treeprep.trainer.attention import kernels, nodes

    monkeypatch.setattr(kernels, "fused_ok", lambda *a: False)
    monkeypatch.setattr(nodes, "fused_ok", lambda *a: False)
    cuts: list[int] = []
    split = stream.split_blocks
    monkeypatch.setattr(nodes, "split_blocks", lambda *a: cuts.append(len(a[0])) or split(*a))
    model = load_model(name, vocab_size=VOCAB, attn="nodes", seed=2)
    model.train()
    b = TreeBatch.from_trees(rows_of(group_tree(9, n_seq=9, roots=2)), norm="sum")
    model.zero_grad(set_to_none=True)
    whole = tree_loss(model, b, loss="sft")
    whole.loss.backward()
    lw, gw = float(whole.loss.detach()), _grads(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for mode in ("recompute", "keep"):
        lh, gh = _run(model, b, "sft", budget=7, mode=mode, stores="host")
        assert abs(lh - lw) <= TOL * abs(lw)
        assert _rel(gh, gw) < TOL, (mode, _rel(gh, gw))
    assert cuts  # the device blocks went through the split


@pytest.mark.usefixtures("small_windows")
def test_host_stores_verify_against_the_linear_layout_in_float64() -> None:
    """Against plain transformers on each sequence (the linear layout), float64: 1e-10."""
    from test_handoff_state import _float64_norms
    from test_handoff_state import _model as _model_of

    model = _model_of("tiny-qwen3", torch.float64)
    _float64_norms(model)
    rows = rows_of(group_tree(31, n_seq=6, roots=2), group_tree(32, n_seq=5))
    rep = verify_gradients(model, rows, loss="sft", norm="sum", attn="nodes", budget=5,
                           stores="host")  # fmt: skip
    assert rep.worst_rel < 1e-10 and rep.loss_rel < 1e-10, (rep.worst_rel, rep.loss_rel)


@pytest.mark.usefixtures("small_windows")
def test_lora_with_host_stores_verifies() -> None:
    """LoRA on queries and values (layer 0's keys need no gradient: no accumulator) against the
    linear layout."""
    from treeprep.trainer.models.lora import apply_lora

    pm = apply_lora(load_model("tiny-qwen3", vocab_size=VOCAB, attn="nodes", seed=1), r=4,
                    targets=["q_proj", "v_proj"])  # fmt: skip
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
    rows = rows_of(group_tree(21, n_seq=6, roots=2), group_tree(22, n_seq=5))
    rep = verify_gradients(pm, rows, loss="grpo", norm="sum", attn="nodes", budget=5,
                           stores="host")  # fmt: skip
    assert rep.ok and rep.worst_rel < TOL, rep.to_dict()


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3-5"])
def test_every_store_lives_in_the_host_pool(name: str) -> None:
    """Every stored key and value and every accumulator is one of the pool's storages (checked
    after each part stores and before each is dropped, when its accumulators are fullest);
    linear-attention states stay on the device, outside the pool."""
    pool = HostPool()
    checked = {"kv": 0, "acc": 0, "linear": 0}
    store, drop = schedule._Runner.store, schedule._Runner.drop

    def check(run: schedule._Runner) -> None:
        for sts in run.states.values():
            for st in sts:
                if isinstance(st, KVStore):
                    assert st.pool is pool and pool.holds(st.k) and pool.holds(st.v)
                    checked["kv"] += 1
                    for acc in (st.gk, st.gv):
                        if acc is not None:
                            assert pool.holds(acc)
                            checked["acc"] += 1
                else:
                    assert isinstance(st, LinearState)
                    for conv, rec in st.states.values():
                        assert not pool.holds(conv) and not pool.holds(rec)
                        checked["linear"] += 1

    def store_checked(self: schedule._Runner, c: int, ho: object) -> None:
        store(self, c, ho)  # type: ignore[arg-type]
        check(self)

    def drop_checked(self: schedule._Runner, c: int) -> None:
        check(self)
        drop(self, c)

    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=5)), norm="token-mean")
    schedule._Runner.store, schedule._Runner.drop = store_checked, drop_checked  # type: ignore[method-assign]
    try:
        _run(_model(name), b, "sft", budget=5, stores="host", pool=pool)
    finally:
        schedule._Runner.store, schedule._Runner.drop = store, drop  # type: ignore[method-assign]
    assert checked["kv"] and checked["acc"], checked
    assert bool(checked["linear"]) == (name == "tiny-qwen3-5")
    assert pool.peak > 0 and pool.current == 0  # every store freed with its part


def _chain(tokens: int) -> TreeBatch:
    toks = np.random.default_rng(0).integers(0, VOCAB, tokens).astype(np.int32)
    return TreeBatch.from_trees(
        [build_tree([Sequence("s", toks, [(1, tokens)])]).to_row()], norm="sum"
    )


def _device_peak(model: torch.nn.Module, tokens: int, stores: str) -> tuple[int, int]:
    """(live bytes outside the pool, the pool's peak) of one chain run as parts of 64."""
    b = _chain(tokens)
    pool = HostPool()
    model.zero_grad(set_to_none=True)
    with LiveBytes() as mem:
        mem.exclude(pool.owns)
        run_parts(model, b, LossConfig("sft"), budget=64, attn="nodes", stores=stores, pool=pool)
    return mem.peak, pool.peak


def test_the_device_peak_does_not_grow_with_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 512-token path against a 256-token one, parts of 64, windows of 32 rows:
    with device stores the peak grows by the stored keys, values and accumulators per path token
    (and the mask vectors); with host stores only by the part's mask vectors (four int64 per
    prefix row, and a few more while they are built), while the pool holds the stores."""
    monkeypatch.setattr(stream, "PREFIX_WINDOW", 32)
    model = _model("tiny-qwen3")
    cfg = model.config
    layers = cfg.num_hidden_layers
    kv = layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # K/V bytes per path token
    _device_peak(model, 64, "gpu")  # warm up
    short, long = 256, 512
    gpu = [_device_peak(model, n, "gpu") for n in (short, long)]
    host = [_device_peak(model, n, "host") for n in (short, long)]
    gpu_slope = (gpu[1][0] - gpu[0][0]) / (long - short)
    host_slope = (host[1][0] - host[0][0]) / (long - short)
    assert gpu_slope >= 2 * kv and gpu[0][1] == 0, (gpu_slope, kv)
    assert host_slope <= 8 * 8, (host_slope, kv)
    pool_slope = (host[1][1] - host[0][1]) / (long - short)
    assert 2 * kv <= pool_slope <= 2 * kv * 1.01, (pool_slope, kv)


def test_stores_are_checked() -> None:
    from treeprep.trainer.config import TrainConfig

    with pytest.raises(TrainingError, match="stores"):
        TrainConfig(data="d", model="tiny-qwen3", run_dir="r", stores="disk")  # type: ignore[arg-type]
    with pytest.raises(TrainingError, match="nodes"):
        TrainConfig(data="d", model="tiny-qwen3", run_dir="r", stores="host", attn="dense")
    b = _chain(40)
    with pytest.raises(TreeprepError, match="nodes"):
        run_parts(_model("tiny-qwen3"), b, LossConfig("sft"), budget=16, attn="dense",
                  stores="host")  # fmt: skip
    with pytest.raises(TreeprepError, match="stores"):
        run_parts(_model("tiny-qwen3"), b, LossConfig("sft"), budget=16, stores="disk")


def _slow_adds(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make every deferred add of the gradient sink late (the worker sleeps first), and count the
    adds in flight at once."""
    seen = {"now": 0, "most": 0, "adds": 0}
    lock = threading.Lock()
    apply = host.GradSink._apply
    original_add = host.GradSink.add

    def add(self: host.GradSink, acc: torch.Tensor, g: torch.Tensor) -> None:
        original_add(self, acc, g)
        if self.depth:  # sent (a count at most the true one: its add may be done already)
            with lock:
                seen["now"] += 1
                seen["most"] = max(seen["most"], seen["now"])

    def slow(self: host.GradSink, *a: object) -> None:
        time.sleep(0.01)
        with lock:
            seen["now"] -= 1
            seen["adds"] += 1
        apply(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(host.GradSink, "add", add)
    monkeypatch.setattr(host.GradSink, "_apply", slow)
    return seen


@pytest.mark.usefixtures("small_windows")
@pytest.mark.parametrize(("name", "mode"), [("tiny-qwen3", "recompute"), ("tiny-gpt-oss", "keep")])
def test_deferred_gradient_adds_give_the_same_bits_as_adding_at_once(
    name: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink adds each window's gradients later, on its worker (here late on purpose): every
    read of an accumulator still waits for them, in the order they were sent, so the gradients
    are the very bits of adding each at once (``grad_depth=0``), and at most GRAD_DEPTH are in
    flight."""
    model = _model(name)
    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=6)), norm="token-mean")
    l0, g0 = _run(model, b, "sft", budget=5, mode=mode, stores="host", pool=HostPool(grad_depth=0))
    seen = _slow_adds(monkeypatch)
    l4, g4 = _run(model, b, "sft", budget=5, mode=mode, stores="host", pool=HostPool())
    assert seen["adds"] >= 20 and 1 < seen["most"] <= host.GRAD_DEPTH, seen
    assert l4 == l0
    assert all(torch.equal(g4[k], g0[k]) for k in g0)


def test_an_add_that_fails_fails_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """An add that raises on the sink's worker is raised in the step (at the next read of an
    accumulator, or at the step's end), never lost."""

    def broken(self: host.GradSink, acc: torch.Tensor, *a: object) -> None:
        self._slots.release()
        raise RuntimeError("the host add failed")

    monkeypatch.setattr(host.GradSink, "_apply", broken)
    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=4)), norm="token-mean")
    with pytest.raises(RuntimeError, match="the host add failed"):
        _run(_model("tiny-qwen3"), b, "sft", budget=5, stores="host", pool=HostPool())
    with pytest.raises(ValueError, match="grad depth"):
        HostPool(grad_depth=-1)
