"""Bin packing and load balancing: first-fit decreasing and longest-processing-time first.

The planner packs parts into micro-batches and micro-batches onto ranks, and cuts a tree's
siblings into bundles; the trainer's linear baseline packs sequences the same way. All of them
are these few greedy rules, written once, deterministic (every sort is stable, ties go to the lower
index) and in plain Python/numpy: the inputs are hundreds to thousands of items, where a loop
over a short list of bins beats any setup cost.

* :func:`first_fit_decreasing`: as many bins as needed, each of a fixed capacity.
* :func:`place`: a fixed number of bins, either first-fit decreasing by size or cost-balanced
  (heaviest first into the cheapest bin with room); items that fit nowhere are reported.
* :func:`longest_processing_time`: bins (with costs) onto workers, each taking at most a given
  number, heaviest bin first onto the least loaded worker.
"""

from __future__ import annotations

import numpy as np


def first_fit_decreasing(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins (lists of item indices, in placement order) of total size <= ``capacity`` each: items
    by decreasing size (ties: lower index first) into the first bin with room, else a new bin.
    An item larger than ``capacity`` gets a bin of its own."""
    sizes = np.asarray(sizes)
    order = np.argsort(-sizes, kind="stable")
    free: list[int] = []
    bins: list[list[int]] = []
    for i in order.tolist():
        s = int(sizes[i])
        for b, f in enumerate(free):
            if s <= f:
                free[b] -= s
                bins[b].append(i)
                break
        else:
            free.append(capacity - s)
            bins.append([i])
    return bins


def place(
    sizes: np.ndarray, costs: np.ndarray, nbins: int, capacity: int, *, balanced: bool
) -> np.ndarray:
    """Bin of each item among ``nbins`` bins of ``capacity`` (-1 where it does not fit).

    ``balanced``: heaviest item (by cost) first into the cheapest bin with room; else first-fit
    decreasing by size. Ties go to the lower item index and the lower bin."""
    free = np.full(nbins, capacity, dtype=np.int64)
    load = np.zeros(nbins, dtype=np.float64)
    where = np.full(len(sizes), -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(sizes)), -(costs if balanced else sizes)))
    inf = np.inf
    for i in order.tolist():
        s = sizes[i]
        room = free >= s
        if not room.any():
            continue
        b = int(np.where(room, load, inf).argmin()) if balanced else int(room.argmax())
        free[b] -= s
        load[b] += costs[i]
        where[i] = b
    return where


def longest_processing_time(
    costs: np.ndarray, workers: int, per_worker: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each bin (cost descending, ties by index) to the least loaded worker with fewer than
    ``per_worker`` bins. Returns (worker of each bin, its slot on that worker, from 0)."""
    n = len(costs)
    worker = np.empty(n, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    load = np.zeros(workers, dtype=np.float64)
    used = np.zeros(workers, dtype=np.int64)
    for b in np.lexsort((np.arange(n), -costs)).tolist():
        r = int(np.where(used < per_worker, load, np.inf).argmin())
        worker[b], slot[b] = r, used[r]
        used[r] += 1
        load[r] += costs[b]
    return worker, slot
