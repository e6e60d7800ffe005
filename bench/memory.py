"""Peak memory and step time of hand-off parts against the budget (issue: long agent trees).

One forward and backward of one large tree, each configuration in a fresh process so that its
peak is its own: peak RSS on CPU (``ru_maxrss``), ``torch.cuda.max_memory_allocated`` on CUDA.
Configurations: the whole tree at once (where it fits), and hand-off parts at each budget in
``recompute`` and ``keep`` modes. Printed per configuration: parts, tokens fed (always the tree's
tokens: nothing is recomputed), prefix rows handed over, peak memory above the loaded model and
tree, seconds, and the time ratio against the whole tree (or against recompute at the largest
budget when the whole tree does not fit).

Workloads:

* ``agent``: a generated agent session (one main thread of calls, each call's prompt the previous
  prompt plus completion plus tool result, a retry branch on one call in five), with a root-to-leaf
  path of ``--path`` tokens; ``--path`` takes several values to show that memory at a fixed budget
  grows with the path's keys and values, not with the tree;
* ``claude-code``: the largest tree of a build (``--data OUT``; default: builds
  ``../shared/data/logs/claude-code`` with the Qwen3 tokenizer into bench/_work): the real session
  with its sub-agents and compaction, a 126k-token path.

    python bench/memory.py --workload agent --path 8192,16384 --budgets 1024,2048,4096
    python bench/memory.py --workload claude-code --device cuda --model qwen3-0.6b --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "memory"
#: the generated workload's vocabulary (small, so that the decoder, not the LM head, dominates)
AGENT_VOCAB = 8192


def agent_tree_row(path_tokens: int, seed: int = 0) -> dict:
    """A generated agent session as a shard row (the real trie builds it)."""
    from treeprep.sequence import Sequence
    from treeprep.trie import build_tree

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, AGENT_VOCAB, 1500)
    seqs = []
    while len(prompt) < path_tokens:
        tries = 2 if rng.random() < 0.2 else 1
        for _ in range(tries):
            gen = rng.integers(0, AGENT_VOCAB, int(rng.integers(100, 400)))
            toks = np.concatenate([prompt, gen])
            seqs.append(Sequence("s", toks, [(len(prompt), len(toks))]))
        tool = rng.integers(0, AGENT_VOCAB, int(rng.integers(300, 900)))
        prompt = np.concatenate([toks, tool])
    return build_tree(seqs).to_row()


def claude_code_row(data: str | None) -> dict:
    import pyarrow.ipc as ipc

    if data is None:
        out = WORK / "claude-code"
        if not (out / "manifest.json").exists():
            subprocess.run(
                [sys.executable, "-m", "treeprep.cli", "build",
                 str(ROOT.parent / "shared/data/logs/claude-code"),
                 "--tokenizer", str(ROOT.parent / "shared/data/tokenizers/qwen3"),
                 "-o", str(out)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        data = str(out)
    best: dict | None = None
    for p in sorted(Path(data, "shards").glob("*.arrow")):
        with open(p, "rb") as f:
            t = ipc.open_file(f).read_all()
        n = t.column("input_ids").to_pylist()
        i = int(np.argmax([len(x) for x in n]))
        if best is None or len(n[i]) > len(best["input_ids"]):
            best = t.slice(i, 1).to_pylist()[0]
    assert best is not None, f"{data}: no trees"
    return best


def _peak_mb(dev: str) -> float:
    if dev == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(spec: dict) -> dict:
    """One configuration in this (fresh) process."""
    import torch

    from treeprep.trainer import TreeBatch, load_model
    from treeprep.trainer.loss import LossConfig, tree_loss
    from treeprep.trainer.parts import run_parts

    torch.manual_seed(0)
    dev = spec["device"]
    row = (
        agent_tree_row(spec["path"])
        if spec["workload"] == "agent"
        else claude_code_row(spec.get("data"))
    )
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    vocab = AGENT_VOCAB if spec["workload"] == "agent" else None
    model = load_model(spec["model"], dtype=dtype, device=dev, attn="auto", vocab_size=vocab)
    if spec.get("checkpointing"):
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = TreeBatch.from_trees([row], norm="token-mean", device=dev)
    depth = int((batch.position_ids.max() + 1).item())
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = (
        _peak_mb(dev)
        if dev == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    t0 = time.perf_counter()
    parts = 1
    prefix = 0
    if spec["budget"] is None:
        out = tree_loss(model, batch, loss="sft")
        out.loss.backward()
        loss = float(out.loss.detach())
        del out
    else:
        res = run_parts(model, batch, LossConfig("sft"), budget=spec["budget"], mode=spec["mode"])
        loss = float(res.loss)
        parts, prefix = res.parts, res.prefix_rows
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = _peak_mb(dev)
    return {
        **spec,
        "tokens_tree": batch.num_tokens,
        "tokens_linear": batch.tokens_linear,
        "longest_path": depth,
        "parts": parts,
        "tokens_fed": batch.num_tokens,
        "prefix_rows": prefix,
        "peak_mb": round(peak, 1),
        "peak_over_base_mb": round(peak - base, 1),
        "seconds": round(dt, 3),
        "loss": loss,
    }


def run_config(spec: dict) -> dict:
    if spec["device"] == "cuda":
        # CUDA peaks reset per configuration, so one process serves them all (and compiles once)
        import torch

        torch.cuda.empty_cache()
        try:
            return child(spec)
        except torch.OutOfMemoryError as e:
            return {**spec, "error": f"out of memory: {str(e).splitlines()[0]}"}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {**spec, "error": " | ".join(tail)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=["agent", "claude-code"], default="agent")
    ap.add_argument("--path", default="8192,16384", help="agent: root-to-leaf path lengths")
    ap.add_argument("--data", default=None, help="claude-code: a build folder (largest tree)")
    ap.add_argument("--budgets", default="1024,2048,4096,8192")
    ap.add_argument("--modes", default="recompute,keep")
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-tree run")
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--checkpointing", action="store_true", help="activation checkpointing per decoder layer"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    paths = [int(x) for x in a.path.split(",")] if a.workload == "agent" else [0]
    results = []
    for path in paths:
        base = {"workload": a.workload, "path": path, "model": a.model, "device": a.device,
                "data": a.data, "checkpointing": a.checkpointing}  # fmt: skip
        specs = [] if a.no_whole else [{**base, "budget": None, "mode": "whole"}]
        specs += [
            {**base, "budget": int(b), "mode": m}
            for b in a.budgets.split(",")
            for m in a.modes.split(",")
        ]
        group = []
        ref = None
        for spec in specs:
            r = run_config(spec)
            if r["mode"] == "whole" and "error" not in r:
                ref = r
            if "error" not in r and ref is not None:
                r["time_vs_whole"] = round(r["seconds"] / ref["seconds"], 3)
            group.append(r)
            print(_line(r), file=sys.stderr if a.json else sys.stdout, flush=True)
        results.extend(group)
    if a.json:
        print(json.dumps(results, indent=2))


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['workload']} path {r['path']} {r['mode']} budget {r['budget']}: {r['error']}"
    b = "whole" if r["budget"] is None else f"{r['budget']:>6}"
    ratio = f"{r['time_vs_whole']:.2f}x" if "time_vs_whole" in r else "-"
    return (
        f"{r['workload']:<11} tree {r['tokens_tree']:>7} path {r['longest_path']:>7} "
        f"budget {b} {r['mode']:<9} parts {r['parts']:>4} fed {r['tokens_fed']:>7} "
        f"prefix {r['prefix_rows']:>9} peak +{r['peak_over_base_mb']:>8.1f} MB "
        f"{r['seconds']:>8.2f} s  vs whole {ratio}"
    )


if __name__ == "__main__":
    main()
