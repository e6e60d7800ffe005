"""Losses on trees whose gradients equal those of the linearized sequences (NOTES section 4).

Every loss starts from :func:`token_logprobs`: the decoder runs once over the packed trees, the
hidden states of the K predecessors ``prev(j)`` of the trained targets j are gathered (never a
shift across the packed sequence, which would pair a node's last token with its next sibling's
first), and only those K rows go through the LM head and the log-softmax. The head is applied in
chunks of ``chunk`` rows under activation checkpointing when K is large, so the K x V float32
logits never exist at once (a 16k-target batch with a 152k vocabulary would need 10 GB).

Losses, all sums over targets with the batch's restored per-target coefficients:

* ``sft``: ``-sum_t w_t log p_t``;
* ``ppo`` / ``grpo``: the clipped surrogate
  ``-sum_u [adv_pos_u min(r_u, clip(r_u)) + adv_neg_u max(r_u, clip(r_u))]`` over the batch's RL
  units u (a target and one old log-prob value; one unit per target unless sequences disagree),
  ``r_u = exp(log p_t(u) - old_u)``; ``old_t`` is the shards' sampler log-prob, or the current
  detached log-prob where none is stored (ratio 1: the plain policy gradient). The two differ only
  in where advantages come from (the batch falls back to GRPO group advantages from rewards) and
  in what a training loop defaults to; the formula is the same. Optional terms:
  ``kl_coef * sum_u w_u k3(old_u or ref_t, log p_t)`` (Schulman's k3 estimator, non-negative) and
  ``-entropy_coef * sum_t w_t H_t`` (full-vocabulary entropy of the predicting distribution);
* ``gspo``: a sequence-level objective. Each sequence's log-prob is gathered from the tree
  (:func:`sequence_logprobs`), its length-normalised ratio ``s = exp((log p_s - old_s) / n_s)``
  is clipped, and the unmodified per-sequence loss ``-count_s c_s n_s min(s A_s, clip(s) A_s)``
  is summed; autograd's fan-out through the gather restores the gradient of shared tokens.

With ``layout="linear"`` the same functions give the baseline: that is what ``treeprep verify``
and the tests compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from treeprep.errors import TreeprepError
from treeprep.trainer.batch import TreeBatch
from treeprep.trainer.model import decoder_hidden

LossName = Literal["sft", "ppo", "grpo", "gspo"]
LOSSES: tuple[str, ...] = ("sft", "ppo", "grpo", "gspo")


@dataclass
class LossOutput:
    """A loss, the per-target log-probs it came from, and scalar metrics (python floats)."""

    loss: torch.Tensor
    token_logp: torch.Tensor  # [K]
    metrics: dict[str, float] = field(default_factory=dict)


def _head_logp(
    head: torch.nn.Module, h_KE: torch.Tensor, tgt_K: torch.Tensor, want_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_KV = head(h_KE).float()
    logp_KV = torch.log_softmax(logits_KV, dim=-1)
    lp = logp_KV.gather(1, tgt_K[:, None])[:, 0]
    if want_entropy:
        ent = -(logp_KV.exp() * logp_KV).sum(-1)
    else:
        ent = torch.zeros_like(lp)
    return lp, ent


def token_logprobs(
    model: torch.nn.Module,
    batch: TreeBatch,
    *,
    attn: str | None = None,
    entropy: bool = False,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] of every trained target (and entropies [K] when ``entropy``)."""
    h_TE = decoder_hidden(model, batch, attn)
    pred = batch.prev.index_select(0, batch.target_index)
    if batch.num_targets and int(pred.min()) < 0:
        raise TreeprepError("a trained target has no predecessor (batch invariant broken)")
    h_KE = h_TE.index_select(0, pred)
    tgt = batch.input_ids.index_select(0, batch.target_index)
    head = model.get_output_embeddings()
    k = h_KE.shape[0]
    if k <= chunk or not torch.is_grad_enabled():
        parts = [
            _head_logp(head, h_KE[i : i + chunk], tgt[i : i + chunk], entropy)
            for i in range(0, max(k, 1), chunk)
        ]
    else:
        parts = [
            checkpoint(
                _head_logp,
                head,
                h_KE[i : i + chunk],
                tgt[i : i + chunk],
                entropy,
                use_reentrant=False,
            )
            for i in range(0, k, chunk)
        ]
    lp = torch.cat([p[0] for p in parts])
    ent = torch.cat([p[1] for p in parts]) if entropy else None
    return lp, ent


def sequence_logprobs(token_logp: torch.Tensor, batch: TreeBatch) -> torch.Tensor:
    """Per sequence entry, the sum of its trained targets' log-probs: [S] (differentiable)."""
    out = token_logp.new_zeros(batch.num_sequences)
    return out.index_add(0, batch.pair_seq, token_logp.index_select(0, batch.pair_target))


def tree_loss(
    model: torch.nn.Module,
    batch: TreeBatch,
    *,
    loss: LossName = "sft",
    attn: str | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    chunk: int = 4096,
) -> LossOutput:
    """The chosen loss on a packed batch (see the module docstring). ``ref_logp`` ([K]) replaces
    the old log-probs in the KL term when a reference model's log-probs are at hand."""
    if loss not in LOSSES:
        raise TreeprepError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    want_ent = entropy_coef != 0.0
    lp, ent = token_logprobs(model, batch, attn=attn, entropy=want_ent, chunk=chunk)
    w = batch.weight.to(lp.dtype)
    metrics: dict[str, float] = {"targets": float(batch.num_targets)}
    if loss == "sft":
        total = -(w * lp).sum()
        metrics["nll"] = float(total.detach())
        return LossOutput(total, lp, metrics)

    lo, hi = 1.0 - clip_eps, 1.0 + (clip_eps if clip_eps_high is None else clip_eps_high)
    if loss == "gspo":
        if torch.isnan(batch.seq_advantage).any():
            raise TreeprepError("gspo needs an advantage (or group rewards) for every sequence")
        pair_lp = lp.index_select(0, batch.pair_target)
        old_pair = torch.where(
            torch.isnan(batch.pair_old_logp), pair_lp.detach(), batch.pair_old_logp.to(lp.dtype)
        )
        n_s = torch.bincount(batch.pair_seq, minlength=batch.num_sequences).to(lp.dtype)
        d_s = lp.new_zeros(batch.num_sequences).index_add(0, batch.pair_seq, pair_lp - old_pair)
        ratio = torch.exp(d_s / n_s.clamp(min=1))
        adv = batch.seq_advantage.to(lp.dtype)
        surr = torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv)
        c = (batch.seq_coef * batch.seq_count).to(lp.dtype) * n_s
        total = -(c * surr).sum()
        metrics["clip_frac"] = (
            float(((ratio < lo) | (ratio > hi)).float().mean()) if len(c) else 0.0
        )
        metrics["policy"] = float(total.detach())
        return LossOutput(total, lp, metrics)

    if torch.isnan(batch.adv_pos).any() or torch.isnan(batch.adv_neg).any():
        raise TreeprepError(
            f"{loss} needs an advantage (or group rewards) for every trained sequence; "
            "some sequences in this batch have neither"
        )
    ulp = lp.index_select(0, batch.unit_target)
    old = torch.where(torch.isnan(batch.old_logp), ulp.detach(), batch.old_logp.to(lp.dtype))
    ratio = torch.exp(ulp - old)
    clipped = ratio.clamp(lo, hi)
    ap, an = batch.adv_pos.to(lp.dtype), batch.adv_neg.to(lp.dtype)
    total = -(ap * torch.minimum(ratio, clipped) + an * torch.maximum(ratio, clipped)).sum()
    metrics["policy"] = float(total.detach())
    metrics["clip_frac"] = float((ratio != clipped).float().mean()) if batch.num_targets else 0.0
    if kl_coef:
        uw = batch.unit_weight.to(lp.dtype)
        if ref_logp is None:
            d = old - ulp
        else:
            d = ref_logp.to(lp.dtype).index_select(0, batch.unit_target) - ulp
        kl = (uw * (torch.exp(d) - d - 1.0)).sum()
        total = total + kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if want_ent:
        assert ent is not None
        e = (w * ent).sum()
        total = total - entropy_coef * e
        metrics["entropy"] = float(e.detach())
    return LossOutput(total, lp, metrics)
