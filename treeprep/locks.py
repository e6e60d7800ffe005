"""Advisory locks on the folders treeprep writes: a build's ``OUT`` and a training run's folder.

A lock is an exclusive ``flock`` on a lock file, taken without waiting: a second process is
refused at once, and the refusal names the holder, because the holder writes its *record*
(``{"pid": ..., "host": ...}``) into the lock file once it holds it. The OS drops an ``flock``
when its holder dies (kill -9 included), so a lock a dead process left is never in the way where
``flock`` works (local file systems, NFSv4, Lustre with ``flock``); its old record is overwritten.

Where the file system refuses ``flock`` (``ENOLCK``, ``EOPNOTSUPP``: some network mounts), the
record alone decides, through a pid file created exclusively next to the lock file
(``LOCK.pid``): a record naming a process of this host that no longer runs is stale and taken
over; one naming a running process, or a process of another host (whose life cannot be checked
from here), is refused with its pid and host, and how to remove it if that process is gone.

A lock is not inherited: its descriptor is closed on exec (``O_CLOEXEC``) and in a forked child
(:func:`_drop_inherited`), so a worker that outlives its parent never keeps the folder locked.
Standard library only (and the import-free :mod:`treeprep.errors`), so the trainer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
from dataclasses import dataclass

from treeprep.errors import FolderLocked

__all__ = ["FolderLock", "Holder", "take_lock"]

#: errnos of a file system that has no ``flock``: the pid file decides instead
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, from its record."""

    pid: int
    host: str

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname())

    def record(self) -> bytes:
        return json.dumps({"pid": self.pid, "host": self.host}).encode() + b"\n"

    def is_stale(self) -> bool:
        """Whether this holder is certainly gone: a process of this host that no longer runs
        (another host's process cannot be checked, so it is never stale)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # it runs, as another user
        return False


def read_holder(path: str) -> Holder | None:
    """The record in a lock file (None: empty, unreadable or not a record)."""
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read(4096) or b"null")
        return Holder(int(d["pid"]), str(d["host"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


#: descriptors of the locks this process holds: a forked child closes them at once
_held: set[int] = set()
_fork_hook = [False]  # registered on the first lock, not at import


def _drop_inherited() -> None:
    """In a forked child: close the lock descriptors the parent holds. An ``flock`` belongs to
    the open file, which a fork shares, so a child that outlived its parent would otherwise keep
    the folder locked against the rerun. The parent's lock is untouched."""
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


class FolderLock:
    """A lock this process holds; :meth:`release` (or the process's end) gives it back."""

    def __init__(self, path: str, fd: int | None, pid_file: str | None) -> None:
        self.path = path
        self._fd = fd
        self._pid_file = pid_file

    def release(self) -> None:
        """Give the lock back: the record is emptied, then the descriptor closed (or the pid file
        of a file system without ``flock`` removed). Safe to call twice."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _held.discard(fd)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
        if self._pid_file is not None:
            with contextlib.suppress(OSError):
                os.remove(self._pid_file)
            self._pid_file = None


def take_lock(path: str, *, what: str) -> FolderLock:
    """Lock ``path`` (made if missing; its folder must exist) for this process, or raise
    :class:`~treeprep.errors.FolderLocked`: ``"{what} (lock PATH is held by pid N on host H)"``.
    ``what`` says what the lock guards, in words."""
    import fcntl

    if not _fork_hook[0]:
        os.register_at_fork(after_in_child=_drop_inherited)
        _fork_hook[0] = True
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        os.close(fd)
        raise FolderLocked(_refusal(what, path, read_holder(path))) from e
    except OSError as e:
        os.close(fd)
        if e.errno not in _NO_FLOCK:
            raise
        return _take_pid_file(path, what)
    _held.add(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, Holder.me().record(), 0)
    return FolderLock(path, fd, None)


def _take_pid_file(path: str, what: str) -> FolderLock:
    """The lock where ``flock`` is refused: ``path.pid`` created exclusively with this process's
    record; a stale one (its process of this host is gone) is taken over once."""
    pid_file = path + ".pid"
    for _ in range(2):
        try:
            fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            holder = read_holder(pid_file)
            if holder is not None and holder.is_stale():
                with contextlib.suppress(FileNotFoundError):
                    os.remove(pid_file)
                continue
            raise FolderLocked(
                _refusal(what, pid_file, holder) + f"; if that process is gone, remove {pid_file}"
            ) from None
        try:
            os.write(fd, Holder.me().record())
        finally:
            os.close(fd)
        return FolderLock(path, None, pid_file)
    raise FolderLocked(_refusal(what, pid_file, read_holder(pid_file)))


def _refusal(what: str, path: str, holder: Holder | None) -> str:
    who = str(holder) if holder is not None else "another process"
    return f"{what} (lock {path} is held by {who})"
