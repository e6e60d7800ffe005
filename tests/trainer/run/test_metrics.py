"""trainer/run/metrics.py ``StepMetricSums``: a step's ratios are sums over all its micro-batches
divided once (not averages of per-micro-batch averages), and the advantage moments count every
trained call of a sequence entry, against numpy on the expanded list."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.trainer.run.metrics import StepMetricSums  # noqa: E402

ONE_PROCESS = SimpleNamespace(distributed=False)


def _batch(adv: list[float], trained: list[int], count: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        seq_advantage=torch.tensor(adv, dtype=torch.float64),
        seq_trained=torch.tensor(trained),
        seq_count=torch.tensor(count),
    )


def test_ratios_weigh_units_not_micro_batches() -> None:
    s = StepMetricSums()
    s.add({"clip_count": 1.0, "units": 2.0, "entropy_sum": 3.0, "targets": 10.0})
    s.add({"clip_count": 0.0, "units": 8.0, "entropy_sum": 1.0, "targets": 30.0})
    out = s.finish(ONE_PROCESS)
    assert out["clip_frac"] == pytest.approx(1 / 10)  # not (1/2 + 0/8) / 2
    assert out["entropy"] == pytest.approx(4 / 40)
    assert "approx_kl" not in out and "adv_mean" not in out  # nothing was added for them


def test_penalty_terms_are_logged_as_terms() -> None:
    s = StepMetricSums()
    s.add({"kl": 0.25, "entropy": 1.5})
    s.add({"kl": 0.5})
    out = s.finish(ONE_PROCESS)
    assert out["kl_term"] == pytest.approx(0.75) and out["entropy_term"] == pytest.approx(1.5)


def test_advantage_moments_count_every_trained_call() -> None:
    s = StepMetricSums()
    # sequence entries: (advantage, trained targets, calls); untrained and NaN entries skipped
    s.add_batch(_batch([1.0, -2.0, 5.0], [3, 1, 0], [2, 1, 4]))
    s.add_batch(_batch([0.5, float("nan")], [1, 2], [3, 1]))
    s.add_batch(_batch([9.0], [0], [1]))  # nothing trained: no moments at all
    out = s.finish(ONE_PROCESS)
    expanded = np.array([1.0, 1.0, -2.0, 0.5, 0.5, 0.5])
    assert out["adv_mean"] == pytest.approx(expanded.mean(), rel=1e-12)
    assert out["adv_std"] == pytest.approx(expanded.std(), rel=1e-12)
    assert (out["adv_min"], out["adv_max"]) == (-2.0, 1.0)


def test_sft_steps_log_no_policy_update_metrics() -> None:
    """Issue 39 item 5: SFT runs logged approx_kl and adv_* of rollouts nobody optimizes."""
    s = StepMetricSums()
    s.add({"clip_count": 1.0, "units": 2.0, "entropy_sum": 3.0, "targets": 10.0})
    s.add({"approx_kl_sum": 0.5, "token_units": 10.0})
    s.add_batch(_batch([1.0], [3], [1]))
    assert {"clip_frac", "approx_kl", "adv_mean"} <= set(s.finish(ONE_PROCESS))
    assert s.finish(ONE_PROCESS, rl=False) == {"entropy": pytest.approx(3 / 10)}
