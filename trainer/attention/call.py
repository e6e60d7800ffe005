"""One attention call as every backend receives it (:class:`AttentionCall`).

Shape legend: B batch (always 1: trees are packed), H query heads, G key/value heads, T the
batch's own tokens, P handed-over prefix rows, D head dim.

:func:`~treeprep.trainer.attention.backends.tree_attention` checks its inputs once and hands each
backend one frozen call: the queries, the batch's own keys and values, the optional prefix rows of
a hand-off part, the :class:`~.mask.TreeMask`, the scale and the layer's extras. Bundling them is
the one place the backends' shared preamble lives: the GQA test (fewer key heads than query heads)
and joining [prefix; own] keys for the backends that attend one contiguous key tensor (``dense``,
``flex``, ``flash``; ``nodes`` reads the prefix rows in place and never joins them). A call holds
tensors by reference; building one copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.options import PLAIN, LayerOptions


@dataclass(frozen=True)
class AttentionCall:
    """The inputs of one tree-attention call (see the module docstring)."""

    #: q_BHTD: the batch's queries
    q: torch.Tensor
    #: k_BGTD: the batch's own keys (without the prefix rows)
    k: torch.Tensor
    #: v_BGTD: the batch's own values
    v: torch.Tensor
    #: pk_BGPD: keys handed over by earlier parts of the tree, or None
    pk: torch.Tensor | None
    #: pv_BGPD: their values, or None
    pv: torch.Tensor | None
    #: the tree rule's metadata for the batch (and its prefix rows)
    tm: TreeMask
    #: the softmax scale
    scale: float
    #: the layer's window, soft-capping and sinks
    opts: LayerOptions = PLAIN

    @property
    def gqa(self) -> bool:
        """Grouped-query attention: fewer key/value heads than query heads."""
        return self.q.shape[1] != self.k.shape[1]

    def joined_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as [prefix rows; own rows] (k_BGKD, v_BGKD with K = P + T; one copy of
        the prefix, cast to the own rows' dtype), for the backends that attend one contiguous key
        tensor."""
        k, v, pk, pv = self.k, self.v, self.pk, self.pv
        if pk is not None and pv is not None and pk.shape[2]:
            k = torch.cat([pk.to(k.dtype), k], dim=2)
            v = torch.cat([pv.to(v.dtype), v], dim=2)
        return k, v
