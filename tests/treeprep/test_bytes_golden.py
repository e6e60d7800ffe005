"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and guard
that moving code between modules changes no byte of the shards, the manifest, the rejects or the
plan. The build runs from the repository root with relative input paths (the paths go into the
manifest, and determinism across absolute paths is another issue). A change that is meant to
change the bytes (a schema version, a new column) re-records them, and says so in its commit.
Re-recorded for issue 14 (formats2): the sample data gained files (conversations, aviary, Codex,
Gemini CLI, OpenHands) and the real logs' OpenHands event stream is now read (two rejects); the
real logs' shard and plan bytes are unchanged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from treeprep.build import BuildConfig, build
from treeprep.pack import PackConfig, pack

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / ".." / "shared" / "data"

SAMPLE_GOLDEN = {
    "manifest.json": "d119b0c91923dc74d21e8c01ed8bb5e1b65bc7cc713b1c05ab0ef85dc93b80ff",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "6cdf8269946871503a9d5c31b91ad45f1d30a207a1acc5d5a0e1ba77bb7c9649"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "97ba0ad5786313292051ae505c4d1037d0d088e4fb9eeac2d9c084f4d96c67fb"
    ),
    "rejects.jsonl": "9c64ed8e009d90008b432627dc7b6efda95d5bd66d20920b300ee57f7bb3da2d",
    "shards/shard-00000.arrow": "c0f7ca60e83fc97f0353671171ef23e225d493a2dae39dd45b5037fc0361ee46",
}

REAL_GOLDEN = {
    "manifest.json": "3d0f4ebfdce1eaa694b512fe1260224f4834fca00e6c507eebeae5929fd8f531",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "4ff0105f9e7b1928a01230dd93d4d8c06b5fc63968203e7532b1586dba0298d7"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "99189752938175a47bf5832e8b58341757a9dbb4422a5ca4521c8f06ef98dbb4"
    ),
    "rejects.jsonl": "bc306fe018fed803850715d2feb8ea1e57a4c5140e922adfe86b93d66c7ff48a",
    "shards/shard-00000.arrow": "0f9ab4e792050253e6bb7c833663935fa322617f6d275e58f09cc984b0c1fb98",
}


def _build_and_pack(out: Path, inputs: str, tokenizer: str | None, budget: int) -> dict[str, str]:
    build(BuildConfig(inputs=[inputs], out=str(out), tokenizer=tokenizer))
    pack(str(out), PackConfig(budget=budget, world_size=2, steps_of=2, seed=3))
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".work" not in p.relative_to(out).parts
    }


def test_sample_data_bytes_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    # budget 2048 cuts two trees into parts, so the cut and the prefixes are covered too
    assert _build_and_pack(tmp_path / "out", "sample_data", None, 2048) == SAMPLE_GOLDEN


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data is absent")
def test_real_logs_qwen3_bytes_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    got = _build_and_pack(
        tmp_path / "out", "../shared/data/logs", "../shared/data/tokenizers/qwen3", 131072
    )
    assert got == REAL_GOLDEN
