"""bench/train.py's FLOP estimate counts what the trainer feeds.

The estimate of the ``shared`` workload (many tasks opening with one system prompt) merges each
micro-batch's trees with :func:`treeprep.pack.share.merge_forest`, as the trainer's assembly does;
its token count must be the trainer's own count of the same steps (``TreeBatch.num_tokens`` with
``share_prefixes``), below the per-tree count, and its linear count the trainer's linear layout's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

from treeprep.flops import from_config  # noqa: E402
from treeprep.trainer import PRESETS  # noqa: E402
from treeprep.trainer.data.plans import make_plan  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402
from treeprep.trainer.data.steps import step_batches  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench" / "train.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shared_estimate_counts_the_merged_tokens_the_trainer_feeds(tmp_path: Path) -> None:
    bt = _bench()
    src = tmp_path / "shared.jsonl"
    small = bt.SHARED["cpu"] | {"tasks": 12}
    bt.shared_openings(src, **small)
    from treeprep.build import BuildConfig, build

    out = tmp_path / "build"
    build(BuildConfig(inputs=[str(src)], out=str(out)))
    shape = from_config(PRESETS["tiny-qwen3"].hf_config(512).to_dict(), name="tiny-qwen3")
    budget = 4096
    est = bt.flop_estimate(out, shape, budget, None)
    reader = BuildReader(str(out))
    plan = make_plan(reader, budget=budget, cost_model=shape, seed=0)
    fed = linear = 0
    for st in plan.steps[1:]:  # step 0 is the bench's untimed warm-up
        for b in step_batches(reader, st, ranks=[0], layout="tree", budget=budget)[0]:
            fed += b.num_tokens
            linear += b.tokens_linear
    assert est["steps"] == len(plan.steps) - 1
    assert est["micro_batches_merged"] > 0
    assert est["tokens_tree_fed"] == fed
    assert est["tokens_tree_fed"] < est["tokens_tree_per_tree"]
    assert est["pairs_tree"] < est["pairs_tree_per_tree"]
    assert est["tokens_linear"] == linear
