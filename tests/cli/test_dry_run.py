"""``treeprep train --dry-run``: JSON fields, nothing written, no model loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treeprep.cli.app import app
from treeprep.cli.dry_run import parse_bytes

ROOT = Path(__file__).resolve().parents[2]


def _files(p: Path) -> dict[str, int]:
    return {str(f.relative_to(p)): f.stat().st_mtime_ns for f in p.rglob("*")}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dry") / "b"
    res = CliRunner().invoke(app, ["build", str(ROOT / "sample_data"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_dry_run_json_writes_nothing_and_loads_no_model(
    build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import treeprep.cli.train_cmd as train_cmd

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the dry run trained")

    monkeypatch.setattr(train_cmd, "_train_with_progress", boom)
    monkeypatch.chdir(tmp_path)
    before = _files(build)
    args = ["--world-size", "8", "--gpu-memory", "80GiB", "--dry-run", "--json"]
    res = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-8b", *args])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert _files(build) == before and list(tmp_path.iterdir()) == []
    for k in ("predicted_peak_bytes", "suggested_budget", "predicted_step_seconds", "terms",
              "fits", "budget", "handoff_bytes_per_path_token"):  # fmt: skip
        assert k in d
    assert d["gpu_memory_bytes"] == 80 * 2**30 and d["world_size"] == 8
    assert d["budget"] == d["suggested_budget"] and d["budget_source"] == "suggested"
    t = d["terms"]
    static = sum(t[k] for k in ("parameters", "gradients", "optimizer", "fsdp_gathered"))
    static += t["handoff"] + t["activations"]
    phases = [t["autocast_weights"], t["lm_head_chunk"] + t["head_weight_gradient"],
              t["layer_backward"]]  # fmt: skip
    assert static + max(phases) <= d["predicted_peak_bytes"] <= static + sum(phases)
    assert d["predicted_peak_bytes"] <= d["gpu_memory_bytes"]


def test_given_budget_and_errors(build: Path) -> None:
    res = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-0.6b", "--budget",
                                   "2048", "--dry-run", "--json", "--parallel", "ddp"])  # fmt: skip
    d = json.loads(res.output)
    assert d["budget"] == 2048 and d["budget_source"] == "given" and d["parallel"] == "ddp"
    bad = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-0.6b", "--dry-run",
                                   "--gpu-memory", "lots"])  # fmt: skip
    assert bad.exit_code == 1 and "--gpu-memory" in str(bad.exception)
    dense = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-0.6b", "--dry-run",
                                     "--attn", "dense"])  # fmt: skip
    assert dense.exit_code == 1 and "attention backend dense keeps" in str(dense.exception)


def test_keep_tokens_bound_the_kept_graphs(build: Path) -> None:
    """``--keep-tokens`` reaches the memory model: none kept holds no graphs and recomputes
    (a longer step) where the default keeps the path's less one part."""

    def run(*extra: str) -> dict:
        res = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-0.6b", "--budget",
                                       "64", "--part-graph", "keep", "--dry-run", "--json",
                                       "--parallel", "ddp", *extra])  # fmt: skip
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    default, none = run(), run("--keep-tokens", "0")
    assert default["terms"]["kept_graphs"] > 0 == none["terms"]["kept_graphs"]
    assert none["predicted_step_seconds"] > default["predicted_step_seconds"]
    assert none["predicted_peak_bytes"] < default["predicted_peak_bytes"]
    bad = CliRunner().invoke(app, ["train", str(build), "--keep-tokens", "-1", "--dry-run"])
    assert bad.exit_code == 2 and "--keep-tokens" in bad.output


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("141GB") == 141 * 10**9
    assert parse_bytes("1024") == 1024


def test_build_facts_count_the_stacks_of_the_largest_trees(build: Path, monkeypatch) -> None:  # noqa: ANN001
    """The dry run's stored rows at a budget: every tree's stack counted (the sample's trees are
    few), or only the largest tree's and the others by their longest path."""
    import numpy as np

    import treeprep.dry_run as mem
    from treeprep.pack.forest import load_forest
    from treeprep.schemas.parts import stored_rows_peak

    f = load_forest(str(build))
    per_tree = [
        stored_rows_peak(
            *(x[f.node_off[t] : f.node_off[t + 1]] for x in (f.node_length, f.node_parent)), 64
        )
        for t in range(f.num_trees)
    ]
    assert max(per_tree) > 0  # some tree is cut at 64
    assert mem.BuildFacts.of(str(build)).stored_rows(64) == max(per_tree)
    monkeypatch.setattr(mem, "COUNTED_TREES", 1)
    one = mem.BuildFacts.of(str(build))
    big = int(np.argmax(f.tokens_tree()))
    rest = max(int(p) for t, p in enumerate(f.longest_path()) if t != big)
    assert len(one.tree_nodes) == 1 and one.rest_path == rest
    assert one.stored_rows(64) == max(per_tree[big], rest - 64)


def test_both_store_places_and_host_memory(build: Path) -> None:
    """Issue 37 item 4: GPU peak and host RAM per rank for both store places, the longest path
    each fits, ``--host-memory`` per node shared by the node's ranks (8 of 8 here)."""
    args = ["--model", "qwen3-8b", "--world-size", "8", "--parallel", "fsdp", "--gpu-memory",
            "80GiB", "--host-memory", "1TiB", "--budget", "1024", "--dry-run",
            "--json"]  # fmt: skip
    res = CliRunner().invoke(app, ["train", str(build), *args, "--stores", "host"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["stores"] == "host" and d["host_memory_bytes"] == 2**40 // 8
    g, h = d["store_places"]["gpu"], d["store_places"]["host"]
    assert d["terms"]["host_stores"] == h["host_bytes"] and g["host_bytes"] == 0
    # (this build's paths are short: the streamed windows outweigh its stores on the GPU)
    assert h["gpu_peak_bytes"] == d["predicted_peak_bytes"]
    assert h["longest_path"] > g["longest_path"] > 0
    text = CliRunner().invoke(app, ["train", str(build), *args[:-1]])
    flat = " ".join(text.output.replace("│", " ").split())  # the table's cells, unwrapped
    assert "host stores" in flat and "longest path that fits" in flat
    bad = CliRunner().invoke(app, ["train", str(build), *args[:-1], "--host-memory", "lots"])
    assert bad.exit_code == 1 and "--host-memory" in str(bad.exception)
    run = CliRunner().invoke(app, ["train", str(build), "--model", "tiny-qwen3", "--host-memory",
                                   "1TiB"])  # fmt: skip
    assert run.exit_code == 1 and "--dry-run" in str(run.exception)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Claude Code session's shape (a 126,189-token path) in place of the sample build's."""
    from treeprep.dry_run import BuildFacts

    facts = BuildFacts(1, 377_978, 126_189, 377_978, 377_978 * 10**5, ((377_978, 377_978 * 10**5),))
    monkeypatch.setattr(BuildFacts, "of", classmethod(lambda cls, path: facts))


def _text(build: Path, *args: str) -> str:
    res = CliRunner(env={"COLUMNS": "250"}).invoke(
        app, ["train", str(build), "--model", "qwen3-8b", "--dry-run", *args]
    )
    assert res.exit_code == 0, res.output
    return res.output


def test_the_figures_say_their_budget_and_cp_and_end_with_a_command(
    build: Path, session: None
) -> None:
    """Issue 53 item 2: ``--cp 8`` shows cp 8, each store row the budget, checkpointing and cp
    its figures hold at (the README's 1.48M and 3.74M at budget 16,384), and the last line is
    the run to start, carrying the options given."""
    out = _text(build, "--world-size", "8", "--cp", "8", "--budget", "16384",
                "--activation-checkpointing", "--host-memory", "1TiB", "--lora-r", "8")  # fmt: skip
    assert "qwen3-8b x 8 (fsdp, cp 8)" in out
    assert "at budget 16,384, checkpointing, cp 8; longest path that fits 1,481,155" in out
    assert "at budget 16,384, checkpointing, cp 8; longest path that fits 3,744,654" in out
    assert "host_stores" not in out  # host RAM is the store rows', not a GPU term at 0.00
    assert out.splitlines()[-1] == (
        f"run: torchrun --nproc-per-node 8 -m treeprep.cli train {build} --model qwen3-8b "
        "--budget 16384 --activation-checkpointing --parallel fsdp --cp 8 --lora-r 8"
    )


def test_no_unbounded_figure_and_given_only_when_given(build: Path, session: None) -> None:
    """Without ``--host-memory`` the host row names the option instead of a path in the billions;
    "(given)" only when ``--stores`` was; ``--stores host`` keeps the gpu row; one process runs
    ``treeprep train``; nothing fitting names the dry run to try next."""
    import re

    plain = _text(build, "--world-size", "8")
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*\d", plain)]
    assert max(numbers) < 10**7, max(numbers)
    assert "set by host RAM, give --host-memory" in plain
    assert "gpu (default)" in plain and "(given)" not in plain
    host = _text(build, "--world-size", "8", "--stores", "host")
    assert "host (given)" in host

    def row(text: str) -> str:
        return next(ln for ln in text.splitlines() if "gpu stores" in ln)

    assert row(host) == row(plain) and "(fits)" in row(plain)
    assert plain.splitlines()[-1].startswith("run: torchrun --nproc-per-node 8 -m treeprep.cli")
    one = CliRunner().invoke(app, ["train", str(build), "--model", "qwen3-0.6b", "--dry-run"])
    assert one.output.splitlines()[-1].startswith(
        f"run: treeprep train {build} --model qwen3-0.6b --budget"
    )
    none = _text(build)
    assert none.splitlines()[-1] == (
        f"nothing fits; try: treeprep train {build} --model qwen3-8b --dry-run --world-size 8 "
        "--parallel fsdp"
    )
    assert "(nothing fits: the smallest tried)" in none
    d = json.loads(_text(build, "--world-size", "8", "--json"))
    assert d["cp"] == 1 and d["command"].startswith("torchrun") and d["stores_source"] == "default"


def test_a_half_precision_dry_run_is_a_bf16_one(tmp_path: Path) -> None:
    """--precision float16 (a grad-scaled half run) has bf16's memory and the tensor cores'
    half-precision peak; the dry run stopped with a KeyError."""
    out = tmp_path / "b"
    res = CliRunner().invoke(
        app, ["build", str(ROOT / "sample_data" / "claude-code"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    got = {}
    for prec in ("float16", "bfloat16"):
        args = [
            "train",
            str(out),
            "--model",
            "qwen3-8b",
            "--dry-run",
            "--json",
            "--precision",
            prec,
        ]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        got[prec] = json.loads(res.output)
    fp16 = got["float16"]["command"].replace("--precision float16", "--precision bfloat16")
    assert fp16 == got["bfloat16"]["command"]
    del got["float16"]["command"], got["bfloat16"]["command"]
    assert got["float16"] == got["bfloat16"]


def test_a_budget_and_parallelism_from_a_config_file_are_given(build: Path, tmp_path: Path) -> None:
    """Issue 55 item 2: the dry run chooses the budget and the parallelism only where they were
    not set: on the command line or in ``--config``'s file (``RUN/config.toml`` holds both), not
    by their defaults (``--budget 4096``, ``--parallel ddp``, the run's)."""
    conf = tmp_path / "c.toml"
    conf.write_text('budget = 1024\nparallel = "fsdp"\n')
    args = ["train", str(build), "--model", "qwen3-0.6b", "--world-size", "8", "--dry-run"]
    d = json.loads(CliRunner().invoke(app, [*args, "--json", "--config", str(conf)]).output)
    assert (d["budget"], d["budget_source"], d["parallel"]) == (1024, "given", "fsdp")
    assert d["parallel_source"] == "given"
    d = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert d["budget_source"] == "suggested" and d["parallel_source"] == "suggested"
