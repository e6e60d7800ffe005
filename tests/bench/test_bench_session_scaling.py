"""bench/session_scaling.py's sessions at a toy size: each format's session of N turns builds one
tree of at least N calls with no reject (the bench refuses to time a build that rejects; Cursor's
needs the system prompt and tools its writer leaves beside it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from treeprep.build import BuildConfig, build

BENCH = Path(__file__).resolve().parents[2] / "bench" / "session_scaling.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_session_scaling", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH_MODULE = _bench()


@pytest.mark.parametrize("fmt", sorted(BENCH_MODULE.WRITERS))
def test_each_session_builds_one_tree_without_rejects(fmt: str, tmp_path: Path) -> None:
    path, file = BENCH_MODULE.write(fmt, tmp_path / "in", 5)
    m = build(BuildConfig(inputs=[str(path)], out=str(tmp_path / "out"), file=file))
    c = m.counts
    assert (c.records_rejected, c.trees) == (0, 1), c
    assert c.records_in_trees == c.records_read >= 5, c
