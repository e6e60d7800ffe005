"""Tree attention behind one interface: ``dense``, ``nodes``, ``flex`` and ``flash`` backends.

Shape legend: B batch (always 1: trees are packed), H query heads, G key/value heads, T packed
tokens, D head dim, Nn nodes, Tk gathered key rows.

The rule (NOTES section 3): token i attends token j iff node(j) is an ancestor-or-self of node(i)
and j <= i. With nodes numbered in pre-order and laid out contiguously in that order, a strict
ancestor's tokens always precede, so the test is ``j <= i and pre[j] <= pre[i] <= last[j]`` with
``pre`` the token's node id: O(1) per pair, from two length-T vectors.

Backends (all exact; they differ in memory and speed):

* ``dense``: the T x T boolean mask materialised once per batch and handed to
  ``scaled_dot_product_attention``. The reference; CPU default for short batches. Memory T^2 bytes
  for the mask plus, on the math path, H T^2 floats per layer.
* ``nodes``: node by node, each node's queries against its ancestors' keys and values gathered into
  one segment (bottom-right causal: the node's own tokens are the segment's tail). Memory per step
  is one node's queries times its path; the gather costs the sum over nodes of their path lengths
  (quadratic for a long chain of tiny nodes, fine for agent trees whose nodes are whole turns). The
  CPU default for long batches, and it runs exactly the index logic the ``flash`` backend uses.
* ``flex``: ``torch.nn.attention.flex_attention`` with a block mask built from the O(1) ``mask_mod``
  (no T x T tensor), compiled with dynamic shapes on GPU. On CPU in torch 2.13 only its forward
  works (backward raises NotImplementedError), so it is a GPU backend that CPU tests check forward.
* ``flash``: ``flash_attn_varlen_func`` over the same per-node gathered segments (flash-attn's
  causal mode is bottom-right aligned, which is what a node's queries need). flash-attn works in
  fp16/bf16 only: float32 inputs are cast to bf16 and the output cast back. Imported lazily;
  optional.

:func:`choose_backend` picks ``flex`` on CUDA, ``dense`` on CPU up to ``DENSE_MAX_TOKENS`` tokens
and ``nodes`` beyond. :class:`TreeMask` carries the batch's metadata and caches what a backend
builds (mask, block mask, gather indices) so that every layer reuses it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from treeprep.errors import TreeprepError

Backend = Literal["dense", "nodes", "flex", "flash"]
BACKENDS: tuple[str, ...] = ("dense", "nodes", "flex", "flash")
#: above this many packed tokens the CPU default switches from ``dense`` to ``nodes``
DENSE_MAX_TOKENS = 4096


def flash_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def choose_backend(device: torch.device | str, num_tokens: int, attn: str = "auto") -> str:
    """The backend for ``attn`` ("auto" or a name) on ``device`` for a batch of ``num_tokens``."""
    dev = torch.device(device)
    if attn != "auto":
        if attn not in BACKENDS:
            raise TreeprepError(
                f"unknown attention backend {attn!r}; expected auto or one of {', '.join(BACKENDS)}"
            )
        if attn == "flash" and not flash_available():
            raise TreeprepError(
                "attention backend 'flash' needs flash-attn (pip install flash-attn)"
            )
        if attn == "flash" and dev.type != "cuda":
            raise TreeprepError("attention backend 'flash' runs on CUDA only")
        return attn
    if dev.type == "cuda":
        return "flex"
    return "dense" if num_tokens <= DENSE_MAX_TOKENS else "nodes"


@dataclass
class NodeSegments:
    """Per-node query ranges and gathered ancestor key rows (the ``nodes`` / ``flash`` layout).

    Queries of node n are packed rows ``cu_q[n]:cu_q[n+1]`` (nodes are contiguous in pre-order, so
    the query order is the packed order). Its keys are ``kv_index[cu_k[n]:cu_k[n+1]]``: the
    tokens of its root-to-node path, ancestors first, its own tokens last.
    """

    cu_q: torch.Tensor  # [Nn+1] int32
    cu_k: torch.Tensor  # [Nn+1] int32
    kv_index: torch.Tensor  # [Tk] int64
    max_q: int
    max_k: int


def node_segments(
    node_start: torch.Tensor, node_length: torch.Tensor, node_parent: torch.Tensor
) -> NodeSegments:
    """Build the gathered-ancestor layout from node arrays (pre-order: parents precede children)."""
    start = node_start.tolist()
    length = node_length.tolist()
    parent = node_parent.tolist()
    nn = len(start)
    path_len = [0] * nn
    for n in range(nn):
        p = parent[n]
        path_len[n] = length[n] + (path_len[p] if p >= 0 else 0)
    # each node's path as (start, length) runs; rows = concat of the ancestors' runs, then its own
    rows: list[torch.Tensor] = []
    runs: list[list[tuple[int, int]]] = [[] for _ in range(nn)]
    for n in range(nn):
        p = parent[n]
        runs[n] = (runs[p] if p >= 0 else []) + [(start[n], length[n])]
    flat_s = []
    flat_l = []
    for n in range(nn):
        for s, ln in runs[n]:
            flat_s.append(s)
            flat_l.append(ln)
    dev = node_start.device
    s_t = torch.tensor(flat_s, dtype=torch.int64, device=dev)
    l_t = torch.tensor(flat_l, dtype=torch.int64, device=dev)
    total = int(l_t.sum())
    # vectorised ranges: row r of run i is s_i + (r - run_offset_i)
    run_off = torch.cumsum(l_t, 0) - l_t
    rows_t = torch.arange(total, device=dev) - torch.repeat_interleave(run_off, l_t)
    kv_index = rows_t + torch.repeat_interleave(s_t, l_t)
    del rows
    cu_q = torch.zeros(nn + 1, dtype=torch.int32, device=dev)
    cu_q[1:] = torch.cumsum(node_length, 0).to(torch.int32)
    cu_k = torch.zeros(nn + 1, dtype=torch.int32, device=dev)
    cu_k[1:] = torch.cumsum(torch.tensor(path_len, device=dev), 0).to(torch.int32)
    return NodeSegments(cu_q, cu_k, kv_index, max(length), max(path_len))


@dataclass
class TreeMask:
    """A batch's attention metadata, passed to every attention call as ``tree_mask=``."""

    token_node: torch.Tensor  # [T] int64: pre-order node id of each token
    token_last: torch.Tensor  # [T] int64: subtree end of each token's node
    node_start: torch.Tensor
    node_length: torch.Tensor
    node_parent: torch.Tensor
    backend: str
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_batch(cls, batch: Any, attn: str = "auto") -> TreeMask:
        backend = choose_backend(batch.device, batch.num_tokens, attn)
        return cls(
            token_node=batch.token_node,
            token_last=batch.node_last[batch.token_node],
            node_start=batch.node_start,
            node_length=batch.node_length,
            node_parent=batch.node_parent,
            backend=backend,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.token_node.shape[0])

    def dense(self) -> torch.Tensor:
        """[T, T] bool: row i may attend column j. Built once, O(T^2) bytes."""
        m = self._cache.get("dense")
        if m is None:
            node, last = self.token_node, self.token_last
            idx = torch.arange(self.num_tokens, device=node.device)
            m = (
                (idx[None, :] <= idx[:, None])
                & (node[None, :] <= node[:, None])
                & (node[:, None] <= last[None, :])
            )
            self._cache["dense"] = m
        return m

    def segments(self) -> NodeSegments:
        s = self._cache.get("segments")
        if s is None:
            s = node_segments(self.node_start, self.node_length, self.node_parent)
            self._cache["segments"] = s
        return s

    def block_mask(self) -> Any:
        bm = self._cache.get("block_mask")
        if bm is None:
            from torch.nn.attention.flex_attention import create_block_mask

            node, last = self.token_node, self.token_last

            def tree_mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
                return (
                    (kv_idx <= q_idx)
                    & (node[kv_idx] <= node[q_idx])
                    & (node[q_idx] <= last[kv_idx])
                )

            t = self.num_tokens
            bm = create_block_mask(tree_mask_mod, None, None, t, t, device=node.device)
            self._cache["block_mask"] = bm
        return bm


# ----------------------------------------------------------------------------------------------
# backends: q_BHTD, k_BGTD, v_BGTD -> o_BHTD
# ----------------------------------------------------------------------------------------------


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tm: TreeMask, scale: float):
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=tm.dense()[None, None], scale=scale, enable_gqa=gqa
    )


def _bottom_right_causal(lq: int, lk: int, device: torch.device) -> torch.Tensor:
    r = torch.arange(lq, device=device)[:, None]
    c = torch.arange(lk, device=device)[None, :]
    return c <= r + (lk - lq)


#: query rows per step in the ``nodes`` backend (bounds memory to NODE_CHUNK x path per head)
NODE_CHUNK = 1024


def _nodes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tm: TreeMask, scale: float):
    seg = tm.segments()
    gqa = q.shape[1] != k.shape[1]
    k_g = k.index_select(2, seg.kv_index)
    v_g = v.index_select(2, seg.kv_index)
    cu_q = seg.cu_q.tolist()
    cu_k = seg.cu_k.tolist()
    n_nodes = len(cu_q) - 1
    lqs = [cu_q[n + 1] - cu_q[n] for n in range(n_nodes)]
    lks = [cu_k[n + 1] - cu_k[n] for n in range(n_nodes)]
    # split, never slice, the packed tensors per node: the backward of a slice fills a zero
    # tensor of the whole input for every slice (quadratic in nodes), a split's backward is one cat
    qs = q.split(lqs, dim=2)
    ks = k_g.split(lks, dim=2)
    vs = v_g.split(lks, dim=2)
    outs = []
    for n in range(n_nodes):
        lq, lk = lqs[n], lks[n]
        for c0 in range(0, lq, NODE_CHUNK):
            c1 = min(lq, c0 + NODE_CHUNK)
            # rows c0..c1 of the node see keys up to (lk - lq) + row: bottom-right causal
            kend = lk - lq + c1
            whole = c0 == 0 and c1 == lq
            mask = _bottom_right_causal(c1 - c0, kend, q.device)
            outs.append(
                F.scaled_dot_product_attention(
                    qs[n] if whole else qs[n][:, :, c0:c1],
                    ks[n] if whole else ks[n][:, :, :kend],
                    vs[n] if whole else vs[n][:, :, :kend],
                    attn_mask=mask[None, None],
                    scale=scale,
                    enable_gqa=gqa,
                )
            )
    return torch.cat(outs, dim=2)


_flex_compiled: Any = None


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tm: TreeMask, scale: float):
    from torch.nn.attention.flex_attention import flex_attention

    global _flex_compiled
    fn = flex_attention
    if q.device.type == "cuda":
        if _flex_compiled is None:
            _flex_compiled = torch.compile(flex_attention, dynamic=True)
        fn = _flex_compiled
    gqa = q.shape[1] != k.shape[1]
    return fn(q, k, v, block_mask=tm.block_mask(), scale=scale, enable_gqa=gqa)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tm: TreeMask, scale: float):
    from flash_attn import flash_attn_varlen_func

    seg = tm.segments()
    dtype = q.dtype
    run = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    q_THD = q[0].transpose(0, 1).to(run)
    k_TkGD = k[0].transpose(0, 1).index_select(0, seg.kv_index).to(run)
    v_TkGD = v[0].transpose(0, 1).index_select(0, seg.kv_index).to(run)
    o_THD = flash_attn_varlen_func(
        q_THD,
        k_TkGD,
        v_TkGD,
        seg.cu_q,
        seg.cu_k,
        seg.max_q,
        seg.max_k,
        dropout_p=0.0,
        softmax_scale=scale,
        causal=True,
    )
    return o_THD.to(dtype).transpose(0, 1)[None]


_IMPLS = {"dense": _dense, "nodes": _nodes, "flex": _flex, "flash": _flash}


def tree_attention(
    q_BHTD: torch.Tensor,
    k_BGTD: torch.Tensor,
    v_BGTD: torch.Tensor,
    tree_mask: TreeMask,
    *,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Attention of packed trees; returns o_BHTD. ``backend`` overrides ``tree_mask.backend``."""
    if q_BHTD.shape[0] != 1:
        raise TreeprepError("tree attention packs trees into one row: batch size must be 1")
    if q_BHTD.shape[2] != tree_mask.num_tokens:
        raise TreeprepError(
            f"tree mask is for {tree_mask.num_tokens} tokens, attention got {q_BHTD.shape[2]}"
        )
    s = scale if scale is not None else q_BHTD.shape[-1] ** -0.5
    return _IMPLS[backend or tree_mask.backend](q_BHTD, k_BGTD, v_BGTD, tree_mask, s)


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
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function registered with transformers' ``AttentionInterface`` as ``"treeprep"``.

    transformers hands it q/k/v as [B, H|G, T, D] after rotary embeddings and expects
    [B, T, H, D] back. The batch's :class:`TreeMask` arrives as the ``tree_mask`` keyword (extra
    model kwargs reach the attention function). Without one it runs plain causal attention, so a
    model loaded by treeprep still works for ordinary calls.
    """
    if dropout:
        raise TreeprepError("tree attention does not implement attention dropout; set it to 0")
    if sliding_window is not None and tree_mask is not None:
        raise TreeprepError("sliding-window layers are not supported by tree attention")
    if tree_mask is None:
        gqa = query.shape[1] != key.shape[1]
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=query.shape[2] > 1, scale=scaling, enable_gqa=gqa
        )
    else:
        out = tree_attention(query, key, value, tree_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
