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


def test_hidden_files_and_folders_a_walk_meets_are_listed_as_excluded(tmp_path: Path) -> None:
    """Folders skip dot-files and dot-folders, never silently: each is listed with its reason (a
    hidden folder once, not what it holds); a hidden file also named on the command line is read,
    not excluded."""
    from treeprep.io.inputs import HIDDEN_REASON, discover_inputs

    (tmp_path / "logs" / ".git" / "objects").mkdir(parents=True)
    (tmp_path / "logs" / ".git" / "objects" / "x").write_text("x")
    (tmp_path / "logs" / "a.jsonl").write_text("{}\n")
    (tmp_path / "logs" / ".aider.llm.history").write_text("TO LLM\n")
    (tmp_path / "logs" / ".env").write_text("K=1\n")
    got = discover_inputs([str(tmp_path / "logs")])
    assert [f.name for f in got.files] == ["a.jsonl"]
    assert got.excluded == [
        (".aider.llm.history", HIDDEN_REASON),
        (".env", HIDDEN_REASON),
        (".git", HIDDEN_REASON),
    ]
    named = discover_inputs([str(tmp_path / "logs"), str(tmp_path / "logs" / ".env")])
    assert [(f.name, f.explicit) for f in named.files] == [(".env", True), ("a.jsonl", False)]
    assert [n for n, _ in named.excluded] == [".aider.llm.history", ".git"]
