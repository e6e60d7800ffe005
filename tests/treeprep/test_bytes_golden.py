"""Golden bytes: a build and a plan of known inputs hash to values recorded from earlier code.

The hashes were recorded from ``main`` before issue 19's restructuring (commit fdd2b9b) and
re-recorded for issue 15 item 22: inputs are now named by their path relative to the input root
(group ids, ``seq_source``, rejects, manifest), and the manifest gained ``duplicate_inputs``. They
guard that moving code between modules changes no byte of the shards, the manifest, the rejects
or the plan. The build runs from the repository root (the adversarial suite checks that the
bytes do not depend on where the inputs lie). Plans were re-recorded for plan version 2
(issue 11: hand-off rows and their columns), the sample files for the new formats and the
OpenHands V1 event stream, now read (issue 14: real-log shards unchanged), and shard schema
version 2 (issue 16: seq_trajectory_id and seq_ref_logprobs columns). Issue 27 re-recorded
them: the Codex sample's web_search_call turn is now a call (was a reject); tau-bench/tau2 trials
are their own trajectories (only the tau trees' per-sequence columns change: seq_trajectory_id, and
identical calls of two trials are no longer merged into one entry; their tokens and nodes are the
same); the sample gained the trajectory-dataset and ATIF files (every other tree, and every other
reject, is unchanged). The real-log manifest (and the plan
summary, which records its sha256) gained the tokenizer's ``content_sha256``, the identity by
content (issue 25 item 7: shards, rejects and plan rows unchanged by it).
Issue 29 re-recorded both plan summaries, and only them (plan rows, shards, manifest and rejects
unchanged): the summary gained ``tokens_shared``, the opening tokens that the trees of one
micro-batch share and the trainer feeds once (116 in the sample plan, 66,787 in the real-log
one), and ``err`` now counts them once (1 - (tokens_pack - tokens_shared) / tokens_linear). The
field is left out while 0, so the sample summary with it removed and the old ``err`` hashes to
the old value (checked when re-recording).
Issue 27 item 7 re-recorded the sample's shard, manifest and plan summary (plan rows and rejects
unchanged): the openai-chat sample's ``python-version`` retry is its own trajectory
(``metadata.trajectory_id``), so GRPO can use its rewards 1 and 0.5; the only shard difference
is that tree's ``seq_trajectory_id`` (checked column by column), the manifest records the
input's new sha256, and the plan summary the manifest's.
Issue 29 (its pack count past the first branch)
re-recorded the real-log plan summary alone: ``tokens_shared`` is now what the trainer's merge
of each micro-batch's whole trees saves, counted from their token ids rather than from each
tree's opening (66,787 -> 67,062 tokens, ``err`` 0.928486 -> 0.928500); the plan rows and the
sample's summary (116, its trees share only within their openings) are unchanged.
Hidden files met by a folder walk are listed in ``excluded_inputs`` (they were skipped without a
word): the sample's manifest gained its two Aider dot-files there (the only difference, checked
against the previous build) and its plan summary the manifest's new sha256; shards, rejects and
plan rows unchanged, and the real-log build holds no hidden file.
Issue 40 item 2 re-recorded the sample's shard, manifest and plan (rejects unchanged): the
sample gained ``atif/trajectories.json`` (an array of two ATIF v1.7 runs of one task: 7 calls, one
new tree). The sample without that file still hashes to the previous values (checked when
re-recording), so no other tree changed.
Issue 40 item 3 re-recorded them again (rejects unchanged): the Codex sample's web search now ends
its call, and the text after it is a call of its own whose prompt holds the search and a
"(results not logged)" tool turn (5 calls -> 6). Compared tree by tree (every row of the shard,
by group id) with the build before: only the Codex session's tree differs.
Issue 40 item 5 re-recorded them once more (rejects unchanged): the sample gained
``mistral_vibe/`` (two Mistral Vibe sessions, the second continuing the first: 4 calls, one new
tree; its two ``meta.json`` sidecars are listed as skipped files). Compared tree by tree with the
build before: the only difference is the new tree. Then ``pi/`` (one Pi session with a fork, a
branch summary and a compaction: 6 calls, one new tree), compared the same way: only the new
tree. Then ``cline/`` (two Cline task histories: 5 calls, two new trees): only the new trees.
Then ``gptme/`` (a conversation and a branch: 7 calls, 2 of them duplicates left out, one new
tree) and ``opencode/`` (two storage sessions, one a sub-agent of the other, and an export: 11
calls, two new trees; the storage's project, message and part files are listed as skipped
files): the sample without both folders still hashes to the previous values, and every shard
row of the previous trees is unchanged (compared by group id).
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
    "manifest.json": "bcecce9bf7654b35c026e42c419510c9f88a6489048bebd23e9d2ea01c0e6951",
    "plans/b2048-w2-n2-s3/plan.arrow": (
        "74ad8635fe4e6be521a20d8c7c798879f3249b8eef293b875688a36372f85c35"
    ),
    "plans/b2048-w2-n2-s3/summary.json": (
        "0c8bfd63256adf719768cf5649bb65413803d61552a50e7506224345726bc907"
    ),
    "rejects.jsonl": "4a3b881290fd094ab083f3e29f636837144abe09532b7f0c111adc6f73f55621",
    "shards/shard-00000.arrow": "957fa967d0e3d9389bd210ad975d1844e05ed56a85172e1f26e06ff941c86f4e",
}

REAL_GOLDEN = {
    "manifest.json": "524621abfc7a445b3085d01da198b5ef06735d189103d136fa0ee0048cadc6ec",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "621457a43cada67b12a5e4f76b739b4ccf4bd0ff73d8b9575cea4b49a587a732"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "dff7ec79f4c973d77cc61efa14e15d7acb9031824db9f1c0066679e046391ada"
    ),
    "rejects.jsonl": "9993489ed909d9a309819b20046eefb1b2e29968f1fa616ce94f384b4475bea1",
    "shards/shard-00000.arrow": "322f755793cc0c4a44d92225558906ad8acb55f271e7d4c457f873c666a98d41",
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
