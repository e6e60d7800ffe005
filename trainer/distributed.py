"""Data parallelism applied from outside the model: process groups, DDP, FSDP2, collectives.

The model code (``models/``, ``objective/``) is written for one device; this module is the only
place that knows about ranks (torchtitan's split), and it imports no other room of the trainer.
The loop wraps one :class:`~treeprep.trainer.run.step.LossModule` (the Hugging Face model plus
the loss, so that the wrapper's ``forward`` is the whole forward pass; this module knows only its
``lm``) in either

* ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel`; gradients are averaged across ranks
  on the last micro-batch of a step (``no_sync`` on the others), or
* ``fsdp``: FSDP2 ``fully_shard``, applied to every decoder layer and then to the root (embeddings,
  final norm and LM head stay in the root group, which unshards in the root's forward, where the
  loss also runs the LM head); every micro-batch reduce-scatters its gradients into the sharded
  ``.grad``: FSDP2 without the sync (``set_requires_gradient_sync(False)``) would keep every
  parameter's unsharded gradient until the step's last micro-batch, the whole model's per rank.
  A step with hand-off parts stays sharded too, its ranks running their passes in lockstep
  (:class:`~treeprep.trainer.parts.sharded.ShardedHandOff`).

Both average gradients over ranks. The loop multiplies each rank's loss by the world size, so
the update is the gradient of the *sum* of the ranks' losses: with the global normalizers of
:mod:`treeprep.trainer.data.steps` that sum is the linearized loss of the step's global batch,
the same one a single process computes when it runs every rank's micro-batches itself.

Processes come from ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
in the environment) or from a test that spawns them and sets the same variables. The backend is
NCCL on CUDA and gloo on CPU.

**A rank that dies.** A collective needs every rank; one killed (``kill -9``, out of memory, a
lost node) leaves the others in it. Gloo notices a peer whose connection closed (a process of
the same host that died) at once; a peer that stops answering without closing it (a hung
process, a host gone off the network) is waited for until the process group's timeout,
``TrainConfig.collective_timeout`` (``--collective-timeout``, default 600 s, which is also
NCCL's own default; torch's gloo default was 30 minutes). A survivor then fails with
:func:`rank_lost`'s :class:`~treeprep.errors.TrainingError`: which rank stopped answering (each
rank leaves its host and pid in the group's store at start-up, so a survivor on the same host
can tell which process is gone), the last whole checkpoint and ``--resume auto``. Nothing is
saved on the way out: a checkpoint is written by every rank together, atomically
(:mod:`treeprep.trainer.run.checkpoint`), so the one in flight stays a ``.tmp-*`` folder that
resuming ignores. Under torchrun the agent also sends the survivors SIGTERM once a worker exits;
:class:`~treeprep.trainer.run.preemption.StopSignals` takes it as a stop request, and after a
lost rank it ignores it, so the message is printed before the process exits (with status 1).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from treeprep.errors import TrainingError, TreeprepError
from treeprep.modes import Parallel


@dataclass
class DistInfo:
    """Where this process stands: its rank, the world size and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    #: this module created the process group (and so destroys it)
    owns_group: bool = False
    #: a collective failed (a rank was lost): the group is not destroyed on the way out
    broken: bool = False

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


def init_distributed(device: str = "auto", timeout: float | None = None) -> DistInfo:
    """Join the process group described by the environment (torchrun), or run alone.
    ``timeout``: the seconds a rank waits in a collective for the others (None: torch's
    default); each rank then leaves its host and pid in the group's store (:func:`rank_lost`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = resolve_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        wait = datetime.timedelta(seconds=timeout) if timeout else None
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=wait)
        owns = True
        _register(rank)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local, dev, owns)


def shutdown(info: DistInfo) -> None:
    """Destroy the process group this module created. Collect garbage first: FSDP2's modules
    and hooks from earlier wraps can still hold the group's pending work, and a group destroyed
    under them aborted the process at exit now and then ("terminate called without an active
    exception", 1 run in about 5 of tests/trainer/test_fsdp_parts.py)."""
    if info.owns_group and dist.is_initialized() and not info.broken:
        gc.collect()
        dist.destroy_process_group()


#: the store keys where each rank leaves ``host pid`` (:func:`rank_lost`)
_WHO = "treeprep/rank/{}"


def _register(rank: int) -> None:
    with contextlib.suppress(Exception):  # naming a lost rank is a nicety, never a failure
        store = dist.distributed_c10d._get_default_store()
        store.set(_WHO.format(rank), f"{socket.gethostname()} {os.getpid()}")


def collective_failed(e: BaseException) -> bool:
    """``e`` is a collective that failed because another rank is gone or did not answer in
    time (gloo's closed connection or timeout, NCCL's errors), not an error of this rank."""
    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and (
        "gloo/" in text or "NCCL" in text or "Connection closed by peer" in text
    )


def _process_state(pid: int) -> str | None:
    """``gone``, ``suspended`` or None (running, or unknown) of a process of this host."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except OSError:
            return None
        return None
    return {"Z": "gone", "X": "gone", "T": "suspended", "t": "suspended"}.get(state)


def silent_ranks(info: DistInfo) -> list[str]:
    """The other ranks whose process is gone or stopped, each as ``rank N (pid P, gone)``, as
    far as this rank can tell: ranks of this host by their pid (left in the store at start-up).
    A store that cannot be read was held by rank 0's process (plain ``env://`` start): rank 0."""
    out: list[str] = []
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=2))
        host = socket.gethostname()
        for r in range(info.world_size):
            key = _WHO.format(r)
            if r == info.rank or not store.check([key]):
                continue
            their_host, pid = store.get(key).decode().split()
            state = _process_state(int(pid)) if their_host == host else None
            if state is not None:
                out.append(f"rank {r} (pid {pid}, {state})")
    except Exception:  # noqa: BLE001  (the store went with its host)
        if info.rank != 0 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun's agent holds it
            out.append("rank 0 (it held the group's store)")
    return out


def rank_lost(
    e: BaseException, info: DistInfo, timeout: float | None, last: str | None
) -> TrainingError:
    """The error of a survivor whose collective failed (``e``): who stopped answering, what the
    backend said (its first sentence, without its source location), the bound on the wait, the
    last whole checkpoint ``last`` and how to continue."""
    who = silent_ranks(info)
    said = re.sub(r"^\[[^\]]*\]\s*", "", str(e).strip().split("\n")[0]).split(". ")[0]
    wait = f"{timeout:g} s" if timeout else "torch's default timeout"
    resume = (
        f"the last whole checkpoint is {last}; restart every rank with --resume auto"
        if last
        else "no checkpoint was written yet; restart every rank (--resume auto starts afresh)"
    )
    return TrainingError(
        f"rank {info.rank}: {', '.join(who) or 'another rank'} stopped answering in a collective "
        f"({said[:200] or type(e).__name__}; a rank that dies is noticed at once, one that hangs "
        f"after --collective-timeout, {wait}). The run cannot go on without it: {resume}"
    )


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
    layers = getattr(cast(Any, lm).get_decoder(), "layers", None)
    if layers is None:
        raise TreeprepError(f"{type(lm).__name__}: no decoder.layers to shard")
    return list(layers)


def wrap(
    module: torch.nn.Module, info: DistInfo, parallel: str, compute: torch.dtype | None = None
) -> torch.nn.Module:
    """Apply DDP or FSDP2 to ``module`` (returned unchanged in a single process): the run's
    forward module, whose ``lm`` attribute is the Hugging Face model
    (:class:`~treeprep.trainer.run.step.LossModule`).

    ``compute``: the autocast dtype of a mixed-precision run (None: none). Under FSDP2 the
    decoder layers then gather their weights in that dtype (:func:`layer_policy`), so autocast
    finds its matmul weights already cast and makes no copies of its own."""
    parallel = Parallel.of(parallel, "parallel", TreeprepError)
    if not info.distributed:
        return module
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(module, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    policy = layer_policy(compute)
    for layer in decoder_layers(_lm(module)):
        if policy is None:
            fully_shard(layer)
        else:
            fully_shard(layer, mp_policy=policy)
    fully_shard(module)
    return module


def layer_policy(compute: torch.dtype | None) -> Any:
    """FSDP2's mixed precision for the decoder layers of a run whose autocast dtype is
    ``compute`` (None for a run without autocast): each layer's float32 shards are cast to
    ``compute`` before the all-gather, so a layer's gathered weights are its compute copy, freed
    with them after the layer's forward (and gathered again for its backward). Autocast's own
    bf16 copies, one per matmul weight, were saved by the matmuls for the backward, so without
    checkpointing all of them stayed live at the end of a forward. Gradients are reduce-scattered
    in float32 into the float32 master shards.

    The layers' inputs are not cast (``cast_forward_inputs=False``): the residual stream stays
    float32 as under autocast alone, and so do rotary's cos/sin and the hand-off state passed to
    the layers. What differs from autocast alone: the norms' weights and biases enter their
    products rounded to ``compute`` (autocast leaves those products alone). The root group (the
    embeddings, the final norm and the LM head) keeps float32 weights under autocast: the
    embedding's output, the residual stream's start, stays float32."""
    if compute is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=compute, reduce_dtype=torch.float32, cast_forward_inputs=False
    )


def unwrap(wrapped: torch.nn.Module) -> torch.nn.Module:
    """The module :func:`wrap` was given (DDP holds it as ``.module``; FSDP2 shards in place)."""
    inner = getattr(wrapped, "module", wrapped)
    assert isinstance(inner, torch.nn.Module)
    return inner


def _lm(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model of the forward module ``module`` (its ``lm``)."""
    lm = getattr(module, "lm", None)
    assert isinstance(lm, torch.nn.Module), type(module).__name__
    return lm


@contextlib.contextmanager
def grad_sync(wrapped: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Under DDP, skip the gradient all-reduce unless ``enabled``: the micro-batches of a step
    accumulate locally and only the last one synchronises. FSDP2 reduce-scatters every
    micro-batch (the module docstring: skipping it would hold the unsharded gradients)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(wrapped, DDP) and not enabled:
        with wrapped.no_sync():
            yield
        return
    yield


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
        sd = get_model_state_dict(_lm(inner), options=opts)
        return sd if info.is_main else None
    return _lm(inner).state_dict() if info.is_main else None


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
