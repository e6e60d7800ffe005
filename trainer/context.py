"""Context parallelism: Ulysses over heads, one micro-batch shared by a group of ranks.

Shape legend: B batch (always 1), H query heads, G key/value heads, T the micro-batch's packed
tokens (padded to a multiple of N), t = T / N one rank's slice, D head dim, E hidden, N the
group's size.

``--cp N`` splits the world into *context groups* of N consecutive ranks (data parallel over the
world / N groups). The ranks of a group receive the same micro-batch (the plan is made for world
/ N data ranks, :func:`data_world` / :func:`data_rank`). Each rank embeds its contiguous slice of
t fed tokens and runs the norms, the projections, the MLP and the LM head on it; positions are
per-token depths, so rotary embeddings need nothing. In the attention glue
(:mod:`treeprep.trainer.attention.hf`) an all-to-all turns q, k, v from [B, H|G, t, D] (every head,
this rank's tokens) into [B, H/N|G/N, T, D] (this rank's heads, every token); the tree attention
then runs unchanged over all T tokens for those heads with the micro-batch's full mask (masks
and positions are per token, so every backend works as it is) and a second all-to-all turns the
output back. The exchanges are autograd functions (:class:`_Exchange`): the backward of one is
the other, so the key and value gradients of every head reach the ranks that projected them.
Rank r of the group holds query heads ``[r H/N, (r+1) H/N)`` and key/value heads
``[r G/N, (r+1) G/N)``: with grouped queries each query head's key/value head is on the same rank.

Loss (NOTES section 3). A loss term of target j is computed from the hidden row of its
predecessor prev(j), so it belongs to the rank whose slice holds prev(j): each rank keeps those
targets (:meth:`~treeprep.trainer.batch.targets.Targets.select`, rows renumbered into its slice)
with
the tree's own coefficients, and the sum of the group's losses is the micro-batch's loss term for
term. Every rank's backward runs through every layer's exchanges (a rank without targets
back-propagates zeros), so the collectives pair up. Parameter gradients are then summed over the
group and over the data-parallel ranks by the ordinary DDP/FSDP2 reduction over the whole world
(the loop's loss scale is the world size, so the average over W ranks is the sum). Per-batch
counts (tokens fed, micro-batches, advantages) are counted by the group's first rank only
(:func:`ContextGroup.counts`).

Padding. A micro-batch whose T is not a multiple of N gets one extra root node of padding tokens
(:func:`pad_batch`): a node id above every real one, so no real query sees it; its tokens are
nobody's predecessor, so they carry no loss and no gradient.

Hand-off parts (trees over the budget, :mod:`treeprep.trainer.parts`). Every rank of the group
runs every part of the tree, in the same order: a part is padded to a multiple of N
(:func:`~treeprep.trainer.parts.schedule.part_mask`, as :func:`pad_batch` pads a micro-batch),
each rank feeds its slice of the part's tokens (:func:`context_slice`), and the layers' keys and
values that a part hands over are stored after the exchange, so each rank stores and
accumulates its own key/value heads' rows of the path: the stores per rank fall by N (with
``--stores host`` too). A part's loss terms belong to the rank holding their predecessor rows,
and a rank with none back-propagates zeros through the part, so every exchange's backward runs
on every rank.

Refused, each with a message: key/value (or query) heads not divisible by N (no KV replication:
heads are split, never copied), linear-attention (hybrid) models (their recurrence runs along the
tokens, which a rank does not hold), and ``gspo`` (its sequence ratio is not a sum over targets).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from treeprep.errors import TrainingError
from treeprep.trainer.batch.targets import Targets
from treeprep.trainer.config import check_loss

__all__ = [
    "ContextGroup",
    "check_model",
    "data_rank",
    "data_world",
    "local_targets",
    "new_context",
    "pad_batch",
]


class ContextGroup:
    """This rank's context group: its process group, its rank in it and its size. A plain class
    (not a dataclass): wrappers that walk a module's inputs leave it alone."""

    __slots__ = ("group", "rank", "size")

    def __init__(self, group: Any, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size

    def __repr__(self) -> str:
        return f"ContextGroup(rank={self.rank}, size={self.size})"

    @property
    def counts(self) -> bool:
        """This rank counts the micro-batch's own figures (tokens fed, micro-batches): the
        group's first rank, so that sums over the world count each micro-batch once."""
        return self.rank == 0

    def slice(self, num_tokens: int) -> tuple[int, int]:
        """This rank's ``[lo, hi)`` of a padded micro-batch of ``num_tokens``."""
        t = num_tokens // self.size
        return self.rank * t, (self.rank + 1) * t

    def to_heads(self, x_BHtD: torch.Tensor) -> torch.Tensor:
        """[B, H, t, D] (every head, this rank's tokens) -> [B, H/N, T, D]."""
        heads = x_BHtD.shape[1]
        if heads % self.size:
            raise TrainingError(
                f"--cp {self.size}: {heads} attention heads do not split {self.size} ways"
            )
        return _Exchange.apply(x_BHtD, self, True)

    def to_tokens(self, x_BhTD: torch.Tensor) -> torch.Tensor:
        """[B, H/N, T, D] (this rank's heads, every token) -> [B, H, t, D]."""
        return _Exchange.apply(x_BhTD, self, False)

    def local_heads(self, x_H: torch.Tensor | None) -> torch.Tensor | None:
        """This rank's share of a per-head tensor (gpt-oss's sink logits), None stays None."""
        if x_H is None:
            return None
        h = x_H.shape[0] // self.size
        return x_H.narrow(0, self.rank * h, h)

    def sum(self, value: float) -> float:
        """``value`` summed over the group (a validation loss: every rank computed its share)."""
        cuda = dist.get_backend(self.group) == "nccl"
        dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return float(t.item())


def _all_to_all(x_N: torch.Tensor, group: Any) -> torch.Tensor:
    """Chunk s of dim 0 goes to rank s; chunk s of the result came from rank s."""
    x_N = x_N.contiguous()
    out = torch.empty_like(x_N)
    dist.all_to_all_single(out, x_N, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, cg: ContextGroup) -> torch.Tensor:
    b, heads, t, d = x.shape
    n, h = cg.size, heads // cg.size
    send = x.reshape(b, n, h, t, d).transpose(0, 1)  # chunk s: rank s's heads, my tokens
    got = _all_to_all(send, cg.group)  # [N, B, h, t, D]: chunk s: my heads, rank s's tokens
    return got.permute(1, 2, 0, 3, 4).reshape(b, h, n * t, d)


def _heads_to_seq(x: torch.Tensor, cg: ContextGroup) -> torch.Tensor:
    b, h, tt, d = x.shape
    n, t = cg.size, tt // cg.size
    send = x.reshape(b, h, n, t, d).permute(2, 0, 1, 3, 4)  # chunk s: my heads, rank s's tokens
    got = _all_to_all(send, cg.group)  # [N, B, h, t, D]: chunk s: rank s's heads, my tokens
    return got.transpose(0, 1).reshape(b, n * h, t, d)


class _Exchange(torch.autograd.Function):
    """The all-to-all between the token split and the head split; its backward is the
    opposite exchange of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cg: ContextGroup, to_heads: bool) -> torch.Tensor:
        ctx.cg, ctx.to_heads = cg, to_heads
        return _seq_to_heads(x, cg) if to_heads else _heads_to_seq(x, cg)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cg = ctx.cg
        return (_heads_to_seq(grad, cg) if ctx.to_heads else _seq_to_heads(grad, cg)), None, None


def new_context(cp: int, rank: int, world_size: int) -> ContextGroup | None:
    """This rank's context group of ``cp`` consecutive ranks (None for ``cp`` 1). Every rank
    must call it: each group is created by every rank, in order."""
    if cp == 1:
        return None
    check_world(cp, world_size)
    mine = None
    for first in range(0, world_size, cp):
        g = dist.new_group(list(range(first, first + cp)))
        if first <= rank < first + cp:
            mine = g
    return ContextGroup(mine, rank % cp, cp)


def data_world(world_size: int, cp: int) -> int:
    """The data-parallel ranks of a world split into context groups of ``cp``."""
    return max(1, world_size // cp)


def data_rank(rank: int, cp: int) -> int:
    """The data-parallel rank (which micro-batches) of process ``rank``."""
    return rank // cp


def check_model(model: torch.nn.Module, cp: int) -> None:
    """Refuse a model that ``--cp`` cannot split: heads not divisible by ``cp``, or a hybrid."""
    if cp == 1:
        return
    from treeprep.trainer.models.hybrid import linear_layers

    conf = getattr(model, "config", None)
    check_config(conf, cp)
    if linear_layers(model):
        raise TrainingError(_hybrid(cp))


def check_config(config: Any, cp: int) -> None:
    """Refuse a model config that ``--cp`` cannot split (:func:`check_model`, without the
    weights): its heads, and ``linear_attention`` among its ``layer_types`` (a hybrid)."""
    if cp == 1:
        return
    conf = getattr(config, "get_text_config", lambda: config)()
    heads = int(getattr(conf, "num_attention_heads", 0) or 0)
    kv = int(getattr(conf, "num_key_value_heads", None) or heads)
    if not heads or heads % cp or kv % cp:
        raise TrainingError(
            f"--cp {cp} splits the attention heads {cp} ways; this model has {heads} query and "
            f"{kv} key/value heads (both must be multiples of {cp}; key/value heads are not "
            "replicated). Use a --cp that divides them"
        )
    if "linear_attention" in (getattr(conf, "layer_types", None) or []):
        raise TrainingError(_hybrid(cp))


def _hybrid(cp: int) -> str:
    return (
        f"--cp {cp}: the model has linear-attention (hybrid) layers, whose recurrence runs "
        "along the tokens; context parallelism is for attention-only models"
    )


def check_world(cp: int, world_size: int) -> None:
    """Refuse a world that context groups of ``cp`` cannot split."""
    if cp > 1 and (world_size % cp or world_size < cp):
        raise TrainingError(
            f"--cp {cp} needs a world size that is a multiple of {cp} (torchrun "
            f"--nproc-per-node); this run has {world_size} "
            f"{'process' if world_size == 1 else 'processes'}"
        )


def refuse_early(cp: int, world_size: int, model: str) -> None:
    """Every ``--cp`` refusal that needs neither a process group nor the weights, made before
    either: the world size (torchrun's ``WORLD_SIZE``) and the model's config (a preset, or a
    model folder's ``config.json``). Each rank then stops with the same one line, instead of one
    rank refusing while the others wait in a collective. A model whose config cannot be read
    here is checked once loaded (:func:`check_model`)."""
    if cp == 1:
        return
    check_world(cp, world_size)
    config = _model_config(model)
    if config is not None:
        check_config(config, cp)


def _model_config(spec: str) -> Any:
    """The transformers config of a preset or a local model folder (None: not found here)."""
    from treeprep.trainer.models.presets import PRESETS

    if spec in PRESETS:
        return PRESETS[spec].hf_config(None)
    if not os.path.isfile(os.path.join(spec, "config.json")):
        return None
    try:
        import transformers as tf

        return tf.AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception:  # any unreadable config: the load reports it
        return None


def pad_batch(batch: Any, n: int) -> Any:
    """``batch`` with its packed tokens padded to a multiple of ``n`` by one extra root node
    (module docstring); the batch itself when no padding is needed."""
    num_tokens, num_nodes = batch.num_tokens, batch.num_nodes
    pad = -num_tokens % n
    if pad == 0:
        return batch
    dev = batch.device

    def more(x: torch.Tensor, values: Any) -> torch.Tensor:
        tail = torch.as_tensor(values, dtype=x.dtype, device=dev)
        return torch.cat([x, tail.expand(pad) if tail.dim() == 0 else tail])

    return replace(
        batch,
        input_ids=more(batch.input_ids, 0),
        position_ids=more(batch.position_ids, torch.arange(pad)),
        token_node=more(batch.token_node, num_nodes),
        prev=more(batch.prev, -1),
        node_start=torch.cat([batch.node_start, torch.tensor([num_tokens], device=dev)]),
        node_length=torch.cat([batch.node_length, torch.tensor([pad], device=dev)]),
        node_parent=torch.cat([batch.node_parent, torch.tensor([-1], device=dev)]),
        node_last=torch.cat([batch.node_last, torch.tensor([num_nodes], device=dev)]),
        part_cuts=None,
    )


def context_slice(
    ids: torch.Tensor, pos: torch.Tensor, pad: int, cg: ContextGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of a hand-off part's token ids and positions after ``pad`` padding
    rows (token 0 at depths 0, 1, ...: the padding root of
    :func:`~treeprep.trainer.parts.schedule.part_mask`)."""
    if pad:
        ids = torch.cat([ids, ids.new_zeros(pad)])
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)])
    lo, hi = cg.slice(int(ids.shape[0]))
    return ids[lo:hi], pos[lo:hi]


def local_targets(targets: Targets, lo: int, hi: int) -> Targets:
    """The targets whose predecessor row lies in ``[lo, hi)``, predicted from rows renumbered
    into that slice, with their units and pairs and the tree's coefficients."""
    pred = targets.pred.cpu().numpy()
    keep = (pred >= lo) & (pred < hi)
    return targets.select(keep, pred[keep] - lo)


def context_hidden(
    lm: torch.nn.Module, batch: Any, cg: ContextGroup, attn: str | None
) -> torch.Tensor:
    """The decoder over this rank's slice of ``batch`` (padded), attention over every token
    for this rank's heads; final hidden states [t, E]."""
    from treeprep.trainer.attention.backends import choose_backend
    from treeprep.trainer.attention.mask import TreeMask
    from treeprep.trainer.models.run import run_decoder

    padded = pad_batch(batch, cg.size)
    attn = attn or getattr(lm, "treeprep_attn", "auto")
    tm = TreeMask.from_batch(padded, choose_backend(padded.device, padded.num_tokens, attn))
    lo, hi = cg.slice(padded.num_tokens)
    ids, pos = padded.input_ids[lo:hi], padded.position_ids[lo:hi]
    return run_decoder(lm, ids, pos, tm, context=cg)


def context_loss(
    lm: torch.nn.Module, batch: Any, cg: ContextGroup, *, attn: str | None = None, **loss_kw: Any
) -> Any:
    """This rank's share of the micro-batch's loss (a
    :class:`~treeprep.trainer.objective.loss.LossOutput`
    whose loss and metric sums add up over the group); ``loss_kw`` are
    :class:`~treeprep.trainer.objective.loss.LossConfig`'s fields."""
    from treeprep.trainer.models.run import output_head
    from treeprep.trainer.objective.loss import LossConfig, check_inputs, loss_from_hidden

    cfg = LossConfig(**loss_kw)
    check_loss(cfg.loss, cg.size)
    check_inputs(batch, cfg)
    h_tE = context_hidden(lm, batch, cg, attn)
    lo, hi = cg.slice(h_tE.shape[0] * cg.size)
    return loss_from_hidden(output_head(lm), h_tE, local_targets(batch.targets(), lo, hi), cfg)
