"""treeprep.build.jobs: the plan's work keys, and the render task's resume and progress."""

from __future__ import annotations

from pathlib import Path

from treeprep.build import BuildConfig, build
from treeprep.build.jobs import plan_jobs
from treeprep.io.inputs import discover_inputs


def _keys(tmp_path: Path, **options: object) -> dict[str, str]:
    cfg = BuildConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "out"), **options)
    inputs = discover_inputs(cfg.inputs, out=cfg.out)
    return {j.name: j.key for j in plan_jobs(cfg, inputs, "tok", str(tmp_path / "work"))}


def test_work_keys_follow_the_files_bytes_and_the_options(tmp_path: Path, write_calls) -> None:
    (tmp_path / "in").mkdir()
    a = Path(write_calls(tmp_path / "in" / "a.jsonl", ["g1"]))
    write_calls(tmp_path / "in" / "b.jsonl", ["g2"])
    first = _keys(tmp_path)
    assert sorted(first) == ["a.jsonl", "b.jsonl"] and len(set(first.values())) == 2
    assert _keys(tmp_path) == first  # the same files and options: the same folders
    other = _keys(tmp_path, format="openai")
    assert not set(other.values()) & set(first.values())  # an option changes every key
    a.write_bytes(a.read_bytes() + b"\n")
    edited = _keys(tmp_path)
    assert edited["a.jsonl"] != first["a.jsonl"] and edited["b.jsonl"] == first["b.jsonl"]


def test_render_task_skips_finished_files_and_reports_them(tmp_path: Path, write_calls) -> None:
    files = [write_calls(tmp_path / f"f{i}.jsonl", [f"g{i}", f"g{i}"]) for i in range(3)]
    out = tmp_path / "out"
    build(BuildConfig(inputs=files[:2], out=str(out)))
    progress: list[tuple[str, int, int]] = []
    build(BuildConfig(inputs=files, out=str(out)), on_progress=lambda *a: progress.append(a))
    renders = [p for p in progress if p[0] == "render"]
    assert renders == [("render", 2, 3), ("render", 3, 3)]  # two resumed, one rendered
    trees = [p for p in progress if p[0] == "trees"]
    assert trees[-1] == ("trees", 3, 3)
