"""treeprep.build.jobs: the plan's work keys, and the render task's resume and progress."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.build.config import FILE
from treeprep.build.jobs import options_digest, plan_jobs
from treeprep.io.inputs import discover_inputs


def _keys(tmp_path: Path, **options: object) -> dict[str, str]:
    file = FileOptions(**options)  # type: ignore[arg-type]
    cfg = BuildConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "out"), file=file)
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


#: a value other than the default for each option whose value is keyed as it is (the file
#: options are keyed by content: below)
CHANGED: dict[str, object] = {
    "format": "openai", "group_by": "session", "native_templates": False, "max_record_bytes": 123,
    "date": "2024-03-01", "map": ("messages=turns",), "since": "2025-01-01",
    "until": "2025-12-31", "model_name": "gpt-*", "project": "/home/dev", "redact": "secrets",
    "reasoning_merge": "drop", "parallel_calls": "split", "check_ids": False,
}  # fmt: skip


@pytest.mark.parametrize(("field", "value"), CHANGED.items())
def test_each_file_option_changes_the_work_key(field: str, value: object) -> None:
    new = options_digest(FileOptions(**{field: value}), "tok")  # type: ignore[arg-type]
    assert new != options_digest(FileOptions(), "tok")


def test_a_new_option_enters_the_work_key_without_being_listed() -> None:
    """An option added to FileOptions is in the key with nothing else changed: the key is derived
    from the dataclass, not from a hand-kept list."""
    more = dataclasses.make_dataclass(
        "MoreOptions", [("dummy", int, dataclasses.field(default=0))], bases=(FileOptions,),
        frozen=True,
    )  # fmt: skip
    base = options_digest(more(), "tok")
    assert base == options_digest(more(), "tok")  # deterministic
    assert base != options_digest(more(dummy=1), "tok")
    assert base != options_digest(FileOptions(), "tok")  # the new field's name is in it too


def test_file_options_are_keyed_by_the_files_content(tmp_path: Path) -> None:
    """A field marked FILE is keyed by what the file holds, not by its path; a new file option
    (a dummy one here) is, too, once it is marked."""
    a, b, c = (tmp_path / n for n in ("a.txt", "b.txt", "c.txt"))
    a.write_text("You are helpful.")
    b.write_text("You are helpful.")
    c.write_text("You are terse.")
    key = {p: options_digest(FileOptions(system_prompt=str(p)), "tok") for p in (a, b, c)}
    assert key[a] == key[b] != key[c]
    more = dataclasses.make_dataclass(
        "MoreOptions", [("notes", str | None, dataclasses.field(default=None, metadata=FILE))],
        bases=(FileOptions,), frozen=True,
    )  # fmt: skip
    note = {p: options_digest(more(notes=str(p)), "tok") for p in (a, b, c)}
    assert note[a] == note[b] != note[c]


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
