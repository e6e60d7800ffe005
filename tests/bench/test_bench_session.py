"""bench/session.py: a build's tree side against its linear side, beside stats' estimate.

A tiny build of sample_data's Claude Code session (one tree of 8 sequences) runs at a budget that
cuts the tree into parts. A sample at least as large as the sequences measures every one of them:
the linear total is the measured sum, with no spread. A smaller sample is stratified and
extrapolated; with seconds that are constant within each stratum the extrapolation is exact.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.flops import from_config  # noqa: E402
from treeprep.stats import compute_stats  # noqa: E402
from treeprep.trainer import PRESETS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "session.py"


def _bench():
    sys.path.insert(0, str(BENCH.parent))  # session.py imports bench/memory.py and bench/train.py
    try:
        spec = importlib.util.spec_from_file_location("bench_session", BENCH)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclass looks its module up
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH.parent))
    return mod


@pytest.fixture(scope="module")
def session_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("session") / "build"
    build(BuildConfig(inputs=[str(ROOT / "sample_data" / "claude-code")], out=str(out)))
    return out


def test_full_sample_measures_every_sequence(session_build: Path, capsys) -> None:
    bs = _bench()
    args = ["--data", str(session_build), "--vocab", "512", "--budget", "1024", "--threads", "1"]
    r = bs.main([*args, "--sample", "100", "--json"])
    assert r["trees"] == 1 and r["sequences"] == 8
    assert r["tree"]["parts"] > 1  # the tree runs as hand-off parts at the budget
    lin = r["linear"]
    assert lin["extrapolated"] is False
    assert lin["measured_sequences"] == 8
    assert lin["seconds"] == pytest.approx(lin["measured_seconds"], rel=1e-12)
    assert lin["se_seconds"] == 0.0 and lin["ci95"][0] == lin["ci95"][1] == lin["seconds"]
    assert [s["count"] for s in lin["strata"]] == [8] and lin["strata"][0]["sampled"] == 8
    assert r["measured_speedup"] == pytest.approx(lin["seconds"] / r["tree"]["seconds"])
    # the estimate is treeprep stats' own, for the same build, model and budget
    shape = from_config(PRESETS["tiny-qwen3"].hf_config(512).to_dict(), name="tiny-qwen3")
    stats = compute_stats(str(session_build), model=shape, budget=1024)
    assert r["stats"]["estimated_speedup"] == stats["packing"]["model_speedup"]
    assert r["ratio"] == pytest.approx(r["measured_speedup"] / r["stats"]["estimated_speedup"])
    assert r["tokens_linear"] == stats["tokens_linear"] and r["tokens_tree"] == stats["tokens_tree"]
    assert "measured" in capsys.readouterr().err  # the line for people goes to stderr with --json

    s = bs.main([*args, "--sample", "4", "--strata", "2"])
    lin = s["linear"]
    assert lin["extrapolated"] is True and lin["measured_sequences"] == 4
    assert [x["sampled"] for x in lin["strata"]] == [2, 2]
    assert sum(x["count"] for x in lin["strata"]) == 8
    assert lin["ci95"][0] <= lin["seconds"] <= lin["ci95"][1]


def test_stratified_extrapolation() -> None:
    bs = _bench()
    lengths = np.array([10, 500, 20, 400, 30, 300, 40, 200, 50, 100, 60, 1000])
    st, picked = bs.stratified_sample(lengths, 6, strata=3, seed=1)
    assert len(picked) == len(set(picked.tolist())) == 6
    assert np.bincount(st[picked], minlength=3).min() >= 2
    # the strata split by length: every length of a stratum below every length of the next
    assert all(lengths[st == h].max() < lengths[st == h + 1].min() for h in range(2))
    # seconds constant within each stratum: the extrapolation is the exact total, no spread
    per_stratum = np.array([1.0, 2.0, 5.0])
    secs = per_stratum[st]
    est = bs.extrapolate(lengths, st, picked, secs[picked])
    assert est["seconds"] == pytest.approx(secs.sum(), rel=1e-12)
    assert est["se_seconds"] == 0.0
    # every unit sampled: the measured sum whatever the strata
    rng = np.random.default_rng(0)
    secs = rng.random(len(lengths))
    full = bs.extrapolate(lengths, st, np.arange(len(lengths)), secs)
    assert full["seconds"] == pytest.approx(secs.sum(), rel=1e-12)
    assert full["se_seconds"] == 0.0
    # a sample at least as large as the population is all of it
    st, picked = bs.stratified_sample(lengths, 99, strata=3)
    assert picked.tolist() == list(range(len(lengths)))
