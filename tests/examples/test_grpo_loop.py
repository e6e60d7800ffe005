"""examples/grpo_loop.py runs, and its update's gradient equals a per-sequence reference."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_loop.py"


def _example():
    spec = importlib.util.spec_from_file_location("grpo_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _grads(model) -> dict[str, torch.Tensor]:
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return g


def _reference(model, rollouts, cfg) -> None:
    """GRPO over trajectories, token-mean, one call at a time through plain SDPA."""
    groups: dict[str, dict[str, float]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, {})[r.trajectory_id] = r.reward
    adv: dict[str, float] = {}
    for trajs in groups.values():
        rew = np.array(list(trajs.values()))
        a = (rew - rew.mean()) / (rew.std() + 1e-6)
        adv.update(zip(trajs, a, strict=True))
    n_total = sum(sum(r.loss_mask[1:]) for r in rollouts)
    lo, hi = 1 - cfg.clip_eps, 1 + cfg.clip_eps_high
    model.set_attn_implementation("sdpa")
    for r in rollouts:
        ids = torch.tensor([r.input_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        pos = torch.tensor([i for i, m in enumerate(r.loss_mask) if m and i > 0])
        lp = logp[pos - 1].gather(1, ids[0, pos][:, None])[:, 0]
        old = torch.tensor([r.old_logprobs[i] for i in pos.tolist()], dtype=torch.float32)
        ratio = torch.exp(lp - old)
        a = adv[r.trajectory_id]
        (-torch.minimum(ratio * a, ratio.clamp(lo, hi) * a).sum() / n_total).backward()
    model.set_attn_implementation("treeprep")


def test_grpo_loop_gradient_equals_per_sequence_reference() -> None:
    ex = _example()
    from treeprep.trainer import load_model
    from treeprep.trainer.online import build_step

    model = load_model("tiny-qwen3", vocab_size=ex.VOCAB, attn="dense", seed=0)
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rollouts = ex.sample_step(model, gen, groups=2, samples=3)
        # move the policy off the sampler so that the ratios differ from 1 and some clip
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        for budget in (256, 24):  # one micro-batch, then each group as hand-off parts
            step = build_step(rollouts, norm="token-mean", adv_norm="grpo", budget=budget)
            assert any(step.has_parts) == (budget == 24)
            _, metrics = step.backward(model, ex.LOSS)
            got = _grads(model)
            _reference(model, rollouts, ex.LOSS)
            want = _grads(model)
            num = sum(float(((got[k] - want[k]).double() ** 2).sum()) for k in want)
            den = sum(float((want[k].double() ** 2).sum()) for k in want)
            assert (num / den) ** 0.5 < 1e-5
    assert 0.0 < metrics["clip_frac"] < 1.0
    assert metrics["approx_kl"] > 0 and metrics["entropy"] > 0
    assert step.tokens_tree < step.tokens_linear


def test_grpo_loop_runs_a_few_steps() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = _example().run(3, groups=2, samples=3)
    assert [h["step"] for h in hist] == [1, 2, 3]
    for h in hist:
        assert np.isfinite(h["loss"]) and 0.0 <= h["reward"] <= 1.0
        assert h["adv_std"] > 0 and abs(h["adv_mean"]) < 1e-6
