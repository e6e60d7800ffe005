"""Data parallelism applied from outside the model: process groups, DDP, FSDP2, collectives.

The model code (``models/``, ``loss.py``) is written for one device; this module is the only
place that knows about ranks (torchtitan's split). The loop wraps one :class:`LossModule` (the
Hugging Face model plus the loss, so that the wrapper's ``forward`` is the whole forward pass) in
either

* ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel`; gradients are averaged across ranks
  on the last micro-batch of a step (``no_sync`` on the others), or
* ``fsdp``: FSDP2 ``fully_shard``, applied to every decoder layer and then to the root (embeddings,
  final norm and LM head stay in the root group, which unshards in the root's forward, where the
  loss also runs the LM head); ``set_requires_gradient_sync(False)`` on all but the last
  micro-batch of a step.

Both average gradients over ranks. The loop multiplies each rank's loss by the world size, so
the update is the gradient of the *sum* of the ranks' losses: with the global normalizers of
:mod:`treeprep.trainer.plan_batches` that sum is the linearized loss of the step's global batch,
the same one a single process computes when it runs every rank's micro-batches itself.

Processes come from ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
in the environment) or from a test that spawns them and sets the same variables. The backend is
NCCL on CUDA and gloo on CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from treeprep.errors import TreeprepError

Parallel = Literal["ddp", "fsdp"]
PARALLEL: tuple[str, ...] = ("ddp", "fsdp")


@dataclass
class DistInfo:
    """Where this process stands: its rank, the world size and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    #: this module created the process group (and so destroys it)
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``auto`` is the local CUDA device when there is one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TreeprepError("device cuda asked for, but torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group described by the environment (torchrun), or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = resolve_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
        owns = True
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local, dev, owns)


def shutdown(info: DistInfo) -> None:
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


class LossModule(torch.nn.Module):
    """The Hugging Face causal LM and the tree loss as one module: ``forward(batch) -> (loss,
    metrics)``. Wrappers (DDP, FSDP2) see the whole forward pass through it."""

    def __init__(self, lm: torch.nn.Module, loss_kw: dict[str, Any], autocast: Any = None):
        super().__init__()
        self.lm = lm
        self.loss_kw = dict(loss_kw)
        self.autocast = autocast

    def forward(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        from treeprep.trainer.loss import tree_loss

        ctx = self.autocast() if self.autocast is not None else contextlib.nullcontext()
        with ctx:
            out = tree_loss(self.lm, batch, **self.loss_kw)
        loss = out.loss if out.loss.dtype == torch.float64 else out.loss.float()
        return loss, out.metrics


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    layers = getattr(lm.get_decoder(), "layers", None)
    if layers is None:
        raise TreeprepError(f"{type(lm).__name__}: no decoder.layers to shard")
    return list(layers)


def wrap(module: LossModule, info: DistInfo, parallel: str) -> torch.nn.Module:
    """Apply DDP or FSDP2 to ``module`` (returned unchanged in a single process)."""
    if parallel not in PARALLEL:
        raise TreeprepError(f"unknown parallelism {parallel!r}; expected ddp or fsdp")
    if not info.distributed:
        return module
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(module, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(module.lm):
        fully_shard(layer)
    fully_shard(module)
    return module


def unwrap(wrapped: torch.nn.Module) -> LossModule:
    inner = getattr(wrapped, "module", wrapped)
    assert isinstance(inner, LossModule)
    return inner


@contextlib.contextmanager
def grad_sync(wrapped: torch.nn.Module, parallel: str, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP2) unless ``enabled``: the
    micro-batches of a step accumulate locally and only the last one synchronises."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(wrapped, DDP):
        if enabled:
            yield
        else:
            with wrapped.no_sync():
                yield
        return
    if parallel == "fsdp" and hasattr(wrapped, "set_requires_gradient_sync"):
        wrapped.set_requires_gradient_sync(enabled)
        yield
        return
    yield


@contextlib.contextmanager
def fsdp_local(wrapped: torch.nn.Module, null_batch: Any) -> Iterator[None]:
    """FSDP2 for a step with hand-off parts (they run the decoder several times per micro-batch,
    a different number of times on each rank, so no collective may happen inside the step).

    A null forward through the root first (FSDP2's lazy initialisation belongs to the root), then
    every group unshards once and stays unsharded and unsynced while the step runs; afterwards
    resharding and gradient sync are turned back on and one synced null pass on every rank
    reduce-scatters the gradients accumulated meanwhile. Parameters are whole on each rank during
    such a step: the memory of DDP, not of FSDP."""
    from torch.distributed.fsdp import FSDPModule

    with torch.no_grad():
        wrapped(null_batch)
    mods = [m for m in wrapped.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
        m.set_requires_gradient_sync(False, recurse=False)
    for m in mods:
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)
            m.set_requires_gradient_sync(True, recurse=False)
    loss, _ = wrapped(null_batch)
    (loss * 0.0).backward()


def all_reduce_grads(params: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Average the local gradients over ranks in one flat buffer per dtype (what DDP does, after
    a step whose micro-batches ran without its hooks: hand-off parts back-propagate several times
    per micro-batch). Parameters without a gradient on this rank count as zeros."""
    if not info.distributed:
        return
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])  # type: ignore[union-attr]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= info.world_size
        off = 0
        for p in group:
            n = p.numel()
            p.grad.copy_(flat[off : off + n].view_as(p))  # type: ignore[union-attr]
            off += n


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum python floats over ranks (float64, on the CPU for gloo, on the device for NCCL)."""
    if not info.distributed:
        return list(values)
    dev = info.device if info.device.type == "cuda" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def full_model_state(wrapped: torch.nn.Module, parallel: str, info: DistInfo) -> dict | None:
    """The unsharded model state dict of the Hugging Face model on rank 0 (None elsewhere);
    every rank must call it under FSDP2 (it gathers)."""
    inner = unwrap(wrapped)
    if parallel == "fsdp" and info.distributed:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(inner.lm, options=opts)
        return sd if info.is_main else None
    return inner.lm.state_dict() if info.is_main else None


def full_optimizer_state(
    wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer, parallel: str, info: DistInfo
) -> dict | None:
    """The optimizer state on rank 0 (unsharded under FSDP2; every rank must call it)."""
    if parallel == "fsdp" and info.distributed:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_optimizer_state_dict(unwrap(wrapped), optimizer, options=opts)
        return sd if info.is_main else None
    return optimizer.state_dict() if info.is_main else None


def load_optimizer_state(
    wrapped: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    parallel: str,
    info: DistInfo,
) -> None:
    """Load a full (unsharded) optimizer state saved by :func:`full_optimizer_state`."""
    if parallel == "fsdp" and info.distributed:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(unwrap(wrapped), optimizer, state, options=opts)
        return
    optimizer.load_state_dict(state)
