"""Sequence's token-prefix helpers: the same-memory shortcut answers as a compare would."""

from __future__ import annotations

import numpy as np
import pytest

from treeprep.sequence import Sequence, common_prefix, is_prefix


def _compare(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    return next((i for i in range(m) if a[i] != b[i]), m)


@pytest.mark.parametrize("seed", range(20))
def test_common_prefix_and_is_prefix_agree_with_a_plain_compare(seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 4, 64).astype(np.int32)
    views = [buf[: rng.integers(0, 64)] for _ in range(4)]
    copies = [v.copy() for v in views]
    others = [rng.integers(0, 4, rng.integers(0, 64)).astype(np.int32) for _ in range(4)]
    for a in [*views, *copies, *others, buf[1:], buf[::2]]:
        for b in [*views, *copies, *others, buf, buf[1:], buf[::2]]:
            assert common_prefix(a, b) == _compare(a, b)
            assert is_prefix(a, b) == (len(a) <= len(b) and _compare(a, b) == len(a))


def test_views_of_other_memory_or_strides_are_compared() -> None:
    buf = np.array([1, 1, 2, 1, 3], dtype=np.int32)
    assert common_prefix(buf, buf[::2]) == 1  # same first address, other strides
    assert not is_prefix(buf[::2], buf)
    assert common_prefix(buf.view(np.uint8), buf) == 1  # same address, other dtype: 1, 0, ...
    assert is_prefix(buf[:0], np.zeros(0, np.int32)) and is_prefix(buf[:3], buf)
    assert not is_prefix(buf, buf[:3])


def test_a_sequence_keeps_the_view_it_is_given() -> None:
    buf = np.arange(8, dtype=np.int32)
    seq = Sequence(group_id="g", tokens=buf[:5], loss_spans=[(2, 5)])
    assert is_prefix(seq.tokens, buf) and common_prefix(seq.tokens, buf) == 5
