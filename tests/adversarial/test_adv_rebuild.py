"""Rebuilding into a good build, and inputs that move under a build (issue 41): a failed or killed
rebuild leaves the earlier build whole (item 1), an input rewritten after it was hashed never
reaches a tree (item 2), and ``-o`` equal to an input folder is refused (item 4)."""

from __future__ import annotations

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

from treeprep.build import BuildConfig, build
from treeprep.errors import EmptyBuildError, TooManyErrors
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
        build(BuildConfig(inputs=[str(_bad_logs(tmp_path))], out=str(out), format="tokens"))
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
            BuildConfig(inputs=[str(_bad_logs(tmp_path))], out=str(tmp_path / "o"), format="tokens")
        )
    assert len(rejects(tmp_path / "o")) == 2
    assert not (tmp_path / "o" / "manifest.json").exists()
