"""Who runs a build's two heavy stages: the :class:`Engine` interface and the local engine.

The driver (:func:`treeprep.build.build`) plans the jobs, then hands an engine the two tasks of
:mod:`treeprep.build.jobs`: a :class:`~treeprep.build.jobs.RenderTask` (stage 1: one
:class:`~treeprep.build.workfiles.FileResult` per file comes back as it finishes) and a
:class:`~treeprep.build.jobs.TreeTask` (stage 2: the shard entries come back).

Planning, rejects and the manifest stay in the driver, so every engine shares the ``done.json``
markers and writes the same bytes. :class:`LocalEngine` is this process: stage 1 inline or in a
pool of ``workers`` processes, stage 2 here. Ray Data is the other engine
(:mod:`treeprep.build.ray`); the driver chooses between them, so this module never imports Ray.

Workers die with their build: a build killed by kill -9 or SIGTERM takes its pool with it
(:func:`die_with_parent`), and a forked worker does not hold ``OUT``'s lock
(:func:`treeprep.build.out.lock_out`), so the rerun is never refused by a leftover worker.

The local pool keeps at most one file per process in flight, so that a worker that dies (kill -9,
out of memory) is noticed at once and named: the build stops with
:class:`~treeprep.errors.WorkerDied` and the files finished so far are kept for the rerun. The
cost is a little idle time at the end of the render, when the last files run on fewer processes
than there are. Forked workers inherit the loaded renderer instead of loading it again (seconds
per process). Stage 2 holds at most the largest group plus one shard's buffer in memory
(:class:`~treeprep.build.workfiles.WorkFiles`).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from treeprep.build.config import FileOptions
from treeprep.build.files import FileWorker, init_worker, process_file
from treeprep.build.jobs import RenderTask, TreeTask
from treeprep.build.workfiles import FileJob, FileResult, WorkFiles, group_rows, group_sequences
from treeprep.errors import WorkerDied
from treeprep.schemas.manifest import ShardEntry
from treeprep.shards import ShardWriter
from treeprep.trie import build_tree

__all__ = ["Engine", "LocalEngine", "die_with_parent"]


class Engine(Protocol):
    """Who runs the two heavy stages (see the module docstring)."""

    def render(self, task: RenderTask) -> Iterator[FileResult]:
        """Stage 1 for every job without a ``done.json``; one result per file, as they finish."""
        ...

    def write_trees(self, task: TreeTask) -> list[ShardEntry]:
        """Stage 2: one trie per group in sorted group order, cut into shards; the shard
        entries."""
        ...


class LocalEngine:
    """This process, with a pool of ``workers`` processes for stage 1."""

    def render(self, task: RenderTask) -> Iterator[FileResult]:
        todo, n = task.start()
        results = (
            _run_pool(todo, task)
            if task.cfg.workers > 1 and len(todo) > 1
            else _run_inline(todo, task)
        )
        for res in results:
            n += 1
            task.report(n)
            yield res

    def write_trees(self, task: TreeTask) -> list[ShardEntry]:
        """Group rows across work files, one trie per group in sorted group order, shards."""
        work = WorkFiles()
        groups = group_rows(work, task.paths, task.drop)
        writer = ShardWriter(task.out, task.shard_tokens, task.before_write)
        gids_sorted = sorted(groups)
        counts = task.counts
        for gi, gid in enumerate(gids_sorted):
            seqs = group_sequences(work, groups[gid])
            tree = build_tree(seqs, gid)
            del seqs  # views into the maps: gone before the maps may be released
            work.maybe_release()
            counts.trees += 1
            counts.sequences += int(tree.seq_count.sum())
            counts.nodes += tree.num_nodes
            counts.tokens_linear += tree.tokens_linear
            counts.tokens_tree += tree.tokens_tree
            writer.add(tree)
            if task.on_progress:
                task.on_progress("trees", gi + 1, len(gids_sorted))
        writer.close()
        work.release()
        return writer.entries


def _run_inline(todo: list[FileJob], task: RenderTask) -> Iterator[FileResult]:
    init_worker(task.cfg.tokenizer, task.cfg.file, task.renderer)
    for job in todo:
        yield process_file(job)


def _run_pool(todo: list[FileJob], task: RenderTask) -> Iterator[FileResult]:
    """Stage 1 in ``cfg.workers`` processes, at most one file per process in flight, so that a
    worker that dies (kill -9, out of memory) is noticed at once and named: the build stops
    with :class:`~treeprep.errors.WorkerDied`; the files finished so far are kept for the rerun."""
    cfg = task.cfg
    procs = min(cfg.workers, len(todo))
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    if "fork" in mp.get_all_start_methods():
        # forked workers inherit the loaded renderer (importing transformers and loading a
        # tokenizer costs seconds per process); the tokenizers library disables its own thread
        # pool in a forked child, which it announces unless told so beforehand
        fork = mp.get_context("fork")
        # one template time budget for the build, in shared memory the workers inherit
        task.renderer.template.share_budget(fork.Array("d", 2))
        init_worker(cfg.tokenizer, cfg.file, task.renderer)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        pool = ProcessPoolExecutor(
            procs, mp_context=fork, initializer=die_with_parent, initargs=(os.getpid(),)
        )
    else:
        spawn = mp.get_context("spawn")
        budget = spawn.Array("d", 2)
        task.renderer.template.share_budget(budget)
        pool = ProcessPoolExecutor(
            procs,
            mp_context=spawn,
            initializer=_init_spawned,
            initargs=(os.getpid(), cfg.tokenizer, cfg.file, budget),
        )
    try:
        with pool:
            yield from _one_per_process(pool, procs, todo)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def die_with_parent(parent: int) -> None:
    """Pool initializer: this worker ends when the build process ``parent`` ends, however it
    ends (kill -9, SIGTERM, a crash), so that no worker outlives its build. On Linux the kernel
    sends the worker SIGKILL (``PR_SET_PDEATHSIG``); elsewhere a thread checks once a second
    whether the parent is still its parent. A parent that died before either was set up is
    noticed at once."""
    if not _kill_me_with_parent():
        threading.Thread(
            target=_watch_parent, args=(parent,), name="treeprep-parent-watch", daemon=True
        ).start()
    if os.getppid() != parent:
        os._exit(1)


def _kill_me_with_parent() -> bool:
    """Ask Linux for SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``); False where
    that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _init_spawned(parent: int, tokenizer: str | None, options: FileOptions, budget: Any) -> None:
    """Pool initializer of a spawned worker: die with the parent, then load the renderer, whose
    template counts its time budget in the build's shared ``budget``."""
    die_with_parent(parent)
    renderer = FileWorker.load(tokenizer, options).renderer
    renderer.template.share_budget(budget)
    init_worker(tokenizer, options, renderer)


def _one_per_process(
    pool: ProcessPoolExecutor, procs: int, todo: list[FileJob]
) -> Iterator[FileResult]:
    """Feed ``pool`` the jobs in order, ``procs`` in flight at most; results as they finish."""
    queue = list(reversed(todo))
    running: dict[Future, FileJob] = {}
    while queue or running:
        while queue and len(running) < procs:
            job = queue.pop()
            running[pool.submit(process_file, job)] = job
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for fut in finished:
            job = running.pop(fut)
            try:
                yield fut.result()
            except BrokenProcessPool as e:
                names = sorted({job.name, *(j.name for j in running.values())})
                raise WorkerDied(
                    "a worker process died (killed or out of memory) while rendering "
                    f"{' or '.join(names)}; the files finished so far are kept: run the "
                    "same build again to resume"
                ) from e
