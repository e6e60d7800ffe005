"""In-memory RL updates: token rollouts from Python lists to restored tree losses, no shards.

An online RL loop (vLLM or SGLang sampling, a verifier, then an update) hands treeprep its
rollouts as Python lists and gets the update done on its own model:

1. :class:`Rollout`: one LLM call of one sample, as token ids with a per-token loss mask and
   optionally per-token old (sampler) and reference log-probs, a reward or an advantage, the
   ``group_id`` (one GRPO group: one tree) and the ``trajectory_id`` (the sample; every call of a
   multi-call agent run shares it).
2. :func:`build_step` groups the rollouts into tries (:func:`treeprep.trie.build_tree`, the same
   code the shard builder runs), fills advantages from rewards over each group's trajectories
   (:mod:`treeprep.trainer.batch.advantages`), and plans the trees under a token ``budget``:
   small trees
   are packed first-fit-decreasing into micro-batches, a tree over the budget becomes its own
   micro-batch that runs as hand-off parts (:func:`treeprep.trainer.parts.run_parts`). Every
   micro-batch carries the step's global normalizers, so the micro-batch losses add up to the
   linearized loss of the whole step.
3. :meth:`OnlineStep.backward` runs every micro-batch's forward and backward on the caller's model
   (gradients accumulate in ``.grad``; the caller clips and steps its optimizer) and returns the
   loss and the step metrics. :meth:`OnlineStep.losses` returns each micro-batch's loss tensor for
   callers that run ``backward`` themselves (refused for a micro-batch that needs hand-off parts,
   whose backward is interleaved with its forward).

The model is any Hugging Face causal LM :func:`treeprep.trainer.load_model` supports; treeprep
switches its attention implementation to tree attention when it runs (set it back, e.g. to
``"sdpa"``, before sampling with ``generate``). Log-probs are stored in float32, as in the shards.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treeprep.errors import TreeprepError
from treeprep.sequence import Sequence as TokenSequence
from treeprep.trainer.batch.advantages import prepare_row, trained_targets
from treeprep.trainer.batch.tree_batch import TreeBatch
from treeprep.trainer.config import LossConfig
from treeprep.trainer.objective.loss import loss_with_config
from treeprep.trainer.parts.schedule import run_parts
from treeprep.trainer.run.metrics import StepMetricSums
from treeprep.trie import build_tree


@dataclass
class Rollout:
    """One call of one sample. Per-token lists are aligned with ``input_ids``."""

    input_ids: Sequence[int]
    #: 1 where the token is trained (the generated tokens), 0 elsewhere
    loss_mask: Sequence[int]
    #: the sampler's log-prob of each token (read where ``loss_mask`` is 1), or None
    old_logprobs: Sequence[float] | None = None
    #: a reference policy's log-prob of each token (for ``kl_coef``), or None
    ref_logprobs: Sequence[float] | None = None
    #: the trajectory's reward (advantages are normalized over the group's trajectories)
    reward: float | None = None
    #: an advantage given by the caller (then rewards are not used for this group)
    advantage: float | None = None
    group_id: str = "0"
    #: the sample this call belongs to (None: the call is its own trajectory)
    trajectory_id: str | None = None


def _spans(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]


#: token ids are stored as int32 in the trees (and the shards)
_ID_LIMIT = 2**31


def _where(r: Rollout, i: int) -> str:
    return f"rollout {i} (group {r.group_id!r})"


def _first_bad(values: np.ndarray, bad: np.ndarray) -> str:
    j = int(np.flatnonzero(bad)[0])
    return f"[{j}] = {values[j]!r}"


def _numbers(
    v: Any, where: str, name: str, *, none_ok: bool = False, kinds: str = "iuf"
) -> np.ndarray:
    """``v`` as a 1-D numeric array, or a TreeprepError naming the field (a ragged or nested list,
    strings, booleans; None entries unless ``none_ok``, which reads them as NaN)."""
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise TreeprepError(f"{where}: {name} is not a flat list of numbers ({e})") from e
    if a.ndim != 1:
        raise TreeprepError(f"{where}: {name} must be a flat list, got shape {a.shape}")
    if a.dtype.kind == "O":  # Python ints beyond 64 bits, or mixed objects
        out = np.empty(len(a), dtype=np.float64)
        for j, x in enumerate(a.tolist()):
            if x is None and none_ok:
                x = np.nan
            elif not isinstance(x, int | float) or isinstance(x, bool) or abs(x) >= 2**63:
                raise TreeprepError(f"{where}: {name}[{j}] = {x!r} is not a number in range")
            out[j] = x
        a = out
    if a.dtype.kind not in kinds:
        raise TreeprepError(f"{where}: {name} must hold numbers, got {a.dtype} values")
    return a


def token_ids(v: Any, where: str, vocab_size: int | None = None) -> np.ndarray:
    """Token ids as int64: whole numbers in ``[0, vocab_size)`` (``[0, 2**31)`` without a
    vocabulary); 5.0 is accepted, 5.7, NaN, -1 or 2**32+5 are refused with the index."""
    a = _numbers(v, where, "input_ids")
    if len(a) == 0:
        raise TreeprepError(f"{where}: input_ids must be a non-empty list of token ids")
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.floor(a))
        if bad.any():
            raise TreeprepError(f"{where}: input_ids{_first_bad(a, bad)} is not a whole number")
    limit = _ID_LIMIT if vocab_size is None else int(vocab_size)
    bad = (a < 0) | (a >= limit)
    if bad.any():
        span = "the token id range" if vocab_size is None else "the model's vocabulary"
        raise TreeprepError(
            f"{where}: input_ids{_first_bad(a, bad)} is outside {span} [0, {limit})"
        )
    return a.astype(np.int64)


def _trained_logprobs(v: Any, where: str, name: str, on: np.ndarray) -> np.ndarray:
    """Per-token log-probs read where the loss mask is 1: finite there (a NaN or inf would pass
    for "missing" and escape the clip); untrained positions may hold anything, None included."""
    a = _numbers(v, where, name, none_ok=True).astype(np.float64)
    if len(a) != len(on):
        raise TreeprepError(f"{where}: {name} has {len(a)} values for {len(on)} tokens")
    bad = on & ~np.isfinite(a)
    if bad.any():
        raise TreeprepError(
            f"{where}: {name}{_first_bad(a, bad)} is not a finite log-prob at a trained token"
        )
    return a[on]


def _scalar(x: Any, where: str, name: str) -> float | None:
    if x is None:
        return None
    if isinstance(x, str | bytes):  # float("1.0") would pass: a caller's bug, not a reward
        raise TreeprepError(f"{where}: {name} = {x!r} is a string, not a number")
    try:
        f = float(x)
    except (TypeError, ValueError) as e:
        raise TreeprepError(f"{where}: {name} = {x!r} is not a number") from e
    if isinstance(x, bool) or not np.isfinite(f):
        raise TreeprepError(f"{where}: {name} = {x!r} is not a finite number")
    return f


def _sequence(r: Rollout, i: int, vocab_size: int | None = None) -> TokenSequence:
    """One rollout checked and turned into a sequence; every refusal names the rollout index,
    its group and the field."""
    where = _where(r, i)
    ids = token_ids(r.input_ids, where, vocab_size)
    mask = _numbers(r.loss_mask, where, "loss_mask", kinds="iufb")
    if mask.shape != ids.shape:
        raise TreeprepError(f"{where}: loss_mask has {len(mask)} values for {len(ids)} tokens")
    bad = ~np.isin(mask, (0, 1))
    if bad.any():
        raise TreeprepError(f"{where}: loss_mask{_first_bad(mask, bad)} is not 0 or 1")
    on = mask.astype(bool)

    def per_token(v: Sequence[float] | None, name: str) -> np.ndarray | None:
        return None if v is None else _trained_logprobs(v, where, name, on)

    return TokenSequence(
        group_id=str(r.group_id),
        tokens=ids,
        loss_spans=_spans(mask.astype(np.int64)),
        logprobs=per_token(r.old_logprobs, "old_logprobs"),
        ref_logprobs=per_token(r.ref_logprobs, "ref_logprobs"),
        reward=_scalar(r.reward, where, "reward"),
        advantage=_scalar(r.advantage, where, "advantage"),
        trajectory_id=str(r.trajectory_id) if r.trajectory_id is not None else f"call-{i}",
        call_id=str(i),
        order=i,
    )


@dataclass
class OnlineStep:
    """One optimizer step's micro-batches, planned (see the module docstring)."""

    rows: list[dict[str, Any]]
    micro_batches: list[TreeBatch]
    budget: int | None
    #: per micro-batch: True when it runs as hand-off parts
    has_parts: list[bool] = field(default_factory=list)
    #: per rollout (in the order given): its largest token id, checked against the model's
    #: vocabulary before anything runs
    max_ids: list[int] = field(default_factory=list)

    def check_vocab(self, model: torch.nn.Module) -> None:
        """TreeprepError naming the first rollout with a token id outside ``model``'s input
        embeddings (else an IndexError on the CPU, a device-side assert on a GPU)."""
        get_emb = getattr(model, "get_input_embeddings", None)
        emb = get_emb() if get_emb is not None else None
        n = getattr(emb, "num_embeddings", None)
        if n is None:
            return
        for i, top in enumerate(self.max_ids):
            if top >= n:
                raise TreeprepError(
                    f"rollout {i}: input_ids holds token id {top}, outside the model's "
                    f"vocabulary [0, {n})"
                )

    @property
    def handoff(self) -> list[bool]:
        """Deprecated name of :attr:`has_parts` (one word per idea: ``handoff`` names the
        hand-off state); warns, and goes in a later release."""
        warnings.warn(
            "OnlineStep.handoff is deprecated: use OnlineStep.has_parts",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.has_parts

    @property
    def tokens_tree(self) -> int:
        return sum(b.num_tokens for b in self.micro_batches)

    @property
    def tokens_linear(self) -> int:
        return sum(b.tokens_linear for b in self.micro_batches)

    def losses(
        self, model: torch.nn.Module, cfg: LossConfig, *, attn: str | None = None
    ) -> list[torch.Tensor]:
        """Each micro-batch's loss tensor (the caller calls ``backward`` on each, or on their
        sum); refused when a micro-batch needs hand-off parts."""
        if any(self.has_parts):
            raise TreeprepError(
                "a tree is over the budget and runs as hand-off parts, whose backward is "
                "interleaved with the forward: use OnlineStep.backward"
            )
        self.check_vocab(model)
        return [loss_with_config(model, b, cfg, attn=attn).loss for b in self.micro_batches]

    def backward(
        self,
        model: torch.nn.Module,
        cfg: LossConfig,
        *,
        attn: str = "auto",
        part_graph: str = "recompute",
    ) -> tuple[float, dict[str, float]]:
        """Forward and backward of every micro-batch on ``model`` (gradients land in ``.grad``);
        returns the step's loss and metrics (``clip_frac``, ``approx_kl``, ``entropy``, ...)."""
        self.check_vocab(model)
        total = 0.0
        sums = StepMetricSums()
        for b, parts in zip(self.micro_batches, self.has_parts, strict=True):
            if parts:
                assert self.budget is not None
                out = run_parts(model, b, cfg, budget=self.budget, mode=part_graph, attn=attn)
                loss, mets = out.loss, out.metrics
            else:
                o = loss_with_config(model, b, cfg, attn=None if attn == "auto" else attn)
                o.loss.backward()
                loss, mets = o.loss.detach(), dict(o.metrics)
            total += float(loss)
            sums.add(mets)
            sums.add_batch(b)
        return total, sums.finish(None)


def build_step(
    rollouts: Iterable[Rollout],
    *,
    norm: str = "token-mean",
    adv_norm: str = "grpo",
    budget: int | None = None,
    device: str | torch.device = "cpu",
    vocab_size: int | None = None,
    share_prefixes: bool = True,
) -> OnlineStep:
    """Tries, advantages and micro-batches of one step's rollouts (module docstring).

    ``budget`` (tokens per micro-batch; None: one micro-batch) packs small trees together and runs
    a tree over it as hand-off parts. Every rollout is checked first (whole token ids in
    ``[0, vocab_size)``, a 0/1 loss mask, finite log-probs at trained tokens, a finite reward and
    advantage); a refusal names the rollout's index and the field. Without ``vocab_size`` the ids
    are checked against the model's vocabulary when the step runs. ``share_prefixes`` merges the
    common prefixes of the groups packed into one micro-batch (:mod:`treeprep.pack.share`)."""
    groups: dict[str, list[TokenSequence]] = {}
    max_ids: list[int] = []
    for i, r in enumerate(rollouts):
        s = _sequence(r, i, vocab_size)
        max_ids.append(int(s.tokens.max()))
        groups.setdefault(s.group_id, []).append(s)
    if not groups:
        raise TreeprepError("build_step needs at least one rollout")
    rows = [prepare_row(build_tree(seqs).to_row(), adv_norm) for _, seqs in sorted(groups.items())]
    n_tok = n_seq = 0.0
    trajs: set[tuple[int, str]] = set()
    for ti, row in enumerate(rows):
        for j, spans in enumerate(row["seq_loss_spans"]):
            n = trained_targets(spans)
            c = int(row["seq_count"][j])
            n_tok += c * n
            n_seq += c if n > 0 else 0
            if n > 0:
                trajs.add((ti, str(row["seq_trajectory_id"][j])))
    kw: dict[str, Any] = {
        "norm": norm,
        "adv_norm": adv_norm,
        "total_tokens": n_tok,
        "total_sequences": n_seq,
        "total_trajectories": float(len(trajs)),
        "device": device,
        "share_prefixes": share_prefixes,
    }
    bins = _pack([len(r["input_ids"]) for r in rows], budget)
    batches = [TreeBatch.from_trees([rows[i] for i in b], **kw) for b in bins]
    over = [budget is not None and bt.num_tokens > budget for bt in batches]
    return OnlineStep(rows, batches, budget, over, max_ids)


def _pack(sizes: list[int], budget: int | None) -> list[list[int]]:
    """First-fit-decreasing bins of tree indices; a tree over the budget is a bin of its own."""
    if budget is None:
        return [list(range(len(sizes)))]
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, f in enumerate(free):
            if sizes[i] <= f:
                free[b] -= sizes[i]
                bins[b].append(i)
                break
        else:
            bins.append([i])
            free.append(budget - sizes[i])
    return [sorted(b) for b in bins]
