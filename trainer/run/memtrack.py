"""The exact peak of live tensor bytes on the CPU, for memory benchmarks and tests.

RSS says little about a training step on the CPU: the allocator keeps freed pages, and the Python
heap and the libraries' code sit in it too. :class:`LiveBytes` is a ``TorchDispatchMode`` that
sees every tensor an operator returns, forward and backward, and counts each distinct storage
once, by its data pointer, from its first sighting until it is freed: a ``weakref.finalize`` on
the storage's Python object fires when the storage itself dies (torch preserves a storage's
Python object for as long as the storage lives). Views share their base's storage and are not
counted twice; an in-place operator allocates nothing. Tensors that exist before the mode is
entered (the model's parameters, the batch) are counted with :meth:`LiveBytes.track`.

Storages that :meth:`LiveBytes.exclude` names are never counted: a host pool's
(:class:`~treeprep.trainer.parts.host.HostPool`, the hand-off stores under ``stores="host"``),
which on the CPU lives in the same memory as everything else but stands for host RAM beside a
device; the pool makes each storage before any operator hands it out, so its bytes never enter
the count, not even for the operator that wraps it.

What it does not see: scratch buffers a kernel allocates and frees inside one operator (SDPA's
fused CPU kernel's blocks), and storages resized in place. Both are transient; the first makes
the figure a lower bound by at most one operator's workspace.

    with LiveBytes() as mem:
        mem.track(*model.parameters())
        loss = model(x).sum()
        loss.backward()
    mem.peak   # bytes
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Live and peak tensor bytes (all devices together) while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # data_ptr -> bytes
        self.current = 0
        self.peak = 0
        #: predicates on a storage's data pointer: storages that are not counted
        self._excluded: list[Callable[[int], bool]] = []

    def exclude(self, owns: Callable[[int], bool]) -> None:
        """Count no storage whose data pointer ``owns`` claims (e.g. ``HostPool.owns``)."""
        self._excluded.append(owns)

    def track(self, *tensors: Any) -> None:
        """Count tensors made outside the mode (and their ``.grad``), once each."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t)
                if t.grad is not None:
                    self._add(t.grad)

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak = self.current

    def _add(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or t.is_sparse:
            return
        st = t.untyped_storage()
        ptr, n = st.data_ptr(), st.nbytes()
        if n == 0 or ptr == 0 or ptr in self.live:
            return
        if any(owns(ptr) for owns in self._excluded):
            return
        self.live[ptr] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, ptr)

    def _free(self, ptr: int) -> None:
        n = self.live.pop(ptr, 0)
        self.current -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out
