"""Prefetch: the next step's micro-batches built in a background thread while the current one
runs (:class:`Prefetch`).

Building a step's batches is host work (pyarrow reads, numpy assembly, the
host-to-device copy); done on the critical path it leaves the device idle between steps. One
producer thread builds step k+1 while the main thread runs step k; torch ops and most of numpy
release the GIL, so the two overlap even in one process. The trade-offs it keeps:

* *Bounded*: the producer starts an item only once the consumer has taken the previous one, so
  at most one step's batches wait beside the running step's (memory: two steps' batches).
* *Deterministic*: one producer consumes the same iterator in the same order, and batch building
  reads no random state (the RNG state a checkpoint saves is untouched by it), so the batches and
  the whole run are bit-identical with ``prefetch`` off, where the same iterator runs inline.
* *Errors*: an exception of the producer (a bad shard, a damaged plan) is handed over and raised
  in the main thread when it asks for that item, the same exception object with its message.
* *Shutdown*: leaving the ``with`` block (the end, a ``break``, an error in the step) stops the
  producer and joins it, so no thread outlives :func:`~treeprep.trainer.run.loop.train`.
* *CUDA*: batches are assembled in pinned host memory and copied with ``non_blocking=True``
  (:mod:`treeprep.trainer.batch`) on the producer's current stream, the device's default stream,
  which the step's kernels also use: stream order makes every copy finish before a kernel reads
  it, and the caching host allocator keeps a pinned buffer until its copy is done. The copies are
  small next to the step; the overlap that matters is the host work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")

#: the name of the producer thread (tests look for it)
THREAD_NAME = "treeprep-prefetch"


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class Prefetch(Generic[T]):
    """Iterate ``source`` in a background thread, one item ahead (module docstring); with
    ``enabled=False`` the same items come from ``source`` inline. Use it as a context manager,
    which stops and joins the thread on the way out.

    >>> with Prefetch(iter(range(3))) as items:
    ...     list(items)
    [0, 1, 2]
    """

    def __init__(
        self, source: Iterator[T], *, enabled: bool = True, device: torch.device | None = None
    ) -> None:
        self._source = source
        self._enabled = enabled
        self._device = device
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._room = threading.Semaphore(1)  # the producer may build one item ahead
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = False

    def __enter__(self) -> Prefetch[T]:
        if self._enabled:
            self._thread = threading.Thread(target=self._produce, name=THREAD_NAME, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._thread is None:
            try:
                return next(self._source)
            except StopIteration:
                self._done = True
                raise
        item = self._items.get()
        self._room.release()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the producer (it finishes the item it is building, if any) and join it."""
        self._done = True
        if self._thread is not None:
            self._stop.set()
            self._room.release()  # wake a producer waiting for room
            self._thread.join()
            self._thread = None
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def _produce(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.set_device(self._device)  # the current device is per thread
        try:
            while True:
                self._room.acquire()
                if self._stop.is_set():
                    return
                try:
                    item = next(self._source)
                except StopIteration:
                    self._items.put(_END)
                    return
                self._items.put(item)
        except BaseException as e:  # handed to the consumer, raised there
            self._items.put(_Failed(e))
