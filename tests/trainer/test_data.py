"""trainer/data.py: the prefetch thread (order, one step ahead, errors, shutdown) and the walk
over epochs and steps. The end-to-end checks (bit-identical runs with prefetch on and off, an
error of batch building out of train()) are in test_train.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

from treeprep.errors import ShardError  # noqa: E402
from treeprep.trainer.data import THREAD_NAME, Prefetch, step_plans  # noqa: E402


def _alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def _wait_until(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("enabled", [True, False])
def test_items_come_in_order_from_the_right_thread(enabled: bool) -> None:
    made_in: list[str] = []

    def source():
        for i in range(6):
            made_in.append(threading.current_thread().name)
            yield {"i": i}

    with Prefetch(source(), enabled=enabled) as items:
        got = [x["i"] for x in items]
        assert next(items, None) is None  # exhausted stays exhausted
    assert got == list(range(6))
    assert made_in == [THREAD_NAME if enabled else "MainThread"] * 6
    assert not _alive()


def test_the_producer_stays_one_item_ahead() -> None:
    made: list[int] = []

    def source():
        for i in range(100):
            made.append(i)
            yield i

    with Prefetch(source()) as items:
        assert next(items) == 0
        _wait_until(lambda: len(made) == 2)  # item 1 built while item 0 is in use
        time.sleep(0.2)
        assert len(made) == 2  # and no further
        assert next(items) == 1
        _wait_until(lambda: len(made) == 3)
        time.sleep(0.1)
        assert len(made) == 3
    assert not _alive()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_producer_error_is_raised_in_the_consumer_as_itself(enabled: bool) -> None:
    err = ShardError("part-00003.arrow: row 12: node_depth is not the parent's depth")

    def source():
        yield 0
        yield 1
        raise err

    got = []
    with pytest.raises(ShardError) as info, Prefetch(source(), enabled=enabled) as items:
        for x in items:
            got.append(x)
    assert info.value is err
    assert str(info.value) == "part-00003.arrow: row 12: node_depth is not the parent's depth"
    assert got == [0, 1]
    assert not _alive()


def test_leaving_early_stops_and_joins_the_producer() -> None:
    closed = threading.Event()

    def endless():
        i = 0
        try:
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    with Prefetch(endless()) as items:
        for x in items:
            if x == 3:
                break
    assert not _alive()
    assert closed.is_set()  # the source generator was closed too
    # an error in the consumer's body stops it the same way
    with pytest.raises(RuntimeError, match="step failed"), Prefetch(endless()) as items:
        next(items)
        raise RuntimeError("step failed")
    assert not _alive()


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
