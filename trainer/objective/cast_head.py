"""The LM head under autocast, its weight cast a vocabulary block at a time.

Autocast runs ``head(h)`` as one matmul on a 16-bit copy of the whole head weight, and the
matmul saves that copy for its backward: at Qwen3-8B's vocabulary and width 1.16 GiB, about three
decoder layers' worth, live through every head chunk's forward and backward (under FSDP2 the
decoder layers arrive in bf16 already, so this copy was the only one autocast made). In its
backward autocast forms the weight's gradient in 16 bits as well (another 1.16 GiB) before
casting it to float32.

:class:`BlockCastLinear` computes the same product without the copy. Its forward casts
:func:`~treeprep.schemas.parts.head_weight_block_rows` rows of the float32 weight at a time and
writes each block's logits, as autocast's matmul does (16-bit operands, 16-bit logits, the same
reduction over the hidden width per logit); it saves the 16-bit input and the float32 weight
itself. Its backward casts each block again: the block's weight gradient is the same 16-bit
product autocast forms, written into the float32 gradient a block at a time; the input's
gradient sums the blocks' products in float32 (:func:`accumulate`) and is handed back in the
input's dtype, not rounded to 16 bits first as autocast's is (its values are therefore at least
as accurate). The live cast is one block: 128 MiB at width 4,096.

It is taken for a plain ``torch.nn.Linear`` head (a soft-capped model's inner head included)
with a float32 weight, a 2-D input and a 16-bit autocast dtype; anything else (no autocast,
adapter-wrapped heads, float64) calls the head as before. The memory model counts the same
(:func:`treeprep.memory.autocast_bytes`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from treeprep.schemas import parts
from treeprep.trainer.models.run import SoftcappedHead

_HALF = (torch.bfloat16, torch.float16)


def head_logits(head: torch.nn.Module, h_KE: torch.Tensor) -> torch.Tensor:
    """``head(h_KE)``, with a plain linear head under autocast cast a block at a time (module
    docstring)."""
    inner = head.head if isinstance(head, SoftcappedHead) else head
    dev = h_KE.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
    if dt is None or not _blockable(inner, h_KE, dt):
        return head(h_KE)
    lin: Any = inner  # a torch.nn.Linear (checked by _blockable)
    logits = BlockCastLinear.apply(h_KE, lin.weight, lin.bias, dt)
    return head.cap_logits(logits) if isinstance(head, SoftcappedHead) else logits


def _blockable(head: torch.nn.Module, h: torch.Tensor, dt: torch.dtype) -> bool:
    if type(head) is not torch.nn.Linear or dt not in _HALF or h.ndim != 2:
        return False
    w, b = head.weight, head.bias
    if w.dtype != torch.float32 or w.device != h.device or h.dtype not in (torch.float32, dt):
        return False
    return b is None or b.dtype == torch.float32


class BlockCastLinear(torch.autograd.Function):
    """``linear(h.to(dt), weight.to(dt), bias.to(dt))`` [K, V] in ``dt``, casting
    :func:`~treeprep.schemas.parts.head_weight_block_rows` rows of ``weight`` at a time in the
    forward and again in the backward (module docstring)."""

    @staticmethod
    def forward(  # noqa: D102
        ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dt: torch.dtype
    ) -> torch.Tensor:
        with torch.autocast(h.device.type, enabled=False):
            x = h.to(dt)
            out = x.new_empty(x.shape[0], weight.shape[0])
            for b in _blocks(weight):
                w = weight[b].to(dt)
                if bias is None:
                    torch.mm(x, w.t(), out=out[:, b])
                else:
                    torch.addmm(bias[b].to(dt), x, w.t(), out=out[:, b])
                del w  # before the next block's
        ctx.save_for_backward(x, weight)
        ctx.h_dtype, ctx.has_bias = h.dtype, bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # noqa: D102
        x, weight = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g = g.to(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            gh = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if need_h else None
            gw = torch.empty_like(weight) if need_w else None
            gb = weight.new_empty(weight.shape[0]) if need_b and ctx.has_bias else None
            for b in _blocks(weight):
                gv = g[:, b]
                if gh is not None:
                    accumulate(gh, gv, weight[b].to(x.dtype))
                if gw is not None:
                    gw[b] = torch.mm(gv.t(), x)  # autocast's 16-bit product, then float32
                if gb is not None:
                    gb[b] = gv.sum(0, dtype=torch.float32)
        return (gh.to(ctx.h_dtype) if gh is not None else None), gw, gb, None


def _blocks(weight: torch.Tensor) -> list[slice]:
    n = parts.head_weight_block_rows(weight.shape[1])
    return [slice(v, v + n) for v in range(0, weight.shape[0], n)]


def accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with 16-bit ``a`` and ``b`` and float32 ``acc``, summed in float32: by
    the matmul's float32 output where the device has it (CUDA), else on float32 copies of the
    operands (their products are exact in float32, so the two differ only in summation order)."""
    if _has_float32_output(a.device.type, a.dtype):
        acc.add_(torch.mm(a, b, out_dtype=torch.float32))
    else:
        acc.addmm_(a.float(), b.float())


@functools.cache
def _has_float32_output(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(..., out_dtype=float32)`` runs for ``dtype`` operands on this device
    type and agrees with the float32 copies' product (checked once, on a small product)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g).to(device_type) for s in ((8, 64), (64, 16)))
    a, b = a.to(dtype), b.to(dtype)
    try:
        got = torch.mm(a, b, out_dtype=torch.float32)
    except (NotImplementedError, RuntimeError, TypeError):
        return False
    want = a.float() @ b.float()
    return got.dtype == torch.float32 and bool(torch.allclose(got, want, rtol=1e-5, atol=1e-5))
