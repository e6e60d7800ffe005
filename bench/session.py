"""bench/session: a whole build's measured speedup, tree against linear, beside ``treeprep stats``.

``bench/train.py`` measures the speedup on generated workloads; ``bench/memory.py`` runs one tree
against the linear trainer on that tree's longest path only. This bench times both sides of a
whole real build (the Claude Code session by default), one forward and backward each, on one
model:

* **tree side**: every tree of the build as the trainer runs it, one tree per micro-batch: whole
  (one forward and backward of :func:`~treeprep.trainer.tree_loss`) when it fits ``--budget``,
  otherwise as hand-off parts at the budget (:func:`~treeprep.trainer.parts.run_parts`,
  ``--part-graph``, stores on the device). The trainer packs trees under the budget together;
  here each runs alone (on the Claude Code build they are 8% of the tree tokens);
* **linear side**: every sequence of the build on its own, the linear trainer: a one-path tree of
  its tokens and trained spans (one ``is_causal`` attention call per layer, no parts, same dtype
  and checkpointing), duplicates counted ``seq_count`` times. With ``--sample N`` only a
  stratified sample of the sequence copies runs: ``--strata`` strata of equal counts by length
  quantiles, each given a share of the N proportional to its tokens (at least two where it holds
  two), sampled without replacement (``--seed``). The linear seconds are then extrapolated:
  the per-stratum mean seconds per sequence times the stratum's count, summed; its spread is the
  standard error of that stratified estimator, sqrt(sum N_h^2 (1 - n_h/N_h) s_h^2 / n_h), and
  ``linear.ci95`` is +- 1.96 of it (``linear.seconds_by_tokens``, the per-stratum seconds per
  token times the stratum's tokens, is a second extrapolation to compare with). A sample at
  least as large as the copies measures every sequence once (no extrapolation).

The two sides are interleaved (the project's rule: ratios measured side by side in one run, so
load drift hits both alike): the work items (trees; sampled sequences) are merged so that each
side has done about the same fraction of its FLOP-model cost at every point. A tree is one item,
so the session's large tree runs whole between linear items. One untimed warm-up first (a
generated tree of twice the budget as parts, the shortest sequence linear: kernels,
FlexAttention's compile). On CUDA every item is synchronized before and after its timing, and
each side reports its ``torch.cuda.max_memory_allocated`` (None on the CPU).

The estimate is ``treeprep stats BUILD --model M --budget B`` of the same build
(:func:`treeprep.stats.compute_stats`, the FLOP model of the trainer's preset):
``stats.estimated_speedup`` is its speedup after packing at the budget, ``ratio`` the measured
speedup over it.

``--trees K`` keeps the K trees with the most linear tokens, ``--max-length L`` only the sequences
of at most L tokens (in an agent session: the calls whose whole context fits, the opening
and its short sub-agents, with their own trained spans), and rebuilds the tries: a smaller build
written to ``bench/_work/session/`` so that both sides and the stats read the same trees. They
exist for the CPU, where the whole session (126k-token path, 9.6 M linear tokens) takes hours.

    python bench/session.py --device cpu --model tiny-qwen3 --budget 1024 --trees 1 \
        --max-length 8192 --sample 8
    python bench/session.py --data bench/_work/memory/claude-code --device cuda \
        --model qwen3-1.7b --budget 16384 --checkpointing --sample 12 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_inputs  # noqa: E402  (bench/memory_inputs.py: the session's build, the warm-up tree)
import train  # noqa: E402  (bench/train.py: attention pairs of a tree's nodes)

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "session"


# --------------------------------------------------------------------------------------------
# the build: the session's own, or a smaller one of the same shape
# --------------------------------------------------------------------------------------------


def session_build(data: str | None) -> Path:
    """``data``, or the Claude Code session built as bench/memory.py builds it."""
    if data is not None:
        return Path(data)
    out = memory_inputs.WORK / "claude-code"
    if not (out / "manifest.json").exists():
        memory_inputs.claude_code_row(None)  # builds it into bench/_work/memory/claude-code
    return out


def limited_build(data: Path, trees: int | None, max_length: int | None) -> Path:
    """The build itself, or (``trees``, ``max_length``) a smaller build: its ``trees`` largest
    trees (by linear tokens) rebuilt from their sequences of at most ``max_length`` tokens,
    written under bench/_work/session/ with the source's manifest and its own shard list."""
    if trees is None and max_length is None:
        return data
    from treeprep.sequence import Sequence
    from treeprep.shards import ShardWriter, iter_trees
    from treeprep.trie import build_tree

    out = WORK / f"{data.name}-trees{trees or 'all'}-len{max_length or 'all'}"
    src = json.loads((data / "manifest.json").read_text())
    mark = out / "derived_from.json"  # the source's shards: a rebuilt source is cut again
    if (out / "manifest.json").exists() and mark.exists():
        if json.loads(mark.read_text()) == src["shards"]:
            return out
    kept = sorted(iter_trees(str(data)), key=lambda t: -t.tokens_linear)[: trees or None]
    writer = ShardWriter(str(out), shard_tokens=1 << 62)
    for t in kept:
        seqs = []
        for s in range(t.num_sequences):
            if max_length is not None and t.seq_length[s] > max_length:
                continue
            flat = t.seq_loss_spans[s]
            spans = [(int(a), int(b)) for a, b in zip(flat[0::2], flat[1::2], strict=True)]
            seq = Sequence(t.group_id, t.sequence_tokens(s), spans, source_format=t.source_format)
            seqs += [seq] * int(t.seq_count[s])
        if seqs:
            writer.add(build_tree(seqs))
    writer.close()
    if not writer.entries:
        raise SystemExit(f"bench/session: no sequence of {data} has at most {max_length} tokens")
    manifest = {**src, "shards": [e.model_dump(mode="json") for e in writer.entries]}
    mark.write_text(json.dumps(src["shards"]))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))  # last: the build is whole
    return out


def sequence_row(tree, s: int) -> dict:
    """Sequence ``s`` of ``tree`` as the linear trainer feeds it: a one-path tree of its tokens
    and trained spans (as :func:`memory_inputs.longest_path_row` makes the longest one)."""
    from treeprep.sequence import Sequence
    from treeprep.trie import build_tree

    flat = tree.seq_loss_spans[s]
    spans = [(int(a), int(b)) for a, b in zip(flat[0::2], flat[1::2], strict=True)]
    return build_tree([Sequence("linear", tree.sequence_tokens(s), spans)]).to_row()


# --------------------------------------------------------------------------------------------
# the linear side's sample and its extrapolation
# --------------------------------------------------------------------------------------------


def strata_of(lengths: np.ndarray, strata: int) -> np.ndarray:
    """Each unit's stratum: ``strata`` groups of (about) equal counts by length quantiles."""
    order = np.argsort(lengths, kind="stable")
    out = np.empty(len(lengths), dtype=np.int64)
    out[order] = np.arange(len(lengths)) * strata // max(len(lengths), 1)
    return out


def stratified_sample(
    lengths: np.ndarray, n: int, strata: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(stratum of every unit, sorted indices of the sampled units). Each stratum gets a share of
    ``n`` proportional to its tokens, at least two where it holds two (a spread needs two), at
    most its count; ``n`` at least the units: every unit."""
    units = len(lengths)
    if n >= units:
        return np.zeros(units, dtype=np.int64), np.arange(units)
    k = max(1, min(strata, n // 2, units))
    st = strata_of(lengths, k)
    counts = np.bincount(st, minlength=k)
    tokens = np.bincount(st, weights=lengths, minlength=k)
    take = np.minimum(counts, 2)  # k <= n / 2: two each fit
    while take.sum() < n:  # the rest by the largest token share not yet given
        gap = np.where(take < counts, tokens / tokens.sum() * n - take, -np.inf)
        take[int(np.argmax(gap))] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(st == h), int(take[h]), replace=False) for h in range(k)]
    return st, np.sort(np.concatenate(picked))


def extrapolate(
    lengths: np.ndarray, strata: np.ndarray, sampled: np.ndarray, seconds: np.ndarray
) -> dict:
    """The stratified estimate of the seconds of every unit from the ``seconds`` of the
    ``sampled`` ones: per stratum, its mean seconds per unit times its count; the standard error
    with the finite-population correction; and per stratum its seconds per token times its
    tokens (``seconds_by_tokens``). Every unit sampled: the measured total, spread 0."""
    total = se2 = by_tokens = 0.0
    rows = []
    for h in range(int(strata.max()) + 1 if len(strata) else 0):
        units = np.flatnonzero(strata == h)
        mine = np.isin(sampled, units)
        secs, lens = seconds[mine], lengths[sampled[mine]]
        big_n, n = len(units), len(secs)
        mean = float(secs.mean())
        var = float(secs.var(ddof=1)) if n > 1 else 0.0
        total += big_n * mean
        se2 += big_n**2 * (1 - n / big_n) * var / n
        by_tokens += float(secs.sum() / lens.sum() * lengths[units].sum())
        rows.append({
            "lengths": [int(lengths[units].min()), int(lengths[units].max())],
            "count": big_n,
            "sampled": n,
            "mean_seconds": round(mean, 4),
            "sd_seconds": round(math.sqrt(var), 4),
            "seconds": round(big_n * mean, 3),
        })  # fmt: skip
    se = math.sqrt(se2)
    return {
        "seconds": total,
        "se_seconds": se,
        "ci95": [total - 1.96 * se, total + 1.96 * se],
        "seconds_by_tokens": by_tokens,
        "strata": rows,
    }


# --------------------------------------------------------------------------------------------
# the runs
# --------------------------------------------------------------------------------------------


@dataclass
class Item:
    """One unit of timed work: a tree (the tree side) or a sequence (the linear side)."""

    side: str  # "tree" | "linear"
    row: dict
    cost: float  # FLOP-model cost, for interleaving
    label: str  # the tree's group id; the sequence's group id and index
    index: int = 0  # linear: the item's place in the sample


def interleave(tree: list[Item], linear: list[Item]) -> list[Item]:
    """Both sides' items in one order where each side has done about the same fraction of its
    cost at every point (the next item is the side's that is behind)."""
    out: list[Item] = []
    tot = {"tree": sum(i.cost for i in tree) or 1.0, "linear": sum(i.cost for i in linear) or 1.0}
    done = {"tree": 0.0, "linear": 0.0}
    queues = {"tree": list(tree), "linear": list(linear)}
    while queues["tree"] or queues["linear"]:
        side = min(
            (s for s in queues if queues[s]),
            key=lambda s: (done[s] + queues[s][0].cost / 2) / tot[s],
        )
        it = queues[side].pop(0)
        done[side] += it.cost
        out.append(it)
    return out


def load(spec: dict):
    """The model as bench/memory.py's ``measure`` loads it: weights in ``dtype``, the attention
    backend, activation checkpointing per decoder layer."""
    import torch

    from treeprep.trainer import load_model

    model = load_model(
        spec["model"],
        dtype=getattr(torch, spec["dtype"]),
        device=spec["device"],
        attn=spec["attn"],
        vocab_size=spec["vocab"],
    )
    if spec["checkpointing"]:
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def step(model, row: dict, spec: dict, *, whole: bool = False) -> tuple[float, int]:
    """One forward and backward of ``row``: whole within the budget (or ``whole``: the linear
    trainer's one path), else as hand-off parts (the trainer's micro-batch); (seconds, parts).
    Only the forward and backward are timed."""
    import torch

    from treeprep.trainer import TreeBatch, tree_loss
    from treeprep.trainer.objective.loss import LossConfig
    from treeprep.trainer.parts import run_parts

    cuda = spec["device"].startswith("cuda")
    model.zero_grad(set_to_none=True)
    batch = TreeBatch.from_trees([row], norm="token-mean", device=spec["device"])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    parts = 1
    if whole or batch.num_tokens <= spec["budget"]:
        out = tree_loss(model, batch, loss="sft", attn=spec["attn"])
        out.loss.backward()
        del out
    else:
        res = run_parts(
            model,
            batch,
            LossConfig("sft"),
            budget=spec["budget"],
            mode=spec["part_graph"],
            attn=spec["attn"],
        )
        parts = res.parts
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, parts


def warm_up(model, spec: dict, linear: Item) -> float:
    """One untimed run of each kind of work before any is timed (kernels, allocator, and on CUDA
    FlexAttention's compile): a generated agent tree of bench/memory.py twice the budget as parts
    (its ids folded into the model's vocabulary), and ``linear`` whole."""
    t0 = time.perf_counter()
    row = memory_inputs.agent_tree_row(max(2 * spec["budget"], 2048))
    vocab = model.config.vocab_size
    step(model, {**row, "input_ids": [i % vocab for i in row["input_ids"]]}, spec)
    step(model, linear.row, spec, whole=True)
    return time.perf_counter() - t0


def run(spec: dict, *, log=None) -> dict:
    """Time both sides of the build in ``spec['data']`` and set them beside stats' estimate."""
    import torch

    from treeprep.flops import from_config
    from treeprep.shards import iter_trees
    from treeprep.stats import compute_stats
    from treeprep.trainer import PRESETS

    t_start = time.perf_counter()
    data = limited_build(session_build(spec["data"]), spec["trees"], spec["max_length"])
    shape = from_config(
        PRESETS[spec["model"]].hf_config(spec["vocab"]).to_dict(), name=spec["model"]
    )
    stats = compute_stats(str(data), model=shape, budget=spec["budget"])
    trees = list(iter_trees(str(data)))

    # the tree side's items; the linear side's population is every sequence copy ("unit")
    tree_items = []
    for t in trees:
        pairs = train._pairs(np.asarray(t.node_depth), np.asarray(t.node_length))
        tree_items.append(Item("tree", t.to_row(), shape.flops(t.tokens_tree, pairs), t.group_id))
    entries = [(ti, s) for ti, t in enumerate(trees) for s in range(t.num_sequences)]
    count = np.array([int(trees[ti].seq_count[s]) for ti, s in entries], dtype=np.int64)
    length = np.array([int(trees[ti].seq_length[s]) for ti, s in entries], dtype=np.int64)
    unit_entry = np.repeat(np.arange(len(entries)), count)
    lengths = length[unit_entry]
    n = spec["sample"] if spec["sample"] is not None else len(lengths)
    strata, sampled = stratified_sample(lengths, n, spec["strata"], spec["seed"])
    full = len(sampled) == len(lengths)
    # every copy of a sequence runs alike: with the whole population, each distinct one once
    todo = np.arange(len(entries)) if full else unit_entry[sampled]
    lin_items = []
    for i, e in enumerate(todo.tolist()):
        ti, s = entries[e]
        L = int(length[e])
        row, cost = sequence_row(trees[ti], s), shape.flops(L, L * (L + 1) // 2)
        lin_items.append(Item("linear", row, cost, f"{trees[ti].group_id}#{s}", i))

    model = load(spec)
    warm = warm_up(model, spec, min(lin_items, key=lambda i: len(i.row["input_ids"])))
    if log:
        log(f"warm-up {warm:.1f} s; {len(tree_items)} trees, {len(lin_items)} sequences to run")
    cuda = spec["device"].startswith("cuda")
    secs = {"tree": 0.0, "linear": 0.0}
    peak: dict[str, int | None] = {"tree": None, "linear": None}
    parts = 0
    lin_secs = np.zeros(len(lin_items))
    for it in interleave(tree_items, lin_items):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        dt, p = step(model, it.row, spec, whole=it.side == "linear")
        if it.side == "tree":
            secs["tree"] += dt
            parts += p
        else:
            lin_secs[it.index] = dt
        if cuda:
            peak[it.side] = max(peak[it.side] or 0, torch.cuda.max_memory_allocated())
        if log:  # each item as it comes, so that a run stopped at its limit keeps them
            log("ITEM " + json.dumps({"side": it.side, "label": it.label, "tokens":
                len(it.row["input_ids"]), "parts": p, "seconds": round(dt, 4)}))  # fmt: skip

    if full:  # the measured total: one stratum, every unit sampled
        unit_secs = lin_secs[unit_entry]
        lin = extrapolate(lengths, np.zeros_like(lengths), np.arange(len(lengths)), unit_secs)
    else:
        lin = extrapolate(lengths, strata, sampled, lin_secs)
    secs["linear"] = lin["seconds"]
    measured = secs["linear"] / secs["tree"]
    est = stats.get("packing", {}).get("model_speedup", stats["model"]["speedup"])
    return {
        "build": str(data),
        "model": spec["model"],
        "params": shape.params_total,
        "device": spec["device"],
        "dtype": spec["dtype"],
        "attn": spec["attn"],
        "checkpointing": spec["checkpointing"],
        "budget": spec["budget"],
        "part_graph": spec["part_graph"],
        "limit": {"trees": spec["trees"], "max_length": spec["max_length"]},
        "trees": len(trees),
        "sequences": len(lengths),
        "tokens_tree": int(stats["tokens_tree"]),
        "tokens_linear": int(stats["tokens_linear"]),
        "tree": {
            "seconds": secs["tree"],
            "trees": len(tree_items),
            "parts": parts,
            "peak_bytes": peak["tree"],
        },
        "linear": {
            **lin,
            "extrapolated": not full,
            "measured_sequences": len(lin_items),
            "measured_seconds": float(lin_secs.sum()),
            "sample": spec["sample"],
            "seed": spec["seed"],
            "peak_bytes": peak["linear"],
        },
        "measured_speedup": measured,
        "measured_speedup_ci95": [lin["ci95"][0] / secs["tree"], lin["ci95"][1] / secs["tree"]],
        "stats": {
            "estimated_speedup": est,
            "estimated_speedup_unpacked": stats["model"]["speedup"],
            "por": stats["por"],
            "err": stats.get("packing", {}).get("err"),
            "ideal_speedup": stats["ideal_speedup"],
            "attention_ratio": stats["attention"]["ratio"],
        },
        "ratio": measured / est,
        "warm_up_seconds": warm,
        "wall_seconds": time.perf_counter() - t_start,
    }


def _line(r: dict) -> str:
    t, lin, s = r["tree"], r["linear"], r["stats"]
    how = (
        f"extrapolated from {lin['measured_sequences']} of {r['sequences']} sequences "
        f"({lin['measured_seconds']:.2f} s measured; 95% {lin['ci95'][0]:.2f}-{lin['ci95'][1]:.2f}"
        f" s; by tokens {lin['seconds_by_tokens']:.2f} s)"
        if lin["extrapolated"]
        else f"all {r['sequences']} sequences measured"
    )
    peaks = (
        f" | peak tree {t['peak_bytes'] / 2**20:,.0f} MiB, linear {lin['peak_bytes'] / 2**20:,.0f}"
        " MiB"
        if t["peak_bytes"] is not None
        else ""
    )
    lo, hi = r["measured_speedup_ci95"]
    return (
        f"{Path(r['build']).name} {r['model']} {r['dtype']} budget {r['budget']}"
        f"{' checkpointing' if r['checkpointing'] else ''}: {r['trees']} trees, "
        f"{r['tokens_tree']:,} tree tokens, {r['tokens_linear']:,} linear | tree "
        f"{t['seconds']:.2f} s ({t['parts']} parts) | linear {lin['seconds']:.2f} s, {how} | "
        f"measured {r['measured_speedup']:.2f}x (95% {lo:.2f}-{hi:.2f}x), stats estimates "
        f"{s['estimated_speedup']:.2f}x, ratio {r['ratio']:.2f}{peaks}"
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default=None, help="a build (default: the Claude Code session)")
    ap.add_argument("--model", default="tiny-qwen3", help="a trainer preset")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default: the preset's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="weights and compute (default: bfloat16 on CUDA, float32 on CPU)",
    )
    ap.add_argument("--attn", default=None, help="attention backend (default: nodes on CPU, auto)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    ap.add_argument("--budget", type=int, default=16384, help="part budget in tokens")
    ap.add_argument("--part-graph", default="recompute", help="hand-off parts: recompute or keep")
    ap.add_argument("--sample", type=int, default=None, help="linear side: sampled sequences")
    ap.add_argument("--strata", type=int, default=4, help="linear side: strata by length")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed")
    ap.add_argument("--trees", type=int, default=None, help="keep the K largest trees (CPU)")
    ap.add_argument(
        "--max-length", type=int, default=None, help="keep sequences of at most L tokens (CPU)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    spec = {
        "data": a.data,
        "model": a.model,
        "vocab": a.vocab,
        "device": a.device,
        "dtype": a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32"),
        "attn": a.attn or ("nodes" if a.device == "cpu" else "auto"),
        "checkpointing": a.checkpointing,
        "budget": a.budget,
        "part_graph": a.part_graph,
        "sample": a.sample,
        "strata": a.strata,
        "seed": a.seed,
        "trees": a.trees,
        "max_length": a.max_length,
    }

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    r = run(spec, log=log)
    print(_line(r), file=sys.stderr if a.json else sys.stdout, flush=True)
    if a.json:
        print(json.dumps(r, indent=2))
    return r


if __name__ == "__main__":
    main()
