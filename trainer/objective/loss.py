"""Losses on trees whose gradients equal those of the linearized sequences (NOTES section 4).

Every loss starts from :func:`token_logprobs`: the decoder runs once over the packed trees, the
hidden states of the K predecessors ``prev(j)`` of the trained targets j are gathered (never a
shift across the packed sequence, which would pair a node's last token with its next sibling's
first), and only those K rows go through the LM head and the log-softmax. The head is applied in
chunks of ``chunk`` rows under activation checkpointing when K is large, so the K x V float32
logits never exist at once (a 16k-target batch with a 152k vocabulary would need 10 GB); on CUDA
with liger-kernel installed, float32 and no entropy term, Liger's fused linear cross-entropy
replaces it (:mod:`treeprep.trainer.objective.fused_head`: no ``entropy`` metric is logged then).
Logits
are computed in float32 at least (float64 stays float64: ``--precision float64`` is float64 end to
end), and the batch's float64 coefficients are cast to the log-probs' dtype.

The linearized objective, per sequence s with normalizer c_s (``norm``: sum, token-mean,
sequence-mean, trajectory-mean; :mod:`treeprep.trainer.batch`), advantage A_s (per trajectory,
:mod:`treeprep.trainer.batch.advantages`), trained mask m_s and multiplicity count_s, is
``L = sum_s count_s c_s sum_t m_s(t) l_s(t)``; the tree restores it with per-target sums of
``count_s c_s`` (and of ``count_s c_s A_s`` split by sign). Per-token terms l_s(t):

* ``sft``: ``l = -log p_t``, restored as ``-sum_t w_t log p_t``;
* ``ppo`` / ``grpo``: the clipped surrogate ``l = -min(r_t A_s, clip(r_t, 1 - eps_low,
  1 + eps_high) A_s)`` with ``r_t = exp(log p_t - old_t)``, restored as
  ``-sum_u [adv_pos_u min(r_u, clip(r_u)) + adv_neg_u max(r_u, clip(r_u))]`` over the batch's RL
  units u (a target and one old/reference log-prob value; one unit per target unless sequences
  disagree). ``eps_low = clip_eps``, ``eps_high = clip_eps_high`` (DAPO's decoupled clip; default
  ``clip_eps``). ``old_t`` is the rollouts' sampler log-prob, or the current detached log-prob
  where none is stored (ratio 1: the plain policy gradient). The two names share the formula;
  they differ in what a loop defaults to;
* ``gspo``: a sequence-level objective. Each sequence's log-prob is gathered from the tree
  (:func:`sequence_logprobs`), its length-normalised ratio ``s = exp((log p_s - old_s) / n_s)``
  is clipped, and the unmodified per-sequence loss ``-count_s c_s n_s min(s A_s, clip(s) A_s)``
  is summed; autograd's fan-out through the gather restores the gradient of shared tokens.

Optional terms, added to any of them with the same per-token weights:

* ``kl_coef * sum_u w_u k(ref_u, log p_t)`` against the rollouts' reference log-probs
  (``seq_ref_logprobs``; refused when a trained token has none), with ``kl_estimator`` ``k1``
  (``log p - ref``: its expectation under the sampling policy is KL(pi || ref)) or ``k3``
  (``exp(ref - log p) - (ref - log p) - 1``: Schulman's non-negative, lower-variance estimator);
* ``-entropy_coef * sum_t w_t H_t``: the full-vocabulary entropy of the predicting distribution.

Metrics (detached sums, so that micro-batches, parts and ranks add up): ``clip_count`` over
``units``, ``approx_kl_sum`` (k3 of the current against the old log-probs, per unit) over
``token_units``, ``ref_kl_sum`` over ``ref_units``, ``entropy_sum`` over ``targets``. The loop
divides them once per step.

With ``layout="linear"`` the same functions give the baseline: that is what ``treeprep verify``
and the tests compare.

Everything after the decoder reads a :class:`~treeprep.trainer.batch.targets.Targets`
(predecessor rows,
target tokens and the restored coefficients), so a hand-off part (:mod:`treeprep.trainer.parts`)
runs the same code on its own slice of the targets: :func:`loss_from_hidden`. Metrics are detached
0-dim tensors (no host-device sync inside a step); the loop turns them into numbers once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import checkpoint

from treeprep.errors import TreeprepError
from treeprep.modes import CLIP_EPS, LOSS_FACTS, KlEstimator, Loss
from treeprep.trainer.batch.targets import Targets
from treeprep.trainer.batch.tree_batch import Missing, TreeBatch
from treeprep.trainer.config import LossConfig  # its home; importable here as documented
from treeprep.trainer.models.run import decoder_hidden, output_head
from treeprep.trainer.objective import fused_head
from treeprep.trainer.objective.cast_head import head_logits
from treeprep.trainer.objective.target_logp import target_logprobs


@dataclass
class LossOutput:
    """A loss, the per-target log-probs it came from, and detached scalar metrics."""

    loss: torch.Tensor
    token_logp: torch.Tensor  # [K]
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def _head_logp(
    head: torch.nn.Module, h_KE: torch.Tensor, tgt_K: torch.Tensor, want_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the targets and the entropies (detached unless ``want_entropy``: the metric
    is always there, the graph only when the loss has an entropy term): the logits, their
    gradient and one block of rows' float32 temporaries
    (:mod:`treeprep.trainer.objective.target_logp`)."""
    return target_logprobs(head_logits(head, h_KE), tgt_K, want_entropy)


def head_logprobs(
    head: torch.nn.Module,
    h_TE: torch.Tensor,
    targets: Targets,
    *,
    entropy: bool = False,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] and entropies [K] of ``targets`` from the decoder's hidden states h_TE
    (the entropies carry a graph only when ``entropy``). Where :func:`fused_head.use_fused`
    allows, Liger's fused linear cross-entropy gives the log-probs and the entropies are None."""
    h_KE = h_TE.index_select(0, targets.pred)
    tgt = targets.token
    if fused_head.use_fused(head, h_KE, entropy):
        return fused_head.fused_logprobs(head, h_KE, tgt)
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
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def token_logprobs(
    model: torch.nn.Module,
    batch: TreeBatch,
    *,
    attn: str | None = None,
    entropy: bool = False,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] and entropies [K] of every trained target (entropies differentiable when
    ``entropy``; None where the fused head computed the log-probs, see :func:`head_logprobs`)."""
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of ``cfg`` from per-target log-probs ``lp`` [K] (and entropies [K], needed when
    ``cfg.entropy_coef``) and the restored coefficients. The metric ``loss_mass`` is the sum of
    the loss's terms' absolute values: the scale of its float rounding, which a loss whose terms
    cancel (RL advantages of both signs) can have far above the loss itself."""
    w = t.weight.to(lp.dtype)
    metrics: dict[str, torch.Tensor]
    facts = LOSS_FACTS[cfg.loss]
    if not facts.rl:
        total = -(w * lp).sum()
        metrics = {"nll": total.detach(), "loss_mass": (w * lp).detach().abs().sum()}
    else:
        lo = 1.0 - cfg.clip_eps
        hi = 1.0 + (cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high)
        if facts.sequence_ratio:
            total, metrics = _gspo(lp, t, lo, hi)
        else:
            total, metrics = _clipped(lp, t, lo, hi)
    ulp = lp.index_select(0, t.unit_target)
    has_old = ~torch.isnan(t.old_logp)
    d_old = torch.where(has_old, t.old_logp.to(lp.dtype) - ulp.detach(), torch.zeros_like(ulp))
    metrics["approx_kl_sum"] = (torch.exp(d_old) - d_old - 1.0).sum().detach()
    metrics["token_units"] = torch.tensor(float(len(ulp)))
    has_ref = ~torch.isnan(t.ref_logp)
    if cfg.kl_coef:
        kl_u = _kl(ulp, t.ref_logp.to(lp.dtype), cfg.kl_estimator)
        kl = (t.unit_weight.to(lp.dtype) * kl_u).sum()
        total = total + cfg.kl_coef * kl
        mass = (t.unit_weight.to(lp.dtype) * kl_u).detach().abs().sum()
        metrics["loss_mass"] = metrics["loss_mass"] + abs(cfg.kl_coef) * mass
        metrics["kl"] = kl.detach()
        metrics["ref_kl_sum"] = kl_u.detach().sum()
        metrics["ref_units"] = torch.tensor(float(len(ulp)))
    else:
        # the metric over the units that have a reference (a unit without one reads its own
        # log-prob, a zero term; none at all gives ref_units 0 and no ``ref_kl``): no
        # device-to-host read deciding whether there are any
        u = ulp.detach()
        kl_u = _kl(u, torch.where(has_ref, t.ref_logp.to(lp.dtype), u), cfg.kl_estimator)
        metrics["ref_kl_sum"] = kl_u.sum()
        metrics["ref_units"] = has_ref.sum().to(lp.dtype)
    if ent is not None:
        metrics["entropy_sum"] = ent.detach().sum()
    if cfg.entropy_coef:
        if ent is None:
            raise TreeprepError("an entropy term needs the entropies of the targets")
        e = (w * ent).sum()
        total = total - cfg.entropy_coef * e
        mass = (w * ent).detach().abs().sum()
        metrics["loss_mass"] = metrics["loss_mass"] + abs(cfg.entropy_coef) * mass
        metrics["entropy"] = e.detach()
    return total, metrics


def _kl(ulp: torch.Tensor, ref: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per unit KL estimate of the policy against the reference (module docstring)."""
    if estimator == "k1":
        return ulp - ref
    d = ref - ulp
    return torch.exp(d) - d - 1.0


def _clipped(
    lp: torch.Tensor, t: Targets, lo: float, hi: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ulp = lp.index_select(0, t.unit_target)
    old = torch.where(torch.isnan(t.old_logp), ulp.detach(), t.old_logp.to(lp.dtype))
    ratio = torch.exp(ulp - old)
    clipped = ratio.clamp(lo, hi)
    ap, an = t.adv_pos.to(lp.dtype), t.adv_neg.to(lp.dtype)
    pos, neg = ap * torch.minimum(ratio, clipped), an * torch.maximum(ratio, clipped)
    total = -(pos + neg).sum()
    return total, {
        "policy": total.detach(),
        "loss_mass": (pos.detach().abs() + neg.detach().abs()).sum(),
        "clip_count": (ratio != clipped).sum().detach().float(),
        "units": torch.tensor(float(len(ratio))),
    }


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
        "loss_mass": (c * surr).detach().abs().sum(),
        "clip_count": ((ratio < lo) | (ratio > hi)).sum().detach().float(),
        "units": torch.tensor(float(len(c))),
    }


def check_inputs(batch: TreeBatch, cfg: LossConfig) -> None:
    """Refuse what the objective cannot compute exactly: an RL loss without advantages (with the
    batch's reason when it has one, ``advantage_errors``), a KL penalty without reference
    log-probs. Reads what the batch found missing on the host (:class:`~.batch.Missing`), so the
    check never waits for the device."""
    if LOSS_FACTS[cfg.loss].rl:
        if batch.advantage_errors:
            raise TreeprepError(f"{cfg.loss}: {batch.advantage_errors[0]}")
        check_advantages(batch.missing, cfg.loss)
    if cfg.kl_coef and batch.missing.ref_logp:
        raise TreeprepError(
            "kl_coef needs the reference log-probs of every trained token (ref_log_probs in "
            "the rollouts, seq_ref_logprobs in the shards); some are missing"
        )


def check_advantages(missing: Missing, loss: str) -> None:
    """Refuse an RL loss on a batch whose sequences have neither advantage nor group rewards."""
    facts = LOSS_FACTS[loss]
    if not facts.rl:
        return
    if facts.sequence_ratio and missing.seq_advantage:
        raise TreeprepError(f"{loss} needs an advantage (or group rewards) for every sequence")
    if not facts.sequence_ratio and missing.unit_advantage:
        raise TreeprepError(
            f"{loss} needs an advantage (or group rewards) for every trained sequence; "
            "some sequences in this batch have neither"
        )


def loss_from_hidden(
    head: torch.nn.Module,
    h_TE: torch.Tensor,
    t: Targets,
    cfg: LossConfig,
) -> LossOutput:
    """LM head on the targets' predecessors, then :func:`objective`."""
    lp, ent = head_logprobs(head, h_TE, t, entropy=cfg.entropy_coef != 0.0, chunk=cfg.chunk)
    total, metrics = objective(lp, ent, t, cfg)
    metrics["targets"] = torch.tensor(float(t.num_targets))
    return LossOutput(total, lp, metrics)


def tree_loss(
    model: torch.nn.Module,
    batch: TreeBatch,
    *,
    loss: Loss | str = Loss.sft,
    attn: str | None = None,
    clip_eps: float = CLIP_EPS,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    kl_estimator: KlEstimator | str = KlEstimator.k3,
    chunk: int = 4096,
) -> LossOutput:
    """The chosen loss on a packed batch (see the module docstring); the KL term reads the
    batch's reference log-probs."""
    cfg = LossConfig(
        Loss.of(loss, "loss", TreeprepError),
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        chunk=chunk,
        kl_estimator=KlEstimator.of(kl_estimator, "kl_estimator", TreeprepError),
    )
    return loss_with_config(model, batch, cfg, attn=attn)


def loss_with_config(
    model: torch.nn.Module, batch: TreeBatch, cfg: LossConfig, *, attn: str | None = None
) -> LossOutput:
    """:func:`tree_loss` with a :class:`LossConfig`."""
    check_inputs(batch, cfg)
    h_TE = decoder_hidden(model, batch, attn)
    return loss_from_hidden(output_head(model), h_TE, batch.targets(), cfg)
