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

Everything after the decoder reads a :class:`~treeprep.trainer.targets.Targets` (predecessor rows,
target tokens and the restored coefficients), so a hand-off part (:mod:`treeprep.trainer.parts`)
runs the same code on its own slice of the targets: :func:`loss_from_hidden`. Metrics are detached
0-dim tensors (no host-device sync inside a step); the loop turns them into numbers once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from treeprep.errors import TreeprepError
from treeprep.trainer.batch import TreeBatch
from treeprep.trainer.models import decoder_hidden, output_head
from treeprep.trainer.targets import Targets

LossName = Literal["sft", "ppo", "grpo", "gspo"]
LOSSES: tuple[str, ...] = ("sft", "ppo", "grpo", "gspo")


@dataclass
class LossOutput:
    """A loss, the per-target log-probs it came from, and detached scalar metrics."""

    loss: torch.Tensor
    token_logp: torch.Tensor  # [K]
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class LossConfig:
    """The objective and its knobs (see the module docstring)."""

    loss: LossName = "sft"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    chunk: int = 4096

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise TreeprepError(f"unknown loss {self.loss!r}; expected one of {', '.join(LOSSES)}")


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


def head_logprobs(
    head: torch.nn.Module,
    h_TE: torch.Tensor,
    targets: Targets,
    *,
    entropy: bool = False,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] (and entropies) of ``targets`` from the decoder's hidden states h_TE."""
    h_KE = h_TE.index_select(0, targets.pred)
    tgt = targets.token
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
    head = output_head(model)
    return head_logprobs(head, h_TE, batch.targets(), entropy=entropy, chunk=chunk)


def sequence_logprobs(token_logp: torch.Tensor, batch: TreeBatch | Targets) -> torch.Tensor:
    """Per sequence entry, the sum of its trained targets' log-probs: [S] (differentiable)."""
    t = batch.targets() if isinstance(batch, TreeBatch) else batch
    out = token_logp.new_zeros(t.num_sequences)
    return out.index_add(0, t.pair_seq, token_logp.index_select(0, t.pair_target))


def objective(
    lp: torch.Tensor,
    ent: torch.Tensor | None,
    t: Targets,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of ``cfg`` from per-target log-probs ``lp`` [K] and the restored coefficients."""
    w = t.weight.to(lp.dtype)
    metrics: dict[str, torch.Tensor] = {}
    if cfg.loss == "sft":
        total = -(w * lp).sum()
        metrics["nll"] = total.detach()
        return total, metrics
    lo = 1.0 - cfg.clip_eps
    hi = 1.0 + (cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high)
    if cfg.loss == "gspo":
        return _gspo(lp, t, lo, hi)
    ulp = lp.index_select(0, t.unit_target)
    old = torch.where(torch.isnan(t.old_logp), ulp.detach(), t.old_logp.to(lp.dtype))
    ratio = torch.exp(ulp - old)
    clipped = ratio.clamp(lo, hi)
    ap, an = t.adv_pos.to(lp.dtype), t.adv_neg.to(lp.dtype)
    total = -(ap * torch.minimum(ratio, clipped) + an * torch.maximum(ratio, clipped)).sum()
    metrics["policy"] = total.detach()
    metrics["clip_count"] = (ratio != clipped).sum().detach().float()
    metrics["units"] = torch.tensor(float(len(ratio)))
    if cfg.kl_coef:
        uw = t.unit_weight.to(lp.dtype)
        if ref_logp is None:
            d = old - ulp
        else:
            d = ref_logp.to(lp.dtype).index_select(0, t.unit_target) - ulp
        kl = (uw * (torch.exp(d) - d - 1.0)).sum()
        total = total + cfg.kl_coef * kl
        metrics["kl"] = kl.detach()
    if cfg.entropy_coef:
        assert ent is not None
        e = (w * ent).sum()
        total = total - cfg.entropy_coef * e
        metrics["entropy"] = e.detach()
    return total, metrics


def _gspo(
    lp: torch.Tensor, t: Targets, lo: float, hi: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    pair_lp = lp.index_select(0, t.pair_target)
    old_pair = torch.where(
        torch.isnan(t.pair_old_logp), pair_lp.detach(), t.pair_old_logp.to(lp.dtype)
    )
    n_s = torch.bincount(t.pair_seq, minlength=t.num_sequences).to(lp.dtype)
    d_s = lp.new_zeros(t.num_sequences).index_add(0, t.pair_seq, pair_lp - old_pair)
    ratio = torch.exp(d_s / n_s.clamp(min=1))
    adv = t.seq_advantage.to(lp.dtype)
    surr = torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv)
    c = (t.seq_coef * t.seq_count).to(lp.dtype) * n_s
    total = -(c * surr).sum()
    return total, {
        "policy": total.detach(),
        "clip_count": ((ratio < lo) | (ratio > hi)).sum().detach().float(),
        "units": torch.tensor(float(len(c))),
    }


def check_advantages(t: Targets, loss: str) -> None:
    """Refuse an RL loss on targets whose sequences have neither advantage nor group rewards."""
    if loss == "gspo" and bool(torch.isnan(t.seq_advantage).any()):
        raise TreeprepError("gspo needs an advantage (or group rewards) for every sequence")
    if loss in ("ppo", "grpo") and (
        bool(torch.isnan(t.adv_pos).any()) or bool(torch.isnan(t.adv_neg).any())
    ):
        raise TreeprepError(
            f"{loss} needs an advantage (or group rewards) for every trained sequence; "
            "some sequences in this batch have neither"
        )


def loss_from_hidden(
    head: torch.nn.Module,
    h_TE: torch.Tensor,
    t: Targets,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> LossOutput:
    """LM head on the targets' predecessors, then :func:`objective`."""
    lp, ent = head_logprobs(head, h_TE, t, entropy=cfg.entropy_coef != 0.0, chunk=cfg.chunk)
    total, metrics = objective(lp, ent, t, cfg, ref_logp)
    metrics["targets"] = torch.tensor(float(t.num_targets))
    return LossOutput(total, lp, metrics)


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
    cfg = LossConfig(loss, clip_eps, clip_eps_high, kl_coef, entropy_coef, chunk)
    t = batch.targets()
    if loss != "sft":
        check_advantages(t, loss)
    h_TE = decoder_hidden(model, batch, attn)
    return loss_from_hidden(output_head(model), h_TE, t, cfg, ref_logp)
