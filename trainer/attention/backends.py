"""Backend choice and dispatch: one interface, ``q_BHTD, k_BGTD, v_BGTD -> o_BHTD``.

Shape legend: B batch (always 1: trees are packed), H query heads, G key/value heads, T the
batch's own tokens, P handed-over prefix rows, D head dim.

Every backend takes one :class:`~.call.AttentionCall`: the queries, keys and values, the optional
prefix keys and values ``pk_BGPD`` / ``pv_BGPD`` (the hand-off of :mod:`treeprep.trainer.parts`),
the batch's :class:`TreeMask`, the scale and the layer's extras; and every backend is exact:

* ``dense`` (:mod:`.dense`): the reference; a [T, P+T] mask;
* ``nodes`` (:mod:`.nodes`): chain by chain over in-place key segments (CPU, bounded memory);
* ``flex`` (:mod:`.flex`): FlexAttention block mask (GPU; CPU forward only in torch 2.13);
* ``flash`` (:mod:`.flash`): flash-attn varlen over gathered node paths (optional, CUDA).

:func:`choose_backend` picks ``flex`` on CUDA; on CPU ``dense`` up to ``DENSE_MAX_TOKENS`` keys and
``nodes`` beyond, and ``nodes`` for every hand-off part with a prefix (it reads the stored prefix
in place; ``dense``, ``flex`` and ``flash`` attend one joined copy of it, which autograd keeps for
the backward: one more copy of the path's keys and values per part).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from treeprep.errors import TreeprepError
from treeprep.modes import Attn
from treeprep.trainer.attention.call import AttentionCall, Direct, Prefix
from treeprep.trainer.attention.dense import dense_attention
from treeprep.trainer.attention.flash import flash_available, flash_tree_attention
from treeprep.trainer.attention.flex import flex_tree_attention
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.nodes import nodes_attention
from treeprep.trainer.attention.options import PLAIN, LayerOptions
from treeprep.trainer.attention.stream import StreamedPrefix

#: above this many packed tokens the CPU default switches from ``dense`` to ``nodes``
DENSE_MAX_TOKENS = 4096

_IMPLS: dict[str, Callable[[AttentionCall], torch.Tensor]] = {
    "dense": dense_attention,
    "nodes": nodes_attention,
    "flex": flex_tree_attention,
    "flash": flash_tree_attention,
}


def choose_backend(
    device: torch.device | str, num_tokens: int, attn: str = "auto", num_keys: int | None = None
) -> str:
    """The backend for ``attn`` ("auto" or a name) on ``device`` for a batch of ``num_tokens``
    queries and ``num_keys`` keys (prefix rows included; default: the queries)."""
    dev = torch.device(device)
    if attn != "auto":
        attn = Attn.of(attn, "attention backend", TreeprepError)
        if attn == "flash" and not flash_available():
            raise TreeprepError(
                "attention backend 'flash' needs flash-attn (pip install flash-attn)"
            )
        if attn == "flash" and dev.type != "cuda":
            raise TreeprepError("attention backend 'flash' runs on CUDA only")
        return attn
    if dev.type == "cuda":
        return "flex"
    keys = num_tokens if num_keys is None else num_keys
    if keys > num_tokens:
        return "nodes"  # a hand-off part: read the stored prefix in place, never a joined copy
    return "dense" if num_tokens * keys <= DENSE_MAX_TOKENS**2 else "nodes"


def tree_attention(
    q_BHTD: torch.Tensor,
    k_BGTD: torch.Tensor,
    v_BGTD: torch.Tensor,
    tree_mask: TreeMask,
    *,
    scale: float | None = None,
    backend: str | None = None,
    prefix: Prefix | tuple[torch.Tensor, torch.Tensor] | StreamedPrefix | None = None,
    opts: LayerOptions = PLAIN,
    direct: Direct | None = None,
) -> torch.Tensor:
    """Attention of packed trees; returns o_BHTD. ``backend`` overrides ``tree_mask.backend``;
    ``prefix`` is the handed-over keys and values that precede the batch's own keys: segments
    ((k_BGSD, v_BGSD), ...) in path order, or one (pk_BGPD, pv_BGPD) pair; ``opts`` the layer's
    window, soft-capping and sinks (:mod:`.options`); ``direct`` the same prefix as plain views
    with where their gradients go (:class:`~.call.AttentionCall`), for backends that send them
    there themselves. A :class:`~.stream.StreamedPrefix` (host stores) is read by ``nodes``, a
    window at a time."""
    if q_BHTD.shape[0] != 1:
        raise TreeprepError("tree attention packs trees into one row: batch size must be 1")
    if q_BHTD.shape[2] != tree_mask.num_tokens:
        raise TreeprepError(
            f"tree mask is for {tree_mask.num_tokens} tokens, attention got {q_BHTD.shape[2]}"
        )
    streamed = None
    if isinstance(prefix, StreamedPrefix):
        streamed, prefix = prefix, None
    if prefix is None:
        segs: Prefix = ()
    elif len(prefix) == 2 and isinstance(prefix[0], torch.Tensor):
        segs = ((prefix[0], prefix[1]),)  # type: ignore[assignment]
    else:
        segs = tuple(prefix)  # type: ignore[arg-type]
    s = scale if scale is not None else q_BHTD.shape[-1] ** -0.5
    call = AttentionCall(q_BHTD, k_BGTD, v_BGTD, segs, tree_mask, s, opts, direct or (), streamed)
    if call.prefix_len != tree_mask.prefix_len:
        raise TreeprepError(
            f"tree mask expects {tree_mask.prefix_len} prefix rows, attention got {call.prefix_len}"
        )
    return _IMPLS[backend or tree_mask.backend](call)
