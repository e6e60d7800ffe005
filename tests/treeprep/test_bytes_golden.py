"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and guard
that moving code between modules changes no byte of the shards, the manifest, the rejects or the
plan. The build runs from the repository root with relative input paths (the paths go into the
manifest, and determinism across absolute paths is another issue). A change that is meant to
change the bytes (a schema version, a new column) re-records them, and says so in its commit.

Re-recorded since: the sample data gained the conversation, Codex and aviary samples (issue 14:
sample manifest, rejects and shard change; the real logs' shards and manifest do not), and plans
became version 2 (hand-off rows and columns, issue 11: both plans change).
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
    "manifest.json": "0400867349ab04c9af6f8067663bd56a447bb7cc209396084f4520d3a84b93b0",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "23eea12323f0eebaf9cdd4a599d94166a5c4257d8f76cc6917519b58ff4b7ea9"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "6d5ea746cd14eefefff0b4af45a00a36c82b6603330ee233f7be0e611e1fd23f"
    ),
    "rejects.jsonl": "9c64ed8e009d90008b432627dc7b6efda95d5bd66d20920b300ee57f7bb3da2d",
    "shards/shard-00000.arrow": "1d29ca23d2e768cd977fd9d675cf6ce3880bdd2f9139804ee24b96e78e8d1b81",
}

REAL_GOLDEN = {
    "manifest.json": "5c09c02fefbe819922dfd3308da52a3ece3ff927216a7a78fbf555032e4784d7",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "8b21204997b80acac324a09971f6907f3473594ae998320bdd141c779305b36d"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "de4af6b73c76784a472c077c535766ec6599d65d312a955334df065d0f8ebb43"
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
