"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and guard
that moving code between modules changes no byte of the shards, the manifest, the rejects or the
plan. The build runs from the repository root with relative input paths (the paths go into the
manifest, and determinism across absolute paths is another issue). A change that is meant to
change the bytes (a schema version, a new column) re-records them, and says so in its commit.

Re-recorded since: the sample data gained the conversation, Codex and aviary samples (issue 14:
sample manifest, rejects and shard change; the real logs' shards and manifest do not), and plans
became version 2 (hand-off rows and columns, issue 11: both plans change), and shards became
schema version 2 (issue 16: ``seq_trajectory_id`` and ``seq_ref_logprobs``; the sample tokens
file names its GRPO samples' trajectories and reference log-probs; every shard, manifest and
plan summary changes, the real logs' plan rows do not).
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
    "manifest.json": "24102f57c9c57a5a7149b3b76f4ecdc6510726e23825c96a8bb37718a4e64477",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "76f6f7a8fff677f81a2386cea2040ee1c46c023bb907d337fc8508cbddd4a731"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "5f772e074410b974c244471ac66bfa18fa4263dce1abb43c84b66f2f68e5ed65"
    ),
    "rejects.jsonl": "9c64ed8e009d90008b432627dc7b6efda95d5bd66d20920b300ee57f7bb3da2d",
    "shards/shard-00000.arrow": "2652db20f3cebfb49bb5975bef08a0e5826bb0e355b0fe91520561f72ddd7758",
}

REAL_GOLDEN = {
    "manifest.json": "bc4a3f4da4404947b2c0128e0615df3939e227f90f9fc36a4abc573e6c9be4af",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "8b21204997b80acac324a09971f6907f3473594ae998320bdd141c779305b36d"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "48dd6319fbd650176b824142e15444831000068384a724cdd1ab4965c2c1dea5"
    ),
    "rejects.jsonl": "8d5cc5bf06455658aa1838f48cbca67c3f558c769da39a7471e1b07eb4d9bbfe",
    "shards/shard-00000.arrow": "52263a9ef5f0bb3b1b6cb903afe542534f7711dbc18e3a7f99130794de97be99",
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
