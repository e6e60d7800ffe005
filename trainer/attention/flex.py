"""``flex``: FlexAttention with a block mask from the tree rule (the GPU path).

Keys are the handed-over prefix rows followed by the batch's own tokens (one copy of the prefix
per layer and part: O(P), against the O(T P) attention work that reads it). The block mask comes
from :func:`~treeprep.trainer.attention.mask.tree_mask_mod` and is built once per batch (the first
layer) and cached on the :class:`TreeMask`. ``flex_attention`` is compiled once with dynamic
shapes on CUDA. On CPU (torch 2.13) only the forward runs: its backward raises
NotImplementedError, so CPU tests check its forward against ``dense``. Layer extras: a window is
one more term of the mask_mod (one block mask per window), soft-capping a ``score_mod``, and sinks
rescale the output by ``sigmoid(lse - sink)`` (the sink column's share of the softmax).
"""

from __future__ import annotations

from typing import Any

import torch

from treeprep.trainer.attention.mask import TreeMask, tree_mask_mod
from treeprep.trainer.attention.options import PLAIN, LayerOptions

_compiled: Any = None


def block_mask(tm: TreeMask, window: int | None = None) -> Any:
    """The batch's FlexAttention block mask for ``window`` (cached on ``tm``)."""
    key = "block_mask" if window is None else f"block_mask:{window}"
    bm = tm._cache.get(key)
    if bm is None:
        from torch.nn.attention.flex_attention import create_block_mask

        bm = create_block_mask(
            tree_mask_mod(tm, window),
            None,
            None,
            tm.num_tokens,
            tm.num_keys,
            device=tm.q_node.device,
        )
        tm._cache[key] = bm
    return bm


def flex_tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pk: torch.Tensor | None,
    pv: torch.Tensor | None,
    tm: TreeMask,
    scale: float,
    opts: LayerOptions = PLAIN,
) -> torch.Tensor:
    """q_BHTD against [prefix; own] keys with the tree block mask; returns o_BHTD."""
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled
    if pk is not None and pv is not None and pk.shape[2]:
        k = torch.cat([pk.to(k.dtype), k], dim=2)
        v = torch.cat([pv.to(v.dtype), v], dim=2)
    fn: Any = flex_attention
    if q.device.type == "cuda":
        if _compiled is None:
            _compiled = torch.compile(flex_attention, dynamic=True)
        fn = _compiled
    gqa = q.shape[1] != k.shape[1]
    bm = block_mask(tm, opts.window)
    score_mod = None
    if opts.softcap is not None:
        cap = float(opts.softcap)

        def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
            return torch.tanh(score / cap) * cap

    if opts.sinks is None:
        return fn(q, k, v, score_mod=score_mod, block_mask=bm, scale=scale, enable_gqa=gqa)
    o, lse = fn(
        q, k, v, score_mod=score_mod, block_mask=bm, scale=scale, enable_gqa=gqa, return_lse=True
    )
    keep = torch.sigmoid(lse.float() - opts.sinks.float().reshape(1, -1, 1))
    return o * keep[..., None].to(o.dtype)
