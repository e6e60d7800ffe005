"""bench/attention: what each tree-attention layout costs on the real Claude Code session.

The session (``../shared/data/logs/claude-code``, Qwen3 tokenizer: 4 trees, 411k unique tokens,
the largest 378k) is planned at a 131,072-token budget with ``cut="prefix"`` (whole
micro-batches of at most the budget; the default hand-off plan runs the 378k-token tree as parts
with handed-over prefixes instead, which this benchmark does not lay out yet), with
:func:`treeprep.trainer.data.plans.make_plan`, and for every micro-batch this prints:

* ``tokens``: T, the tokens it feeds (the planner's recomputed prefix included);
* ``block_mask_bytes``: the FlexAttention block mask built from node intervals
  (:func:`treeprep.trainer.attention.flex.block_mask`), its index tensors, against ``t2_bytes``
  (T x K, what an uncompiled ``create_block_mask`` materialises) and ``build_seconds``;
* ``dense_pairs``: the (query, key) pairs the tree rule allows, the work an exact kernel does;
  ``block_pairs``: the pairs FlexAttention computes, 128 x 128 per partial or full block;
* ``gathered_rows``: the key rows the ``flash`` layout gathers (the sum over nodes of their path
  lengths); ``segment_rows``: the rows the ``nodes`` backend reads in place
  (``TreeMask.chains().segment_rows``).

Top-level figures are sums over the micro-batches (``block_mask_fraction`` is the largest
per-micro-batch ratio of block-mask bytes to T x K bytes). CPU only, no model: it measures
layouts, not kernels.

    python bench/attention.py            # a table
    python bench/attention.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def ensure_build(work: Path) -> Path:
    from treeprep.build import BuildConfig, build

    out = work / "claude-code-qwen3"
    if not (out / "manifest.json").exists():
        build(
            BuildConfig(
                inputs=[str(SHARED / "logs" / "claude-code")],
                out=str(out),
                tokenizer=str(SHARED / "tokenizers" / "qwen3"),
            )
        )
    return out


def measure(batch) -> dict:  # noqa: ANN001
    from treeprep.trainer.attention import TreeMask
    from treeprep.trainer.attention.flash import node_key_rows
    from treeprep.trainer.attention.flex import block_classes, block_mask, block_mask_bytes

    tm = TreeMask.from_batch(batch, "flex")
    t0 = time.perf_counter()
    bm = block_mask(tm)
    secs = time.perf_counter() - t0
    partial, full = block_classes(tm)
    depth = np.zeros(tm.num_tokens, dtype=np.int64)  # keys each query sees, from the node layout
    start, length, parent = tm.node_start, tm.node_length, tm.node_parent
    above = np.zeros(len(start), dtype=np.int64)
    for n in range(len(start)):  # pre-order: parents come first
        above[n] = above[parent[n]] + length[parent[n]] if parent[n] >= 0 else 0
        depth[start[n] : start[n] + length[n]] = above[n] + np.arange(1, length[n] + 1)
    _, cu_k, _, _, _ = node_key_rows(tm)
    t, k = tm.num_tokens, tm.num_keys
    bb = block_mask_bytes(bm)
    return {
        "tokens": t,
        "keys": k,
        "block_mask_bytes": bb,
        "t2_bytes": t * k,
        "block_mask_fraction": bb / (t * k),
        "build_seconds": secs,
        "dense_pairs": int(depth.sum()),
        "block_pairs": int(partial.sum() + full.sum()) * 128 * 128,
        "partial_blocks": int(partial.sum()),
        "full_blocks": int(full.sum()),
        "gathered_rows": int(cu_k[-1]),
        "segment_rows": int(tm.chains().segment_rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budget", type=int, default=131072)
    ap.add_argument("--work", default=str(ROOT / "bench" / "_work" / "attention"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (SHARED / "logs" / "claude-code").is_dir():
        sys.exit(f"bench/attention needs {SHARED}/logs/claude-code")
    import torch

    from treeprep.trainer.batch import TreeBatch
    from treeprep.trainer.data.plans import make_plan
    from treeprep.trainer.data.reader import BuildReader
    from treeprep.trainer.data.rows import part_row

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    reader = BuildReader(str(ensure_build(work)))
    plan = make_plan(reader, budget=a.budget, cut="prefix")
    rows = []
    for step in plan.steps:
        for mb in step.slots[0]:
            batch = TreeBatch.from_trees([part_row(reader.tree(p.shard, p.row), p) for p in mb])
            rows.append(measure(batch))
    keys = ("tokens", "block_mask_bytes", "t2_bytes", "build_seconds", "dense_pairs",
            "block_pairs", "gathered_rows", "segment_rows")  # fmt: skip
    out: dict = {k: sum(r[k] for r in rows) for k in keys}
    out["block_mask_fraction"] = max(r["block_mask_fraction"] for r in rows)
    out.update(budget=a.budget, micro_batches=rows, torch=torch.__version__)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"claude-code session, budget {a.budget:,}: attention layouts")
    for c in ("T", "mask MB", "% of T·K", "build s", "dense pairs", "block pairs",
              "gathered rows", "segment rows"):  # fmt: skip
        tab.add_column(c, justify="right")
    for r in [*rows, out]:
        tab.add_row(
            f"{r['tokens']:,}",
            f"{r['block_mask_bytes'] / 2**20:.1f}",
            f"{100 * r['block_mask_bytes'] / r['t2_bytes']:.3f}",
            f"{r['build_seconds']:.2f}",
            f"{r['dense_pairs']:,}",
            f"{r['block_pairs']:,}",
            f"{r['gathered_rows']:,}",
            f"{r['segment_rows']:,}",
        )
    Console().print(tab)


if __name__ == "__main__":
    main()
