"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and guard
that moving code between modules changes no byte of the shards, the manifest, the rejects or the
plan. The build runs from the repository root with relative input paths (the paths go into the
manifest, and determinism across absolute paths is another issue). A change that is meant to
change the bytes (a schema version, a new column) re-records them, and says so in its commit.
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
    "manifest.json": "6719c486dc6d2a571e894f3456fecbf6b096b6f70a7102e32c5a38cf4e35800b",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "20cbe51598383a617774ff095e0dcd606a04835b8b204d5847fa78af3d3da06a"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "914ec70e28a703eb81b8437ecd1d4e73e5d6daabe043dc7b93c4b8bf6e69e262"
    ),
    "rejects.jsonl": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "shards/shard-00000.arrow": "0e4c64901ac6ae5c30ece06c21fcbeae59b573d9878762ef1a39747cc7c42c22",
}

REAL_GOLDEN = {
    "manifest.json": "5c09c02fefbe819922dfd3308da52a3ece3ff927216a7a78fbf555032e4784d7",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "4ff0105f9e7b1928a01230dd93d4d8c06b5fc63968203e7532b1586dba0298d7"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "1cb93ff5882b17da4c49c20f8ddcea232a14432b799179dbb3b30b0889f44203"
    ),
    "rejects.jsonl": "8d5cc5bf06455658aa1838f48cbca67c3f558c769da39a7471e1b07eb4d9bbfe",
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
