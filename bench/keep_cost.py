"""bench/keep_cost: what keep mode's bound on kept graphs costs in time.

``--part-graph keep`` holds the graphs of the parts on the depth-first stack up to the tree's
longest path less one part (:meth:`treeprep.trainer.parts.plan.PartLayout.kept_parts`); the parts
beyond recompute their forward, as ``recompute`` does for all of them. This times one forward and
backward of bench/memory.py's generated agent session three ways, interleaved round by round
(the order rotating; the first round dropped from the medians): keep within the path (the
default), keep with every graph (``keep_tokens`` unbounded, the behaviour before the bound) and
recompute, and prints the ratios.

    python bench/keep_cost.py --path 16384 --budget 2048 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import AGENT_VOCAB, agent_tree_row  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--path", type=int, default=16384, help="the agent session's path (tokens)")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()

    import torch

    from treeprep.trainer import TreeBatch, load_model
    from treeprep.trainer.objective.loss import LossConfig
    from treeprep.trainer.parts import part_layout, run_parts

    torch.manual_seed(0)
    model = load_model(a.model, dtype=getattr(torch, a.dtype), attn="nodes", vocab_size=AGENT_VOCAB)
    batch = TreeBatch.from_trees([agent_tree_row(a.path)], norm="token-mean")
    layout = part_layout(batch, a.budget)
    inner = sum(p.num_tokens for p in layout.parts if layout.children[p.index])
    keeps = layout.kept_parts()
    kept = sum(p.num_tokens for p in layout.parts if keeps[p.index])
    print(f"tree {batch.num_tokens:,} tokens, path {layout.path:,}, {len(layout.parts)} parts at "
          f"budget {a.budget}; inner parts {inner:,} tokens, {kept:,} kept within the path; "
          f"{a.model} {a.dtype}")  # fmt: skip
    runs = {
        "keep": dict(mode="keep"),
        "keep_every": dict(mode="keep", keep_tokens=10**12),
        "recompute": dict(mode="recompute"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for rnd in range(a.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            run_parts(model, batch, LossConfig("sft"), budget=a.budget, attn="nodes", **runs[name])  # type: ignore[arg-type]
            times[name].append(time.perf_counter() - t0)
            print(f"round {rnd}  {name:10s} {times[name][-1]:7.2f} s", flush=True)
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items()}
    print(
        "median seconds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
        + f"; keep / keep_every {med['keep'] / med['keep_every']:.3f}, "
        f"keep / recompute {med['keep'] / med['recompute']:.3f}"
    )


if __name__ == "__main__":
    main()
