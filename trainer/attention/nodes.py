"""``nodes``: chain by chain, every key segment attended in place (no gathered paths).

Shape legend: B = 1, H query heads, G key/value heads, r = H / G, q query rows of one chunk,
L key rows of one chain (its prefix rows, ancestor segments and own tokens).

A chain (see :mod:`treeprep.trainer.attention.mask`) is a run of nodes each the first child of the
one before: its queries are one contiguous packed range and see (a) a leading run of the
handed-over prefix rows, (b) a few contiguous ancestor segments of the packed sequence, all in
full, and (c) its own tokens causally. Each of these key blocks is a view of the packed keys (no
copy).

Plain layers (:mod:`.blocks`): every block goes through a fused SDPA kernel (:mod:`.kernels`:
the flash kernel on the CPU, the memory-efficient one on CUDA), which returns its partial output
and log-sum-exp, and the blocks are merged exactly (one softmax over
all visible keys); the backward runs the kernel's backward per block with the merged output. No
score matrix is written or kept: a chain costs what the linear layout's causal call costs per
(query, key) pair. Elsewhere (layers with a window, soft-capping or sinks; values narrower than
the keys, as in latent attention; other devices) the scores against each block are computed
from the same views, concatenated along the key axis, soft-maxed once and split back per block
for the value products (the math path); so do CUDA runs in float64, or where the CUDA kernel
failed its one check (:func:`.kernels.fused_ok`). GQA groups the r query heads of a key head
into the query rows, so keys are never repeated either.

Memory: no gathered key rows at all (``gathered_rows`` is 0). The fused path keeps the queries,
the block views, the output and its log-sum-exp; the math path's transient scores of one chunk
are H x NODE_CHUNK x L floats, and autograd keeps the soft-maxed scores of every chunk, as SDPA's
math path does. Chains with neither prefix nor ancestors whose tokens no other chain's segment
cuts (a whole one-path tree, so every sequence of the linear layout) run as one ``is_causal``
SDPA call, whatever their length (plain layers only): the padding-free packed causal baseline a
good linear trainer runs (SDPA's flash kernel on CPU keeps no T x T scores).

Layer extras (:mod:`.options`). A sliding window adds a depth mask per key block; blocks that lie
wholly beyond the window of every query of a chunk are not read at all (ancestor segments are
ordered by depth, so a long path costs a window's worth of keys per query).

Host stores (``stores="host"``, :mod:`.stream`): a chain with prefix rows reads them from the
host a window at a time, merged with its device blocks by log-sum-exp; the device never holds
more than a window of the prefix. Soft-capping applies
to the scaled scores before the masks; sinks add one logit column per query row to the softmax.
"""

from __future__ import annotations

import bisect

import torch
import torch.nn.functional as F

from treeprep.trainer.attention import stream
from treeprep.trainer.attention.blocks import block_attention
from treeprep.trainer.attention.call import AttentionCall
from treeprep.trainer.attention.kernels import fused_ok
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.options import LayerOptions, cap_scores, softmax_rows
from treeprep.trainer.attention.stream import split_blocks, streamed_attention, window_masks

#: query rows per step (bounds the transient scores to H x NODE_CHUNK x L floats)
NODE_CHUNK = 1024


def _chunk_attention(
    q_BHqD: torch.Tensor,
    blocks_k: list[torch.Tensor],
    blocks_v: list[torch.Tensor],
    masks: list[torch.Tensor | None],
    scale: float,
    opts: LayerOptions,
) -> torch.Tensor:
    """One chunk over key blocks; ``masks[b]`` ([q, L_b] bool, or None for all visible)."""
    _, h, nq, d = q_BHqD.shape
    g = blocks_k[0].shape[1]
    r = h // g
    qg = q_BHqD.reshape(1, g, r * nq, d)
    scores = []
    for kb, mb in zip(blocks_k, masks, strict=True):
        sb = cap_scores(torch.matmul(qg, kb.transpose(-1, -2)) * scale, opts.softcap)
        if mb is not None:
            bias = torch.zeros(mb.shape, dtype=qg.dtype, device=qg.device)
            bias.masked_fill_(~mb, float("-inf"))
            sb = sb + bias.repeat(r, 1)
        scores.append(sb)
    sk = torch.cat(scores, dim=-1) if len(scores) > 1 else scores[0]
    sink_rows = None
    if opts.sinks is not None:
        sink_rows = opts.sinks.reshape(1, g, r, 1).expand(1, g, r, nq).reshape(1, g, r * nq, 1)
    p = softmax_rows(sk, sink_rows)
    ps = p.split([kb.shape[2] for kb in blocks_k], dim=-1)
    o = torch.matmul(ps[0], blocks_v[0])
    for pb, vb in zip(ps[1:], blocks_v[1:], strict=True):
        o = o + torch.matmul(pb, vb)
    return o.reshape(1, h, nq, blocks_v[0].shape[-1])


def _pieces(x: torch.Tensor, bounds: list[int]) -> dict[int, torch.Tensor]:
    sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return dict(zip(bounds[:-1], x.split(sizes, dim=2), strict=True))


def _starts(bounds: list[int], a: int, b: int) -> list[int]:
    """Starts of the pieces covering packed rows [a, b) (both are piece boundaries)."""
    return bounds[bisect.bisect_left(bounds, a) : bisect.bisect_left(bounds, b)]


def nodes_attention(call: AttentionCall) -> torch.Tensor:
    """q_BHTD over in-place key segments per chain; returns o_BHTD."""
    q, k, v = call.q, call.k, call.v
    tm, scale, opts, gqa = call.tm, call.scale, call.opts, call.gqa
    ch = tm.chains()
    fused = opts.plain and fused_ok(q, k, v)
    # split (never slice) the packed tensors once, at every chain, chunk and segment boundary:
    # a slice's backward zero-fills the whole input per slice, a split's backward is one cat
    cut = {0, q.shape[2]}
    for c in range(len(ch.start)):
        cut.update((ch.start[c], ch.end[c]))
        for a, b in ch.segments[c]:
            cut.update((a, b))
    # a chain that is a whole root path and that no segment cuts runs as one causal call
    inner = sorted(cut)
    whole = set()
    for c in range(len(ch.start)):
        s, e = ch.start[c], ch.end[c]
        if opts.plain and not ch.prefix[c] and not ch.segments[c] and _starts(inner, s, e) == [s]:
            whole.add(c)
        elif not fused:  # the fused kernel tiles its queries itself; the math path is chunked
            cut.update(range(s, e, NODE_CHUNK))
    bounds = sorted(cut)
    qp, kp, vp = _pieces(q, bounds), _pieces(k, bounds), _pieces(v, bounds)
    w = opts.window
    pl = tm.prefix_len
    kd = tm.k_depth_np() if w is not None else None
    outs: list[torch.Tensor] = []
    for c in range(len(ch.start)):
        s, e = ch.start[c], ch.end[c]
        m = ch.prefix[c]
        seg = ch.segments[c]
        if c in whole:
            outs.append(
                F.scaled_dot_product_attention(
                    qp[s], kp[s], vp[s], is_causal=True, scale=scale, enable_gqa=gqa
                )
            )
            continue
        # key blocks: (k, v, first key row in [prefix; own] coordinates)
        blocks: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        # the fused kernel sends the prefix blocks' gradients to their stores itself
        pre = call.prefix_blocks(m, direct=fused) if m else []
        blocks.extend((kb, vb, at) for kb, vb, at, _ in pre)
        into = [g for *_, g in pre]
        for a, b in seg:
            blocks.extend((kp[x], vp[x], pl + x) for x in _starts(bounds, a, b))
        for c0 in _starts(bounds, s, e):
            n = qp[c0].shape[2]
            own = [*((kp[x], vp[x], pl + x) for x in _starts(bounds, s, c0)), (kp[c0], vp[c0], -1)]
            if call.streamed is not None and m:
                outs.append(_streamed_chunk(call, m, blocks + own, qp[c0], pl + c0, kd))
                continue
            if fused:
                ks, vs = [b[0] for b in blocks + own], [b[1] for b in blocks + own]
                sent = into + [None] * (len(ks) - len(into))
                outs.append(block_attention(qp[c0], ks, vs, scale, causal_last=True, into=sent))
                continue
            bk, bv, masks = _window_blocks(blocks + own, tm, w, kd, pl + c0, n)
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            masks[-1] = causal if masks[-1] is None else masks[-1] & causal
            outs.append(_chunk_attention(qp[c0], bk, bv, masks, scale, opts))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _streamed_chunk(
    call: AttentionCall,
    m: int,
    blocks: list[tuple[torch.Tensor, torch.Tensor, int]],
    q: torch.Tensor,
    q0: int,
    kd: object,
) -> torch.Tensor:
    """A chunk of queries (key rows ``q0:q0+n``) over the first ``m`` rows of a host prefix,
    streamed a window at a time (:mod:`.stream`), and its device ``blocks`` (the last one its
    own rows)."""
    assert call.streamed is not None
    n, w = q.shape[2], call.opts.window
    wins = window_masks(call.streamed.windows(m), call.tm, w, q0, n)
    bk, bv, masks = _window_blocks(blocks, call.tm, w, kd, q0, n)
    if w is not None:  # the own block's causal rule joins its window mask
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        masks[-1] = causal if masks[-1] is None else masks[-1] & causal
    if not (call.opts.plain and fused_ok(q, bk[-1], bv[-1])):  # the written-out kernel
        bk, bv, masks = split_blocks(bk, bv, masks, stream.PREFIX_WINDOW)
    return streamed_attention(q, wins, bk, bv, masks, scale=call.scale, opts=call.opts,
                              causal_last=w is None, anchor=call.streamed.anchor)  # fmt: skip


def _window_blocks(
    blocks: list[tuple[torch.Tensor, torch.Tensor, int]],
    tm: TreeMask,
    window: int | None,
    kd: object,
    q0: int,
    n: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]:
    """The blocks a chunk of ``n`` queries (key rows ``q0:q0+n``) reads, with their window masks;
    the last block is the chunk's own (start -1 means "the queries' own rows")."""
    if window is None:
        return [b[0] for b in blocks], [b[1] for b in blocks], [None] * len(blocks)
    import numpy as np

    assert isinstance(kd, np.ndarray) and tm.q_depth is not None and tm.k_depth is not None
    qmin = int(kd[q0 : q0 + n].min())
    qd = tm.k_depth[q0 : q0 + n]
    bk: list[torch.Tensor] = []
    bv: list[torch.Tensor] = []
    masks: list[torch.Tensor | None] = []
    for i, (kb, vb, start) in enumerate(blocks):
        lo = q0 if start < 0 else start
        hi = lo + kb.shape[2]
        last = i == len(blocks) - 1
        if not last and int(kd[lo:hi].max()) <= qmin - window:
            continue  # wholly beyond every query's window
        bk.append(kb)
        bv.append(vb)
        masks.append(qd[:, None] - tm.k_depth[None, lo:hi] < window)
    return bk, bv, masks
