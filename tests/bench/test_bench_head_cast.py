"""bench/head_cast.py at a toy size: the LM head cast in blocks under bf16 autocast against
autocast's whole cast, with the weight's gradient. The logits are bit-identical, the blocks'
peak is below the whole cast's (its copy and its bf16 weight gradient are gone), and the hidden
states' gradient is at least as close to float64."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "head_cast.py"


def test_head_cast_bench_reports_blocks_against_whole() -> None:
    args = ["--vocab", "4096", "--hidden", "64", "--rows", "32", "--block-rows", "500",
            "--rounds", "2", "--device", "cpu", "--json"]  # fmt: skip
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    r = json.loads(out.stdout)
    assert r["block_rows"] == 500 and r["logits_identical"]
    assert r["peak_bytes"]["blocks"] < r["peak_bytes"]["whole"], r
    assert r["hidden_grad_error"]["blocks"] <= r["hidden_grad_error"]["whole"], r
    assert set(r["seconds"]) == {"whole", "blocks"}
