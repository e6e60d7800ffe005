"""A part's prefix read from host memory a window at a time (``stores="host"``).

Shape legend: B = 1, H query heads, G key/value heads, r = H / G, q query rows of one call,
W rows of one window, L_b key rows of block b, D head width.

Under ``stores="host"`` the keys and values that earlier parts handed over live in a host pool
(:mod:`treeprep.trainer.parts.host`). A part's prefix is then a :class:`StreamedPrefix`: host
views of the stores, one per contiguous run of stored rows, and where each run's gradients go.
The ``nodes`` backend attends it with :func:`streamed_attention`, one call per chain (or chunk of
queries), over

* the prefix, cut into windows of at most :data:`PREFIX_WINDOW` rows, each copied to the device
  just before it is attended and dropped right after (on CUDA from pinned memory on a side stream,
  the next window's copy issued before the current one is attended, so the copies overlap the
  attention; on the CPU a plain copy, so the CPU runs and counts what a device would), and
* the part's own key blocks (ancestor segments of the packed part and the chain's own rows, the
  last one causal), which live on the device as usual,

merged exactly by log-sum-exp, as the fused block attention merges its blocks
(:mod:`.blocks`): ``l = log sum_b exp(l_b)``, ``o = sum_b exp(l_b - l) o_b``, here one block at
a time (a running output and log-sum-exp), so neither the path nor the blocks' partial outputs
are ever held at once. Nothing of the prefix is saved for the backward: it reads each window
again (the same prefetched copies), runs block b's backward with the *merged* output and
log-sum-exp (so its share of dq and its dk, dv are exact), and sends the window's dk, dv to the
store's host accumulators at once. So the device holds one or two windows of one layer, never
the path: the device memory of a step no longer grows with the session.

Block kernels: a fused SDPA kernel where it applies (:func:`.kernels.fused_ok`: one dtype, one
head width, a block visible in full or causal, no soft-capping; the CPU's flash kernel, CUDA's
memory-efficient one), else the same product written out on the block (scores, soft-capping, a
boolean mask, exp against the block's or the merged log-sum-exp), which runs on any device and
is what windowed layers (a depth mask per block) and soft-capped layers use. Sinks (gpt-oss)
enter once, in the merged log-sum-exp: they take probability mass and add no value, and their
gradient is ``-sum exp(sink - l) rowsum(do * o)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from treeprep.trainer.attention import kernels
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.attention.options import LayerOptions, cap_scores

#: prefix rows per device window: what the device holds of one layer's prefix at once (twice
#: that while the next window's copy is in flight)
PREFIX_WINDOW = 2048

#: where a segment's key/value gradients go: (first row within the segment, dk_BGWD, dv_BGWD)
GradSend = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class HostSegment:
    """One contiguous run of stored prefix rows: host views k_BGSD, v_BGSD of a store, and where
    their gradients go (None: no gradients, a pass without a graph)."""

    k: torch.Tensor
    v: torch.Tensor
    send: GradSend | None = None


@dataclass(frozen=True)
class Window:
    """At most :data:`PREFIX_WINDOW` prefix rows of one segment: host views, the first prefix
    row they stand for, and where their gradients go."""

    k: torch.Tensor
    v: torch.Tensor
    at: int
    send: Callable[[torch.Tensor, torch.Tensor], None] | None


@dataclass(frozen=True)
class StreamedPrefix:
    """A part's prefix as host segments in path order (module docstring). ``anchor`` is a leaf
    that puts each attention call on the autograd tape in passes with gradients (its own
    gradient is nothing)."""

    segments: tuple[HostSegment, ...]
    anchor: torch.Tensor | None = None
    #: rows per window (None: :data:`PREFIX_WINDOW`, read when the windows are cut)
    window: int | None = None

    @property
    def rows(self) -> int:
        return sum(int(s.k.shape[2]) for s in self.segments)

    def windows(self, m: int) -> list[Window]:
        """The first ``m`` prefix rows as windows (a window never spans two segments)."""
        out: list[Window] = []
        at = 0
        size = self.window or PREFIX_WINDOW
        for seg in self.segments:
            n = min(int(seg.k.shape[2]), m - at)
            for a in range(0, n, size):
                b = min(n, a + size)
                send = None if seg.send is None else _sender(seg.send, a)
                out.append(Window(seg.k[:, :, a:b], seg.v[:, :, a:b], at + a, send))
            at += n
            if at >= m:
                break
        return out


def _sender(send: GradSend, a: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    return lambda dk, dv: send(a, dk, dv)


def window_masks(
    wins: list[Window], tm: TreeMask, window: int | None, q0: int, n: int
) -> list[tuple[Window, torch.Tensor | None]]:
    """The windows a chunk of ``n`` queries (key rows ``q0:q0+n``) reads, with their sliding
    window masks ([n, W] bool; None without a window). Windows wholly beyond every query's
    window are left out, so they are never copied."""
    if window is None:
        return [(w, None) for w in wins]
    kd = tm.k_depth_np()
    assert tm.k_depth is not None
    qmin = int(kd[q0 : q0 + n].min())
    qd = tm.k_depth[q0 : q0 + n]
    out: list[tuple[Window, torch.Tensor | None]] = []
    for w in wins:
        a, b = w.at, w.at + int(w.k.shape[2])
        if int(np.max(kd[a:b])) <= qmin - window:
            continue
        out.append((w, qd[:, None] - tm.k_depth[None, a:b] < window))
    return out


# --------------------------------------------------------------------------------------------
# copying windows to the device
# --------------------------------------------------------------------------------------------

_SIDE: dict[torch.device, Any] = {}


def copy_stream(device: torch.device) -> Any:
    """The CUDA stream that host stores are copied on, both ways: the windows' reads here and the
    stores' writes (:meth:`~treeprep.trainer.parts.host.HostPool.copy_in`), so a window is read
    only after its store is written (one stream runs in order)."""
    side = _SIDE.get(device)
    if side is None:
        side = _SIDE[device] = torch.cuda.Stream(device)
    return side


def rows_to_device(t: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """A host tensor k_BGWD laid rows first (a store's window, or a whole accumulator) as a device
    tensor of the same shape: its rows are one contiguous block ([W, G, D] in memory), which moves
    as one copy (asynchronous from pinned memory with ``non_blocking``)."""
    rows_first = t[0].transpose(0, 1)
    dst = torch.empty(rows_first.shape, dtype=t.dtype, device=device)
    dst.copy_(rows_first, non_blocking=non_blocking)
    return dst.transpose(0, 1).unsqueeze(0)


def load_windows(
    wins: list[Window], device: torch.device, k_dtype: torch.dtype, v_dtype: torch.dtype
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The windows' keys and values on ``device`` in order, cast to the own rows' dtypes. On CUDA
    each window's copy is issued on a side stream one window ahead of its use; the compute stream
    waits for it by an event, and the copies are marked as used by the compute stream, so the
    caching allocator reuses their memory (the same few blocks, window after window) only once
    the attention that read them is done."""
    if device.type != "cuda":
        for w in wins:
            yield (rows_to_device(w.k, device, False).to(k_dtype),
                   rows_to_device(w.v, device, False).to(v_dtype))  # fmt: skip
        return
    main = torch.cuda.current_stream(device)
    side = copy_stream(device)

    def issue(w: Window) -> tuple[torch.Tensor, torch.Tensor, Any]:
        with torch.cuda.stream(side):
            k, v = rows_to_device(w.k, device, True), rows_to_device(w.v, device, True)
            ev = torch.cuda.Event()
            ev.record(side)
        return k, v, ev

    nxt = issue(wins[0]) if wins else None
    for i in range(len(wins)):
        assert nxt is not None
        k, v, ev = nxt
        nxt = issue(wins[i + 1]) if i + 1 < len(wins) else None
        main.wait_event(ev)
        k.record_stream(main)
        v.record_stream(main)
        yield k.to(k_dtype), v.to(v_dtype)


# --------------------------------------------------------------------------------------------
# one block: forward (partial output and log-sum-exp) and backward (with the merged ones)
# --------------------------------------------------------------------------------------------


def _acc(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _is_fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, softcap: Any
) -> bool:
    return mask is None and softcap is None and kernels.fused_ok(q, k, v)


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    causal: bool,
    mask: torch.Tensor | None,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked capped scores, raw scaled scores), [1, G, r q, L] in the accumulation dtype."""
    _, h, nq, d = q.shape
    g, L = k.shape[1], k.shape[2]
    r = h // g
    raw = torch.matmul(q.reshape(1, g, r * nq, d).to(_acc(q)), k.to(_acc(q)).transpose(-1, -2))
    raw = raw * scale
    s = cap_scores(raw, softcap)
    if causal:
        tril = torch.ones(nq, L, dtype=torch.bool, device=q.device).tril(L - nq)
        mask = tril if mask is None else mask & tril
    if mask is not None:
        s = s.masked_fill(~mask.repeat(r, 1), float("-inf"))
    return s, raw


def block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    mask: torch.Tensor | None,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's partial output o_BHqD and log-sum-exp l_BHq (-inf where a row sees none)."""
    if _is_fused(q, k, v, mask, softcap):
        o, lse = kernels.forward(q, k, v, causal, scale)
        return o, lse.to(_acc(q))
    _, h, nq, _ = q.shape
    s, _ = _scores(q, k, scale, causal, mask, softcap)
    lse = torch.logsumexp(s, dim=-1)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    o = torch.matmul(torch.exp(s - safe[..., None]), v.to(s.dtype))
    return o.reshape(1, h, nq, v.shape[-1]), lse.reshape(1, h, nq)


def block_backward(
    g_o: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    rowterm: torch.Tensor,
    plan: _Plan,
    causal: bool,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block b's share of dq and its dk, dv, from the *merged* output ``o`` and log-sum-exp
    ``lse`` (``rowterm``: rowsum(do * o), [1, H, q])."""
    if _is_fused(q, k, v, mask, plan.softcap):
        return kernels.backward(g_o, q, k, v, o, lse, causal, plan.scale)
    _, h, nq, d = q.shape
    g = k.shape[1]
    r = h // g
    s, raw = _scores(q, k, plan.scale, causal, mask, plan.softcap)
    acc = s.dtype
    p = torch.exp(s - lse.reshape(1, g, r * nq, 1).to(acc))
    go = g_o.reshape(1, g, r * nq, g_o.shape[-1]).to(acc)
    dv = torch.matmul(p.transpose(-1, -2), go)
    ds = p * (torch.matmul(go, v.to(acc).transpose(-1, -2)) - rowterm.reshape(1, g, r * nq, 1))
    if plan.softcap is not None:
        ds = ds * (1 - torch.tanh(raw / plan.softcap) ** 2)
    dq = torch.matmul(ds, k.to(acc)) * plan.scale
    dk = torch.matmul(ds.transpose(-1, -2), q.reshape(1, g, r * nq, d).to(acc)) * plan.scale
    return dq.reshape(1, h, nq, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --------------------------------------------------------------------------------------------
# the call: windows and device blocks merged by log-sum-exp
# --------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What one streamed call attends besides its tensor inputs."""

    scale: float
    softcap: float | None
    #: prefix windows with their masks (None: visible in full)
    windows: list[tuple[Window, torch.Tensor | None]]
    #: the device blocks' masks (None: visible in full)
    masks: list[torch.Tensor | None]
    #: the last device block is the queries' own rows, causal
    causal_last: bool

    def blocks(
        self, q: torch.Tensor, ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, bool, torch.Tensor | None, Any]]:
        """(k, v, causal, mask, where the gradients go or None) of every block: the windows,
        copied to the device one ahead of their use, then the device blocks."""
        wins = [w for w, _ in self.windows]
        loaded = load_windows(wins, q.device, ks[0].dtype, vs[0].dtype)
        for (w, mask), (k, v) in zip(self.windows, loaded, strict=True):
            yield k, v, False, mask, w.send
        n = len(ks)
        for i in range(n):
            yield ks[i], vs[i], self.causal_last and i == n - 1, self.masks[i], None


def _combine(
    acc: tuple[torch.Tensor, torch.Tensor] | None, o_b: torch.Tensor, l_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The running (output, log-sum-exp) merged with one more block's (exact up to rounding)."""
    o_b = o_b.to(l_b.dtype)
    if acc is None:
        return o_b, l_b
    o_a, l_a = acc
    lse = torch.logaddexp(l_a, l_b)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)  # a row that sees nothing yet stays 0
    return o_a * torch.exp(l_a - safe)[..., None] + o_b * torch.exp(l_b - safe)[..., None], lse


def _sink_rows(sinks: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Per-head sink logits as [1, H, q] rows beside ``lse``."""
    return sinks.to(lse.dtype).reshape(1, -1, 1).expand_as(lse)


class _Streamed(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        plan: _Plan,
        anchor: torch.Tensor | None,
        sinks: torch.Tensor | None,
        *kv: torch.Tensor,
    ) -> torch.Tensor:
        n = len(kv) // 2
        ks, vs = kv[:n], kv[n:]
        acc: tuple[torch.Tensor, torch.Tensor] | None = None
        for k, v, causal, mask, _ in plan.blocks(q, ks, vs):
            acc = _combine(acc, *block_forward(q, k, v, plan.scale, causal, mask, plan.softcap))
        assert acc is not None
        o, lse = acc
        if sinks is not None:  # one more softmax column, of no value
            full = torch.logaddexp(lse, _sink_rows(sinks, lse))
            o, lse = o * torch.exp(lse - full)[..., None], full
        o = o.to(q.dtype).contiguous()
        ctx.plan = plan
        ctx.save_for_backward(q, o, lse, sinks, *kv)
        return o

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, o, lse, sinks, *kv = ctx.saved_tensors
        plan: _Plan = ctx.plan
        n = len(kv) // 2
        g = g.contiguous()
        rowterm = (g.to(lse.dtype) * o.to(lse.dtype)).sum(-1)
        dq: torch.Tensor | None = None
        dks: list[torch.Tensor | None] = []
        dvs: list[torch.Tensor | None] = []
        nw = len(plan.windows)
        for i, (k, v, causal, mask, send) in enumerate(plan.blocks(q, kv[:n], kv[n:])):
            dq_b, dk, dv = block_backward(g, q, k, v, o, lse, rowterm, plan, causal, mask)
            dq = dq_b if dq is None else dq + dq_b
            if i >= nw:
                dks.append(dk)
                dvs.append(dv)
            elif send is not None:  # a prefix window: its gradients go to the host store now
                send(dk, dv)
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            p_sink = torch.exp(_sink_rows(sinks, lse) - lse)
            dsinks = (-(p_sink * rowterm)).sum(dim=(0, 2)).to(sinks.dtype)
        return (dq, None, None, dsinks, *dks, *dvs)


def split_blocks(
    blocks_k: list[torch.Tensor],
    blocks_v: list[torch.Tensor],
    masks: list[torch.Tensor | None],
    size: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]:
    """The device key blocks but the last (the queries' own rows) cut to at most ``size`` rows,
    for the written-out kernel, whose scores are q x block rows: an ancestor segment as long as
    a part would otherwise cost H x q x budget floats at once. Split, not sliced, so each
    block's gradient is joined by one cat."""
    ks: list[torch.Tensor] = []
    vs: list[torch.Tensor] = []
    ms: list[torch.Tensor | None] = []
    last = len(blocks_k) - 1
    for i, (k, v, m) in enumerate(zip(blocks_k, blocks_v, masks, strict=True)):
        if i == last or k.shape[2] <= size:
            ks.append(k)
            vs.append(v)
            ms.append(m)
            continue
        ks += k.split(size, dim=2)
        vs += v.split(size, dim=2)
        ms += [None] * len(k.split(size, dim=2)) if m is None else list(m.split(size, dim=1))
    return ks, vs, ms


def streamed_attention(
    q_BHqD: torch.Tensor,
    windows: list[tuple[Window, torch.Tensor | None]],
    blocks_k: list[torch.Tensor],
    blocks_v: list[torch.Tensor],
    masks: list[torch.Tensor | None],
    *,
    scale: float,
    opts: LayerOptions,
    causal_last: bool,
    anchor: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of ``q_BHqD`` over the prefix ``windows`` (host, with their masks,
    :func:`window_masks`) and the device key blocks (``masks[b]`` or None; the last one the
    queries' own rows, causal when ``causal_last``), one softmax over all: o_BHqD."""
    plan = _Plan(scale, opts.softcap, windows, masks, causal_last)
    return _Streamed.apply(q_BHqD, plan, anchor, opts.sinks, *blocks_k, *blocks_v)


__all__ = [
    "PREFIX_WINDOW",
    "HostSegment",
    "StreamedPrefix",
    "Window",
    "block_backward",
    "block_forward",
    "copy_stream",
    "load_windows",
    "rows_to_device",
    "split_blocks",
    "streamed_attention",
    "window_masks",
]
