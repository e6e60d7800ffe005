"""The host pool: where hand-off stores live under ``stores="host"``.

A long agent session is one long path, and a hand-off part's stores (:mod:`.state`) hold every
stored row of it for every attention layer: with ``stores="gpu"`` that is what makes the device
memory of a step grow with the session (28 GB of 40 GB for Qwen3-1.7B on the 126k-token Claude
Code path). With ``stores="host"`` the stores and their gradient accumulators are allocated here
instead, and the attention reads them a window of rows at a time
(:mod:`treeprep.trainer.attention.stream`): the device then holds one part's activations and
one window of one layer, whatever the path's length; the host holds the path.

* On CUDA the pool's tensors are pinned (page-locked), so that the windows' host-to-device copies
  run asynchronously on a side stream (PyTorch's caching host allocator reuses freed pinned
  blocks, so a part's stores do not pay ``cudaHostAlloc`` again).
* On the CPU the pool is a separate set of storages in the same memory: the trainer copies each
  window out of it as it would to a device, so the CPU runs the same code path, and the
  live-tensor counter (:class:`~treeprep.trainer.run.memtrack.LiveBytes`) leaves the pool out
  (:meth:`HostPool.owns`) and counts what a device would hold. Tests check that every store
  tensor is one of the pool's.

Layout. A store of ``S`` rows is allocated rows first, ``[S, G, D]``, and handed out as the
``[1, G, S, D]`` view the attention expects: a window of rows ``[a, b)`` is then one contiguous
block of memory, which a single asynchronous copy moves (a heads-first store would need one copy
per head, or a staging copy on the host).

A store the host cannot give (``DefaultCPUAllocator: can't allocate memory``, a failed
``cudaHostAlloc``) is :class:`HostPoolExhausted`, with the bytes asked and held: the trainer turns
it into one line naming the step and what to change (:class:`~treeprep.trainer.run.step.Stepper`).

Gradients. A window's key and value gradients are computed on the device, one window at a time,
and belong in the host accumulators. Copied back and added in place (``acc.add_(g.cpu())``),
each window's copy would wait for the device to finish all it was given (a host sync per window
and layer), and the device would idle while the host copied and added. :class:`GradSink` takes
them off that path: on CUDA each gradient is copied into a pinned staging buffer on a copy
stream of its own (after an event on the compute stream, and marked as used by that stream so
the caching allocator does not hand its memory out before the copy read it), and one worker
thread waits for each copy and adds it into its accumulator, in the order they were sent (the
same adds in the same order as the synchronous way: the same bits). At most
:data:`GRAD_DEPTH` gradients are in flight, so staging memory is bounded and a host slower
than the device holds the device back instead of piling up. A reader of an accumulator
(:meth:`KVStore.with_accumulated <treeprep.trainer.parts.state.KVStore.with_accumulated>`)
first waits for every add sent before it (:meth:`GradSink.flush`), as does the end of a step.
On the CPU the same worker adds the gradient tensors themselves (no copy): the CPU runs the
deferred adds and their flushes as a device does, so its tests cover them. ``grad_depth=0``
adds each gradient at once, synchronously (the way before, kept to measure the difference:
``bench/memory.py --stores host,host-sync``).

The pool counts its live bytes and their peak (``host_store_bytes`` in ``bench/memory.py``);
a storage leaves the count when it is freed (the stores of a part are dropped once every
descendant has run its backward).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from treeprep.errors import TrainingError
from treeprep.modes import Accumulate, Stores
from treeprep.schemas.parts import stored_rows_peak
from treeprep.trainer.attention.stream import copy_stream


class HostPoolExhausted(TrainingError):
    """The host would not give the pool a store's memory: ``asked`` bytes, with ``held`` bytes
    of stores live. The trainer names the step and what to change."""

    def __init__(self, asked: int, held: int) -> None:
        self.asked, self.held = asked, held
        gib = 1 << 30
        super().__init__(
            f"the host pool (--stores host) could not allocate {asked / gib:.2f} GiB of host "
            f"memory for this step's hand-off stores (holding {held / gib:.2f} GiB already: at "
            f"least {(asked + held) / gib:.2f} GiB needed)"
        )


#: gradients on their way into the host accumulators at once (:class:`GradSink`)
GRAD_DEPTH = 4


class GradSink:
    """Adds device gradients into host accumulators off the device's path (module docstring).

    ``depth``: gradients in flight at most; 0 adds each at once. ``pool``: where the pinned
    staging buffers are allocated (CUDA), counted with the stores."""

    def __init__(self, device: torch.device, depth: int, pool: HostPool) -> None:
        if depth < 0:
            raise ValueError(f"grad depth must be >= 0, got {depth}")
        self.device = device
        self.depth = depth
        self._pool = pool
        self._slots = threading.BoundedSemaphore(max(depth, 1))
        self._pending: deque[Future[None]] = deque()
        self._free: list[torch.Tensor] = []  # pinned uint8 staging buffers (CUDA)
        self._worker: ThreadPoolExecutor | None = None
        self._stream: Any = None

    def add(self, acc: torch.Tensor, g: torch.Tensor) -> None:
        """``acc.add_(g)``, ``acc`` a host accumulator view, ``g`` this run's gradient of it."""
        if self.depth == 0:
            acc.add_(g.to(acc.device))
            return
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()  # raises what an add raised
        self._slots.acquire()
        try:
            dst, src, buf, done = self._stage(acc, g)
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="treeprep-grads")
            self._pending.append(self._worker.submit(self._apply, dst, src, buf, done))
        except BaseException:
            self._slots.release()
            raise

    def flush(self) -> None:
        """Wait for every add sent so far (and raise what one raised)."""
        while self._pending:
            self._pending.popleft().result()

    def _stage(
        self, acc: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
        """What the worker adds, and into what: (the accumulator, the gradient where the worker
        can read it, its staging buffer or None, the event that says its copy is done or None).
        From CUDA both are laid rows first, ``[W, G, D]``, as the pool lays the accumulator out:
        the copy is one memcpy and the add a contiguous one."""
        if g.device.type != "cuda":
            return acc, g, None, None
        n = g.numel() * g.element_size()
        buf = next((b for b in self._free if b.numel() >= n), None)
        if buf is None:
            buf = self._pool.pinned_bytes(n)
        else:
            self._free.remove(buf)
        _, heads, rows, dim = g.shape
        staged = buf[:n].view(g.dtype).view(rows, heads, dim)
        main = torch.cuda.current_stream(g.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(g.device)
        ready = torch.cuda.Event()
        ready.record(main)
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            staged.copy_(g[0].transpose(0, 1), non_blocking=True)  # contiguous on the device first
            done = torch.cuda.Event()
            done.record(self._stream)
        g.record_stream(self._stream)
        return acc[0].transpose(0, 1), staged, buf, done

    def _apply(
        self, dst: torch.Tensor, src: torch.Tensor, buf: torch.Tensor | None, done: Any
    ) -> None:
        try:
            if done is not None:
                done.synchronize()
            dst.add_(src)
        finally:
            if buf is not None:
                self._free.append(buf)
            self._slots.release()


class HostPool:
    """Host storages for hand-off stores (module docstring); ``device``: the run's device (CUDA:
    pinned memory); ``grad_depth``: see :class:`GradSink`."""

    def __init__(self, device: torch.device | str = "cpu", *, grad_depth: int = GRAD_DEPTH) -> None:
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self._live: dict[int, int] = {}  # data_ptr -> bytes
        self.current = 0
        self.peak = 0
        #: where the windows' gradients go on their way into the accumulators
        self.sink = GradSink(self.device, grad_depth, self)

    def pinned_bytes(self, n: int) -> torch.Tensor:
        """A registered buffer of ``n`` pinned bytes (the gradient sink's staging)."""
        return self._allocate((n, 1, 1), torch.uint8).view(-1)

    def owns(self, ptr: int) -> bool:
        """Whether the storage at data pointer ``ptr`` is one of the pool's (live)."""
        return ptr in self._live

    def holds(self, t: torch.Tensor) -> bool:
        """Whether tensor ``t`` (or the tensor it is a view of) lives in the pool."""
        return t.device.type == "cpu" and self.owns(t.untyped_storage().data_ptr())

    def rows(self, rows: int, heads: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized store of ``rows`` rows: [1, heads, rows, dim], rows-first in memory.
        Raises :class:`HostPoolExhausted` (with the bytes asked and held) when the host cannot
        give the memory."""
        shape = (rows, heads, dim)
        try:
            base = self._allocate(shape, dtype)
        except (RuntimeError, MemoryError) as e:  # DefaultCPUAllocator, cudaHostAlloc
            n = rows * heads * dim * dtype.itemsize
            raise HostPoolExhausted(n, self.current) from e
        return base.permute(1, 0, 2).unsqueeze(0)

    def _allocate(self, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
        """A registered ``[S, G, D]`` tensor of the pool (pinned on CUDA)."""
        rows, heads, dim = shape
        if self.pin:
            base = torch.empty(shape, dtype=dtype, pin_memory=True)
            self._register(base.untyped_storage())
            return base
        n = rows * heads * dim * dtype.itemsize
        # the storage first, registered before any operator hands it out (LiveBytes)
        st = torch.UntypedStorage(max(n, 1))
        self._register(st)
        return torch.empty(0, dtype=dtype).set_(st, 0, shape, (heads * dim, dim, 1))

    def zeros(self, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A zeroed store shaped as ``like`` ([1, G, S, D]) in ``dtype`` (default ``like``'s)."""
        _, g, s, d = like.shape
        out = self.rows(s, g, d, like.dtype if dtype is None else dtype)
        return out.zero_()

    def copy_in(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A pool copy of ``t`` ([1, G, S, D], any device), cast to ``dtype``.

        From CUDA the rows are cast and laid rows first on the device, then moved by one
        asynchronous copy on the stream the windows are read back on
        (:func:`~treeprep.trainer.attention.stream.copy_stream`), after the compute stream's work
        so far: a window read on that stream sees its store whole, and the compute stream never
        waits. (A plain ``copy_`` into the rows-first view went through a pageable temporary of
        the heads-first layout: a host sync per layer and part, and a strided copy on the
        host.)"""
        _, g, s, d = t.shape
        dt = t.dtype if dtype is None else dtype
        out = self.rows(s, g, d, dt)
        if t.device.type != "cuda":
            return out.copy_(t)
        src = t[0].transpose(0, 1).to(dt).contiguous()  # [S, G, D], as the pool lays it out
        stream = copy_stream(t.device)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            out[0].transpose(0, 1).copy_(src, non_blocking=True)
        src.record_stream(stream)
        return out

    def _register(self, st: torch.UntypedStorage) -> None:
        ptr, n = st.data_ptr(), st.nbytes()
        self._live[ptr] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, ptr)

    def _free(self, ptr: int) -> None:
        self.current -= self._live.pop(ptr, 0)


def store_bytes_per_row(config: Any, dtype: torch.dtype, accumulate: str) -> int:
    """Bytes one stored row takes over the layers that hand keys and values over (all but the
    linear-attention ones): keys and values in ``dtype`` and an accumulator for each."""
    types = getattr(config, "layer_types", None) or []
    layers = int(config.num_hidden_layers) - sum(t == "linear_attention" for t in types)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    b = torch.empty((), dtype=dtype).element_size()
    acc = 4 if accumulate == Accumulate.float32 and b < 4 else b
    return layers * 2 * heads * int(dim) * (b + acc)


def use_host_stores(stores: Stores | str, run: Any) -> bool:
    """Whether a run's stores go to the host pool: ``host`` always, ``gpu`` never; ``auto`` on
    CUDA when this tree's stores at their largest (the most rows one stack of parts stores,
    :func:`~treeprep.schemas.parts.stored_rows_peak`) would take more than half the device's
    free memory (the rest is the parts' activations'), never on the CPU (no device memory to
    save: the host is the device). ``run``: the schedule's runner (model, batch, layout)."""
    if stores != Stores.auto:
        return stores == Stores.host
    dev = run.batch.input_ids.device
    if dev.type != "cuda":
        return False
    b = run.batch
    rows = stored_rows_peak(
        np.asarray(b.node_length.cpu()), np.asarray(b.node_parent.cpu()), run.layout.budget
    )
    dtype = run.store_dtype or next(run.model.parameters()).dtype
    need = rows * store_bytes_per_row(run.model.config, dtype, run.accumulate)
    free, _ = torch.cuda.mem_get_info(dev)
    return bool(need > free // 2)


__all__ = ["GRAD_DEPTH", "GradSink", "HostPool", "store_bytes_per_row", "use_host_stores"]
