"""Files that survive a crash: temporary name, fsync, rename; and the crash points tests use.

Every file a build publishes (work files, ``done.json`` markers, shards, ``rejects.jsonl``, the
manifest) is written under a temporary name, fsynced and renamed with :func:`commit`, so that
after a crash a name holds either nothing or a whole file; the folder is fsynced too, so the
rename itself is durable. The trainer's checkpoints use the same folder flush.

This module imports only the standard library, so that any room (the trainer included) may use it
without pulling in Arrow or polars. The trade-off of ``fsync`` is time: one call per published
file, which is small next to rendering or compressing that file.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["commit", "crash_point", "fsync_path", "sha256_of", "write_atomic"]


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
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path) or ".")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through ``path.tmp`` and :func:`commit`."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    commit(path + ".tmp", path)


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
