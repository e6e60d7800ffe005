"""What a part hands over to its descendants, per layer, and how gradients come back.

Memory is the point of this module: a long agent session is one long path, and everything a
part keeps for its descendants is held for every token of that path. Each layer's hand-off state
is therefore held **once**:

* :class:`KVStore`: the post-rotary keys and values of the part's rows that some descendant part
  reads (positions are depths, so a descendant's queries see them exactly as in the whole tree),
  detached, in the run's compute dtype (the autocast dtype in mixed precision, where rotary and
  the key norm would otherwise leave the keys in float32; the dtype the layer computed them in
  otherwise), plus one gradient accumulator per stored tensor, allocated when the first
  descendant sends a gradient back. The accumulators are in the stored dtype (bf16 in a bf16 run,
  float32 in float32, float64 in float64) unless the run asks for float32 accumulation
  (``accumulate="float32"``; a no-op outside 16-bit runs).
* :class:`LinearState`: a linear-attention layer's conv and recurrent states at the end of each of
  the part's node pieces, keyed by the tree index of the piece's last token
  (:mod:`treeprep.trainer.models.hybrid`); a descendant piece reads the one at its predecessor.

A descendant never gathers its prefix into a new tensor. Its prefix is a tuple of *segments*:
views of the ancestors' stores, one per contiguous run of stored rows on its path
(:func:`prefix_segments`), handed to the attention as they are
(:class:`~treeprep.trainer.attention.call.AttentionCall`). With gradients on, each segment is read
through :class:`_ReadStore`, an autograd function whose backward adds the segment's key and value
gradients straight into the store's accumulators: no leaf tensor, no ``.grad`` of the prefix, no
scatter afterwards. The ``nodes`` backend's fused block attention goes one step further: it reads
the plain views and its backward adds each block's gradients into the store itself (the
direct triples :meth:`HandOff.exchange` returns), so not even one layer's prefix gradient is
held at once. Per path token and layer that is 2 x kv_heads x head_dim values stored and as
many accumulated: twice the path's K/V bytes when accumulating in the model dtype (three times
with float32 accumulators in bf16), plus transients of one part.

:class:`HandOff` is the per-part exchange the attention glue calls once per layer
(:func:`treeprep.trainer.attention.hf.hf_tree_attention`): it records the layer's own keys and
values where the part stores them, passes them on through :class:`_OwnGradient` in a pass with
gradients (whose backward adds what the descendants accumulated on them, so the part's backward
needs no handle on them: under activation checkpointing they are recomputed with the layer), and
returns the layer's prefix segments.
Linear-attention layers call :meth:`HandOff.linear_state` and :meth:`HandOff.record_linear`
instead; their (small) states arrive as leaves made on first use, whose gradients
:meth:`HandOff.return_grads` adds to the producers' :class:`LinearState`.

Host stores (``stores="host"``). The stores and their accumulators are allocated in a
:class:`~.host.HostPool` (:attr:`KVStore.pool`): a layer's own stored rows are copied there as
soon as the layer has computed them (:attr:`HandOff.stash`), a descendant's prefix is a
:class:`~treeprep.trainer.attention.stream.StreamedPrefix` of host views that the attention
copies to the device a window at a time, and each window's gradients are added into the host
accumulators in its backward (:meth:`KVStore.grad_at`). Linear-attention states are a few
hundred KB per part boundary and stay on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treeprep.errors import TreeprepError
from treeprep.modes import Accumulate
from treeprep.trainer.attention.stream import HostSegment, StreamedPrefix, rows_to_device
from treeprep.trainer.parts.host import HostPool


def check_accumulate(accumulate: str) -> None:
    """Refuse an unknown hand-off accumulation (:class:`treeprep.modes.Accumulate`)."""
    Accumulate.of(accumulate, "hand-off accumulation", TreeprepError)


def accumulator_dtype(dtype: torch.dtype, accumulate: str) -> torch.dtype:
    """The dtype of the gradient accumulator of a stored tensor of ``dtype``."""
    check_accumulate(accumulate)
    if accumulate == "float32" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


#: adds a key/value block's gradients (dk_BGSD, dv_BGSD) to the store it was read from
GradInto = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass
class KVStore:
    """A part's stored keys and values for one layer and their gradient accumulators.

    ``rows`` are the part's local rows kept (sorted), or None when all are kept."""

    k: torch.Tensor  # [1, G, S, D], detached
    v: torch.Tensor
    rows: np.ndarray | None
    accumulate: str = "model"
    gk: torch.Tensor | None = None
    gv: torch.Tensor | None = None
    #: whether the part's graph keys / values need a gradient (no trainable parameter upstream
    #: of them, e.g. layer 0's keys from frozen weights under LoRA: False, and no accumulator)
    need: tuple[bool, bool] = (True, True)
    #: the host pool the store and its accumulators live in (``stores="host"``), or None
    pool: HostPool | None = None

    def _accumulator(self, t: torch.Tensor) -> torch.Tensor:
        dtype = accumulator_dtype(t.dtype, self.accumulate)
        if self.pool is not None:
            return self.pool.zeros(t, dtype)
        return torch.zeros_like(t, dtype=dtype)

    def add_grad(self, s: int, e: int, gk: torch.Tensor | None, gv: torch.Tensor | None) -> None:
        """Add a descendant's gradient of stored rows ``[s, e)`` to the accumulators (only of
        the tensors that :attr:`need` it: the others' gradients go nowhere)."""
        if self.need[0] and gk is not None:
            if self.gk is None:
                self.gk = self._accumulator(self.k)
            self._add(self.gk[:, :, s:e], gk)
        if self.need[1] and gv is not None:
            if self.gv is None:
                self.gv = self._accumulator(self.v)
            self._add(self.gv[:, :, s:e], gv)

    def _add(self, acc: torch.Tensor, g: torch.Tensor) -> None:
        if self.pool is not None:  # a host accumulator: the pool's sink adds it off the path
            self.pool.sink.add(acc, g)
        else:
            acc.add_(g.to(acc.device))

    def grad_into(self, s: int) -> GradInto:
        """Where a block read from stored rows ``s, s + 1, ...`` sends its gradients directly
        (the fused block attention's backward, without autograd holding them)."""
        return lambda gk, gv: self.add_grad(s, s + int(gk.shape[2]), gk, gv)

    def grad_at(self, s: int) -> Callable[[int, torch.Tensor, torch.Tensor], None]:
        """Where a window read from stored rows ``s + a, ...`` sends its gradients, given ``a``
        (host stores: a device window's gradients, added on the host)."""
        return lambda a, gk, gv: self.add_grad(s + a, s + a + int(gk.shape[2]), gk, gv)

    def with_accumulated(
        self, which: int, g: torch.Tensor, rows: torch.Tensor | None
    ) -> torch.Tensor:
        """``g``, the gradient of the part's own keys (``which`` 0) or values (1) as its
        attention returns it, plus what its descendants accumulated on the stored rows."""
        acc = (self.gk, self.gv)[which]
        if acc is None:
            return g
        if self.pool is not None:
            self.pool.sink.flush()  # every add sent before this read has landed
            if g.device.type == "cuda":  # one asynchronous copy on the compute stream
                acc = rows_to_device(acc, g.device, True)
        acc = acc.to(device=g.device, dtype=g.dtype)
        return g + acc if rows is None else g.index_add(2, rows, acc)


class OwnStores:
    """Where a part's :class:`_OwnGradient` nodes find its stores when its backward runs
    (:attr:`states`, set just before it and cleared after). The nodes hold this, not the
    :class:`HandOff`: the exchange holds the nodes' root outputs, and a node's context that
    held the exchange would make a cycle the garbage collector cannot break (autograd nodes are
    not traversed), leaking every part's exchange and the stores it reads, step after step."""

    __slots__ = ("states",)

    def __init__(self) -> None:
        self.states: list[LayerState] | None = None


class _OwnGradient(torch.autograd.Function):
    """A layer's own keys and values on their way into attention, unchanged; the backward adds
    what the part's descendants accumulated on them (:meth:`KVStore.with_accumulated`, the store
    looked up when the backward runs: :class:`OwnStores`). The third output, a 0-dim zero, is a
    root of the part's backward, so the node runs even where no loss gradient comes through the
    attention (a part without targets). Nothing holds the keys and values for this: under
    activation checkpointing they are recomputed with the layer."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, key: torch.Tensor, value: torch.Tensor, own: OwnStores, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.own, ctx.layer = own, layer
        return key.view_as(key), value.view_as(value), key.new_zeros(())

    @staticmethod
    def backward(ctx: Any, gk: torch.Tensor, gv: torch.Tensor, _root: torch.Tensor) -> Any:  # type: ignore[override]
        sts = ctx.own.states
        st = sts[ctx.layer] if sts is not None else None
        if isinstance(st, KVStore):
            rows = None
            if st.rows is not None:
                rows = torch.as_tensor(st.rows, device=gk.device)
            gk, gv = st.with_accumulated(0, gk, rows), st.with_accumulated(1, gv, rows)
        return (
            gk if ctx.needs_input_grad[0] else None,
            gv if ctx.needs_input_grad[1] else None,
            None,
            None,
        )


class _ReadStore(torch.autograd.Function):
    """Rows ``[s, e)`` of a store as views; the backward adds their gradients to the store's
    accumulators and returns nothing (``anchor`` only puts the read on the autograd tape)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, anchor: torch.Tensor, store: KVStore, s: int, e: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.store, ctx.s, ctx.e = store, s, e
        return store.k[:, :, s:e], store.v[:, :, s:e]

    @staticmethod
    def backward(ctx: Any, gk: torch.Tensor | None, gv: torch.Tensor | None) -> Any:  # type: ignore[override]
        ctx.store.add_grad(ctx.s, ctx.e, gk, gv)
        return None, None, None, None


@dataclass
class LinearState:
    """A part's linear-attention states for one layer (detached), by the tree index of the last
    token of each node piece, plus the gradients descendants returned for them (accumulated in
    the states' dtype, or float32 under ``accumulate="float32"`` in 16-bit runs)."""

    states: dict[int, tuple[torch.Tensor, torch.Tensor]]
    accumulate: str = "model"
    grads: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def add_grad(self, key: int, gconv: torch.Tensor, grec: torch.Tensor) -> None:
        g = self.grads.get(key)
        conv, rec = self.states[key]
        if g is None:
            self.grads[key] = [
                gconv.to(accumulator_dtype(conv.dtype, self.accumulate), copy=True),
                grec.to(accumulator_dtype(rec.dtype, self.accumulate), copy=True),
            ]
        else:
            g[0] += gconv
            g[1] += grec

    def backward_pairs(self, ho: HandOff, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        own = ho.linear_own.get(layer, {})
        out = []
        for key, (gc, gr) in self.grads.items():
            conv, rec = own[key]
            out += [(conv, gc.to(conv.dtype)), (rec, gr.to(rec.dtype))]
        return out


LayerState = KVStore | LinearState
#: one run of a part's prefix: (producing part, first stored row, end stored row)
Segment = tuple[int, int, int]


def prefix_segments(
    sources: list[tuple[int, np.ndarray]], kept: dict[int, np.ndarray | None]
) -> list[Segment]:
    """A part's prefix as runs of its ancestors' stored rows, in path order.

    ``sources`` are (part, local rows) in prefix order (:class:`~.plan.PartSpec`); ``kept[p]`` the
    local rows part ``p`` stores (sorted), or None when it stores all of them."""
    out: list[Segment] = []
    for p, rows in sources:
        kp = kept[p]
        pos = rows if kp is None else np.searchsorted(kp, rows)
        if kp is not None and not np.array_equal(kp[pos], rows):
            raise RuntimeError(f"part {p} did not store a row a descendant reads")
        brk = np.flatnonzero(np.diff(pos) != 1) + 1
        for run in np.split(pos, brk):
            if len(run):
                out.append((p, int(run[0]), int(run[-1]) + 1))
    return out


def _recomputing() -> bool:
    """Whether this runs inside a backward: activation checkpointing recomputing a layer.

    The backward runs on the forward's graph (non-reentrant checkpointing only feeds it the
    recomputed saved tensors), so a layer's own keys and values stay those of the forward.
    Recording the recomputed ones instead kept each recomputed layer's tensors (its input
    norm, its projections) alive until the part ended: every layer's at once by the end of
    its backward (+17% of the peak, small-qwen3 in bf16 on an 8k path at budget 2048)."""
    return bool(torch._C._current_graph_task_id() != -1)


class HandOff:
    """One part's exchange: prefix segments in, own keys and values recorded (module doc).

    A plain class, not a dataclass: wrappers that rebuild dataclasses and dicts in a module's
    inputs (FSDP2) must hand every layer this very object, or the records would go to copies.

    With gradients on, a layer's reads of the stores go on the autograd tape when the layer asks
    for them (:meth:`exchange`), not all at once before the first layer: autograd runs a ready
    node in the order it was recorded, latest first, so reads recorded up front would run after
    every layer's backward, each holding its layer's prefix gradient until then (one more copy
    of the path's keys and values over all layers: about 13.5 GiB for Qwen3-1.7B on the
    126k-token Claude Code path, the memory model's shortfall on an H200). Recorded inside the
    layer, they run right after its attention's backward and add their gradients into the
    stores at once."""

    __slots__ = (
        "anchor",
        "keep_own",
        "linear_leaves",
        "linear_own",
        "linear_sources",
        "need",
        "own",
        "own_stores",
        "reads",
        "requires_grad",
        "roots",
        "stash",
        "host",
    )

    def __init__(
        self,
        reads: dict[int, tuple[tuple[KVStore, int, int], ...]],
        *,
        linear_sources: dict[int, list[tuple[int, LinearState]]] | None = None,
        requires_grad: bool = False,
    ) -> None:
        #: per layer, the part's prefix as (store, first row, end row) segments in path order
        self.reads = reads
        #: with gradients on, the leaf that puts each read on the autograd tape
        self.anchor: torch.Tensor | None = None
        #: per layer, the part's own keys and values as computed, for its stores: recorded in
        #: passes without gradients, and in passes with them only when ``keep_own`` (``keep``
        #: mode stores the rows of its graph pass); a pass whose own keys and values only need
        #: their descendants' gradients gets them through :class:`_OwnGradient` instead
        self.own: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.keep_own = not requires_grad
        #: per layer, whether the own keys and values need a gradient (no trainable parameter
        #: upstream of them: False)
        self.need: dict[int, tuple[bool, bool]] = {}
        #: with gradients on, the roots of the part's backward that reach each layer's
        #: :class:`_OwnGradient`
        self.roots: list[torch.Tensor] = []
        #: the part's own stores, for its backward (what descendants accumulated)
        self.own_stores = OwnStores()
        #: linear-attention layers: the ancestors' stored states (part, state) per layer
        self.linear_sources = linear_sources or {}
        #: linear-attention leaves made so far: (layer, key) -> (part, conv leaf, recurrent leaf)
        self.linear_leaves: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor]] = {}
        #: per layer, the part's own linear-attention states by key (graph tensors)
        self.linear_own: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.requires_grad = requires_grad
        #: host stores: turns a layer's own keys and values into what the part stores (its
        #: rows, detached, in the pool) as soon as it records them; None: recorded as computed
        self.stash: Callable[[int, torch.Tensor, torch.Tensor], tuple[Any, Any]] | None = None
        #: host stores: the prefix is streamed from the pool (a :class:`StreamedPrefix`)
        self.host = False

    def linear_state(self, layer: int, key: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state after tree token ``key`` for ``layer``, as leaves (made once per part)."""
        hit = self.linear_leaves.get((layer, key))
        if hit is None:
            for part, st in self.linear_sources.get(layer, []):
                if key in st.states:
                    conv, rec = st.states[key]
                    hit = (
                        part,
                        conv.detach().requires_grad_(self.requires_grad),
                        rec.detach().requires_grad_(self.requires_grad),
                    )
                    break
            else:
                raise RuntimeError(f"layer {layer}: no handed-over state after token {key}")
            self.linear_leaves[(layer, key)] = hit
        return hit[1], hit[2]

    def record_linear(
        self, layer: int, key: int, conv: torch.Tensor, recurrent: torch.Tensor
    ) -> None:
        own = self.linear_own.setdefault(layer, {})
        if key not in own or not _recomputing():
            own[key] = (conv, recurrent)

    def exchange(
        self, layer: int | None, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[
        torch.Tensor,
        torch.Tensor,
        tuple[tuple[torch.Tensor, torch.Tensor], ...] | StreamedPrefix | None,
        tuple[tuple[torch.Tensor, torch.Tensor, GradInto], ...] | None,
    ]:
        """Record the layer's own keys and values; return the keys and values for its attention
        (through :class:`_OwnGradient` when gradients are on), its prefix segments (views of
        the stores, read through :class:`_ReadStore` when gradients are on), and with gradients
        on the same as direct (view, where its gradients go) triples."""
        if layer is None:
            raise RuntimeError("hand-off parts need attention modules with a layer_idx")
        recomputing = _recomputing()
        if not recomputing:
            self.need[layer] = (key.requires_grad, value.requires_grad)
        if self.keep_own and (layer not in self.own or not recomputing):
            self.own[layer] = (key, value) if self.stash is None else self.stash(layer, key, value)
        if (
            self.requires_grad
            and torch.is_grad_enabled()
            and (key.requires_grad or value.requires_grad)
        ):
            key, value, root = _OwnGradient.apply(key, value, self.own_stores, layer)
            if not recomputing:
                self.roots.append(root)
        reads = self.reads.get(layer)
        if not reads:
            return key, value, None, None
        if self.host:
            return key, value, self._streamed(reads, key.device), None
        if not (self.requires_grad and torch.is_grad_enabled()):
            return key, value, tuple((st.k[:, :, s:e], st.v[:, :, s:e]) for st, s, e in reads), None
        if self.anchor is None:
            self.anchor = torch.empty(0, device=key.device, requires_grad=True)
        anchor = self.anchor
        segs = tuple(_ReadStore.apply(anchor, st, s, e) for st, s, e in reads)
        direct = tuple((st.k[:, :, s:e], st.v[:, :, s:e], st.grad_into(s)) for st, s, e in reads)
        return key, value, segs, direct  # type: ignore[return-value]

    def _streamed(
        self, reads: tuple[tuple[KVStore, int, int], ...], device: torch.device
    ) -> StreamedPrefix:
        """The prefix as host views of the stores, with where each run's gradients go when
        this pass has gradients (host stores)."""
        grad = self.requires_grad and torch.is_grad_enabled()
        if grad and self.anchor is None:
            self.anchor = torch.empty(0, device=device, requires_grad=True)
        segs = tuple(
            HostSegment(st.k[:, :, s:e], st.v[:, :, s:e], st.grad_at(s) if grad else None)
            for st, s, e in reads
        )
        return StreamedPrefix(segs, self.anchor if grad else None)

    @classmethod
    def gather(
        cls,
        states: dict[int, list[LayerState]],
        segments: list[Segment],
        layers: int,
        requires_grad: bool,
    ) -> HandOff:
        """The exchange of a part whose prefix is ``segments`` of the ancestors' ``states``
        (part -> per layer). Nothing is copied, nothing is read yet: each attention layer gets
        views of the stores when it calls :meth:`exchange`."""
        reads: dict[int, tuple[tuple[KVStore, int, int], ...]] = {}
        linear: dict[int, list[tuple[int, LinearState]]] = {}
        if segments:
            parts = list(dict.fromkeys(p for p, _, _ in segments))
            for li in range(layers):
                first = states[parts[0]][li]
                if isinstance(first, LinearState):
                    linear[li] = [(p, states[p][li]) for p in parts]  # type: ignore[misc]
                    continue
                row = []
                for p, s, e in segments:
                    st = states[p][li]
                    assert isinstance(st, KVStore)
                    row.append((st, s, e))
                reads[li] = tuple(row)
        return cls(reads, linear_sources=linear, requires_grad=requires_grad)

    def return_grads(self, states: dict[int, list[LayerState]]) -> None:
        """Add the linear-attention leaves' gradients to the producing parts' states (the keys'
        and values' gradients went to the stores during the backward already)."""
        for (li, key), (p, conv, rec) in self.linear_leaves.items():
            if conv.grad is None and rec.grad is None:
                continue
            gc = conv.grad if conv.grad is not None else torch.zeros_like(conv)
            gr = rec.grad if rec.grad is not None else torch.zeros_like(rec)
            st = states[p][li]
            assert isinstance(st, LinearState)
            st.add_grad(key, gc, gr)
