"""GRPO on tau-bench: each trial is a sample, the task is the group (issue 27 item 7).

The advantages of a tau-bench build are per trial: every call of a trial carries the z-score of
its trial's reward among the task's trials, each trial counted once however many calls it made.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

from treeprep.build import BuildConfig, build
from treeprep.shards import iter_trees
from treeprep.trainer.batch.advantages import group_advantages, normalize, trajectory_index

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data" / "tau_bench_shop.json"
REAL = ROOT / ".." / "shared" / "data" / "logs" / "tau-bench"


def _check_per_trial(out: Path) -> int:
    trees = 0
    for tree in iter_trees(str(out)):
        traj = trajectory_index(tree)
        n = int(traj.max()) + 1
        assert n > 1  # several trials in the task's tree
        rewards = np.full(n, np.nan)
        for t, r in zip(traj, tree.seq_reward, strict=True):
            assert r is not None
            assert np.isnan(rewards[t]) or rewards[t] == r
            rewards[t] = r
        adv = group_advantages(tree, "grpo")
        np.testing.assert_allclose(adv, normalize(rewards, "grpo")[traj], rtol=1e-12)
        trials = collections.Counter(s.split("/trial-")[1].split("/")[0] for s in tree.seq_call_id)
        assert len(trials) == n
        trees += 1
    return trees


def test_sample_advantages_are_per_trial(tmp_path: Path) -> None:
    build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "b")))
    assert _check_per_trial(tmp_path / "b") == 2


def test_a_trial_with_more_calls_counts_once(tmp_path: Path) -> None:
    """Rewards [1, 0] with trials of unequal length: +1/-1 per trial, not weighted by calls."""
    build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "b")))
    mixed = 0
    for tree in iter_trees(str(tmp_path / "b")):
        adv = group_advantages(tree, "grpo")
        rew = np.array(tree.seq_reward, dtype=np.float64)
        if len(set(rew)) == 2:
            np.testing.assert_allclose(np.abs(adv), 1.0, rtol=1e-5)
            assert (np.sign(adv) == np.sign(rew - 0.5)).all()
            lengths = collections.Counter(trajectory_index(tree).tolist())
            mixed += len(set(lengths.values())) > 1
    assert mixed  # the sample has a task whose winning and losing trials differ in length


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data is absent")
def test_real_tau_bench_advantages_are_per_trial(tmp_path: Path) -> None:
    build(BuildConfig(inputs=[str(REAL)], out=str(tmp_path / "b")))
    assert _check_per_trial(tmp_path / "b") == 50
