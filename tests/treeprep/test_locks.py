"""treeprep.locks: the folder lock of builds and runs (issue 41 item 3). Held, it refuses a second
holder naming its pid and host; it dies with its holder; where the file system has no ``flock``,
a pid file decides, and a record of a dead process of this host is stale and taken over."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import treeprep.locks as locks
from treeprep.errors import FolderLocked


def test_a_held_lock_refuses_another_process_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = locks.take_lock(str(path), what="busy")
    code = (
        "import sys\nfrom treeprep.errors import FolderLocked\nfrom treeprep.locks import "
        f"take_lock\ntry:\n    take_lock({str(path)!r}, what='busy')\n"
        "except FolderLocked as e:\n    sys.exit(str(e))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    want = f"busy (lock {path} is held by pid {os.getpid()} on host {socket.gethostname()})"
    assert res.stderr.strip() == want
    lock.release()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lock.release()  # twice: nothing


@pytest.fixture()
def no_flock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that refuses ``flock`` (an NFS mount without lock support)."""
    import fcntl

    def refuse(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_without_flock_a_pid_file_decides(tmp_path: Path, no_flock: None) -> None:
    path = str(tmp_path / "x.lock")
    lock = locks.take_lock(path, what="busy")
    assert json.loads(Path(path + ".pid").read_text())["pid"] == os.getpid()
    with pytest.raises(FolderLocked, match=rf"held by pid {os.getpid()} on host .*remove "):
        locks.take_lock(path, what="busy")  # this process runs: not stale
    lock.release()
    assert not os.path.exists(path + ".pid")
    locks.take_lock(path, what="busy").release()


def test_without_flock_a_dead_holder_of_this_host_is_stale(tmp_path: Path, no_flock: None) -> None:
    path = str(tmp_path / "x.lock")
    dead = locks.Holder(_dead_pid(), socket.gethostname())
    Path(path + ".pid").write_bytes(dead.record())
    lock = locks.take_lock(path, what="busy")  # taken over
    assert locks.read_holder(path + ".pid") == locks.Holder.me()
    lock.release()


def test_without_flock_another_hosts_holder_is_refused(tmp_path: Path, no_flock: None) -> None:
    path = str(tmp_path / "x.lock")
    Path(path + ".pid").write_bytes(locks.Holder(_dead_pid(), "elsewhere-node-7").record())
    with pytest.raises(FolderLocked, match=r"on host elsewhere-node-7\); if that process is gone"):
        locks.take_lock(path, what="busy")
