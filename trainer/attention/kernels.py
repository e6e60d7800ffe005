"""One block of attention through a fused kernel that returns its log-sum-exp: a pair per device.

Shape legend: B = 1, H query heads, G key/value heads (G divides H, r = H / G), q query rows,
L key rows of the block, D head width.

The ``nodes`` backend (:mod:`.blocks`) and the host-store stream (:mod:`.stream`) attend a query
chunk over several key blocks and merge the blocks by log-sum-exp; the backward runs each block's
kernel backward with the *merged* output and log-sum-exp. Both need a kernel that returns the
log-sum-exp and a backward that takes it back. torch has one per device, with its own signature:

* CPU: ``_scaled_dot_product_flash_attention_for_cpu`` and its backward (float32, float64 and
  16-bit; G < H taken as is).
* CUDA: the memory-efficient kernel, ``_scaled_dot_product_efficient_attention`` and its backward
  (float32 and 16-bit; no float64). It takes one head count for queries and keys: a block visible
  in full is attended with the r query heads of a key head stacked as query rows
  (``[1, G, r q, D]``, exact when every row sees every key, and no key is copied); a causal block
  (the queries' own rows, square) repeats its keys r times. Its log-sum-exp comes padded along the
  rows (to a multiple of 32 in the torch versions seen so far): the padding is read off the kernel
  once and the merged log-sum-exp handed back the same way. Its dropout seed and offset are unused
  at dropout 0.

:func:`fused_ok` says whether a block runs fused here. On CUDA the pair is checked once per
device, dtype and head width against the written-out product in float64 (forward and backward,
blocks in full and causal, GQA) before it is used; a pair that disagrees or raises is not used
again in the process (a warning says why), and the callers keep their written-out path. So a
kernel that behaves otherwise in some torch version costs speed, never exactness.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import torch

_CPU_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

#: devices whose blocks go through the memory-efficient kernel (meta: its shapes only, which
#: lets the CPU tests walk this path)
_EFFICIENT = ("cuda", "meta")

#: dtypes each device's kernel takes
_DTYPES = {
    "cpu": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
    "cuda": (torch.float32, torch.bfloat16, torch.float16),
}

#: relative error of the once-per-setup check against float64, per dtype (float32: the
#: project's bar; 16-bit: a few units of bf16 rounding)
_CHECK_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def fused_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a block of these tensors runs through the fused kernel: one head width for
    queries, keys and values (latent attention's values are narrower), one dtype (under
    autocast rotary leaves queries and keys float32, values bf16), a device and dtype the kernel
    takes, and on CUDA a pair that passed its check (module docstring)."""
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        return False
    if not q.dtype == k.dtype == v.dtype:
        return False
    if q.dtype not in _DTYPES.get(q.device.type, ()):
        return False
    if q.device.type == "cuda":
        return _cuda_checked(q.device, q.dtype, int(q.shape[-1]))
    return True


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """o_BHqD and the log-sum-exp l_BHq (float32; float64 for float64 inputs) of ``q`` over one
    block, in full or ``causal`` (square, aligned)."""
    if q.device.type not in _EFFICIENT:
        o, lse = _CPU_FWD(q, k, v, 0.0, causal, scale=scale)
        return o, lse
    _, h, nq, d = q.shape
    g = k.shape[1]
    if causal:
        k, v = _repeat(k, h // g), _repeat(v, h // g)
        o, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q.contiguous(), k, v, None, True, 0.0, True, scale=scale
        )
        return o, lse[..., :nq]
    qg = q.reshape(1, g, (h // g) * nq, d).contiguous()
    o, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        qg, k, v, None, True, 0.0, False, scale=scale
    )
    return o.reshape(1, h, nq, d), lse[..., : qg.shape[2]].reshape(1, h, nq)


def backward(
    g_o: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block's share of dq and its dk, dv, given the output ``o`` and log-sum-exp ``lse``
    of the whole softmax the block is part of (the merged ones)."""
    if q.device.type not in _EFFICIENT:
        dq, dk, dv = _CPU_BWD(g_o, q, k, v, o, lse, 0.0, causal, scale=scale)
        return dq, dk, dv
    _, h, nq, d = q.shape
    g = k.shape[1]
    r = h // g
    if causal:
        kr, vr = _repeat(k, r), _repeat(v, r)
        dq, dk, dv = _cuda_bwd((g_o, q, kr, vr, o, lse), True, scale)
        if r > 1:
            dk = dk.reshape(1, g, r, *dk.shape[2:]).sum(2)
            dv = dv.reshape(1, g, r, *dv.shape[2:]).sum(2)
        return dq, dk, dv

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(1, g, r * nq, t.shape[-1]).contiguous()

    flat = (rows(g_o), rows(q), k, v, rows(o), lse.reshape(1, g, r * nq))
    dq, dk, dv = _cuda_bwd(flat, False, scale)
    return dq.reshape(1, h, nq, d), dk, dv


def _repeat(t: torch.Tensor, r: int) -> torch.Tensor:
    """k_BGLD as r copies per key head, in the order query heads use them (h // r)."""
    return t.contiguous() if r == 1 else t.repeat_interleave(r, dim=1)


def _cuda_bwd(
    tensors: tuple[torch.Tensor, ...], causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The efficient kernel's backward of ``(g_o, q, k, v, o, lse)``, its log-sum-exp [B, H',
    q'] unpadded: padded here as its forward pads it. No dropout, so no seed."""
    *c, o, lse = tensors
    b, h, n = lse.shape
    padded = torch.zeros(b, h, _lse_rows(n, lse.device), dtype=torch.float32, device=lse.device)
    padded[..., :n] = lse.float()
    seed = torch.empty((), dtype=torch.int64)
    c = [t.contiguous() for t in c]
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        *c, None, o.contiguous(), padded, seed, seed, 0.0, [True, True, True, False], causal,
        scale=scale,
    )  # fmt: skip
    return dq, dk, dv


@functools.cache
def _lse_pad(device: torch.device) -> int:
    """The row multiple the efficient kernel pads its log-sum-exp to (read off one call)."""
    x = torch.zeros(1, 1, 1, 8, device=device)
    _, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(x, x, x, None, True)
    return int(lse.shape[-1])


def _lse_rows(n: int, device: torch.device) -> int:
    pad = _lse_pad(device)
    return n if pad <= 1 else math.ceil(n / pad) * pad


@functools.cache
def _cuda_checked(device: torch.device, dtype: torch.dtype, d: int) -> bool:
    """Whether the CUDA pair agrees with the written-out product in float64 for ``dtype`` and
    head width ``d`` (module docstring); warns and says no otherwise."""
    try:
        # the first block may come inside a forward (no grad), an eval pass (inference mode) or
        # an autocast region: the check runs outside all three
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.autocast(device.type, enabled=False),
        ):
            err = _check_error(device, dtype, d)
    except Exception as e:  # noqa: BLE001 - any failure means: do not use the kernel here
        why = f"{type(e).__name__}: {e}"
    else:
        if err <= _CHECK_TOL[dtype]:
            return True
        why = f"relative error {err:.2e} against float64 (bar {_CHECK_TOL[dtype]:.0e})"
    warnings.warn(
        f"nodes attention: the fused CUDA kernel is not used for {dtype} (head width {d}) on "
        f"{device}: {why}; the written-out product runs instead (exact, slower)",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def _check_error(device: torch.device, dtype: torch.dtype, d: int) -> float:
    """The largest relative error of :func:`forward` / :func:`backward` (a block in full then a
    causal block, 4 query heads over 2 key heads, merged by log-sum-exp) against float64. The
    tensors are laid out as the callers hand them over: the queries and the causal block are
    views into packed tensors at a row offset, the block in full a rows-first view (a store's
    layout, ``[rows, G, D]`` in memory)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    nq, nk, h, g, lead = 37, 53, 4, 2, 5
    scale = d**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def packed(x: torch.Tensor) -> torch.Tensor:  # [1, heads, lead + nq, D]: its last nq rows
        return x.to(device, dtype).split([lead, nq], dim=2)[1]

    def rows_first(x: torch.Tensor) -> torch.Tensor:  # [nk, G, D] in memory as [1, G, nk, D]
        return x.to(device, dtype).transpose(0, 1).unsqueeze(0)

    qp, g64 = rand(1, h, lead + nq, d), rand(1, h, nq, d)
    kf, vf, kc, vc = (
        rand(nk, g, d),
        rand(nk, g, d),
        rand(1, g, lead + nq, d),
        rand(1, g, lead + nq, d),
    )
    ks = [kf.transpose(0, 1).unsqueeze(0), kc[:, :, lead:]]
    vs = [vf.transpose(0, 1).unsqueeze(0), vc[:, :, lead:]]
    want = _reference(qp[:, :, lead:], ks, vs, g64, scale)
    q = packed(qp)
    kd, vd = [rows_first(kf), packed(kc)], [rows_first(vf), packed(vc)]
    parts = [forward(q, kd[i], vd[i], i == 1, scale) for i in range(2)]
    lse = torch.logaddexp(parts[0][1].double(), parts[1][1].double())
    o = sum(torch.exp(p[1].double() - lse)[..., None] * p[0].double() for p in parts)
    assert isinstance(o, torch.Tensor)
    o_c, g_c, lse_c = o.to(dtype).contiguous(), g64.to(device, dtype), lse.to(parts[0][1].dtype)
    grads = [backward(g_c, q, kd[i], vd[i], o_c, lse_c, i == 1, scale) for i in range(2)]
    dq = grads[0][0].double() + grads[1][0].double()
    got = [o, dq, *grads[0][1:], *grads[1][1:]]
    errs = [(a.double().cpu() - b).norm() / b.norm() for a, b in zip(got, want, strict=True)]
    return float(max(errs))


def _reference(
    q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], g_o: torch.Tensor, scale: float
) -> list[torch.Tensor]:
    """[o, dq, dk_0, dv_0, dk_1, dv_1] of one softmax over the blocks (the last one causal, its
    rows the queries'), written out in float64 with autograd."""
    r = q.shape[1] // ks[0].shape[1]
    q = q.clone().requires_grad_(True)
    kv = [x.clone().requires_grad_(True) for x in (*ks, *vs)]
    kk = torch.cat([x.repeat_interleave(r, dim=1) for x in kv[:2]], dim=2)
    vv = torch.cat([x.repeat_interleave(r, dim=1) for x in kv[2:]], dim=2)
    nq, n0 = q.shape[2], ks[0].shape[2]
    visible = torch.ones(nq, n0 + nq, dtype=torch.bool)
    visible[:, n0:] = torch.ones(nq, nq, dtype=torch.bool).tril()
    s = (q @ kk.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    o = torch.softmax(s, dim=-1) @ vv
    o.backward(g_o)
    assert q.grad is not None and all(x.grad is not None for x in kv)
    grads: list[Any] = [kv[0].grad, kv[2].grad, kv[1].grad, kv[3].grad]
    return [o.detach(), q.grad, *grads]


__all__ = ["backward", "forward", "fused_ok"]
