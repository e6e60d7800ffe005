"""binpack: first-fit decreasing, placement into a fixed number of bins, LPT over workers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from treeprep.binpack import first_fit_decreasing, longest_processing_time, place


def test_first_fit_decreasing_by_hand() -> None:
    # sizes sorted: 6 (i1), 5 (i3), 4 (i0), 3 (i4), 2 (i2); capacity 10
    assert first_fit_decreasing(np.array([4, 6, 2, 5, 3]), 10) == [[1, 0], [3, 4, 2]]


@given(st.lists(st.integers(1, 10), min_size=0, max_size=30), st.integers(10, 20))
def test_first_fit_decreasing_packs_every_item_once_within_capacity(sizes, cap) -> None:
    bins = first_fit_decreasing(np.array(sizes, dtype=np.int64), cap)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= cap for b in bins)
    # a new bin is opened only for an item that fits in no earlier bin's final free space
    for k, b in enumerate(bins[1:], start=1):
        first = b[0]
        assert all(sizes[first] > cap - sum(sizes[i] for i in prev) for prev in bins[:k])


def test_place_balanced_and_first_fit() -> None:
    sizes = np.array([5, 5, 3])
    costs = np.array([1.0, 3.0, 2.0])
    assert place(sizes, costs, 2, 8, balanced=True).tolist() == [1, 0, 1]
    assert place(sizes, costs, 2, 8, balanced=False).tolist() == [0, 1, 0]
    assert place(np.array([9]), np.array([1.0]), 2, 8, balanced=True).tolist() == [-1]


def test_longest_processing_time_balances_and_respects_slots() -> None:
    worker, slot = longest_processing_time(np.array([5.0, 1.0, 4.0, 2.0]), 2, 2)
    # 5 -> w0; 4 -> w1; 2 -> w1 (4 < 5); 1 -> w0 (5 < 6)
    assert worker.tolist() == [0, 0, 1, 1]
    assert slot.tolist() == [0, 1, 0, 1]
    worker, slot = longest_processing_time(np.array([9.0, 1.0, 1.0]), 3, 1)
    assert sorted(worker.tolist()) == [0, 1, 2] and slot.tolist() == [0, 0, 0]
