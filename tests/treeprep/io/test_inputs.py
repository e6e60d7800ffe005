"""treeprep.io.inputs: files, folders and globs in, each input file once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from treeprep.errors import InputError
from treeprep.io.inputs import expand_inputs


def test_expand_inputs_files_folders_globs(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".hidden").mkdir()
    for rel in ["d/b.jsonl", "d/a.json", "d/sub/c.jsonl.gz", "d/.x.jsonl", "d/.hidden/y.jsonl"]:
        (tmp_path / rel).write_bytes(b"{}\n")
    (tmp_path / "top.jsonl").write_bytes(b"{}\n")
    d = str(tmp_path / "d")
    got = expand_inputs([d, str(tmp_path / "top.jsonl"), os.path.join(d, "b.jsonl")])
    assert got == sorted(
        [
            (os.path.join(d, "a.json"), False),
            (os.path.join(d, "b.jsonl"), True),  # also named explicitly: explicit wins
            (os.path.join(d, "sub", "c.jsonl.gz"), False),
            (str(tmp_path / "top.jsonl"), True),
        ]
    )
    assert expand_inputs([str(tmp_path / "d" / "*.json*")]) == [
        (os.path.join(d, "a.json"), False),
        (os.path.join(d, "b.jsonl"), False),
    ]
    assert expand_inputs([str(tmp_path / "**" / "c.jsonl.gz")]) == [
        (os.path.join(d, "sub", "c.jsonl.gz"), False)
    ]


@pytest.mark.parametrize("spec", ["missing.jsonl", "nothing-*.jsonl"])
def test_expand_inputs_missing(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InputError) as ei:
        expand_inputs([str(tmp_path / spec)])
    assert ei.value.file == str(tmp_path / spec)
    assert ei.value.line == 0
    assert ei.value.reason == "no such file or folder"
