"""treeprep.atomic: whole files or nothing, and the one folder flush the trainer shares."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from treeprep.atomic import commit, crash_point, fsync_path, sha256_of, write_atomic
from treeprep.errors import TreeprepError


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(b"old")
    write_atomic(str(path), b'{"new": 1}\n')
    assert path.read_bytes() == b'{"new": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_commit_renames_the_temporary_name(tmp_path: Path) -> None:
    tmp = tmp_path / "shard.arrow.tmp"
    tmp.write_bytes(b"abc")
    commit(str(tmp), str(tmp_path / "shard.arrow"))
    assert not tmp.exists()
    assert (tmp_path / "shard.arrow").read_bytes() == b"abc"


def test_commit_of_a_missing_temporary_raises(tmp_path: Path) -> None:
    # one error line naming the temporary, like every write failure (issue 26 item 12)
    with pytest.raises(TreeprepError, match=r"gone\.tmp: cannot write: .*No such file"):
        commit(str(tmp_path / "gone.tmp"), str(tmp_path / "gone"))
    assert not (tmp_path / "gone").exists()


def test_sha256_of_is_the_digest_of_the_bytes_as_stored(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # more than one read block
    (tmp_path / "f.bin").write_bytes(data)
    assert sha256_of(str(tmp_path / "f.bin")) == hashlib.sha256(data).hexdigest()


def test_fsync_path_flushes_files_and_folders_and_names_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fsync_path(str(tmp_path / "f"))
    fsync_path(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        fsync_path(str(tmp_path / "missing"))


def test_crash_point_does_nothing_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEPREP_CRASH_AT", "somewhere-else")
    crash_point("before-manifest")  # still alive


def test_checkpoint_folder_flush_passes_over_a_folder_it_cannot_open(tmp_path: Path) -> None:
    """The trainer's checkpoint flush is the pipeline's, except that a missing folder is not an
    error there (regression guard for the shared helper)."""
    pytest.importorskip("torch")
    from treeprep.trainer.run.checkpoint import _fsync_dir

    _fsync_dir(str(tmp_path))
    _fsync_dir(str(tmp_path / "missing"))  # no error
