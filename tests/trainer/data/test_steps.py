"""trainer/data/steps.py: the walk over epochs and steps (``step_plans``), and the step's global
normalizers (``step_normalizers``) that every micro-batch of a step shares."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

from treeprep.trainer.data.steps import step_plans  # noqa: E402


@dataclass
class _Plan:
    steps: list[str]


class _Epochs:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.asked: list[int] = []

    def get(self, epoch: int) -> _Plan:
        self.asked.append(epoch)
        return _Plan([f"e{epoch}s{i}" for i in range(self.sizes[epoch])])


def test_step_plans_walk_epochs_like_the_loop_counts_them() -> None:
    ep = _Epochs([3, 3, 3, 3])
    walk = [(e, s, st) for e, s, _, st in step_plans(ep, 0, 1, 5, None)]  # type: ignore[arg-type]
    assert walk == [(0, 1, "e0s1"), (0, 2, "e0s2"), (1, 0, "e1s0"), (1, 1, "e1s1"), (1, 2, "e1s2")]
    # a resumed position at the end of an epoch moves on; the epoch limit stops the walk
    # without making the next epoch's plan
    ep = _Epochs([3, 3, 3, 3])
    walk = [(e, s) for e, s, _, _ in step_plans(ep, 0, 3, 10, 2)]  # type: ignore[arg-type]
    assert walk == [(1, 0), (1, 1), (1, 2)]
    assert 2 not in ep.asked
    assert list(step_plans(_Epochs([3]), 1, 0, 4, 1)) == []  # type: ignore[arg-type]
    assert list(step_plans(_Epochs([3]), 0, 0, 0, None)) == []  # type: ignore[arg-type]
