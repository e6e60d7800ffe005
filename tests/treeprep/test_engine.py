"""treeprep.engine: the stage tasks, the local engine, and the build config's checks."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from treeprep.build import BuildConfig, build
from treeprep.engine import LocalEngine, RenderTask, TreeTask, work_paths
from treeprep.errors import TreeprepError
from treeprep.render import Renderer
from treeprep.schemas.manifest import Counts
from treeprep.workfiles import FileJob, FileResult


def _calls(path: Path, groups: list[str]) -> str:
    with open(path, "wb") as f:
        for i, g in enumerate(groups):
            rec = {
                "group_id": g,
                "call_id": f"{g}-{i}",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "completion": {"role": "assistant", "content": f"answer {i}"},
            }
            f.write(orjson.dumps(rec) + b"\n")
    return str(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", 0, "workers must be >= 1, got 0"),
        ("max_errors", -1, "max_errors must be >= 0, got -1"),
        ("shard_tokens", 0, "shard_tokens must be >= 1, got 0"),
        ("max_record_bytes", 0, "max_record_bytes must be >= 1, got 0"),
        ("engine", "spark", "engine must be 'local' or 'ray', got 'spark'"),
        ("workers", None, "workers must be an integer, got None"),
        ("shard_tokens", 2.5, "shard_tokens must be an integer, got 2.5"),
    ],
)
def test_build_config_names_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TreeprepError) as e:
        BuildConfig(inputs=["x"], out="o", **{field: value})  # type: ignore[arg-type]
    assert str(e.value) == message


def test_build_config_accepts_no_error_limit_and_the_limits_themselves() -> None:
    cfg = BuildConfig(inputs=["x"], out="o", max_errors=None, workers=1, shard_tokens=1)
    assert cfg.max_errors is None
    assert BuildConfig(inputs=["x"], out="o", max_errors=0).max_errors == 0


def test_render_task_skips_finished_files_and_reports_them(tmp_path: Path) -> None:
    files = [_calls(tmp_path / f"f{i}.jsonl", [f"g{i}", f"g{i}"]) for i in range(3)]
    out = tmp_path / "out"
    build(BuildConfig(inputs=files[:2], out=str(out)))
    progress: list[tuple[str, int, int]] = []
    build(BuildConfig(inputs=files, out=str(out)), on_progress=lambda *a: progress.append(a))
    renders = [p for p in progress if p[0] == "render"]
    assert renders == [("render", 2, 3), ("render", 3, 3)]  # two resumed, one rendered
    trees = [p for p in progress if p[0] == "trees"]
    assert trees[-1] == ("trees", 3, 3)


def test_local_engine_stages_match_a_build(tmp_path: Path) -> None:
    """The engine driven by hand (stage 1, then stage 2 on work_paths) writes the same shard
    bytes and counts as build(), which drives it the same way."""
    src = _calls(tmp_path / "a.jsonl", ["g1", "g2", "g1", "g3"])
    ref = build(BuildConfig(inputs=[src], out=str(tmp_path / "ref")))

    out = tmp_path / "hand"
    work = out / ".work" / "k"
    job = FileJob(src, True, "k", str(work), "", 0, "a.jsonl")
    cfg = BuildConfig(inputs=[src], out=str(out))
    engine = LocalEngine()
    results: dict[str, FileResult] = {
        r.path: r for r in engine.render(RenderTask([job], cfg, Renderer.load(None)))
    }
    assert results["a.jsonl"].sequences == 4
    assert job.is_done()
    assert list(engine.render(RenderTask([job], cfg, Renderer.load(None)))) == []  # resumed
    counts = Counts()
    named: list[str] = []
    entries = engine.write_trees(
        TreeTask(work_paths([job], results), str(out), 1 << 20, counts, None, named.append)
    )
    assert named == ["shards/shard-00000.arrow"]
    assert [e.sha256 for e in entries] == [e.sha256 for e in ref.shards]
    assert (counts.trees, counts.sequences) == (ref.counts.trees, ref.counts.sequences) == (3, 4)
    assert counts.tokens_tree == ref.counts.tokens_tree
