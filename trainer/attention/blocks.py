"""One softmax over several key blocks, each attended by a fused SDPA kernel, merged exactly.

Shape legend: B = 1, H query heads, G key/value heads (GQA: G divides H; :mod:`.kernels` takes
G < H on every device), q query rows, L_b key rows of block b, D head width.

The ``nodes`` backend reads a chain's keys as a few blocks that already lie in memory (handed-over
prefix rows, ancestor segments of the packed sequence, the chain's own earlier rows, all visible in
full, and its own rows, causal). One attention over their union is the softmax over all of them;
instead of building those scores (the math path: H x q x L floats written, soft-maxed and kept for
the backward), every block goes through a fused kernel that returns its partial output o_b and
its log-sum-exp l_b (:mod:`.kernels`: SDPA's flash kernel on the CPU, its memory-efficient one on
CUDA), and the blocks are merged with

    l = log sum_b exp(l_b),    o = sum_b exp(l_b - l) o_b,

which is exactly the softmax over the union (the same identity FlashAttention applies to its own
key tiles). The backward calls the kernel's backward once per block with the *merged* o and l: its
probabilities exp(s - l) and its row term rowsum(do * o) are then those of the whole softmax, so
each call returns block b's exact share of dq and the exact dk_b, dv_b (the rule ring attention
uses across devices). Nothing of size q x L is stored: the saved tensors are q, the blocks (views),
o and l.

Plain layers only (a window, soft-capping or sinks change the scores, and those layers keep the
math path); :func:`fused_ok` says where a kernel runs.
"""

from __future__ import annotations

from typing import Any

import torch

from treeprep.trainer.attention import kernels


class _BlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        scale: float,
        causal_last: bool,
        n: int,
        into: list[Any] | None,
        *kv: torch.Tensor,
    ) -> torch.Tensor:
        ks, vs = kv[:n], kv[n:]
        parts = [
            kernels.forward(q, k, v, causal_last and i == n - 1, scale)
            for i, (k, v) in enumerate(zip(ks, vs, strict=True))
        ]
        if n == 1:
            o, lse = parts[0]
        else:
            lse_n = torch.stack([p[1] for p in parts])  # [n, B, H, q], float32 or float64
            lse = torch.logsumexp(lse_n, dim=0)
            w = torch.exp(lse_n - lse)[..., None]
            acc = w[0] * parts[0][0].to(w.dtype)
            for i in range(1, n):
                acc = acc + w[i] * parts[i][0].to(w.dtype)
            o = acc.to(q.dtype)
        o = o.contiguous()
        ctx.scale, ctx.causal_last, ctx.n, ctx.into = scale, causal_last, n, into
        ctx.save_for_backward(q, o, lse, *kv)
        return o

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, o, lse, *kv = ctx.saved_tensors
        n = ctx.n
        g = g.contiguous()
        dq: torch.Tensor | None = None
        dks: list[torch.Tensor] = []
        dvs: list[torch.Tensor] = []
        for i in range(n):
            causal = ctx.causal_last and i == n - 1
            dq_i, dk_i, dv_i = kernels.backward(g, q, kv[i], kv[n + i], o, lse, causal, ctx.scale)
            dq = dq_i if dq is None else dq + dq_i
            sink = ctx.into[i] if ctx.into is not None else None
            if sink is not None:  # a stored prefix block: its gradients go to its store now
                sink(dk_i, dv_i)
                dk_i = dv_i = None
            dks.append(dk_i)
            dvs.append(dv_i)
        return (dq, None, None, None, None, *dks, *dvs)


def block_attention(
    q_BHqD: torch.Tensor,
    blocks_k: list[torch.Tensor],
    blocks_v: list[torch.Tensor],
    scale: float,
    *,
    causal_last: bool,
    into: list[Any] | None = None,
) -> torch.Tensor:
    """Attention of ``q_BHqD`` over the union of the key blocks (all visible; the last one causal,
    aligned with the queries, when ``causal_last``): o_BHqD. ``into[b]``, where given, receives
    block b's key and value gradients in the backward (its block is then outside autograd)."""
    n = len(blocks_k)
    return _BlockAttention.apply(q_BHqD, scale, causal_last, n, into, *blocks_k, *blocks_v)
