"""The glue to transformers: the function registered with ``AttentionInterface``.

transformers hands the attention function q/k/v as [B, H|G, T, D] after rotary embeddings and
expects [B, T, H, D] back; extra model keywords reach it, so the batch's :class:`TreeMask` arrives
as ``tree_mask=``. When the mask carries a hand-off (a part of a larger tree), the layer's own
keys and values are recorded for the descendant parts and the ancestors' handed-over keys and
values come back as the prefix (``module.layer_idx`` names the layer). Without a mask it runs plain
causal attention, so a model loaded by treeprep still works for ordinary calls.

Under autocast the tree path takes queries, keys and values in the autocast dtype, as SDPA does
in the linear trainer (:func:`_autocast_inputs`).

The layer's extras arrive as transformers' keywords and become :class:`LayerOptions`:
``sliding_window`` (the layer's window; transformers passes None on full-attention layers),
``s_aux`` (gpt-oss's per-head sink logits) and ``softcap`` (attention logit soft-capping).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from treeprep.errors import TreeprepError
from treeprep.trainer.attention.backends import tree_attention
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.options import LayerOptions

ATTN_NAME = "treeprep"


def hf_tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    tree_mask: TreeMask | None = None,
    s_aux: torch.Tensor | None = None,
    softcap: float | None = None,
    cp_group: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature over a tree (see the module docstring). With
    ``cp_group`` (context parallelism, :mod:`treeprep.trainer.context`) q/k/v hold this rank's
    tokens: exchanged for all tokens of this rank's heads, attended, exchanged back."""
    if dropout:
        raise TreeprepError("tree attention does not implement attention dropout; set it to 0")
    opts = LayerOptions(window=sliding_window, softcap=softcap, sinks=s_aux)
    if tree_mask is None and not opts.plain:
        raise TreeprepError(
            "treeprep's attention runs windows, sinks and soft-capping on trees only; "
            "call the model with tree_mask= (or load it with another attn_implementation)"
        )
    if tree_mask is None:
        gqa = query.shape[1] != key.shape[1]
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=query.shape[2] > 1, scale=scaling, enable_gqa=gqa
        )
        return out.transpose(1, 2).contiguous(), None
    query, key, value = _autocast_inputs(query, key, value)
    if cp_group is not None:
        query, key, value = (cp_group.to_heads(x) for x in (query, key, value))
        sinks = cp_group.local_heads(s_aux)
        opts = LayerOptions(window=sliding_window, softcap=softcap, sinks=sinks)
    prefix = direct = None
    if tree_mask.handoff is not None:
        layer = getattr(module, "layer_idx", None)
        key, value, prefix, direct = tree_mask.handoff.exchange(layer, key, value)
    out = tree_attention(
        query, key, value, tree_mask, scale=scaling, prefix=prefix, opts=opts, direct=direct
    )
    if cp_group is not None:
        out = cp_group.to_tokens(out)
    return out.transpose(1, 2).contiguous(), None


def _autocast_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Under autocast, queries, keys and values in the autocast dtype, as autocast hands them to
    SDPA in the linear trainer: rotary and the key norm leave queries and keys float32 while the
    values are bf16, and the backends' products cast them at every use anyway. One cast here
    lets the fused block kernels run (one dtype, :func:`.kernels.fused_ok`), makes the stored
    prefix blocks the own rows' dtype (no float32 copy of the prefix per call) and halves what
    context parallelism sends."""
    dev = q.device.type
    if not torch.is_autocast_enabled(dev):
        return q, k, v
    dt = torch.get_autocast_dtype(dev)
    return q.to(dt), k.to(dt), v.to(dt)


def register_attention() -> None:
    """Register :func:`hf_tree_attention` as transformers attention ``"treeprep"`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, hf_tree_attention)
