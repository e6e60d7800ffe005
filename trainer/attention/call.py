"""One attention call as every backend receives it (:class:`AttentionCall`).

Shape legend: B batch (always 1: trees are packed), H query heads, G key/value heads, T the
batch's own tokens, P handed-over prefix rows, D head dim.

:func:`~treeprep.trainer.attention.backends.tree_attention` checks its inputs once and hands each
backend one frozen call: the queries, the batch's own keys and values, the prefix rows of a
hand-off part, the :class:`~.mask.TreeMask`, the scale and the layer's extras. Bundling them is
the one place the backends' shared preamble lives: the GQA test (fewer key heads than query heads)
and joining [prefix; own] keys for the backends that attend one contiguous key tensor (those
whose ``reads_prefix_in_place`` fact is False, :data:`treeprep.modes.ATTN_FACTS`); the others
read the prefix in place and never join it.

The prefix is a tuple of *segments*, (k_BGSD, v_BGSD) pairs in path order whose lengths add up to
P: views of the stores that earlier parts left behind (:mod:`treeprep.trainer.parts.state`), so a
part's prefix is never gathered into one tensor unless a joining backend asks for it. A call holds
tensors by reference; building one copies nothing. Under ``stores="host"`` the prefix is instead a
:class:`~.stream.StreamedPrefix` (host views, read a window at a time by ``nodes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from treeprep.errors import TreeprepError
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.options import PLAIN, LayerOptions
from treeprep.trainer.attention.stream import StreamedPrefix

#: a part's handed-over keys and values: (k_BGSD, v_BGSD) segments in path order
Prefix = tuple[tuple[torch.Tensor, torch.Tensor], ...]
#: the same segments as plain views (no autograd), each with the function its gradients
#: (dk_BGSD, dv_BGSD, possibly of a leading slice) are added through
Direct = tuple[tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor, torch.Tensor], None]], ...]


@dataclass(frozen=True)
class AttentionCall:
    """The inputs of one tree-attention call (see the module docstring)."""

    #: q_BHTD: the batch's queries
    q: torch.Tensor
    #: k_BGTD: the batch's own keys (without the prefix rows)
    k: torch.Tensor
    #: v_BGTD: the batch's own values
    v: torch.Tensor
    #: the keys and values handed over by earlier parts of the tree, as segments (may be empty)
    prefix: Prefix
    #: the tree rule's metadata for the batch (and its prefix rows)
    tm: TreeMask
    #: the softmax scale
    scale: float
    #: the layer's window, soft-capping and sinks
    opts: LayerOptions = PLAIN
    #: with gradients on, the prefix as plain views and where their gradients go (empty: use
    #: ``prefix``, whose reads are on the autograd tape)
    direct: Direct = ()
    #: ``stores="host"``: the prefix in host memory, streamed (``prefix`` is then empty)
    streamed: StreamedPrefix | None = None

    @property
    def gqa(self) -> bool:
        """Grouped-query attention: fewer key/value heads than query heads."""
        return self.q.shape[1] != self.k.shape[1]

    @property
    def prefix_len(self) -> int:
        """P: the prefix rows over all segments."""
        n = sum(int(k.shape[2]) for k, _ in self.prefix)
        return n + (self.streamed.rows if self.streamed is not None else 0)

    def prefix_blocks(
        self, m: int, *, direct: bool = False
    ) -> list[tuple[torch.Tensor, torch.Tensor, int, Callable | None]]:
        """The first ``m`` prefix rows as in-place blocks (k, v, first row, where the gradients
        go), each cast to the own rows' dtype (a no-op when they share it). With ``direct`` and
        direct segments, the blocks are plain views and the caller's backward must send their
        gradients through the function given; otherwise it is None and autograd does."""
        segs = (
            self.direct if direct and self.direct else tuple((k, v, None) for k, v in self.prefix)
        )
        out: list[tuple[torch.Tensor, torch.Tensor, int, Callable | None]] = []
        at = 0
        for k, v, into in segs:
            if at >= m:
                break
            n = min(int(k.shape[2]), m - at)
            if n < k.shape[2]:
                k, v = k[:, :, :n], v[:, :, :n]
            out.append((k.to(self.k.dtype), v.to(self.v.dtype), at, into))
            at += n
        return out

    def joined_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as [prefix rows; own rows] (k_BGKD, v_BGKD with K = P + T), for the
        backends that attend one contiguous key tensor: one copy of the prefix, cast to the own
        rows' dtype, which autograd keeps for the backward (an in-place reader avoids it)."""
        if self.streamed is not None:
            raise TreeprepError(
                "stores=host streams the prefix a window at a time: attention backend nodes"
            )
        if not self.prefix_len:
            return self.k, self.v
        ks = [k.to(self.k.dtype) for k, _ in self.prefix] + [self.k]
        vs = [v.to(self.v.dtype) for _, v in self.prefix] + [self.v]
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)
