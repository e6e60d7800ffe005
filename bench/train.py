"""bench/train: measured tree-training speedup against the FLOP-model estimate, same run.

For each workload the same shards, model, budget and optimizer steps are trained twice with
:func:`treeprep.trainer.run.loop.train`: once on the packed tries (``layout="tree"``) and once with
every sequence on its own (``layout="linear"``, first-fit into micro-batches of the same budget:
what a linearizing trainer runs). Both train exactly the same sequences with the same loss, so the
measured speedup is the ratio of their wall times. The estimate is the FLOP model of
:mod:`treeprep.flops` for what this trainer runs: the body (projections, MLP) per fed token, the
attention per (query, key) pair each layout computes, and the LM head on the trained targets only
(``estimated_speedup``; ``estimate_head_all`` counts the head on every fed token, as a trainer that
computes full logits pays it). The first step of each run is a warm-up and is not timed.

The tree layout's tokens are counted as the trainer feeds them: the trees of each micro-batch
merged into one forest (:func:`treeprep.pack.share.merge_forest`, the trainer's
``share_prefixes``, on by default), so an opening shared by several trees is counted once
(``tokens_tree_fed``, ``pairs_tree``). The bench stops if the tree run's own count of fed tokens
differs. ``estimated_speedup_per_tree`` and ``ratio_per_tree`` count every tree on its own, as
before the merge.

A fair baseline. The linear layout is what a good linearizing trainer runs: padding-free packed
sequences, each with plain causal attention (``baseline: "causal"``): every sequence is a one-node
tree, and the ``nodes`` backend runs each one as a single ``is_causal`` SDPA call (flash-attn varlen
or FlexAttention on a GPU). Load drift on a shared machine cancels out because the layouts are
interleaved: ``--rounds`` rounds each train both layouts (tree first in even rounds, linear first in
odd ones) over the same steps, and the timed seconds of all rounds are summed per layout.

Workloads:

* ``sample``: the project's ``sample_data/`` built with the built-in tokenizer (POR about 0.66);
* ``agent``: generated agent sessions (token rollouts: each call's prompt extends the previous
  call's prompt, completion and tool result; one call in five is retried, a branch), POR about
  0.75;
* ``shared``: generated tasks with shared openings (:func:`shared_openings`): every task opens
  with the same system prompt and tool schemas, then one of two domain policies and its request,
  and is sampled as a few short agent rollouts (one tree per task). On the cpu scale the opening
  is about 760 tokens and a tree about 1,030, so three or four trees fill a 4096-token
  micro-batch and are merged; on the gpu scale the opening is about 3,000 tokens.

``--workload all`` (the default) runs the three, ``both`` the first two.

Configurations:

* ``cpu``: ``small-qwen3`` (hidden 512, 8 layers, 25M non-embedding parameters, a 32k vocabulary:
  58M in all), float32, budget 4096, attention ``nodes`` (each node attends its ancestors only, so
  both layouts compute exactly the (query, key) pairs the FLOP model counts; ``dense`` computes
  budget^2 pairs per micro-batch whatever the layout, which flatters the tree layout);
* ``gpu``: ``qwen3-0.6b``, ``qwen3-1.7b`` and ``qwen3-4b`` shapes (random weights, full 151,936
  vocabulary), bf16 autocast, budgets 16k and 32k, attention ``auto`` (FlexAttention), a longer
  agent workload.

    python bench/train.py                       # cpu, all workloads, 4 steps x 2 rounds
    python bench/train.py --workload shared     # shared openings only
    python bench/train.py --workload agent --steps 6
    python bench/train.py --config gpu          # needs CUDA
    python bench/train.py --config gpu --checkpointing --models qwen3-4b --budgets 32768

``--checkpointing`` turns activation checkpointing on in both layouts (what fits 4B and larger at
32k tokens); the estimate then counts the recomputed forward of the decoder layers
(:meth:`treeprep.flops.ModelShape.breakdown`), which both layouts pay in proportion to their body
and attention FLOPs, so the estimated speedup moves towards the body-and-attention ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------------------------


def agent_rollouts(
    path: Path,
    *,
    sessions: int,
    calls: tuple[int, int],
    system: tuple[int, int],
    turn: tuple[int, int],
    seed: int = 0,
) -> None:
    """Token rollouts of agent sessions (ids are bytes of the built-in tokenizer)."""
    rng = np.random.default_rng(seed)

    def ids(lo_hi: tuple[int, int]) -> list[int]:
        return rng.integers(32, 127, int(rng.integers(*lo_hi))).tolist()

    with open(path, "w", encoding="utf-8") as f:
        for s in range(sessions):
            prompt = [257] + ids(system) + [258]
            n_calls = int(rng.integers(*calls))
            for c in range(n_calls):
                tries = 2 if rng.random() < 0.2 else 1
                for t in range(tries):
                    gen = ids((turn[0] // 3, turn[1] // 3)) + [258]
                    rec = {
                        "group_id": f"session-{s}",
                        "call_id": f"session-{s}/{c}/{t}",
                        "prompt_token_ids": prompt,
                        "generation_token_ids": gen,
                    }
                    f.write(json.dumps(rec) + "\n")
                prompt = prompt + gen + [257] + ids((2 * turn[0] // 3, 2 * turn[1] // 3)) + [258]


def shared_openings(
    path: Path,
    *,
    tasks: int,
    system: int,
    policy: int,
    task: tuple[int, int],
    rollouts: tuple[int, int],
    calls: tuple[int, int],
    turn: tuple[int, int],
    seed: int = 0,
) -> None:
    """Token rollouts of many tasks that open alike: one system prompt with the tool schemas
    (``system`` tokens) shared by every task, then one of two domain policies (``policy`` tokens
    each), then the task's own request; each task (one tree) is sampled ``rollouts`` times, and
    each rollout is a short agent session (each call's prompt extends the previous call's prompt,
    completion and tool result; one call in five is retried, a branch)."""
    rng = np.random.default_rng(seed)

    def ids(n: int) -> list[int]:
        return rng.integers(32, 127, n).tolist()

    def span(lo_hi: tuple[int, int]) -> list[int]:
        return ids(int(rng.integers(*lo_hi)))

    head = [257] + ids(system) + [258]
    policies = [ids(policy) + [258] for _ in range(2)]
    with open(path, "w", encoding="utf-8") as f:
        for k in range(tasks):
            opening = head + policies[k % 2] + [257] + span(task) + [258]
            for r in range(int(rng.integers(*rollouts))):
                prompt = opening
                for c in range(int(rng.integers(*calls))):
                    tries = 2 if rng.random() < 0.2 else 1
                    for t in range(tries):
                        gen = span((turn[0] // 3, turn[1] // 3)) + [258]
                        rec = {
                            "group_id": f"task-{k}",
                            "call_id": f"task-{k}/{r}/{c}/{t}",
                            "prompt_token_ids": prompt,
                            "generation_token_ids": gen,
                        }
                        f.write(json.dumps(rec) + "\n")
                    tool = span((2 * turn[0] // 3, 2 * turn[1] // 3))
                    prompt = prompt + gen + [257] + tool + [258]


#: the ``shared`` workload per scale: at the cpu budget (4096) three trees fit a micro-batch
SHARED = {
    "cpu": {"tasks": 48, "system": 600, "policy": 100, "task": (30, 80), "rollouts": (2, 4),
            "calls": (2, 3), "turn": (45, 105)},
    "gpu": {"tasks": 192, "system": 2500, "policy": 500, "task": (100, 300), "rollouts": (4, 8),
            "calls": (3, 6), "turn": (200, 500)},
}  # fmt: skip


def ensure_build(name: str, work: Path, scale: str) -> Path:
    from treeprep.build import BuildConfig, build

    out = work / f"build-{name}-{scale}"
    if (out / "manifest.json").exists():
        return out
    if name == "sample":
        inputs = [str(ROOT / "sample_data")]
    elif name == "shared":
        src = work / f"shared-{scale}.jsonl"
        shared_openings(src, **SHARED[scale])
        inputs = [str(src)]
    else:
        src = work / f"agent-{scale}.jsonl"
        if scale == "cpu":
            agent_rollouts(src, sessions=16, calls=(5, 9), system=(250, 400), turn=(80, 200))
        else:
            agent_rollouts(src, sessions=64, calls=(6, 10), system=(1500, 3000), turn=(800, 1600))
        inputs = [str(src)]
    build(BuildConfig(inputs=inputs, out=str(out)))
    return out


# --------------------------------------------------------------------------------------------
# the estimate
# --------------------------------------------------------------------------------------------


def _pairs(depth: np.ndarray, ln: np.ndarray) -> int:
    """Attention (query, key) pairs of nodes: each token attends its ancestors and itself."""
    return int((ln * depth + ln * (ln + 1) // 2).sum())


def _micro_batch(rows: list[dict], merge: bool) -> tuple[int, int, int, int]:
    """(tokens, pairs) the micro-batch of these part rows feeds tree by tree, then merged into
    one forest as the trainer assembles it (:func:`treeprep.pack.share.merge_forest`)."""
    from treeprep.pack.share import merge_forest

    arr = [{k: np.asarray(r[k], dtype=np.int64) for k in _TREE_KEYS} for r in rows]
    tt = sum(len(r["input_ids"]) for r in arr)
    tp = sum(_pairs(r["node_depth"], r["node_length"]) for r in arr)
    if not merge or len(rows) < 2:
        return tt, tp, tt, tp
    f = merge_forest(*([r[k] for r in arr] for k in _TREE_KEYS[:4]))
    return tt, tp, len(f.input_ids), int((f.position_ids + 1).sum())


_TREE_KEYS = ("input_ids", "node_parent", "node_offset", "node_length", "node_depth")


def flop_estimate(data: Path, shape, budget: int, steps: int | None) -> dict:
    """FLOPs each layout feeds over the timed steps (2 .. ``steps``) of the in-memory plan: the
    tree layout per tree, and with the trees of each micro-batch merged (what the trainer feeds
    with ``share_prefixes``, its default); the linear layout every sequence copy on its own."""
    from treeprep.trainer.data.plans import make_plan
    from treeprep.trainer.data.reader import BuildReader
    from treeprep.trainer.data.rows import part_row

    reader = BuildReader(str(data))
    plans: dict[int, object] = {}

    def plan_of(epoch: int):  # the loop plans each epoch with seed + epoch
        if epoch not in plans:
            plans[epoch] = make_plan(reader, budget=budget, cost_model=shape, seed=epoch)
        return plans[epoch]

    per = len(plan_of(0).steps)
    n = steps or per
    # global step i of the run is step i % per of epoch i // per; step 0 is the untimed warm-up
    run = [plan_of(i // per).steps[i % per] for i in range(1 if n > 1 else 0, n)]
    plan = plan_of(0)
    tt = tp = mt = mp = lt = lp = 0
    trees = merged_mbs = 0
    for st in run:
        for mb in (mb for rank in st.slots for mb in rank):
            rows = [part_row(reader.tree(p.shard, p.row), p) for p in mb]
            merge = not any(p.handoff_cuts for p in mb)  # a hand-off row runs alone, unmerged
            counts = _micro_batch(rows, merge)
            tt, tp, mt, mp = tt + counts[0], tp + counts[1], mt + counts[2], mp + counts[3]
            trees += len(mb)
            merged_mbs += int(merge and len(mb) > 1)
        for p in st.parts:
            tree = reader.tree(p.shard, p.row)
            sn = np.asarray(tree["seq_node"], dtype=np.int64)
            seq_len = np.asarray(tree["node_depth"])[sn] + np.asarray(tree["node_length"])[sn]
            cnt = np.asarray(tree["seq_count"], dtype=np.int64)
            sel = np.asarray(p.seqs, dtype=np.int64)
            L, c = seq_len[sel], cnt[sel]
            lt += int((L * c).sum())
            lp += int((L * (L + 1) // 2 * c).sum())
    return {
        "steps": len(run),
        "plan_steps": len(plan.steps),
        "parts": trees,
        "micro_batches_merged": merged_mbs,
        "tokens_tree_per_tree": tt,
        "tokens_tree_fed": mt,
        "tokens_linear": lt,
        "pairs_tree_per_tree": tp,
        "pairs_tree": mp,
        "pairs_linear": lp,
        "estimate": shape.flops(lt, lp) / shape.flops(mt, mp),
    }


# --------------------------------------------------------------------------------------------
# the runs
# --------------------------------------------------------------------------------------------


def run_layout(
    data: Path, work: Path, layout: str, spec: dict, steps: int | None, seed: int = 0
) -> dict:
    from treeprep.trainer.run.loop import TrainConfig, train

    cfg = TrainConfig(
        data=str(data),
        model=spec["model"],
        run_dir=str(work / f"run-{layout}-{seed}"),
        overwrite=True,  # a benchmark's runs are throwaway: a rerun replaces them
        layout=layout,
        budget=spec["budget"],
        steps=steps,
        epochs=None if steps else 1,
        vocab_size=spec["vocab"],
        precision=spec["precision"],
        device=spec["device"],
        attn=spec.get("attn", "auto"),
        save_final=False,
        lr=1e-4,
        activation_checkpointing=spec.get("checkpointing", False),
    )
    import torch

    cuda = str(spec["device"]).startswith("cuda")
    if cuda:  # each layout's own peak (the other layout's run has been freed)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    res = train(cfg)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    if res.stopped:  # a signal (a time limit's SIGTERM) stopped it at a step boundary
        raise SystemExit(f"bench/train: the {layout} run was stopped by {res.stopped}")
    h = res.history[1:] if len(res.history) > 1 else res.history
    secs = sum(m.seconds for m in h)
    return {
        "layout": layout,
        "steps": len(res.history),
        "timed_steps": len(h),
        "seconds": secs,
        "tokens_fed": sum(m.tokens for m in h),
        "tokens_linear": sum(m.tokens_linear for m in h),
        "linear_tokens_per_s": sum(m.tokens_linear for m in h) / secs,
        "fed_tokens_per_s": sum(m.tokens for m in h) / secs,
        "losses": [m.loss for m in res.history],
        # over the timed steps, as the estimate
        "targets_timed": sum(m.targets for m in h),
        # CUDA: the run's peak of allocated bytes (model, optimizer, activations); None on CPU
        "peak_bytes": peak,
    }


def bench_one(workload: str, spec: dict, steps: int | None, work: Path, rounds: int) -> dict:
    from treeprep.flops import from_config
    from treeprep.stats import compute_stats
    from treeprep.trainer import PRESETS

    data = ensure_build(workload, work, spec["scale"])
    shape = from_config(
        PRESETS[spec["model"]].hf_config(spec["vocab"]).to_dict(), name=spec["model"]
    )
    stats = compute_stats(str(data), model=shape, budget=spec["budget"])
    est = flop_estimate(data, shape, spec["budget"], steps)
    sub = work / f"{workload}-{spec['model']}-{spec['budget']}"
    secs = {"tree": 0.0, "linear": 0.0}
    runs: dict[str, dict] = {}
    for r in range(rounds):
        for lay in ("tree", "linear") if r % 2 == 0 else ("linear", "tree"):
            runs[lay] = run_layout(data, sub, lay, spec, steps, seed=r)
            secs[lay] += runs[lay]["seconds"]
    t, lin = runs["tree"], runs["linear"]
    assert t["tokens_linear"] == lin["tokens_linear"], "layouts trained different sequences"
    measured = secs["linear"] / secs["tree"]
    if t["tokens_fed"] != est["tokens_tree_fed"]:  # the trainer did not feed the merged forests
        raise SystemExit(
            f"bench/train: the tree run fed {t['tokens_fed']:,} tokens, the merged estimate "
            f"counts {est['tokens_tree_fed']:,} (per tree {est['tokens_tree_per_tree']:,})"
        )
    ckpt = spec.get("checkpointing", False)
    head = {"head_tokens": t["targets_timed"], "checkpointing": ckpt}
    f_t = shape.flops(est["tokens_tree_fed"], est["pairs_tree"], **head)
    f_p = shape.flops(est["tokens_tree_per_tree"], est["pairs_tree_per_tree"], **head)
    f_l = shape.flops(est["tokens_linear"], est["pairs_linear"],
                      head_tokens=lin["targets_timed"], checkpointing=ckpt)  # fmt: skip
    estimated = f_l / f_t
    loss_gap = max(abs(a - b) / abs(b) for a, b in zip(t["losses"], lin["losses"], strict=True))
    peaks = (t["peak_bytes"], lin["peak_bytes"])
    return {
        "workload": workload,
        "model": spec["model"],
        "params": shape.params_total,
        "budget": spec["budget"],
        "precision": spec["precision"],
        "attn": spec.get("attn", "auto"),
        "checkpointing": ckpt,
        "baseline": "causal",
        "rounds": rounds,
        "por": stats["por"],
        "err": stats["packing"].get("err"),
        "stats_model_speedup": stats["packing"].get("model_speedup"),
        "measured_speedup": measured,
        "estimated_speedup": estimated,
        "ratio": measured / estimated,
        "estimated_speedup_per_tree": f_l / f_p,
        "ratio_per_tree": measured * f_p / f_l,
        "tokens_shared": est["tokens_tree_per_tree"] - est["tokens_tree_fed"],
        "estimate_head_all": est["estimate"],
        "ratio_head_all": measured / est["estimate"],
        "estimate_detail": est,
        "tree": {k: v for k, v in t.items() if k != "losses"} | {"seconds_all": secs["tree"]},
        "linear": {k: v for k, v in lin.items() if k != "losses"} | {"seconds_all": secs["linear"]},
        "max_rel_loss_gap": loss_gap,
        "peak_tree_vs_linear": peaks[0] / peaks[1] if None not in peaks else None,
    }


#: ``--workload both`` runs the first two, ``all`` (the default) all three
WORKLOADS = ("sample", "agent", "shared")

CONFIGS = {
    "cpu": [
        {
            "model": "small-qwen3",
            "vocab": 32768,
            "budget": 4096,
            "precision": "float32",
            "device": "cpu",
            "attn": "nodes",
            "scale": "cpu",
            "steps": 4,
        },  # fmt: skip
    ],
    "gpu": [
        {
            "model": m,
            "vocab": 151936,
            "budget": b,
            "precision": "bfloat16",
            "device": "cuda",
            "scale": "gpu",
        }  # fmt: skip
        for m in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
        for b in (16384, 32768)
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="cpu")
    ap.add_argument(
        "--workload",
        default="all",
        help=f"one of {', '.join(WORKLOADS)}, a comma list of them, both (sample,agent) or all",
    )
    ap.add_argument(
        "--steps", type=int, default=None, help="optimizer steps (default: cpu 4, gpu 1 epoch)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both layouts")
    ap.add_argument("--work", default=str(ROOT / "bench" / "_work" / "train"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--models", default=None, help="comma list: only these models of the config")
    ap.add_argument("--budgets", default=None, help="comma list: only these budgets")
    ap.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing in both layouts (the estimate counts the recompute)",
    )
    ap.add_argument(
        "--attn",
        default=None,
        help="attention backend of both layouts (default: the config's; auto on the GPU, which "
        "is flex there and compiles first)",
    )
    a = ap.parse_args()
    import torch

    if a.config == "gpu" and not torch.cuda.is_available():
        sys.exit("bench/train --config gpu needs a CUDA device")
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    loads = {"both": ["sample", "agent"], "all": list(WORKLOADS)}.get(
        a.workload, a.workload.split(",")
    )
    if bad := [w for w in loads if w not in WORKLOADS]:
        ap.error(f"unknown workloads {bad}: choose from {', '.join(WORKLOADS)}, both or all")
    results = []
    specs = [
        s
        for s in CONFIGS[a.config]
        if (a.models is None or s["model"] in a.models.split(","))
        and (a.budgets is None or str(s["budget"]) in a.budgets.split(","))
    ]
    for spec in specs:
        spec = {**spec, "checkpointing": a.checkpointing, **({"attn": a.attn} if a.attn else {})}
        for w in loads:
            t0 = time.perf_counter()
            r = bench_one(w, spec, a.steps or spec.get("steps"), work, a.rounds)
            r["wall_s"] = time.perf_counter() - t0
            results.append(r)
            print(_line(r), file=sys.stderr if a.json else sys.stdout, flush=True)
    machine = {
        "device": torch.cuda.get_device_name() if a.config == "gpu" else "cpu",
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    if a.json:
        print(json.dumps({"machine": machine, "results": results}, indent=2))
    else:
        print(f"machine: {machine}")


def _line(r: dict) -> str:
    t, lin = r["tree"], r["linear"]
    return (
        f"{r['workload']:>6} {r['model']} ({r['params'] / 1e6:.0f}M) budget {r['budget']}"
        f"{' checkpointing' if r['checkpointing'] else ''}: "
        f"POR {r['por']:.3f} | tree {t['linear_tokens_per_s']:,.0f} linear-eq tok/s "
        f"({t['fed_tokens_per_s']:,.0f} fed), causal baseline {lin['linear_tokens_per_s']:,.0f} "
        f"tok/s | measured {r['measured_speedup']:.2f}x, estimated {r['estimated_speedup']:.2f}x "
        f"(LM head on targets), ratio {r['ratio']:.2f}; trees unmerged: estimate "
        f"{r['estimated_speedup_per_tree']:.2f}x, ratio {r['ratio_per_tree']:.2f}; head on every "
        f"token: estimate "
        f"{r['estimate_head_all']:.2f}x, ratio {r['ratio_head_all']:.2f} | {r['rounds']} rounds x "
        f"{t['timed_steps']} timed steps, losses agree to {r['max_rel_loss_gap']:.1e}"
        + (
            f" | peak tree {t['peak_bytes'] / 2**30:.2f} GiB, linear "
            f"{lin['peak_bytes'] / 2**30:.2f} GiB ({r['peak_tree_vs_linear']:.2f}x)"
            if r["peak_tree_vs_linear"] is not None
            else ""
        )
    )


if __name__ == "__main__":
    main()
