"""trainer/data/prefetch.py: the prefetch thread (order, one step ahead, errors, shutdown). The
end-to-end checks (bit-identical runs with prefetch on and off, an error of batch building out of
train()) are in test_train.py."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("torch")

from treeprep.errors import ShardError  # noqa: E402
from treeprep.trainer.data.prefetch import THREAD_NAME, Prefetch  # noqa: E402


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
