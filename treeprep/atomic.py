"""Files that survive a crash: temporary name, fsync, rename; and the crash points tests use.

Every file a build publishes (work files, ``done.json`` markers, shards, ``rejects.jsonl``, the
manifest) is written under a temporary name, fsynced and renamed with :func:`commit`, so that
after a crash a name holds either nothing or a whole file; the folder is fsynced too, so the
rename itself is durable. The trainer's checkpoints use the same folder flush.

A write that fails (disk full, a read-only or foreign-owned OUT, a quota) becomes one
:class:`~treeprep.errors.TreeprepError` line naming the path and the cause, through
:func:`writing` (which the writers of the build and of the trainer's checkpoints wrap around their
write call sites), instead of a raw ``OSError`` traceback or pyarrow's message without a path; the
half-written temporary file is removed, and every file already published stays whole.

This module imports only the standard library (and the import-free ``treeprep.errors``), so that
any room (the trainer included) may use it without pulling in Arrow or polars. The trade-off of
``fsync`` is time: one call per published file, which is small next to rendering or compressing
that file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator

from treeprep.errors import TreeprepError

__all__ = [
    "commit",
    "crash_point",
    "fsync_path",
    "sha256_of",
    "make_dirs",
    "write_atomic",
    "write_failure",
    "writing",
]

_CAUSES = {
    errno.ENOSPC: "no space left on the device (disk full)",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "file too large for the file system",
    errno.EIO: "input/output error of the device",
}


def write_failure(path: str, e: BaseException) -> TreeprepError:
    """The TreeprepError for a failed write of ``path``: the path, the cause in words (from the
    errno when there is one) and the system's own message."""
    code = getattr(e, "errno", None)
    if isinstance(code, int) and code in _CAUSES:
        detail = f"{_CAUSES[code]} ({errno.errorcode[code]})"
    else:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
    return TreeprepError(
        f"{path}: cannot write: {detail}. Files published before are kept whole; free space or "
        "fix the permissions, then rerun"
    )


@contextlib.contextmanager
def writing(path: str, tmp: str | None = None) -> Iterator[None]:
    """Around the write call sites of ``path``: an ``OSError`` inside (pyarrow's included, which
    names no path) becomes :func:`write_failure`'s TreeprepError, and the temporary file ``tmp``
    (half written) is removed. A TreeprepError raised inside passes through unchanged."""
    try:
        yield
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise write_failure(getattr(e, "filename", None) or path, e) from e


def fsync_path(path: str) -> None:
    """Flush a file (or a folder's entries) to disk; a no-op where the OS refuses folders."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str, path: str) -> None:
    """fsync ``tmp``, rename it to ``path``, fsync the folder: the rename is durable and the
    file whole, or the old state stays."""
    with writing(path, tmp):
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(os.path.dirname(path) or ".")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through ``path.tmp`` and :func:`commit`."""
    with writing(path, path + ".tmp"):
        with open(path + ".tmp", "wb") as f:
            f.write(data)
    commit(path + ".tmp", path)


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, failing as :func:`writing` does."""
    with writing(path):
        os.makedirs(path, exist_ok=True)


def sha256_of(path: str) -> str:
    """Hex SHA-256 of a file's bytes as stored (a compressed file is not decompressed)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def crash_point(name: str) -> None:
    """Test hook: ``TREEPREP_CRASH_AT=name`` kills this process here, as kill -9 would (the
    crash tests in ``tests/adversarial`` stop builds at named points and compare the bytes of
    the rerun); ``TREEPREP_STALL_AT=name`` stops it here for good, as a hung file would (the
    tests that kill a build around its stalled workers). Costs two environment lookups."""
    if os.environ.get("TREEPREP_CRASH_AT") == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("TREEPREP_STALL_AT") == name:
        import time

        while True:
            time.sleep(3600)
