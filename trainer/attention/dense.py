"""``dense``: the exact reference. One [T, P+T] boolean mask per batch, handed to SDPA.

Memory: T (P+T) bytes for the mask plus, on SDPA's math path (CPU, float32), H T (P+T) floats per
layer. Use it for small batches and as the oracle the other backends are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treeprep.trainer.attention.mask import TreeMask


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pk: torch.Tensor | None,
    pv: torch.Tensor | None,
    tm: TreeMask,
    scale: float,
) -> torch.Tensor:
    """q_BHTD against [prefix; own] keys under the tree rule; returns o_BHTD."""
    if pk is not None and pv is not None and pk.shape[2]:
        k = torch.cat([pk.to(k.dtype), k], dim=2)
        v = torch.cat([pv.to(v.dtype), v], dim=2)
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=tm.dense()[None, None], scale=scale, enable_gqa=gqa
    )
