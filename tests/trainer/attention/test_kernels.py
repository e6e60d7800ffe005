"""The per-device fused block kernels (:mod:`treeprep.trainer.attention.kernels`): the check a
CUDA kernel passes before it is used, run here on the CPU pair against written-out float64
attention; the CUDA path's reshapes walked on the meta device (shapes only); and a failed check
turning the kernel off with a warning. The CUDA numbers themselves are checked on a GPU
(``tests/trainer/test_gpu.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from treeprep.trainer.attention import kernels  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_the_check_passes_the_cpu_pair_at_its_bar(dtype: str) -> None:
    """The check's own arithmetic (blocks merged by log-sum-exp, each block's backward with the
    merged output, GQA, a causal block) against autograd on the written-out softmax: the CPU
    kernels agree at float32 rounding, so the harness is right and its bar is reachable."""
    dt = getattr(torch, dtype)
    err = kernels._check_error(torch.device("cpu"), dt, 64)
    bar = 1e-12 if dt == torch.float64 else kernels._CHECK_TOL[dt]
    assert err <= bar, err
    if dt == torch.float32:
        assert err > 0  # a real comparison: float32 kernels against float64


def test_the_cuda_path_shapes_on_meta() -> None:
    """GQA (4 query heads, 2 key heads): a block in full stacks the query heads as rows, a causal
    block repeats its keys; outputs, log-sum-exps and gradients come back in the callers' shapes
    (the kernel's log-sum-exp padded to 32 rows and cut back)."""
    meta = torch.device("meta")
    q = torch.empty(1, 4, 37, 64, device=meta)
    full = torch.empty(1, 2, 53, 64, device=meta)
    own = torch.empty(1, 2, 37, 64, device=meta)
    for k, causal in ((full, False), (own, True)):
        o, lse = kernels.forward(q, k, k, causal, 0.125)
        assert o.shape == q.shape and lse.shape == (1, 4, 37)
        dq, dk, dv = kernels.backward(o, q, k, k, o, lse, causal, 0.125)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def test_a_failed_check_turns_the_kernel_off_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CUDA kernel that raises (or disagrees) in its check is not used: fused_ok says no and
    the written-out product runs."""
    cuda = torch.device("cuda", 0)

    def broken(device: object, dtype: object, d: int) -> float:
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(kernels, "_check_error", broken)
    kernels._cuda_checked.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no kernel for this shape"):
            assert not kernels._cuda_checked(cuda, torch.bfloat16, 128)
        monkeypatch.setattr(kernels, "_check_error", lambda *a: 0.5)
        with pytest.warns(RuntimeWarning, match="relative error 5.00e-01"):
            assert not kernels._cuda_checked(cuda, torch.float32, 64)
    finally:
        kernels._cuda_checked.cache_clear()


def test_the_check_runs_inside_a_forward_an_eval_pass_and_autocast() -> None:
    """The first fused block on a device comes inside a layer's forward (an autograd function:
    no grad), maybe in an eval pass or under autocast; the check still measures (its own
    backward raised there, and a raise turns the kernel off). Run here with the CPU pair."""
    cpu = torch.device("cpu")
    kernels._cuda_checked.cache_clear()
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert kernels._cuda_checked(cpu, torch.float32, 16)
        with torch.no_grad():
            assert kernels._cuda_checked(cpu, torch.float32, 32)
    finally:
        kernels._cuda_checked.cache_clear()


def test_fused_ok_refuses_what_no_kernel_takes() -> None:
    q = torch.zeros(1, 2, 3, 8)
    assert kernels.fused_ok(q, q, q)
    assert not kernels.fused_ok(q, q, torch.zeros(1, 2, 3, 4))  # narrower values
    assert not kernels.fused_ok(q, q, q.bfloat16())  # mixed dtypes under autocast
    assert not kernels.fused_ok(q.int(), q.int(), q.int())
