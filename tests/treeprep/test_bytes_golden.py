"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and
re-recorded for issue 15 item 22: inputs are now named by their path relative to the input root
(group ids, ``seq_source``, rejects, manifest), and the manifest gained ``duplicate_inputs``. They
guard that moving code between modules changes no byte of the shards, the manifest, the rejects
or the plan. The build runs from the repository root (the adversarial suite checks that the
bytes do not depend on where the inputs lie). Plans were re-recorded for plan version 2
(issue 11: hand-off rows and their columns), the sample files for the new formats and the
OpenHands V1 event stream, now read (issue 14: real-log shards unchanged), and shard schema
version 2 (issue 16: seq_trajectory_id and seq_ref_logprobs columns). The sample was re-recorded
for issue 27 item 1: the Codex sample's web_search_call turn is now a call (was a reject).
A change that is meant to change the bytes (a schema version, a new column) re-records them,
and says so in its commit.
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
    "manifest.json": "11ebe00707f4b35a80e2646740524de09e36e615fc33dbecf9cf4dcf41ede51e",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "a8bae7ae92c3ea3a6d7a9556298bfd8dcb68f8da53ba255c66a34a3ae2b8d4c5"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "c94ccb211c4a7524cf01d5404775f6e7d3e7d7e10f6fffe0e1f435ba0603c1d2"
    ),
    "rejects.jsonl": "960e380351bd59fe229666a9b73633a9a449384ad57af0fdff0847d053632ca5",
    "shards/shard-00000.arrow": "71b3ea173129e33e07cb3dc0e77f05a8ad9bf83d74cbe4244c1e849d385a6e43",
}

REAL_GOLDEN = {
    "manifest.json": "ef0a5c028782e83ccf8951e2f828022f0752b9e8f33af920ac766c026c1a4c49",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "e1e582ee711f2b40cbab322a214b2631cd9c3c543fb0a10d1e660760983b2416"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "e7c4cf014c33d98f3b0ecee9e36a24eb641ef586595f99d11e7bc96941237f03"
    ),
    "rejects.jsonl": "9993489ed909d9a309819b20046eefb1b2e29968f1fa616ce94f384b4475bea1",
    "shards/shard-00000.arrow": "a82776810595f39e2c9e8905c91dbb7b02364645ac426595d4cac9b21ab3dbda",
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
