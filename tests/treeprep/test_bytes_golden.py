"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and
re-recorded for issue 15 item 22: inputs are now named by their path relative to the input root
(group ids, ``seq_source``, rejects, manifest), and the manifest gained ``duplicate_inputs``. They
guard that moving code between modules changes no byte of the shards, the manifest, the rejects
or the plan. The build runs from the repository root (the adversarial suite checks that the
bytes do not depend on where the inputs lie). Plans were re-recorded for plan version 2
(issue 11: hand-off rows and their columns), the sample files for the new formats and the
OpenHands V1 event stream, now read (issue 14: real-log shards unchanged).
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
    "manifest.json": "a17d212d4fdd76ea6b4320198677f2f60dee3fbc3406d44e206f5766c2b98d76",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "fb559583f06c6b65da9a59a2863e59ea234f82af5cde7a886d2d03f0ac99086a"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "e0bc8ab9f367c88eb4dfde1a630bc929abbb85fa3a4d847966941493e36ed406"
    ),
    "rejects.jsonl": "bd9675fb601040b7e10b3ef72f24d695411ee72536760b91724480cf17f08f6c",
    "shards/shard-00000.arrow": "01dc467209faea98308b39f79153516b9674c197704d92124e2410ac9aeb5d35",
}

REAL_GOLDEN = {
    "manifest.json": "b61f611681dae508b4c8f15e71e1439a5c521521b4fd4816b526f76ffc667005",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "e1e582ee711f2b40cbab322a214b2631cd9c3c543fb0a10d1e660760983b2416"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "d322e78cd0e044b0469f584a86b95977074a644f9e4a4ac9303abd2c5fb685fa"
    ),
    "rejects.jsonl": "9993489ed909d9a309819b20046eefb1b2e29968f1fa616ce94f384b4475bea1",
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
