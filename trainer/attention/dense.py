"""``dense``: the exact reference. One [T, P+T] boolean mask per batch (and window), handed to SDPA.

Memory: T (P+T) bytes for the mask plus, on SDPA's math path (CPU, float32), H T (P+T) floats per
layer. Use it for small batches and as the oracle the other backends are tested against. Layers
with soft-capping or sinks (:mod:`.options`), which SDPA does not take, run the same product
written out: scores, cap, mask, softmax with the sink column, values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treeprep.trainer.attention.call import AttentionCall
from treeprep.trainer.attention.options import cap_scores, softmax_rows


def dense_attention(call: AttentionCall) -> torch.Tensor:
    """q_BHTD against [prefix; own] keys under the tree rule; returns o_BHTD."""
    q, scale, opts = call.q, call.scale, call.opts
    k, v = call.joined_kv()
    mask = call.tm.dense(opts.window)
    if opts.softcap is None and opts.sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[None, None], scale=scale, enable_gqa=call.gqa
        )
    r = q.shape[1] // k.shape[1]
    if r > 1:
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    s = cap_scores(torch.matmul(q, k.transpose(-1, -2)) * scale, opts.softcap)
    s = s.masked_fill(~mask[None, None], float("-inf"))
    sinks = None if opts.sinks is None else opts.sinks.reshape(1, -1, 1, 1)
    return torch.matmul(softmax_rows(s, sinks).to(v.dtype), v)
