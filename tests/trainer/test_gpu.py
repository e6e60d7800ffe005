"""GPU exactness (skipped without CUDA): ``flex`` against ``dense``, hand-off parts against the
whole tree, in float32 (1e-5 relative), and bf16 losses within bf16 rounding of float32.

Run on a CUDA machine with ``python -m pytest tests/trainer/test_gpu.py``; CI has no GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from trainer_fixtures import VOCAB, group_tree, rows_of  # noqa: E402

from treeprep.trainer import TreeBatch, load_model  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig, tree_loss  # noqa: E402
from treeprep.trainer.parts import run_parts  # noqa: E402

TOL = 1e-5


def _model(dtype=torch.float32):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return load_model("tiny-qwen3", vocab_size=VOCAB, dtype=dtype, device="cuda", seed=1)


def _grads(model):
    g = {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return g


def _rel(a, b):
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    return num / sum(float(b[k].norm() ** 2) for k in b) ** 0.5


def _batch(seed=3, n=9):
    rows = rows_of(group_tree(seed, n_seq=n, roots=2), group_tree(seed + 1, n_seq=n))
    return TreeBatch.from_trees(rows, norm="sequence-mean", device="cuda")


@pytest.mark.parametrize("loss", ["sft", "ppo"])
def test_flex_equals_dense_fp32(loss: str) -> None:
    model = _model()
    b = _batch()
    out = {}
    for attn in ("dense", "flex"):
        o = tree_loss(model, b, loss=loss, attn=attn)
        o.loss.backward()
        out[attn] = (float(o.loss), o.token_logp.detach().double(), _grads(model))
    assert abs(out["flex"][0] - out["dense"][0]) <= TOL * abs(out["dense"][0])
    assert float((out["flex"][1] - out["dense"][1]).abs().max()) < 1e-4
    assert _rel(out["flex"][2], out["dense"][2]) < TOL


@pytest.mark.parametrize("budget", [7, 32])
@pytest.mark.parametrize(
    ("attn", "stores"), [("dense", "gpu"), ("flex", "gpu"), ("nodes", "host"), ("auto", "host")]
)
def test_parts_equal_whole_tree_on_gpu(budget: int, attn: str, stores: str) -> None:
    """Hand-off parts against the whole tree, with the stores on the device and in the pinned
    host pool (its windows copied on a side stream, issue 37)."""
    model = _model()
    rows = rows_of(group_tree(11, n_seq=10))
    b = TreeBatch.from_trees(rows, norm="token-mean", device="cuda")
    o = tree_loss(model, b, loss="sft", attn="dense")
    o.loss.backward()
    gw = _grads(model)
    r = run_parts(model, b, LossConfig("sft"), budget=budget, attn=attn, stores=stores)
    assert abs(float(r.loss) - float(o.loss)) <= TOL * abs(float(o.loss))
    assert _rel(_grads(model), gw) < TOL


def test_bf16_loss_within_bf16_rounding() -> None:
    """bf16 weights and activations (flex) against float32 (dense) on the same random weights
    (a 64-wide head: inductor finds no flex kernel for tiny-qwen3's 16-wide heads in bf16, nor
    for this model in float32 under dynamic shapes, torch 2.11)."""
    b = _batch(5)
    kw = {"vocab_size": VOCAB, "device": "cuda", "seed": 1}
    l32 = float(tree_loss(load_model("small-qwen3", **kw), b, loss="sft", attn="dense").loss)
    m16 = load_model("small-qwen3", dtype=torch.bfloat16, **kw)
    l16 = float(tree_loss(m16, b, loss="sft", attn="flex").loss)
    assert abs(l16 - l32) <= 2e-2 * abs(l32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", [16, 64, 128])
def test_the_fused_block_kernel_passes_its_check(dtype: str, d: int) -> None:
    """The memory-efficient kernel pair the ``nodes`` backend and the host-store stream use on
    CUDA (blocks in full and causal, GQA, merged by log-sum-exp, each block's backward with the
    merged output) agrees with float64 within its bar: float32 at 1e-5, bf16 at its rounding.
    Where it does not, the product is written out (exact, slower), with a warning."""
    import warnings

    from treeprep.trainer.attention import kernels

    kernels._cuda_checked.cache_clear()
    dt = getattr(torch, dtype)
    err = kernels._check_error(torch.device("cuda", 0), dt, d)
    assert err <= kernels._CHECK_TOL[dt], err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels._cuda_checked(torch.device("cuda", 0), dt, d)


def test_the_lm_head_cast_in_blocks_on_cuda(monkeypatch) -> None:
    """The head under bf16 autocast, cast a block at a time (``cast_head``): CUDA's matmul with a
    float32 output passes its check, the logits are within one bf16 rounding of autocast's own
    (cuBLAS may tile a narrower product differently), the weight's gradient within bf16
    rounding, and the hidden states' gradient at least as close to float64 as autocast's."""
    from treeprep.schemas import parts
    from treeprep.trainer.objective import cast_head

    assert cast_head._has_float32_output("cuda", torch.bfloat16)
    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", 300 * 256)  # 7 blocks of 2,000 rows
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 2000, bias=False, device="cuda")
    h = torch.randn(96, 256, device="cuda", requires_grad=True)
    g = torch.randn(96, 2000, device="cuda")
    out = {}
    for name, fn in (("whole", head), ("blocks", lambda x: cast_head.head_logits(head, x))):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            y = fn(h)
        out[name] = (y.detach(), *torch.autograd.grad(y, [h, head.weight], g.bfloat16()))
    ref_h = g.double() @ head.weight.detach().double()
    (yw, hw, ww), (yb, hb, wb) = out["whole"], out["blocks"]
    assert yb.dtype == torch.bfloat16
    assert float((yb.float() - yw.float()).abs().max()) <= float(yw.float().abs().max()) * 2**-7
    assert float((wb - ww).norm() / ww.norm()) < 4e-3
    err_b = float((hb.double() - ref_h).norm() / ref_h.norm())
    err_w = float((hw.double() - ref_h).norm() / ref_h.norm())
    assert err_b <= err_w, (err_b, err_w)
