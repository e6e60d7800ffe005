"""Rebuilding into a good build, and inputs that move under a build (issue 41): a failed or killed
rebuild leaves the earlier build whole (item 1), an input rewritten after it was hashed never
reaches a tree (item 2), and ``-o`` equal to an input folder is refused (item 4)."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pytest
from hostile import (
    assert_reconciles,
    manifest,
    output_hashes,
    rejects,
    rollout,
    run_subprocess,
    write_jsonl,
)

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import EmptyBuildError, TooManyErrors, TreeprepError
from treeprep.shards import iter_trees


def _logs(root: Path, tag: str = "a", n: int = 4) -> Path:
    logs = root / f"logs-{tag}"
    for f in range(n):
        rows = [rollout(f"g{f}", [1, 2, f], [10 + i], call_id=f"{tag}{f}/{i}") for i in range(3)]
        write_jsonl(logs / f"f{f}.jsonl", rows)
    return logs


def _bad_logs(root: Path) -> Path:
    return write_jsonl(root / "bad" / "b.jsonl", [{"nonsense": 1}, rollout("g", [-1], [2])]).parent


@pytest.fixture()
def good(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A good build (several shards) in ``tmp_path/o`` and its published files' hashes."""
    out = tmp_path / "o"
    build(BuildConfig(inputs=[str(_logs(tmp_path))], out=str(out), shard_tokens=10))
    assert len(manifest(out)["shards"]) > 1
    return out, output_hashes(out)


def _whole(out: Path) -> int:
    """Trees of the build in ``out``, read through the manifest (sizes and sha256 checked)."""
    return len(list(iter_trees(str(out))))


# ---- item 1: a rebuild that fails leaves the earlier build whole -------------------------------


def test_rebuild_with_every_record_rejected_keeps_the_good_build(
    good: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    out, before = good
    with pytest.raises(EmptyBuildError, match=r"earlier build is kept; see .*next/rejects\.jsonl"):
        build(
            BuildConfig(
                inputs=[str(_bad_logs(tmp_path))], out=str(out), file=FileOptions(format="tokens")
            )
        )
    assert output_hashes(out) == before  # manifest, shards and rejects as they were
    assert _whole(out) == 4
    staged = (out / ".work" / "next" / "rejects.jsonl").read_text().splitlines()
    assert len(staged) == 2  # the failed build's rejects, beside the kept build
    res = run_subprocess(["build", str(tmp_path / "bad"), "-o", str(out), "--format", "tokens"])
    assert res.returncode == 1 and "no record reached a tree" in res.stderr
    assert output_hashes(out) == before


def test_rebuild_stopped_by_max_errors_keeps_the_good_build(
    good: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    out, before = good
    logs = _logs(tmp_path, "b")
    write_jsonl(logs / "zz.jsonl", [rollout("g", [-1], [2])])
    with pytest.raises(TooManyErrors):
        build(BuildConfig(inputs=[str(logs)], out=str(out), max_errors=0))
    assert output_hashes(out) == before and _whole(out) == 4


def test_rebuild_killed_before_publishing_keeps_the_good_build_and_reruns(
    good: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    out, before = good
    new = _logs(tmp_path, "b", n=2)
    args = ["build", str(new), "-o", str(out)]
    res = run_subprocess(args, env={"TREEPREP_CRASH_AT": "before-manifest"})
    assert res.returncode == -signal.SIGKILL
    assert output_hashes(out) == before and _whole(out) == 4  # every new shard was staged
    assert run_subprocess(args).returncode == 0
    fresh = tmp_path / "fresh"
    build(BuildConfig(inputs=[str(new)], out=str(fresh)))
    assert output_hashes(out) == output_hashes(fresh)
    assert not (out / ".work" / "next").exists()


def test_rebuild_killed_while_publishing_reruns_to_the_same_bytes(
    good: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    out, _ = good
    new = _logs(tmp_path, "b", n=2)
    args = ["build", str(new), "-o", str(out)]
    res = run_subprocess(args, env={"TREEPREP_CRASH_AT": "publishing"})
    assert res.returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()  # half published: no reader takes it
    assert run_subprocess(args).returncode == 0
    fresh = tmp_path / "fresh"
    build(BuildConfig(inputs=[str(new)], out=str(fresh)))
    assert output_hashes(out) == output_hashes(fresh)
    assert_reconciles(out)


def test_failed_first_build_still_writes_its_rejects_to_out(tmp_path: Path) -> None:
    with pytest.raises(EmptyBuildError, match=r"see .*o/rejects\.jsonl"):
        build(
            BuildConfig(
                inputs=[str(_bad_logs(tmp_path))],
                out=str(tmp_path / "o"),
                file=FileOptions(format="tokens"),
            )
        )
    assert len(rejects(tmp_path / "o")) == 2
    assert not (tmp_path / "o" / "manifest.json").exists()


# ---- item 2: an input rewritten after it was hashed never reaches a tree ------------------------


@pytest.mark.parametrize("when", ["before-reading", "while-reading"])
def test_input_rewritten_after_its_hash_is_a_reject_and_rerun_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    import treeprep.build.files as files

    logs = _logs(tmp_path, n=2)
    target = logs / "f1.jsonl"
    old_sha = hashlib.sha256(target.read_bytes()).hexdigest()
    new_rows = [rollout("g1", [1, 2, 1], [99], call_id="new/0")]
    real = files._render_records

    def render_after_a_rewrite(job, spec, opts, *args):  # type: ignore[no-untyped-def]
        if job.path.endswith("f1.jsonl") and when == "before-reading":
            write_jsonl(target, new_rows)
        out = real(job, spec, opts, *args)
        if job.path.endswith("f1.jsonl") and when == "while-reading":
            write_jsonl(target, new_rows)  # a writer appending after the reader's last line
        return out

    monkeypatch.setattr(files, "_render_records", render_after_a_rewrite)
    out = tmp_path / "o"
    build(BuildConfig(inputs=[str(logs)], out=str(out)))
    calls = sorted(c for t in iter_trees(str(out)) for c in t.seq_call_id)
    assert calls == ["a0/0", "a0/1", "a0/2"]  # nothing of f1, old or new
    (rej,) = rejects(out)
    assert rej["file"] == "f1.jsonl" and rej["reason"].startswith("changed during the build")
    entry = next(i for i in assert_reconciles(out)["inputs"] if i["path"] == "f1.jsonl")
    assert entry["sha256"] == old_sha and entry["records_rejected"] == 1
    monkeypatch.setattr(files, "_render_records", real)
    build(BuildConfig(inputs=[str(logs)], out=str(out)))  # the rerun reads it as it is now
    calls = sorted(c for t in iter_trees(str(out)) for c in t.seq_call_id)
    assert calls == ["a0/0", "a0/1", "a0/2", "new/0"] and rejects(out) == []


# ---- item 4: -o equal to an input folder is refused before anything is written ------------------


@pytest.mark.parametrize("spec", ["{logs}", "{logs}/", "{logs}/*.jsonl", "{logs}/f0.jsonl"])
def test_out_equal_to_an_input_folder_is_refused(tmp_path: Path, spec: str) -> None:
    """Before: the build wrote into the input folder, and the next one read its own manifest,
    shard and rejects back as inputs (the counts changed)."""
    logs = _logs(tmp_path)
    before = sorted(p.name for p in logs.iterdir())
    with pytest.raises(TreeprepError, match=r"input folder is the build.s output folder"):
        build(BuildConfig(inputs=[spec.format(logs=logs)], out=str(logs)))
    assert sorted(p.name for p in logs.iterdir()) == before  # nothing written into it
    build(BuildConfig(inputs=[str(logs)], out=str(logs / "o")))  # OUT inside: left out
    assert manifest(logs / "o")["excluded_inputs"] == [
        {"path": "o", "reason": "the build's output folder"}
    ]
