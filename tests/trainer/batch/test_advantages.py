"""trainer/batch/advantages.py ``normalize``: a group's rewards to advantages, against the
definitions
written out here (GRPO's z-score with the population std, Dr. GRPO's centring, RLOO's
leave-one-out baseline computed by an explicit loop)."""

from __future__ import annotations

import numpy as np
import pytest

from treeprep.errors import TreeprepError

pytest.importorskip("torch")

from treeprep.trainer.batch.advantages import normalize  # noqa: E402

R = np.array([1.0, 0.0, 0.5, 2.0, -1.0])


def test_grpo_is_the_z_score() -> None:
    mean = sum(R) / len(R)
    std = (sum((r - mean) ** 2 for r in R) / len(R)) ** 0.5
    np.testing.assert_allclose(normalize(R, "grpo"), [(r - mean) / (std + 1e-6) for r in R])


def test_dr_grpo_centres_only() -> None:
    np.testing.assert_allclose(normalize(R, "dr-grpo"), R - R.mean(), rtol=1e-15)


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    want = [r - (sum(R) - r) / (len(R) - 1) for r in R]
    np.testing.assert_allclose(normalize(R, "rloo"), want, rtol=1e-12)


def test_none_returns_a_copy_of_the_rewards() -> None:
    out = normalize(R, "none")
    np.testing.assert_array_equal(out, R)
    out[0] = 99.0
    assert R[0] == 1.0


@pytest.mark.parametrize("adv_norm", ["grpo", "dr-grpo", "rloo"])
def test_a_group_of_one_has_no_baseline_and_zero_advantage(adv_norm: str) -> None:
    np.testing.assert_array_equal(normalize(np.array([3.0]), adv_norm), [0.0])


def test_equal_rewards_give_zero_advantages_not_nan() -> None:
    out = normalize(np.full(4, 0.7), "grpo")
    np.testing.assert_array_equal(out, np.zeros(4))


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(
        TreeprepError, match="^adv_norm 'ppo'; expected one of grpo, dr-grpo, rloo, none$"
    ):
        normalize(R, "ppo")
