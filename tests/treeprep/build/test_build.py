"""The build pipeline end to end: counts reconcile, determinism, resume, grouping, round trips."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from treeprep.build import BuildConfig, build
from treeprep.build import engines as engines_mod
from treeprep.cli.app import app
from treeprep.errors import TooManyErrors
from treeprep.export import export_sequences
from treeprep.schemas.manifest import load_manifest
from treeprep.shards import iter_trees

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT / ".." / "shared" / "data"
QWEN3 = SHARED / "tokenizers" / "qwen3"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/data is absent")


def _rollout(group: str, prompt: list[int], gen: list[int], **kw) -> dict:
    return {"group_id": group, "prompt_token_ids": prompt, "generation_token_ids": gen, **kw}


def _write_jsonl(path: Path, rows: list, raw_lines: list[bytes] = ()) -> Path:
    with open(path, "wb") as f:
        for r in rows:
            f.write(orjson.dumps(r) + b"\n")
        for line in raw_lines:
            f.write(line + b"\n")
    return path


def _chat(group: str, n_turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Count up."}]
    calls = []
    for k in range(n_turns):
        comp = {"role": "assistant", "content": f"number {k}"}
        calls.append(
            {"group_id": group, "call_id": f"{group}-{k}", "messages": msgs, "completion": comp}
        )
        msgs = msgs + [comp, {"role": "user", "content": f"and after {k}?"}]
    return calls


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())}


def test_counts_reconcile_and_rejects_name_file_and_line(tmp_path: Path) -> None:
    good = _write_jsonl(
        tmp_path / "calls.jsonl",
        _chat("s1", 3),
        raw_lines=[b'{"messages": [', b'{"messages": [{"role": "robot", "content": "x"}]}'],
    )
    toks = _write_jsonl(tmp_path / "toks.jsonl", [_rollout("g", [1, 2, 3], [4, 5])])
    m = build(BuildConfig(inputs=[str(good), str(toks)], out=str(tmp_path / "out")))
    c = m.counts
    assert c.records_read == 6
    assert c.records_rejected == 2
    assert c.records_in_trees == 4
    assert c.records_read == c.records_in_trees + c.records_rejected
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["file"]).name, r["line"]) for r in rejects] == [
        ("calls.jsonl", 4),
        ("calls.jsonl", 5),
    ]
    assert c.trees == 2  # one per group id


def test_same_inputs_give_same_bytes_and_workers_do_not_matter(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        rows = _chat(f"s{i}", 4) + _chat("shared-group", 2)
        files.append(str(_write_jsonl(tmp_path / f"f{i}.jsonl", rows)))
    outs = []
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        # dedup off: the shared group's calls are the same in every file (copies, which a
        # default build trains once: tests/treeprep/build/test_curate.py)
        cfg = BuildConfig(inputs=files, out=str(tmp_path / name), workers=workers, dedup=False)
        build(cfg)
        outs.append(tmp_path / name)
    a, b, c = (_shard_bytes(o) for o in outs)
    assert a == b == c
    man = [(o / "manifest.json").read_text() for o in outs]
    assert man[0] == man[1] == man[2]
    # the group spread over three files is one tree
    trees = {t.group_id: t for t in iter_trees(str(outs[0]))}
    assert int(trees["shared-group"].seq_count.sum()) == 6


def test_a_killed_build_resumes_without_redoing_finished_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [str(_write_jsonl(tmp_path / f"f{i}.jsonl", _chat(f"s{i}", 3))) for i in range(3)]
    clean = tmp_path / "clean"
    build(BuildConfig(inputs=files, out=str(clean)))

    out = tmp_path / "out"
    real = engines_mod.process_file
    seen: list[str] = []

    def dies_on_second(job):
        seen.append(Path(job.path).name)
        if len(seen) == 2:
            raise KeyboardInterrupt("killed")
        return real(job)

    monkeypatch.setattr(engines_mod, "process_file", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        build(BuildConfig(inputs=files, out=str(out)))
    assert not (out / "manifest.json").exists()

    seen.clear()
    monkeypatch.setattr(engines_mod, "process_file", lambda job: seen.append(job.path) or real(job))
    build(BuildConfig(inputs=files, out=str(out)))
    assert [Path(p).name for p in seen] == ["f1.jsonl", "f2.jsonl"]  # f0 finished before the kill
    assert _shard_bytes(out) == _shard_bytes(clean)
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))


def test_max_errors_stops_the_build_with_exit_code_1(tmp_path: Path) -> None:
    bad = _write_jsonl(tmp_path / "bad.jsonl", [_rollout("g", [1], [2])], raw_lines=[b"{"] * 3)
    with pytest.raises(TooManyErrors):
        build(BuildConfig(inputs=[str(bad)], out=str(tmp_path / "o1"), max_errors=2))
    res = CliRunner().invoke(
        app, ["build", str(bad), "-o", str(tmp_path / "o2"), "--max-errors", "2"]
    )
    assert res.exit_code == 1
    # within the limit the build finishes and reports them
    m = build(BuildConfig(inputs=[str(bad)], out=str(tmp_path / "o3"), max_errors=3))
    assert m.counts.records_rejected == 3 and m.counts.trees == 1


def test_gzip_input_and_default_group_by_file(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl.gz"
    rows = [{"prompt_token_ids": [1, 2], "generation_token_ids": [3]} for _ in range(2)]
    with gzip.open(p, "wb") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    m = build(BuildConfig(inputs=[str(p)], out=str(tmp_path / "o")))
    (tree,) = list(iter_trees(str(tmp_path / "o")))
    assert tree.group_id == "r.jsonl.gz"  # relative to the input root (issue 15 item 22)
    assert tree.seq_count.tolist() == [2]
    assert m.counts.tokens_linear == 6 and m.counts.tokens_tree == 3


def test_shards_are_readable_by_polars_pyarrow_and_datasets(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "t.jsonl", [_rollout("g", [1, 2, 3], [4]), _rollout("h", [5], [6])])
    build(BuildConfig(inputs=[str(p)], out=str(tmp_path / "o")))
    shard = next((tmp_path / "o" / "shards").iterdir())
    import polars as pl

    assert pl.read_ipc(shard)["group_id"].to_list() == ["g", "h"]
    with pa.memory_map(str(shard)) as src:
        assert pa.ipc.open_file(src).read_all().num_rows == 2
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "arrow", data_files=str(shard), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds["input_ids"][0] == [1, 2, 3, 4]


rollout_rows = st.lists(
    st.tuples(
        st.sampled_from(["g1", "g2", "g3"]),
        st.sampled_from([[1, 2, 3], [1, 2], [7], [1, 2, 3, 4, 5]]),
        st.lists(st.integers(0, 9), min_size=1, max_size=5),
        st.sampled_from([None, 1.0, -1.0]),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=rollout_rows)
def test_export_of_build_is_the_input_multiset(tmp_path_factory, rows) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    recs = [_rollout(g, p, gen, **({} if a is None else {"advantage": a})) for g, p, gen, a in rows]
    src = _write_jsonl(tmp / "r.jsonl", recs)
    build(BuildConfig(inputs=[str(src)], out=str(tmp / "o")))
    n = export_sequences(str(tmp / "o"), str(tmp / "seqs.jsonl"))
    got = Counter()
    for line in (tmp / "seqs.jsonl").read_text().splitlines():
        r = json.loads(line)
        got[(r["group_id"], tuple(r["input_ids"]), tuple(r["loss_mask"]), r.get("advantage"))] += 1
    want = Counter(
        (g, tuple(p + gen), tuple([0] * len(p) + [1] * len(gen)), a) for g, p, gen, a in rows
    )
    assert n == len(rows)
    assert got == want


@needs_shared
def test_done_when_command_of_issue_2(tmp_path: Path) -> None:
    """The issue's acceptance command: build, stats --json, export, on real logs with Qwen3."""
    out = tmp_path / "OUT"
    llm = SHARED / "logs" / "openhands" / "tests" / "fixtures" / "llm_data"
    roll = (
        SHARED
        / "logs"
        / "openai-responses"
        / "competitive_coding_challenges__example_rollouts.jsonl"
    )
    runner = CliRunner()
    res = runner.invoke(
        app, ["build", str(llm), str(roll), "--tokenizer", str(QWEN3), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["stats", str(out), "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    m = load_manifest(str(out))
    for key in (
        "trees",
        "sequences",
        "tokens_linear",
        "tokens_tree",
        "por",
        "ideal_speedup",
        "records_read",
        "records_rejected",
    ):
        assert key in stats
    assert stats["records_read"] == m.counts.records_read
    assert stats["records_read"] == stats["sequences"] + stats["records_rejected"]
    assert stats["tokens_tree"] < stats["tokens_linear"]
    res = runner.invoke(app, ["export", str(out), "-o", str(tmp_path / "seqs.jsonl")])
    assert res.exit_code == 0, res.output
    lines = (tmp_path / "seqs.jsonl").read_text().splitlines()
    assert len(lines) == stats["sequences"]
    assert m.tokenizer.name == "qwen3"
    assert os.path.basename(m.shards[0].path).startswith("shard-")


def test_work_of_dropped_inputs_is_pruned(tmp_path: Path) -> None:
    a = str(_write_jsonl(tmp_path / "a.jsonl", [_rollout("g", [1], [2])]))
    b = str(_write_jsonl(tmp_path / "b.jsonl", [_rollout("h", [3], [4])]))
    out = tmp_path / "o"
    build(BuildConfig(inputs=[a, b], out=str(out)))
    assert len([p for p in (out / ".work").iterdir() if p.is_dir()]) == 2
    m = build(BuildConfig(inputs=[a], out=str(out)))
    assert len([p for p in (out / ".work").iterdir() if p.is_dir()]) == 1
    assert m.counts.trees == 1
