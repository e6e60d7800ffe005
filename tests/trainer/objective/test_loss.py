"""trainer/objective/loss.py: the objective against the textbook formulas written out here, per
unit.

``objective`` takes per-target log-probs and restored coefficients (:class:`Targets`); these tests
hand it small coefficient vectors and check the loss and its gradient against a per-unit
computation in float64: SFT is minus the weighted log-likelihood; PPO/GRPO is the clipped
surrogate ``min(r A, clip(r) A)`` (written here with ``min``, not with treeprep's split of the
advantage into positive and negative parts); the KL penalty's k1 and k3 estimators; the entropy
bonus. Bad knobs are refused by ``LossConfig``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import TreeprepError  # noqa: E402
from treeprep.trainer.batch.targets import Targets  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig, objective  # noqa: E402

F64 = torch.float64
LP = [-0.5, -1.2, -0.3, -2.0]  # per-target log-probs of the policy
W = [0.5, 0.25, 0.125, 0.125]  # restored weights w_t
ADV = [1.0, -2.0, 0.5, -0.25]  # per-unit advantages
OLD = [-0.9, -1.0, -0.35, -2.5]  # the sampler's log-probs
REF = [-0.6, -1.5, -0.2, -1.9]  # the reference policy's


def _targets(old: list[float] | None = OLD) -> Targets:
    k = len(LP)
    w = torch.tensor(W, dtype=F64)
    adv = torch.tensor(ADV, dtype=F64)
    none = torch.full((k,), float("nan"), dtype=F64)
    return Targets(
        pred=torch.arange(k),
        token=torch.arange(k),
        weight=w,
        unit_target=torch.arange(k),
        unit_weight=w,
        adv_pos=w * adv.clamp(min=0),
        adv_neg=w * adv.clamp(max=0),
        old_logp=none if old is None else torch.tensor(old, dtype=F64),
        ref_logp=torch.tensor(REF, dtype=F64),
        pair_seq=torch.zeros(0, dtype=torch.int64),
        pair_target=torch.zeros(0, dtype=torch.int64),
        pair_old_logp=torch.zeros(0, dtype=F64),
        seq_coef=torch.zeros(0, dtype=F64),
        seq_count=torch.zeros(0, dtype=torch.int64),
        seq_advantage=torch.zeros(0, dtype=F64),
    )


def _lp() -> torch.Tensor:
    return torch.tensor(LP, dtype=F64, requires_grad=True)


def test_sft_is_minus_the_weighted_log_likelihood() -> None:
    lp = _lp()
    loss, metrics = objective(lp, None, _targets(), LossConfig())
    want = -sum(w * x for w, x in zip(W, LP, strict=True))
    assert loss.item() == pytest.approx(want, rel=1e-15)
    assert metrics["nll"].item() == pytest.approx(want, rel=1e-15)
    loss.backward()
    assert lp.grad.tolist() == [-w for w in W]


@pytest.mark.parametrize("eps_high", [None, 0.28])
def test_ppo_is_the_clipped_surrogate_per_unit(eps_high: float | None) -> None:
    eps = 0.2
    lp = _lp()
    cfg = LossConfig(loss="ppo", clip_eps=eps, clip_eps_high=eps_high)
    loss, metrics = objective(lp, None, _targets(), cfg)
    hi = 1 + (eps if eps_high is None else eps_high)
    want, grad, clipped = 0.0, [], 0
    for x, old, a, w in zip(LP, OLD, ADV, W, strict=True):
        r = math.exp(x - old)
        c = min(max(r, 1 - eps), hi)
        want -= w * min(r * a, c * a)
        clipped += c != r
        # d/dx of -w min(r a, c a): the unclipped branch carries r' = r; the clipped one none
        grad.append(-w * a * r if r * a <= c * a else 0.0)
    assert clipped >= 2  # the check is real: both sides of the clip occur
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics["clip_count"].item() == clipped
    loss.backward()
    assert lp.grad.tolist() == pytest.approx(grad, rel=1e-12, abs=1e-15)


def test_ppo_without_sampler_logprobs_is_on_policy() -> None:
    """No stored old log-probs: the ratio is 1 (the policy's own detached log-probs), so the loss
    is minus the advantage-weighted sum and the gradient is the policy gradient w A."""
    lp = _lp()
    loss, metrics = objective(lp, None, _targets(old=None), LossConfig(loss="grpo"))
    assert loss.item() == pytest.approx(-sum(w * a for w, a in zip(W, ADV, strict=True)))
    assert metrics["clip_count"].item() == 0
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-w * a for w, a in zip(W, ADV, strict=True)])


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalty_estimators(estimator: str) -> None:
    coef = 0.1
    base, _ = objective(_lp(), None, _targets(), LossConfig())
    cfg = LossConfig(kl_coef=coef, kl_estimator=estimator)  # type: ignore[arg-type]
    loss, metrics = objective(_lp(), None, _targets(), cfg)
    kl = 0.0
    for x, ref, w in zip(LP, REF, W, strict=True):
        kl += w * ((x - ref) if estimator == "k1" else math.exp(ref - x) - (ref - x) - 1)
    assert metrics["kl"].item() == pytest.approx(kl, rel=1e-12)
    assert loss.item() == pytest.approx(base.item() + coef * kl, rel=1e-12)


def test_entropy_bonus_needs_entropies() -> None:
    ent = torch.tensor([0.7, 1.1, 0.2, 2.3], dtype=F64)
    loss, metrics = objective(_lp(), ent, _targets(), LossConfig(entropy_coef=0.01))
    e = sum(w * h for w, h in zip(W, ent.tolist(), strict=True))
    assert metrics["entropy"].item() == pytest.approx(e, rel=1e-12)
    want = -sum(w * x for w, x in zip(W, LP, strict=True)) - 0.01 * e
    assert loss.item() == pytest.approx(want, rel=1e-12)
    with pytest.raises(TreeprepError, match="entropies"):
        objective(_lp(), None, _targets(), LossConfig(entropy_coef=0.01))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"loss": "dpo"}, "loss .dpo.; expected one of sft, ppo, grpo, gspo"),
        ({"kl_estimator": "k2"}, "kl_estimator .k2.; expected one of k3, k1"),
        ({"clip_eps": 1.0}, "clip_eps must be in"),
        ({"clip_eps_high": -0.1}, "clip_eps_high must be"),
        ({"chunk": 0}, "chunk must be"),
    ],
)
def test_loss_config_refuses_bad_knobs(kw: dict, match: str) -> None:
    with pytest.raises(TreeprepError, match=match):
        LossConfig(**kw)


def test_the_loss_facts_answer_for_every_loss() -> None:
    """One LOSS_FACTS row per loss; the advantage check and the ``--cp`` refusal follow the row:
    an RL loss refuses the advantage its ratio needs (per sequence or per unit), sft none, and
    ``--cp 2`` refuses exactly the losses whose row forbids splitting a sequence."""
    from treeprep.errors import TrainingError
    from treeprep.modes import LOSS_FACTS, Loss
    from treeprep.trainer.batch.assembly import Missing
    from treeprep.trainer.config import check_loss
    from treeprep.trainer.objective.loss import check_advantages

    assert list(LOSS_FACTS) == list(Loss)
    for loss, facts in LOSS_FACTS.items():
        for missing, refused in (
            (Missing(seq_advantage=True), facts.rl and facts.sequence_ratio),
            (Missing(unit_advantage=True), facts.rl and not facts.sequence_ratio),
        ):
            if refused:
                with pytest.raises(TreeprepError, match=f"^{loss} needs an advantage"):
                    check_advantages(missing, loss)
            else:
                check_advantages(missing, loss)
        check_loss(loss, 1)
        if facts.context_parallel:
            check_loss(loss, 2)
        else:
            with pytest.raises(TrainingError, match=f"--cp 2: {loss}'s sequence-level ratio"):
                check_loss(loss, 2)
