"""treeprep.io.compressed: the whole decompressed file, or an InputError naming it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import zstandard

from treeprep.errors import InputError
from treeprep.io.compressed import read_all

DATA = b'{"a": 1}\n' * 1000


@pytest.mark.parametrize(
    "name,encode",
    [("d.json", bytes), ("d.json.gz", gzip.compress), ("d.json.zst", zstandard.compress)],
)
def test_read_all(tmp_path: Path, name: str, encode) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_bytes(encode(DATA))
    assert read_all(str(p)) == DATA


def test_read_all_errors_name_the_file_at_line_0(tmp_path: Path) -> None:
    cut = tmp_path / "d.json.gz"
    blob = gzip.compress(DATA)
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError) as ei:
        read_all(str(cut))
    assert (ei.value.file, ei.value.line) == (str(cut), 0)
    assert ei.value.reason.startswith("truncated or corrupt gzip stream: ")
    missing = tmp_path / "none.json"
    with pytest.raises(InputError) as ei:
        read_all(str(missing))
    assert (ei.value.file, ei.value.line) == (str(missing), 0)
    assert ei.value.reason.startswith("cannot read: ")
