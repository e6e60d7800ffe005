"""treeprep.build.engines: the local engine driven by hand, stage by stage."""

from __future__ import annotations

from pathlib import Path

from treeprep.build import BuildConfig, build
from treeprep.build.engines import LocalEngine
from treeprep.build.jobs import RenderTask, TreeTask, work_paths
from treeprep.build.workfiles import FileJob, FileResult
from treeprep.render import Renderer
from treeprep.schemas.manifest import Counts


def test_local_engine_stages_match_a_build(tmp_path: Path, write_calls) -> None:
    """The engine driven by hand (stage 1, then stage 2 on work_paths) writes the same shard
    bytes and counts as build(), which drives it the same way."""
    src = write_calls(tmp_path / "a.jsonl", ["g1", "g2", "g1", "g3"])
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
