"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and
re-recorded for issue 15 item 22: inputs are now named by their path relative to the input root
(group ids, ``seq_source``, rejects, manifest), and the manifest gained ``duplicate_inputs``. They
guard that moving code between modules changes no byte of the shards, the manifest, the rejects
or the plan. The build runs from the repository root (the adversarial suite checks that the
bytes do not depend on where the inputs lie). Plans were re-recorded for plan version 2
(issue 11: hand-off rows and their columns), the sample files for the new formats and the
OpenHands V1 event stream, now read (issue 14: real-log shards unchanged), and shard schema
version 2 (issue 16: seq_trajectory_id and seq_ref_logprobs columns). The real-log manifest (and
the plan summary, which records its sha256) were re-recorded for issue 25 item 7: the tokenizer
entry gained ``content_sha256``, the identity by content (shards, rejects and plan rows
unchanged; builds of the built-in tokenizer unchanged).
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
    "manifest.json": "b443d5dfb80c992e6e353c81b586328b8f7837f2868547008b21e8d29723a7a0",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "6983f8e80699f0c260c7930014fc301b2d921567f7634e4ceac7ade59d30573f"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "3404dbc82bf2a2a87694f41745452ecc7e932fa3dfe4019bfedf93613c23db0b"
    ),
    "rejects.jsonl": "bd9675fb601040b7e10b3ef72f24d695411ee72536760b91724480cf17f08f6c",
    "shards/shard-00000.arrow": "cc2fc7d2b9c137456064f4a717e444071b7d58ae6149f7e499af3fe56c7888bc",
}

REAL_GOLDEN = {
    "manifest.json": "f383d8f945db2d7e2d7f2862cc17642b800f9436ac5f6ffa4343e9a79ff9e68e",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "e1e582ee711f2b40cbab322a214b2631cd9c3c543fb0a10d1e660760983b2416"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "5a384b545751e8c56212b27d19b8c14bcf42e5c4e3a11001f5a8a1c0cbe1d909"
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
