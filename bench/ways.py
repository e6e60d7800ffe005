"""Two or more ways of one forward and backward, measured side by side (``bench/head_memory.py``,
``bench/head_cast.py``): interleaved round by round, the order alternating, each run's peak
bytes beyond the tensors it is handed and its seconds.

Peaks: exact live tensor bytes on the CPU (:class:`~treeprep.trainer.run.memtrack.LiveBytes`, in
the first round, which it slows), the allocator's maximum on CUDA (every round). Seconds: the
median of the rounds after the first.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def run_ways(
    names: Sequence[str], run: Callable[[str], None], *, rounds: int, device: Any, fixed: Sequence
) -> tuple[dict[str, int], dict[str, float]]:
    """(peak bytes, median seconds) per name of ``run(name)``, which does one forward and
    backward; ``fixed``: the tensors that exist before it (weights, inputs), left out of the
    CPU peak."""
    import torch

    from treeprep.trainer.run.memtrack import LiveBytes

    peaks: dict[str, int] = {}
    times: dict[str, list[float]] = {k: [] for k in names}
    for rnd in range(rounds):
        for name in list(names) if rnd % 2 == 0 else list(names)[::-1]:
            if device.type == "cuda":
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            tracker = LiveBytes() if device.type == "cpu" and rnd == 0 else None
            t0 = time.perf_counter()
            if tracker is not None:
                with tracker:
                    tracker.track(*fixed)
                    run(name)
                peaks[name] = tracker.peak - sum(t.numel() * t.element_size() for t in fixed)
            else:
                run(name)
            if device.type == "cuda":
                torch.cuda.synchronize()
                peaks[name] = torch.cuda.max_memory_allocated() - base
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items()}
    return peaks, med
