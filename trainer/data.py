"""What the loop feeds: the build checked against the model, epoch plans, each step's
micro-batches, and the prefetch that builds the next step's batches while the current one runs.

* :func:`check_compatible` refuses shards built with another tokenizer than the model folder's
  own, or holding token ids outside the model's vocabulary.
* :class:`Epochs`: an epoch is a plan (:mod:`treeprep.trainer.plan_batches`): the one given with
  ``plan`` (the same order every epoch), or one made in memory with the packer and seed
  ``seed + epoch``; plans are made on first use and kept (they are small).
* :func:`step_work` walks the steps from a position (epoch, step in the epoch) the way the loop
  counts them, and builds each step's micro-batches for this process's ranks
  (:func:`~treeprep.trainer.plan_batches.step_batches`): read the shards, assemble every
  :class:`~treeprep.trainer.batch.TreeBatch`, copy it to the device. A step's micro-batches carry
  the step's *global* normalizers, so the sum of the micro-batch losses over all ranks is the
  linearized loss of the step's global batch.
* :class:`Prefetch` runs such an iterator in one background thread, one item ahead.

Prefetch design. Building a step's batches is host work (pyarrow reads, numpy assembly, the
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
  producer and joins it, so no thread outlives :func:`~treeprep.trainer.loop.train`.
* *CUDA*: batches are assembled in pinned host memory and copied with ``non_blocking=True``
  (:mod:`treeprep.trainer.batch`) on the producer's current stream, the device's default stream,
  which the step's kernels also use: stream order makes every copy finish before a kernel reads
  it, and the caching host allocator keeps a pinned buffer until its copy is done. The copies are
  small next to the step; the overlap that matters is the host work.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from treeprep.errors import ShardError, TrainingError
from treeprep.trainer.batch import TreeBatch
from treeprep.trainer.config import TrainConfig
from treeprep.trainer.models.presets import PRESETS
from treeprep.trainer.plan_batches import (
    BuildReader,
    EpochPlan,
    StepPlan,
    load_plan,
    make_plan,
    step_batches,
)

T = TypeVar("T")

#: the name of the producer thread (tests look for it)
THREAD_NAME = "treeprep-prefetch"


# --------------------------------------------------------------------------------------------
# the build against the model
# --------------------------------------------------------------------------------------------


def tokenizer_sha256(folder: str) -> str | None:
    """The identity hash :mod:`treeprep.render` records in a manifest, for a model folder's own
    tokenizer (None when the folder has no ``tokenizer.json``)."""
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return None
    from pathlib import Path

    from transformers import AutoTokenizer

    from treeprep.schemas.tokenizer import chat_template_of, folder_sha256

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainingError(f"{folder}: cannot load the model's tokenizer: {e}") from e
    template = chat_template_of(tok)
    if template is None:
        return None  # no chat template: the builds' identity cannot be compared; ids are checked
    return folder_sha256(Path(folder), template)


def check_compatible(reader: BuildReader, model_spec: str, vocab_size: int) -> None:
    """Refuse shards built with another tokenizer than the model folder's, or with token ids
    outside the model's vocabulary."""
    tok = reader.manifest.tokenizer
    if model_spec not in PRESETS and os.path.isdir(model_spec):
        sha = tokenizer_sha256(model_spec)
        if sha is not None and sha != tok.sha256:
            raise ShardError(
                f"{reader.out_dir}: shards were built with tokenizer {tok.name!r} (sha256 "
                f"{tok.sha256[:12]}), but the model folder {model_spec} has another tokenizer "
                f"(sha256 {sha[:12]}); rebuild with `treeprep build ... --tokenizer {model_spec}`"
            )
    top = reader.max_token_id()
    if top >= vocab_size:
        raise ShardError(
            f"{reader.out_dir}: token id {top} is outside the model's vocabulary ({vocab_size}); "
            f"the shards were built with tokenizer {tok.name!r} ({tok.vocab_size} tokens)"
        )


# --------------------------------------------------------------------------------------------
# epochs and steps
# --------------------------------------------------------------------------------------------


class Epochs:
    """Epoch plans, made on demand and kept (they are small)."""

    def __init__(self, cfg: TrainConfig, reader: BuildReader, world: int, cost: Any) -> None:
        self.cfg, self.reader, self.cost = cfg, reader, cost
        self._cache: dict[int, EpochPlan] = {}
        self.world = world

    def get(self, epoch: int) -> EpochPlan:
        p = self._cache.get(epoch)
        if p is None:
            if self.cfg.plan:
                p = self._cache.get(0) or load_plan(self.reader, self.cfg.plan)
            else:
                p = make_plan(
                    self.reader,
                    budget=self.cfg.budget,
                    world_size=self.world,
                    steps_of=self.cfg.steps_of,
                    seed=self.cfg.seed + epoch,
                    cost_model=self.cost,
                    cut=self.cfg.cut,
                )
            self._cache[epoch] = p
        return p


def step_plans(
    epochs: Epochs, epoch: int, epoch_step: int, count: int, max_epochs: int | None
) -> Iterator[tuple[int, int, EpochPlan, StepPlan]]:
    """Up to ``count`` steps from (``epoch``, ``epoch_step``), as (epoch, step in the epoch, the
    epoch's plan, the step), stopping before epoch ``max_epochs`` (None: no epoch limit)."""
    for _ in range(count):
        while True:
            if max_epochs is not None and epoch >= max_epochs:
                return
            plan = epochs.get(epoch)
            if epoch_step < len(plan.steps):
                break
            epoch, epoch_step = epoch + 1, 0
        yield epoch, epoch_step, plan, plan.steps[epoch_step]
        epoch_step += 1


@dataclass
class StepWork:
    """One optimizer step's input: where it sits in the data, and this process's micro-batches
    (``batches[i][m]``: micro-batch m of the i-th rank this process runs)."""

    epoch: int
    epoch_step: int
    epoch_steps: int  # steps in this epoch
    handoff: bool  # some micro-batch of the step, on any rank, runs as hand-off parts
    batches: list[list[TreeBatch]]


def step_work(
    cfg: TrainConfig,
    reader: BuildReader,
    epochs: Epochs,
    *,
    start: tuple[int, int],
    count: int,
    ranks: list[int],
    budget: int,
    device: torch.device,
) -> Iterator[StepWork]:
    """The steps :func:`step_plans` walks, each with its micro-batches built for ``ranks``."""
    for epoch, epoch_step, plan, sp in step_plans(epochs, *start, count, cfg.epochs):
        batches = step_batches(reader, sp, ranks=ranks, layout=cfg.layout, norm=cfg.norm,
                               adv_norm=cfg.adv_norm, budget=budget, device=device)  # fmt: skip
        handoff = any(p.handoff_cuts for p in sp.parts)
        yield StepWork(epoch, epoch_step, len(plan.steps), handoff, batches)


# --------------------------------------------------------------------------------------------
# prefetch
# --------------------------------------------------------------------------------------------


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
