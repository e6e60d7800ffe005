"""bench/head_cast.py at a toy size: the LM head cast in blocks under bf16 autocast against
autocast's whole cast, with the weight's gradient. The logits are bit-identical, the blocks'
peak is below the whole cast's (its copy and its bf16 weight gradient are gone), and the hidden
states' gradient is at least as close to float64."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from treeprep.schemas import parts  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench" / "head_cast.py"


def test_head_cast_bench_reports_blocks_against_whole(monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCH.parent))  # head_cast.py imports bench/ways.py
    spec = importlib.util.spec_from_file_location("bench_head_cast", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # --block-rows sets the trainer's block for the process: restored after the test
    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", parts.HEAD_WEIGHT_BLOCK_ELEMENTS)
    args = ["--vocab", "4096", "--hidden", "64", "--rows", "32", "--block-rows", "500",
            "--rounds", "2", "--device", "cpu", "--json"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["head_cast.py", *args])
    bench.main()
    r = json.loads(capsys.readouterr().out)
    assert r["block_rows"] == 500 and r["logits_identical"]
    assert r["peak_bytes"]["blocks"] < r["peak_bytes"]["whole"], r
    assert r["hidden_grad_error"]["blocks"] <= r["hidden_grad_error"]["whole"], r
    assert set(r["seconds"]) == {"whole", "blocks"}
