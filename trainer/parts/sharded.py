"""FSDP2 through a step with hand-off parts (:class:`ShardedHandOff`): every rank runs the same
sequence of forward and backward passes (:func:`next_pass`), so the per-layer gathers and
reduce-scatters stay in lockstep while the parameters stay sharded.

Split out of :mod:`treeprep.trainer.distributed`, which sets up the process group and wraps the
model; this module is the step's schedule under FSDP2.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from treeprep.errors import TreeprepError
from treeprep.trainer.distributed import DistInfo

FORWARD, BACKWARD, DONE = 0, 1, 2
_PASS = {"forward": FORWARD, "backward": BACKWARD}


def next_pass(wants: list[list[int]]) -> int:
    """The pass every rank runs next, from each rank's ``[wanted pass, holds a null graph]``:
    a forward if any rank wants one; else, when a rank that is done holds no null graph to
    back-propagate, a (null) forward for everyone; else a backward; ``DONE`` once all are."""
    kinds = [k for k, _ in wants]
    if FORWARD in kinds:
        return FORWARD
    if all(k == DONE for k in kinds):
        return DONE
    if any(k == DONE and not kept for k, kept in wants):
        return FORWARD
    return BACKWARD


class ShardedHandOff:
    """FSDP2 through a step with hand-off parts, parameters staying sharded (one per run).

    Every forward of a part gathers each decoder layer's parameters in the layer's pre-forward
    and frees them in its post-forward; every backward gathers them again layer by layer and
    reduce-scatters the layer's gradient before freeing it, exactly as an ordinary FSDP2 step
    does. What differs from an ordinary step:

    * **Ranks in lockstep.** A tree's parts run a data-dependent sequence of forward and backward
      passes (depth-first, a no-grad forward on the way down in ``recompute`` mode, several
      backward passes per micro-batch), different on each rank. FSDP2's collectives pair up by
      order, and a forward's all-gathers and a backward's all-gathers have the same sizes, so the
      ranks must run the same *sequence* of passes, not only the same number. Before each pass
      (:meth:`before_pass`, which :func:`~treeprep.trainer.parts.run_parts` calls) the ranks
      exchange what they want next; forwards go first; a rank that wants something else runs a
      null pass of the same kind meanwhile (a one-token null batch through the root: a forward
      whose graph is kept, or the backward of such a graph with a zero loss). No rank has to
      back-propagate a null graph it lacks: when a rank that is done holds none, every rank
      first runs a null forward. At the end (:meth:`finish`) every rank pads until all are done.
    * **One layer at a time, no prefetch.** A backward whose only roots are a part's keys and
      values (a part without targets) never reaches the last layer's output, where FSDP2 hooks
      its pre-backward gather; every parametrised submodule's output gathers its layer instead,
      on its first gradient. Such a backward must issue the same collectives in the same order
      as one with a loss, so each layer prefetches only itself (a no-op): with FSDP2's default
      backward prefetch, the layer below is gathered before the reduce-scatter of the layer
      above in one case and after it in the other, and two gloo ranks deadlock (seen). It also
      keeps one layer's full parameters per rank, not two (besides the all-gather output of the
      layer running its forward, which FSDP2 frees at the layer's post-forward, as in any step).
      A backward that does not reach every layer (keys and values of some layers only) would
      reorder the collectives; it raises after the fact rather than let shards pair up wrongly.
    * **Gradients reduce-scattered per backward.** The layers reduce-scatter (and average) after
      every backward, into their sharded gradients, which accumulate across the step; unused
      parameters count as zeros (``set_reduce_scatter_unused_params``) so that every backward
      reduce-scatters the same tensors on every rank. The root (embeddings, final norm, LM head)
      is gathered once for the step, accumulates unsharded and unsynced, and is reduce-scattered
      by one synced null pass at the end, then resharded.
    """

    def __init__(self, wrapped: torch.nn.Module, null_batch: Any, info: DistInfo) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.root: Any = wrapped
        self.null_batch = null_batch
        self.info = info
        self.layers: list[Any] = [
            m for m in wrapped.modules() if isinstance(m, FSDPModule) and m is not wrapped
        ]
        self.initialised = False
        self.null_passes = 0
        self.passes = 0
        self._graphs: list[torch.Tensor] = []  # null forwards not yet back-propagated
        self._hooks: list[Any] = []
        #: what :meth:`_restore` puts back besides the hooks
        self._restores: list[Any] = []
        self._busy = False
        self._reached: set[int] = set()
        self._in_backward = False

    @contextlib.contextmanager
    def step(self) -> Iterator[ShardedHandOff]:
        """Configure FSDP2 for the step, yield, then pad, reduce the root and restore."""
        self._begin()
        try:
            yield self
            self.finish()
        finally:
            self._restore()

    def _begin(self) -> None:
        if not self.initialised:
            # FSDP2's lazy initialisation belongs to the root's first forward
            with torch.no_grad():
                self.root(self.null_batch)
            self.initialised = True
        self.root.set_requires_gradient_sync(False, recurse=False)
        self.root.set_reshard_after_backward(False, recurse=False)
        self.root.unshard()
        for i, layer in enumerate(self.layers):
            layer.set_requires_gradient_sync(True, recurse=False)
            layer.set_reduce_scatter_unused_params(True, recurse=False)
            layer.set_modules_to_backward_prefetch([layer])
            for m in layer.modules():
                if next(m.parameters(recurse=False), None) is not None:
                    self._hooks.append(m.register_forward_hook(self._gather_on_grad(i, layer)))
            self._gather_before_recompute(i, layer)

    def _gather_on_grad(self, index: int, layer: Any) -> Any:
        def tensor_hook(grad: torch.Tensor) -> None:
            self._reached.add(index)
            layer.unshard()

        def forward_hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(tensor_hook)

        return forward_hook

    def _gather_before_recompute(self, index: int, layer: Any) -> None:
        """Under activation checkpointing, gather the layer before the backward recomputes it.
        transformers checkpoints the layer's ``forward``, so FSDP2's hooks stay outside; a
        backward that enters the layer at its keys and values (a part's handed-over gradients)
        recomputes it before any gradient reaches a submodule's output, with its parameters
        still sharded. The layer's checkpoint function is wrapped for the step: the recomputed
        forward (run inside a backward) gathers the layer first."""
        fn = getattr(layer, "_gradient_checkpointing_func", None)
        if fn is None:
            return

        def gather() -> None:
            self._reached.add(index)
            layer.unshard()

        # a partial with the function's own keywords: the part guard reads use_reentrant there
        keywords = dict(getattr(fn, "keywords", None) or {})
        layer._gradient_checkpointing_func = functools.partial(
            _gathering_checkpoint, fn, gather, **keywords
        )
        self._restores.append(lambda: setattr(layer, "_gradient_checkpointing_func", fn))

    def before_pass(self, kind: str) -> None:
        """Wait (running null passes) until every rank runs a pass of this ``kind``."""
        self._check_reach()
        self._want(_PASS[kind])
        self.passes += 1
        self._in_backward = kind == "backward"

    def _check_reach(self) -> None:
        if self._in_backward and len(self._reached) != len(self.layers):
            raise TreeprepError(
                f"rank {self.info.rank}: a hand-off backward reached {len(self._reached)} of "
                f"{len(self.layers)} decoder layers; sharded FSDP2 needs every backward to reach "
                "every layer (the ranks' gathers would not pair up). Use --parallel ddp"
            )
        self._reached.clear()
        self._in_backward = False

    def _want(self, kind: int) -> None:
        if self._busy:
            return
        while (agreed := self._agree(kind)) != kind:
            self._null_pass(agreed)

    def _agree(self, kind: int) -> int:
        dev = self.info.device if self.info.device.type == "cuda" else torch.device("cpu")
        mine = torch.tensor([kind, int(bool(self._graphs))], dtype=torch.int64, device=dev)
        rows = [torch.empty_like(mine) for _ in range(self.info.world_size)]
        dist.all_gather(rows, mine)
        return next_pass(torch.stack(rows).tolist())

    def _null_pass(self, kind: int) -> None:
        self._busy = True
        try:
            if kind == FORWARD:
                with torch.enable_grad():
                    loss, _ = self.root(self.null_batch)
                self._graphs.append(loss)
            else:
                self._reached.clear()
                (self._graphs.pop() * 0.0).backward()
                self._in_backward = True
                self._check_reach()
        finally:
            self._busy = False
        self.null_passes += 1

    def finish(self) -> None:
        """Pad until every rank is done, then reduce-scatter the root's gradients (one synced
        null pass on every rank) and reshard the root."""
        self._check_reach()
        self._want(DONE)
        self._graphs.clear()
        self.root.set_requires_gradient_sync(True, recurse=False)
        self._null_pass(FORWARD)
        self._null_pass(BACKWARD)
        self.root.reshard()

    def _restore(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for undo in self._restores:
            undo()
        self._restores.clear()
        self._graphs.clear()
        self._reached.clear()
        self._in_backward = False
        self.root.set_requires_gradient_sync(True, recurse=False)
        self.root.set_reshard_after_backward(True, recurse=False)
        for layer in self.layers:
            layer.set_reduce_scatter_unused_params(False, recurse=False)
            layer.set_modules_to_backward_prefetch([])


def _gathering_checkpoint(
    checkpoint: Any, gather: Any, forward: Any, *args: Any, **kwargs: Any
) -> Any:
    """``checkpoint(forward, ...)`` whose recompute (``forward`` run inside a backward) calls
    ``gather`` first (:meth:`ShardedHandOff._gather_before_recompute`)."""

    def gathered(*a: Any, **kw: Any) -> Any:
        if torch._C._current_graph_task_id() != -1:
            gather()
        return forward(*a, **kw)

    return checkpoint(gathered, *args, **kwargs)
