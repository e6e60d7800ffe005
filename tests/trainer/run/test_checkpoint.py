"""trainer/run/checkpoint.py building blocks: a random state survives a save through ``torch.save``
and ``torch.load(weights_only=True)`` and replays the same draws; file checksums catch a missing,
truncated, replaced or corrupted checkpoint file and refuse entries that leave the folder."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import CheckpointError  # noqa: E402
from treeprep.trainer.run.checkpoint import (  # noqa: E402
    checksum_files,
    rng_state,
    set_rng_state,
    verify_files,
)


def _draws() -> tuple:
    return (
        [random.random() for _ in range(3)],
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.standard_normal(),
        torch.rand(3).tolist(),
    )


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.standard_normal()
    torch.save(rng_state(), tmp_path / "rng.pt")
    first = _draws()
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    assert _draws() != first
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == first


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "step-1"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(b"\x01\x02\x03\x04" * 8)
    (d / "optimizer.pt").write_bytes(b"optimizer state")
    (d / "state.json").write_text("{}")  # never listed: it holds the list
    return d


def test_checksums_list_every_file_but_the_state(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    files = checksum_files(str(d))
    assert sorted(files) == ["model/weights.bin", "optimizer.pt"]
    assert files["optimizer.pt"]["bytes"] == len(b"optimizer state")
    import hashlib

    assert files["optimizer.pt"]["sha256"] == hashlib.sha256(b"optimizer state").hexdigest()
    verify_files(str(d), files)  # unchanged: passes


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: (d / "optimizer.pt").unlink(), "missing or unreadable"),
        (lambda d: (d / "optimizer.pt").write_bytes(b"optimizer"), "truncated or replaced"),
        (lambda d: (d / "optimizer.pt").write_bytes(b"optimizer stat_"), "corrupted"),
    ],
)
def test_verify_files_catches_damage(tmp_path: Path, damage, match: str) -> None:
    d = _folder(tmp_path)
    files = checksum_files(str(d))
    damage(d)
    with pytest.raises(CheckpointError, match=match):
        verify_files(str(d), files)


@pytest.mark.parametrize("rel", ["../escape.bin", "/etc/passwd"])
def test_verify_files_refuses_entries_outside_the_folder(tmp_path: Path, rel: str) -> None:
    d = _folder(tmp_path)
    with pytest.raises(CheckpointError, match="bad file entry"):
        verify_files(str(d), {rel: {"bytes": 1, "sha256": "0" * 64}})
    with pytest.raises(CheckpointError, match="not a table"):
        verify_files(str(d), ["optimizer.pt"])  # type: ignore[arg-type]
