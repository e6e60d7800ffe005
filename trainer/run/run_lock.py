"""One training run per run folder at a time: ``RUN/.run.lock``, held from set-up to the end.

Two ``treeprep train`` runs into one folder would interleave their ``metrics.jsonl`` lines and
their checkpoints (one dies at its first save, the other logs step 1 twice). The run's main rank
takes an advisory lock on ``RUN/.run.lock`` (:mod:`treeprep.locks`: an ``flock``, and the
holder's pid and host written into the file) before anything of the run is read or written; a
second run is refused at once, naming the holder's pid and host. The lock goes with its holder:
:func:`release_run_folder` at the end of :func:`~treeprep.trainer.run.loop.train`, and the OS when
the
process dies (kill -9, out of memory), so a crashed run never blocks the next; a stale record
(a dead process of this host) is taken over where the file system has no ``flock``.

Under torchrun only rank 0 locks (the ranks of one run share the folder), and its verdict is
broadcast, so every rank of a refused run stops with the same message instead of waiting in a
collective. Within one process the lock is re-entrant (a process that holds it may train into
the folder again, one run after the other); the file is never deleted (deleting a lock file
lets two processes lock two files of one name).
"""

from __future__ import annotations

import os

from treeprep.atomic import make_dirs
from treeprep.errors import FolderLocked, TrainingError
from treeprep.locks import FolderLock, take_lock

__all__ = ["LOCK", "lock_run_folder", "release_run_folder"]

#: the lock file in a run folder
LOCK = ".run.lock"

#: run folders held (by real path): the lock and how many runs of this process hold it
_held: dict[str, tuple[FolderLock, int]] = {}
#: the process ``_held`` belongs to (a forked child holds none of its parent's locks)
_owner = [os.getpid()]


def _mine() -> dict[str, tuple[FolderLock, int]]:
    if _owner[0] != os.getpid():
        _held.clear()  # the parent's: treeprep.locks closed their descriptors in this child
        _owner[0] = os.getpid()
    return _held


def lock_run_folder(run_dir: str) -> None:
    """Lock ``run_dir`` (made if missing) for this process's run, or raise
    :class:`~treeprep.errors.TrainingError` naming the pid and host of the run that holds it."""
    key = os.path.realpath(run_dir)
    held = _mine()
    if key in held:
        lock, n = held[key]
        held[key] = (lock, n + 1)
        return
    make_dirs(run_dir)
    what = (
        f"{run_dir}: another treeprep train is running in this run folder; wait for it to "
        "finish or pick another --out"
    )
    try:
        lock = take_lock(os.path.join(run_dir, LOCK), what=what)
    except FolderLocked as e:
        raise TrainingError(str(e)) from None
    except OSError as e:
        raise TrainingError(f"{run_dir}: cannot lock the run folder: {e}") from e
    held[key] = (lock, 1)


def release_run_folder(run_dir: str) -> None:
    """Give back this process's lock on ``run_dir`` once its last run ends (nothing when this
    process does not hold it: a rank other than the main one, or a run refused before)."""
    key = os.path.realpath(run_dir)
    held = _mine()
    if key not in held:
        return
    lock, n = held.pop(key)
    if n > 1:
        held[key] = (lock, n - 1)
    else:
        lock.release()
