"""Log-probabilities of the targets and the entropies from LM-head logits, a block at a time.

``log_softmax(logits.float()).gather(target)`` through autograd holds, per row and vocabulary
entry, the float32 logits, the log-softmax (saved for its backward) and, for the entropy, ``exp``
and a product at once: 16 bytes in the forward, and the log-softmax, its gradient and the
logits' gradient in the backward. At Qwen3's vocabulary (151,936) a 4,096-row chunk of the loss
is then 9.3 GiB.

:class:`TargetLogProb` computes the same values with the same operations, row-wise, on
blocks of at most :data:`~treeprep.schemas.parts.HEAD_BLOCK_ELEMENTS` logits at a time, and
saves only the logits, in their own dtype, with the entropies ``H`` and the log-sum-exps
``lse``. Its backward rebuilds each block's ``log p = x - lse`` in one float32 buffer, turns it
in place into ``p - onehot(t)`` and writes ``-g_lp`` times that into one gradient tensor of the
logits' dtype (with an entropy gradient, ``- g_H p (log p + H)`` joins it, ``p`` in a second
buffer). What stays is the logits and their gradient: 2 x 2 bytes per row and vocabulary entry in
bf16 runs, 2 x 4 in float32 runs, and the float32 temporaries of one block (two in the
forward: the log-softmax and its ``exp``, which then holds their product). Float64 logits are
computed in float64. The memory model counts the same (:func:`treeprep.memory.lm_head_bytes`).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from treeprep.schemas import parts


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Float64 stays; anything else is computed in float32 (a view when it already is)."""
    return t if t.dtype == torch.float64 else t.float()


def _one_pass(t: torch.Tensor) -> bool:
    """Whether an elementwise op from ``t``'s dtype to float32 runs as one pass: always when
    ``t`` is float32 or float64 already, on CUDA for 16-bit ``t`` (the cast happens in the
    kernel); the CPU vectorizes no mixed-dtype op, so there a 16-bit block is copied first."""
    return t.dtype in (torch.float32, torch.float64) or t.is_cuda


class TargetLogProb(torch.autograd.Function):
    """``(log p[target], entropy)`` of ``softmax(logits)`` per row: logits [K, V], targets [K]
    (int64) -> two [K] tensors in float32 (float64 for float64 logits). See the module
    docstring for what it holds."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> Any:  # noqa: D102
        k, v = logits.shape
        wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lp = logits.new_empty(k, dtype=wide)
        ent = logits.new_empty(k, dtype=wide)
        lse = logits.new_empty(k, dtype=wide)
        n = parts.head_block_rows(v)
        for i in range(0, k, n):
            x = _wide(logits[i : i + n])
            ls = torch.log_softmax(x, dim=-1)
            # the log-sum-exp, read at each row's largest logit (whose log-prob is the smallest
            # in magnitude, so the difference rounds as the log-sum-exp itself does)
            top = x.argmax(dim=-1, keepdim=True)
            lse[i : i + n] = (x.gather(1, top) - ls.gather(1, top))[:, 0]
            del x
            lp[i : i + n] = ls.gather(1, target[i : i + n, None])[:, 0]
            p = ls.exp()
            ent[i : i + n] = -p.mul_(ls).sum(-1)  # p log p in p's buffer: two blocks, not three
            del ls, p  # before the next block's are made
        ctx.save_for_backward(logits, target, ent, lse)
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None) -> Any:  # noqa: D102
        logits, target, ent, lse = ctx.saved_tensors
        if g_lp is None and g_ent is None:
            return None, None
        grad = torch.empty_like(logits)
        n = parts.head_block_rows(logits.shape[1])
        for i in range(0, logits.shape[0], n):
            b = slice(i, i + n)
            x = logits[b]  # log p = x - lse, in one new float32 (float64) buffer
            ls = torch.sub(x, lse[b, None]) if _one_pass(x) else x.float().sub_(lse[b, None])
            if g_ent is None:  # d log p_t / dx = onehot(t) - p: p - onehot(t) in place
                p = ls.exp_().scatter_add_(1, target[b, None], -torch.ones_like(lse[b, None]))
                neg = -cast(torch.Tensor, g_lp)[b, None]
                if _one_pass(x):  # times -g_lp straight into the gradient's dtype
                    torch.mul(p, neg, out=grad[b])
                else:
                    grad[b] = p.mul_(neg)
            else:  # dH/dx = -p (log p + H)
                p = ls.exp()
                gb = ls.add_(ent[b, None]).mul_(p).mul_(-g_ent[b, None])
                if g_lp is not None:
                    gb.sub_(p.mul_(g_lp[b, None]))
                    gb.scatter_add_(1, target[b, None], g_lp[b, None])
                grad[b] = gb
                del gb
            del ls, p  # before the next block's are made
        return grad, None


def target_logprobs(
    logits: torch.Tensor, target: torch.Tensor, want_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [K] of ``target`` under ``softmax(logits)`` and the entropies [K] (detached
    unless ``want_entropy``), through :class:`TargetLogProb`."""
    lp, ent = TargetLogProb.apply(logits, target)
    return lp, ent if want_entropy else ent.detach()


__all__ = ["TargetLogProb", "target_logprobs"]
