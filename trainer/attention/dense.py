"""``dense``: the exact reference. One [T, P+T] boolean mask per batch (and window), handed to SDPA.

Memory: T (P+T) bytes for the mask plus, on SDPA's math path (CPU, float32), H T (P+T) floats per
layer. Use it for small batches and as the oracle the other backends are tested against. Layers
with soft-capping or sinks (:mod:`.options`), which SDPA does not take, run the same product
written out: scores, cap, mask, softmax with the sink column, values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treeprep.trainer.attention.mask import TreeMask, with_prefix
from treeprep.trainer.attention.options import PLAIN, LayerOptions, cap_scores, softmax_rows


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pk: torch.Tensor | None,
    pv: torch.Tensor | None,
    tm: TreeMask,
    scale: float,
    opts: LayerOptions = PLAIN,
) -> torch.Tensor:
    """q_BHTD against [prefix; own] keys under the tree rule; returns o_BHTD."""
    k, v = with_prefix(k, v, pk, pv)
    mask = tm.dense(opts.window)
    gqa = q.shape[1] != k.shape[1]
    if opts.softcap is None and opts.sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[None, None], scale=scale, enable_gqa=gqa
        )
    r = q.shape[1] // k.shape[1]
    if r > 1:
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    s = cap_scores(torch.matmul(q, k.transpose(-1, -2)) * scale, opts.softcap)
    s = s.masked_fill(~mask[None, None], float("-inf"))
    sinks = None if opts.sinks is None else opts.sinks.reshape(1, -1, 1, 1)
    return torch.matmul(softmax_rows(s, sinks).to(v.dtype), v)
