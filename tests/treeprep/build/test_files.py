"""treeprep.build.files: stage 1 for one file, down to its last line of defence against a buggy
adapter."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import treeprep.formats as formats_mod
from treeprep.build.config import FileOptions
from treeprep.build.files import FileWorker
from treeprep.build.workfiles import FileJob
from treeprep.formats import ReadOptions
from treeprep.formats.base import FormatSpec
from treeprep.schemas import Reject


def test_stage1_turns_an_adapter_bug_into_a_counted_reject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def buggy(path: str, opts: ReadOptions) -> Iterator[Any]:
        yield Reject(file=path, line=1, reason="a bad first line")
        raise TypeError("'int' object is not iterable")

    spec = FormatSpec(name="buggy", sniff=lambda p, h: True, read=buggy)
    monkeypatch.setattr(formats_mod, "get_format", lambda name: spec)
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n{}\n")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()  # the bytes read are the bytes hashed
    job = FileJob(str(src), True, "k", str(tmp_path / "w"), sha, 6, name="in.jsonl")
    from treeprep.render import Renderer

    worker = FileWorker(FileOptions(format="buggy"), renderer=Renderer.load(None))
    result = worker.process(job)
    assert (result.records_read, result.records_rejected, result.sequences) == (2, 2, 0)
    rejects = [json.loads(x) for x in (tmp_path / "w" / "rejects.jsonl").read_text().splitlines()]
    assert rejects[1]["reason"] == (
        "internal error in adapter buggy: TypeError: 'int' object is not iterable"
    )
