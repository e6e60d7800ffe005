"""Depth-first execution of a tree's hand-off parts: forward down, backward on the way up.

A tree whose tokens exceed the budget runs as parts (:mod:`.plan`). The schedule walks the part
tree depth-first, children in order:

* **enter** a part: run its forward. Its queries attend the handed-over keys and values of its
  prefix (leaf tensors gathered from the ancestors' stored states, :mod:`.state`) and its own
  tokens under the tree rule; its own keys and values are stored, detached, for its descendants;
* **leave** a part, once every descendant has run its backward: run its backward with its loss and
  the gradients its descendants accumulated on its keys and values,
  ``torch.autograd.backward([loss, k_0, v_0, ...], [1, gk_0, gv_0, ...])``, then scatter its own
  prefix leaves' gradients into its ancestors' accumulators.

A part without child parts runs forward and backward at once. Two modes for the others:

* ``keep``: the forward on entering builds the graph and keeps it until the part is left. No
  recomputation; memory holds the graphs of the parts on the current depth-first stack, as many
  as fit within the tree's longest path less one part (``keep_tokens``,
  :meth:`~.plan.PartLayout.kept_parts`): a part that would go over runs as in ``recompute``. The
  part's LM head runs its forward and backward at once, on a detached copy of the final hidden
  states, so only their gradient is kept with the graph (never the head's logits and
  log-softmax); the part's backward starts from that pair and its keys' and values' gradients.
* ``recompute`` (the default): the forward on entering runs without a graph and keeps only the
  keys and values; leaving recomputes the forward from the same inputs (tokens plus prefix
  leaves), exactly as activation checkpointing does, then runs the backward.

Memory bound (recompute): one part's activations (at most ``budget`` tokens) + what the parts on
the stack stored for their descendants (:mod:`.state`): only the rows of their keys and values
that a descendant reads (the rows on the descendants' paths), once, in the run's compute dtype,
and one gradient accumulator each; a descendant reads them in place. For agent trees (one long
main thread, short side branches) that is twice the K/V of the longest path; it never grows with
the number of branches. In keep mode a kept part stores every row (its graph holds them anyway)
and the kept graphs add to it: at most the longest path's tokens' graphs with the running part's,
what the linear trainer holds for that path, plus the hand-off state; recompute holds one part's.

Exactness. Every loss term lives in exactly one part (the part holding the target's predecessor)
with the tree's own restored coefficients, attention sees exactly the keys the whole tree would
show it, and the handed-over gradients are summed over every consumer before the producer's
backward, so the gradients equal the whole tree's to float rounding. Sequence-level objectives
(``gspo``) are not a sum over targets: a no-graph pre-pass computes every target's log-prob, the
derivative of the exact loss with respect to each log-prob is taken there, and each part then
back-propagates the linear surrogate ``sum_t g_t log p_t``, whose gradient is the loss's (an
entropy term is not a function of the targets' log-probs alone: each part adds its own share of
it to the surrogate).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from treeprep.errors import TreeprepError
from treeprep.modes import LOSS_FACTS, PartGraph, Stores, reads_prefix_in_place
from treeprep.schemas.parts import HEAD_ROWS
from treeprep.trainer.attention.backends import choose_backend
from treeprep.trainer.attention.mask import TreeMask
from treeprep.trainer.config import check_loss
from treeprep.trainer.context import context_slice, local_targets
from treeprep.trainer.models.guard import check_part_checkpointing
from treeprep.trainer.models.run import output_head, run_decoder
from treeprep.trainer.objective.loss import (
    LossConfig,
    check_inputs,
    head_logprobs,
    loss_from_hidden,
    objective,
)
from treeprep.trainer.parts.host import HostPool, use_host_stores
from treeprep.trainer.parts.plan import PartLayout, PartSpec, part_layout
from treeprep.trainer.parts.state import (
    HandOff,
    KVStore,
    LayerState,
    LinearState,
    check_accumulate,
    prefix_segments,
)


@dataclass
class PartsOutput:
    """The tree's loss (detached), metrics (detached tensors) and what was fed."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    parts: int = 0
    tokens_fed: int = 0
    prefix_rows: int = 0


def part_mask(
    batch: Any, spec: PartSpec, backend: str, handoff: HandOff | None, pad: int = 0
) -> TreeMask:
    """The :class:`TreeMask` of one part: its own rows after its prefix rows. ``pad`` rows of
    padding follow the part's own (context parallelism: a multiple of the group's size) as one
    more root piece whose node id is above every real one, as
    :func:`~treeprep.trainer.context.pad_batch` pads a micro-batch: no real query sees them."""
    dev = batch.input_ids.device
    a, b = spec.start, spec.end
    rows = torch.as_tensor(spec.prefix_rows, device=dev)
    own = torch.arange(a, b + pad, device=dev)  # padding's indices follow every real token's
    q_node = batch.token_node[a:b]
    last = batch.node_last.index_select(0, q_node)
    depth = batch.position_ids[a:b]
    pieces = (spec.piece_start, spec.piece_length, spec.piece_parent, spec.piece_prefix)
    if pad:
        pad_node = torch.full((pad,), batch.num_nodes, dtype=q_node.dtype, device=dev)
        q_node, last = torch.cat([q_node, pad_node]), torch.cat([last, pad_node])
        depth = torch.cat([depth, torch.arange(pad, dtype=depth.dtype, device=dev)])
        pieces = tuple(
            np.append(x, v) for x, v in zip(pieces, (spec.num_tokens, pad, -1, 0), strict=True)
        )  # type: ignore[assignment]
    pre_node = batch.token_node.index_select(0, rows)
    return TreeMask(
        q_node=q_node,
        q_index=own,
        k_node=torch.cat([pre_node, q_node]),
        k_last=torch.cat([batch.node_last.index_select(0, pre_node), last]),
        k_index=torch.cat([rows, own]),
        node_start=pieces[0],
        node_length=pieces[1],
        node_parent=pieces[2],
        node_prefix=pieces[3],
        backend=backend,
        prefix_len=len(spec.prefix_rows),
        handoff=handoff,
        q_depth=depth,
        k_depth=torch.cat([batch.position_ids.index_select(0, rows), depth]),
    )


def _walk(layout: PartLayout, enter: Callable[[int], bool], leave: Callable[[int], None]) -> None:
    """Depth-first over the part forest; ``leave`` runs after all descendants (iterative)."""
    roots = [p.index for p in layout.parts if p.parent < 0]
    stack: list[tuple[int, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        c, leaving = stack.pop()
        if leaving:
            leave(c)
            continue
        if enter(c):
            stack.append((c, True))
            stack.extend((k, False) for k in reversed(layout.children[c]))


class _Runner:
    """One tree's schedule: the stored hand-off states of the parts on the stack, the walk's
    steps (:meth:`enter` a part, :meth:`leave` it) and its sums (:meth:`run` walks it)."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch: Any,
        layout: PartLayout,
        cfg: LossConfig,
        attn: str,
        autocast: Any,
        *,
        keeps: np.ndarray | None = None,
        accumulate: str = "model",
        before_pass: Callable[[str], None] | None = None,
        pool: HostPool | None = None,
        context: Any = None,
        loss_scale: float = 1.0,
    ) -> None:
        self.model = model
        #: what the gradient is multiplied by (not the returned loss)
        self.loss_scale = loss_scale
        #: context parallelism (:class:`~treeprep.trainer.context.ContextGroup`): each part is
        #: padded to a multiple of the group's size, this rank runs its slice of the part's
        #: tokens and stores its heads' keys and values (None: the whole part, every head)
        self.context = context
        #: host stores: the pool every store and accumulator is allocated in (None: the device)
        self.pool = pool
        self.before_pass = before_pass
        self.batch = batch
        self.layout = layout
        self.cfg = cfg
        self.attn = attn
        self.autocast = autocast
        self.head = output_head(model)
        #: the dtype losses and log-probs are summed in: float64 in float64 runs, else float32
        #: (read from the head's parameters: a soft-capped or adapter-wrapped head has no .weight)
        head_dtype = next(self.head.parameters()).dtype
        self.sum_dtype = torch.float64 if head_dtype == torch.float64 else torch.float32
        # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
        self.layers = int(cast(Any, model).config.num_hidden_layers)
        self.targets = batch.targets()
        self.states: dict[int, list[LayerState]] = {}
        #: per part, the local rows some later part reads (what it stores, unless it keeps its
        #: graph)
        self.read_rows = layout.read_rows()
        #: per stored part, the local rows its stores hold (None: all of them)
        self.kept: dict[int, np.ndarray | None] = {}
        #: per part, whether it keeps its graph (``keep`` mode): its stores then hold every row,
        #: which the graph holds anyway; the others store only the rows later parts read
        self.keeps = np.zeros(len(layout.parts), dtype=bool) if keeps is None else keeps
        self.accumulate = accumulate
        #: the dtype keys and values are stored in: the autocast dtype in mixed-precision runs
        #: (attention computes in it; rotary and the key norm promote keys to float32 first),
        #: else the dtype the layer computed them in
        self.store_dtype: torch.dtype | None = None
        if autocast is not None:
            with autocast():
                self.store_dtype = torch.get_autocast_dtype(batch.input_ids.device.type)
        self.linear_coef: torch.Tensor | None = None  # gspo: d loss / d log p per target
        #: per layer, whether its keys and values need a gradient (:meth:`learn_need`)
        self.need: dict[int, tuple[bool, bool]] = {}
        #: the walk's sums: the tree's loss (detached) and metrics, over the parts left so far
        self.total = torch.zeros((), dtype=self.sum_dtype, device=batch.input_ids.device)
        self.metrics: dict[str, torch.Tensor] = {}
        #: per part on the stack that keeps its graph: its forward's (exchange, loss output,
        #: head pair), until it is left
        self.graphs: dict[int, tuple[HandOff, Any, Any]] = {}

    def run(self) -> PartsOutput:
        """The whole schedule: the gspo pre-pass if the loss needs it, then the depth-first walk
        with gradients (module docstring)."""
        if LOSS_FACTS[self.cfg.loss].sequence_ratio:
            self.linear_coef, pre = _gspo_coefficients(self)
            self.total = pre.pop("loss").to(self.sum_dtype)
            self.metrics.update(pre)
        _walk(self.layout, self.enter, self.leave)
        if self.pool is not None:
            self.pool.sink.flush()  # an add that failed says so in this step
        return PartsOutput(
            loss=self.total,
            metrics=self.metrics,
            parts=len(self.layout.parts),
            tokens_fed=int(self.batch.num_tokens),
            prefix_rows=self.layout.prefix_rows,
        )

    def enter(self, c: int) -> bool:
        """Enter part ``c``: a part without child parts runs forward and backward at once (and
        is not left); a part that keeps its graph runs its forward with it; any other runs it
        without. Either stores what its descendants read. Whether the walk goes into ``c``."""
        spec = self.layout.parts[c]
        if not self.layout.children[c]:
            if spec.target_select.any():
                self.finish(spec, *self.forward_head_first(spec, self.loss_scale))
            return False
        if self.keeps[c]:
            ho, out, hidden = self.forward_head_first(spec, self.loss_scale, keep_own=True)
            self.graphs[c] = (ho, out, hidden)
        else:
            with torch.no_grad():
                ho, _ = self.decode(spec, grad=False)
        self.store(c, ho)
        return True

    def leave(self, c: int) -> None:
        """Leave part ``c`` (every descendant has run its backward): its backward from its kept
        graph, or from a forward recomputed now, then free its stores."""
        spec = self.layout.parts[c]
        if c in self.graphs:
            self.finish(spec, *self.graphs.pop(c))
        else:
            self.finish(spec, *self.forward_head_first(spec, self.loss_scale))
        self.drop(c)

    def finish(
        self,
        spec: PartSpec,
        ho: HandOff,
        out: Any,
        hidden: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """Add the part's loss output to the sums, then run its :meth:`backward`."""
        if out is not None and not isinstance(out, torch.Tensor):
            self.total = self.total + out.loss.detach().to(self.sum_dtype)
            _add_metrics(self.metrics, out.metrics)
        self.backward(spec, ho, hidden)

    def decode(
        self, spec: PartSpec, grad: bool, keep_own: bool = False
    ) -> tuple[HandOff, torch.Tensor]:
        """The part's decoder pass: its hand-off exchange and final hidden states h_TE
        (``keep_own``: a pass with gradients whose own keys and values are stored after it)."""
        segs = prefix_segments(spec.sources, self.kept)
        ho = HandOff.gather(self.states, segs, self.layers, requires_grad=grad)
        ho.keep_own = ho.keep_own or keep_own
        streamed = self.pool is not None and len(spec.prefix_rows) > 0
        backend = choose_backend(
            self.batch.device,
            spec.num_tokens,
            self.attn,
            len(spec.prefix_rows) + spec.num_tokens,
            in_place=streamed,  # a backend whose fact says it reads host stores a window at a time
        )
        if self.pool is not None:  # the stores live in the host pool, the prefix is streamed
            ho.host = True
            ho.stash = lambda _li, k, v: self.stored(spec.index, k, v)
        pad = self.pad(spec)
        tm = part_mask(self.batch, spec, backend, ho, pad)
        a, b = spec.start, spec.end
        ids, pos = self.batch.input_ids[a:b], self.batch.position_ids[a:b]
        if self.context is not None:
            ids, pos = context_slice(ids, pos, pad, self.context)
        if self.before_pass is not None:
            self.before_pass("forward")
        with torch.set_grad_enabled(grad), self.ctx():
            h = run_decoder(self.model, ids, pos, tm, context=self.context)
        if grad and not self.need:
            self.learn_need(ho)
        return ho, h

    def pad(self, spec: PartSpec) -> int:
        """Padding rows after the part's own: to a multiple of the context group's size."""
        return 0 if self.context is None else -spec.num_tokens % self.context.size

    def learn_need(self, ho: HandOff) -> None:
        """Which layers' keys and values need a gradient, from the first forward with a graph
        (the same for every part): a store of one that needs none keeps no accumulator."""
        self.need = dict(ho.need)
        for sts in self.states.values():
            for li, st in enumerate(sts):
                if isinstance(st, KVStore):
                    st.need = self.need.get(li, st.need)

    def ctx(self) -> Any:
        return self.autocast() if self.autocast is not None else contextlib.nullcontext()

    def forward_head_first(
        self, spec: PartSpec, scale: float, keep_own: bool = False
    ) -> tuple[HandOff, Any, Any]:
        """A part's forward with a graph, its LM head run forward and backward at once:
        :meth:`decode`, then the part's loss on a detached copy of h_TE,
        :data:`~treeprep.schemas.parts.HEAD_ROWS` targets at a time, each chunk's loss
        back-propagated at once through the head (its parameters' gradients land in ``.grad``
        now; a chunk's logits and log-softmax are freed before the next chunk runs, never held
        with the graph). Returns the exchange, the loss output (detached, summed over the
        chunks) and (h_TE, its gradient): the pair the part's backward starts from instead of
        the loss. ``keep_own``: as in :meth:`decode`."""
        ho, h = self.decode(spec, grad=True, keep_own=keep_own)
        if not spec.target_select.any():
            return ho, None, None
        leaf = h.detach().requires_grad_(True)
        picked = np.flatnonzero(spec.target_select)
        outs = []
        n = HEAD_ROWS  # read at each call (the tests make it small)
        for i in range(0, len(picked), n):
            sel = np.zeros_like(spec.target_select)
            sel[picked[i : i + n]] = True
            out = self.part_loss(
                replace(spec, target_select=sel, target_pred=spec.target_pred[i : i + n]), leaf
            )
            if out is None:  # no target of this chunk is this rank's (context parallelism)
                continue
            loss = out if isinstance(out, torch.Tensor) else out.loss
            if loss.requires_grad:
                torch.autograd.backward([loss], [torch.full_like(loss, scale)])
            outs.append(_detached(out))
        pair = (h, leaf.grad) if leaf.grad is not None else None
        if pair is None and self.context is not None:
            # a rank without targets of its own back-propagates zeros: every rank of the group
            # runs every layer's exchanges in the backward, so the collectives pair up
            pair = (h, torch.zeros_like(h))
        return ho, (_summed(outs) if outs else None), pair

    def part_loss(self, spec: PartSpec, h: torch.Tensor) -> Any:
        """The part's share of the loss from its hidden states, with a graph (None without
        targets)."""
        out: Any = None
        if spec.target_select.any():
            t = self.targets.select(spec.target_select, spec.target_pred)
            if self.context is not None:  # the targets whose predecessor is in this rank's slice
                t = local_targets(t, *self.context.slice(spec.num_tokens + self.pad(spec)))
                if not t.num_targets:
                    return None
            with torch.enable_grad(), self.ctx():
                if self.linear_coef is not None:
                    ent_c = self.cfg.entropy_coef
                    lp, ent = head_logprobs(
                        self.head, h, t, entropy=ent_c != 0.0, chunk=self.cfg.chunk
                    )
                    sel = torch.as_tensor(spec.target_select, device=h.device)
                    out = (self.linear_coef[sel].to(lp.dtype) * lp).sum()
                    if ent_c:
                        out = out - ent_c * (t.weight.to(lp.dtype) * ent).sum()
                else:
                    out = loss_from_hidden(self.head, h, t, self.cfg)
        return out

    def stored_rows(self, c: int) -> np.ndarray | None:
        """The local rows part ``c`` stores: those its descendants read (None: all of them, when
        it keeps its graph or they read all)."""
        rows: np.ndarray | None = self.read_rows[c]
        spec = self.layout.parts[c]
        if self.keeps[c] or rows is None or len(rows) == spec.num_tokens:
            # all of the part's rows; a padded part names them, leaving its padding out
            return np.arange(spec.num_tokens) if self.pad(spec) else None
        return rows

    def stored(self, c: int, k: torch.Tensor, v: torch.Tensor) -> tuple[Any, Any]:
        """Part ``c``'s keys and values of one layer as it stores them: detached, in the store
        dtype, its stored rows only, and in the host pool under host stores."""
        k, v = k.detach(), v.detach()
        if self.store_dtype is not None:
            k, v = k.to(self.store_dtype), v.to(self.store_dtype)
        rows = self.stored_rows(c)
        if rows is not None:
            idx = torch.as_tensor(rows, device=k.device)
            k, v = k.index_select(2, idx), v.index_select(2, idx)
        if self.pool is not None:
            k, v = self.pool.copy_in(k), self.pool.copy_in(v)
        return k, v

    def store(self, c: int, ho: HandOff) -> None:
        """Keep what part ``c``'s descendants read: the rows of its keys and values on their
        paths (all rows when it keeps its graph, or when they read all), and its linear states.
        Under host stores the exchange stored each layer's already (:attr:`HandOff.stash`)."""
        rows = self.stored_rows(c)
        st: list[LayerState] = []
        for li in range(self.layers):
            if li in ho.own:
                own = ho.own[li]
                k, v = own if ho.stash is not None else self.stored(c, *own)
                need = self.need.get(li, (True, True))
                st.append(KVStore(k, v, rows, self.accumulate, need=need, pool=self.pool))
            else:
                own = ho.linear_own.get(li, {})
                states = {key: (c_.detach(), r.detach()) for key, (c_, r) in own.items()}
                st.append(LinearState(states, self.accumulate))
        self.states[c] = st
        self.kept[c] = rows

    def drop(self, c: int) -> None:
        """Free part ``c``'s stores (every descendant has run its backward)."""
        del self.states[c]
        self.kept.pop(c, None)

    def backward(
        self, spec: PartSpec, ho: HandOff, hidden: tuple[torch.Tensor, torch.Tensor] | None
    ) -> None:
        """The part's backward from its hidden states and their gradient (``hidden``: its head
        ran its backward, scaled, in :meth:`forward_head_first`; None without targets), and from
        its own keys and values with what its descendants accumulated on them."""
        tensors: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        if hidden is not None and hidden[0].requires_grad:
            tensors.append(hidden[0])
            grads.append(hidden[1])
        st = self.states.get(spec.index)
        if st is not None:  # what the descendants accumulated on the part's own K/V goes in
            ho.own_stores.states = st  # at each layer's _OwnGradient, reached from these roots
            tensors += ho.roots
            grads += [torch.zeros_like(r) for r in ho.roots]
            for li, s in enumerate(st):
                if not isinstance(s, LinearState):
                    continue
                for t, g in s.backward_pairs(ho, li):
                    if t.requires_grad:  # else no trainable parameter is upstream of it
                        tensors.append(t)
                        grads.append(g)
        if tensors:
            if self.before_pass is not None:
                self.before_pass("backward")
            torch.autograd.backward(tensors, grads)
        ho.own_stores.states = None
        ho.roots.clear()
        ho.return_grads(self.states)


def _detached(out: Any) -> Any:
    """A part's loss output (a tensor, or a :class:`LossOutput`) without its graph."""
    if isinstance(out, torch.Tensor):
        return out.detach()
    return replace(out, loss=out.loss.detach(), token_logp=out.token_logp.detach())


def _summed(outs: list[Any]) -> Any:
    """One part's loss outputs over its head chunks as one: losses and metrics summed (every
    metric is a sum over targets, as parts add them), log-probs in target order."""
    if len(outs) == 1:
        return outs[0]
    if isinstance(outs[0], torch.Tensor):
        return torch.stack(outs).sum()
    metrics: dict[str, torch.Tensor] = {}
    for o in outs:
        _add_metrics(metrics, o.metrics)
    return replace(
        outs[0],
        loss=torch.stack([o.loss for o in outs]).sum(),
        token_logp=torch.cat([o.token_logp for o in outs]),
        metrics=metrics,
    )


def _add_metrics(into: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor]) -> None:
    """Add ``metrics`` into ``into`` key by key (every metric is a sum over targets)."""
    for k, v in metrics.items():
        into[k] = into[k] + v if k in into else v


def _gspo_coefficients(run: _Runner) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The no-graph pre-pass: every target's log-prob, then d loss / d log p (see module doc)."""
    t = run.targets
    dtype = run.sum_dtype
    lp_all = torch.zeros(t.num_targets, dtype=dtype, device=run.batch.device)
    ent_all = torch.zeros(t.num_targets, dtype=dtype, device=run.batch.device)
    parts = run.layout.parts

    def enter(c: int) -> bool:
        spec = parts[c]
        with torch.no_grad():
            ho, h = run.decode(spec, grad=False)
            if spec.target_select.any():
                ts = t.select(spec.target_select, spec.target_pred)
                with run.ctx():
                    lp, ent = head_logprobs(run.head, h, ts, chunk=min(run.cfg.chunk, HEAD_ROWS))
                sel = torch.as_tensor(spec.target_select, device=lp.device)
                lp_all[sel] = lp.to(dtype)
                ent_all[sel] = ent.to(dtype)
        if run.layout.children[c]:
            run.store(c, ho)
            return True
        return False

    _walk(run.layout, enter, run.drop)
    leaf = lp_all.detach().requires_grad_(True)
    # the entropy term is added by the parts themselves; its value (and metric) comes from here
    with torch.enable_grad():
        total, mets = objective(leaf, ent_all, t, replace(run.cfg, entropy_coef=0.0))
        (g,) = torch.autograd.grad(total, leaf)
    if run.cfg.entropy_coef:
        e = (t.weight.to(dtype) * ent_all).sum()
        total = total - run.cfg.entropy_coef * e
        mets["entropy"] = e
    mets["targets"] = torch.tensor(float(t.num_targets))
    return g, {"loss": total.detach(), **mets}


def _check_modes(mode: str, accumulate: str) -> None:
    PartGraph.of(mode, "part graph", TreeprepError)
    check_accumulate(accumulate)


def run_parts(
    model: torch.nn.Module,
    batch: Any,
    cfg: LossConfig,
    *,
    budget: int,
    mode: PartGraph | str = PartGraph.recompute,
    attn: str = "auto",
    autocast: Any = None,
    loss_scale: float = 1.0,
    accumulate: str = "model",
    keep_tokens: int | None = None,
    before_pass: Callable[[str], None] | None = None,
    stores: Stores | str = Stores.gpu,
    pool: HostPool | None = None,
    context: Any = None,
) -> PartsOutput:
    """Forward and backward of a one-tree batch as hand-off parts (gradients land in ``.grad``).

    ``loss_scale`` multiplies the gradient (not the returned loss), as a loop's world-size factor
    would; ``accumulate`` is the dtype of the handed-over gradients' accumulators ("model": the
    stored keys' own dtype; "float32": float32 in 16-bit runs). ``keep_tokens`` bounds the tokens
    whose graphs ``keep`` mode holds at once (default: the tree's longest path less one part,
    :func:`~treeprep.schemas.parts.keep_cap`). ``before_pass`` is called with
    ``"forward"`` right before each decoder forward and ``"backward"`` right before each backward
    (FSDP2 keeps ranks in lockstep through it). ``stores``: where the parts' stored keys and
    values and their accumulators live (:class:`~treeprep.modes.Stores`: gpu, the run's device;
    host, a host pool streamed a window at a time, ``pool`` or a new one; auto,
    :func:`~.host.use_host_stores`). ``context``: this rank's context group (``--cp``,
    :mod:`treeprep.trainer.context`): every rank of the group runs every part, its slice of the
    part's tokens and its heads' stores, and gets its share of the loss. See the module
    docstring for the order, the modes and the memory bound."""
    _check_modes(mode, accumulate)
    if context is not None:
        check_loss(cfg.loss, context.size)
    stores = Stores.of(stores, "stores", TreeprepError)
    if stores != "gpu" and not reads_prefix_in_place(attn):
        raise TreeprepError(
            f"stores={stores} reads the prefix from host memory a window at a time with the "
            f"nodes backend; attention backend {attn!r} attends a joined prefix (use auto or nodes)"
        )
    if keep_tokens is not None and keep_tokens < 0:
        raise TreeprepError(f"keep_tokens must be >= 0, got {keep_tokens}")
    check_part_checkpointing(model)
    layout = part_layout(batch, budget, getattr(batch, "part_cuts", None))
    keeps = layout.kept_parts(keep_tokens) if mode == "keep" else None
    runner = _Runner(model, batch, layout, cfg, attn, autocast, keeps=keeps,
                     accumulate=accumulate, before_pass=before_pass, context=context,
                     loss_scale=loss_scale)  # fmt: skip
    if use_host_stores(stores, runner):
        runner.pool = pool if pool is not None else HostPool(batch.input_ids.device)
    check_inputs(batch, cfg)
    return runner.run()


__all__ = ["PartsOutput", "part_mask", "run_parts"]
