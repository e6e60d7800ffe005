"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and
re-recorded for issue 15 item 22: inputs are now named by their path relative to the input root
(group ids, ``seq_source``, rejects, manifest), and the manifest gained ``duplicate_inputs``. They
guard that moving code between modules changes no byte of the shards, the manifest, the rejects
or the plan. The build runs from the repository root (the adversarial suite checks that the
bytes do not depend on where the inputs lie). Plans were re-recorded for plan version 2
(issue 11: hand-off rows and their columns), the sample files for the new formats (issue 14).
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
    "manifest.json": "818d86d8899f830fcd4ed1047aff69b713e90630e86cac41d21fd070b9232ef8",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "c4999f9822d76d093581dbf9bdb223eea50c2226f0243f61e5ab7a535df1276e"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "587735c29c956d18de5b0dcec947edea5bf251232ef1909d32abc34d55bce01d"
    ),
    "rejects.jsonl": "bd9675fb601040b7e10b3ef72f24d695411ee72536760b91724480cf17f08f6c",
    "shards/shard-00000.arrow": "29cef92739d49cf9e6c51f5692c1ccc532729aa0c0fc63820c599b506a9974de",
}

REAL_GOLDEN = {
    "manifest.json": "a0aa137587918c7627857d98790e179e67683d362030a91d05cdeeffc151a0e4",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "e1e582ee711f2b40cbab322a214b2631cd9c3c543fb0a10d1e660760983b2416"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "65cae8608fc2dda427216820c3aa5d2f3af03803ec15516513fe018a1eec168c"
    ),
    "rejects.jsonl": "fd995d33f6185292c925634451519eb15afa68d02fff79feed13a7941fcb84a7",
    "shards/shard-00000.arrow": "fc96b23356c3bf62415659dea817ed5673efff6333709f70063420963e560a7f",
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
