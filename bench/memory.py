"""Peak memory and step time of hand-off parts against the budget and the linear trainer.

One forward and backward of one large tree, each configuration in a fresh process so that its
peak is its own. ``peak_bytes`` is the peak of live tensor bytes: on the CPU counted exactly by
:class:`~treeprep.trainer.run.memtrack.LiveBytes` (a dispatch-mode tracker; the model's parameters
and the batch included, RSS never used), on CUDA ``torch.cuda.max_memory_allocated``.
Configurations (``--modes``): the whole tree at once (unless ``--no-whole``), ``linear`` (the
causal baseline: the tree's longest sequence as a one-path tree, one ``is_causal`` attention call
per layer, same dtype and checkpointing), and hand-off parts at each budget in ``recompute`` and
``keep`` modes. ``--dtype float32|bfloat16`` loads the weights in that dtype (CPU too);
``--autocast`` instead runs what ``treeprep train`` runs in bf16: float32 weights under bf16
autocast (no weight cache), the memory model's ``autocast=True``.

Every result carries ``peak_bytes``, ``predicted_peak_bytes`` (:mod:`treeprep.memory`, no
optimizer: one forward and backward, its gradients included; for ``keep``, over the largest
stack of kept ancestors, its tokens and those of them in parts with targets, ``kept_tokens``
and ``kept_grad_tokens``, and the rows its other ancestors store, ``kept_stored_rows``, read
from the part plan),
``handoff_bytes_per_path_token`` and
``kv_bytes_per_path_token`` (layers x 2 x kv_heads x head_dim x dtype bytes). Two figures per path
token, both on the tree's longest path with every token trained (:func:`child`):

* ``handoff_bytes_per_path_token``: the handed-over state itself, counted from the stores (the
  most bytes their keys, values and accumulators hold at once, :func:`held_state`), over the
  path's tokens; the gradients on their way into the stores are one key block at a time (the
  fused kernel adds each block's into its store), so they do not grow with the path;
* ``peak_bytes_per_path_token``: everything that grows with the path, as a difference of peaks
  (the path run as parts at the same budget at its full and at half its length): the hand-off
  state plus the part's mask vectors (a few int64 per prefix row).

Both are 0 for ``whole`` and ``linear`` (nothing is handed over).
``--linear-model`` does not run the linear trainer: its result is the memory model's peak for
the longest path (``model_only``), for a path too long to run in the time at hand. The trees and
the predictions live in ``bench/memory_inputs.py``.

Store places (``--stores gpu,host``, issue 37): each hand-off configuration runs with its stores
on the device and in a host pool (:mod:`treeprep.trainer.parts.host`, streamed a window at a
time). Every result carries ``device_peak_bytes`` (CUDA: ``max_memory_allocated``; CPU: the
live-tensor count with the pool left out, which is what a device would hold) and
``host_store_bytes`` (the pool's peak; 0 with gpu stores). ``--rounds N`` runs every
configuration N times, the configurations interleaved round by round, and the summary gives each
one's median seconds, the host / gpu time ratio (and host-sync / host), the device peak's growth
from the shortest to the longest path, and its ratio to the linear trainer's peak on the longest
path.

``host-sync`` is host stores with each window's gradients copied back and added at once
(``HostPool(grad_depth=0)``: a host sync per window and layer), the way before the gradient sink
(:class:`~treeprep.trainer.parts.host.GradSink`): ``--stores gpu,host,host-sync`` measures what
the sink saves, side by side.

Workloads:

* ``agent``: a generated agent session (one main thread of calls, each call's prompt the previous
  prompt plus completion plus tool result, a retry branch on one call in five), with a root-to-leaf
  path of ``--path`` tokens; ``--path`` takes several values to show that memory at a fixed budget
  grows with the path's keys and values, not with the tree;
* ``claude-code``: the largest tree of a build (``--data OUT``; default: builds
  ``../shared/data/logs/claude-code`` with the Qwen3 tokenizer into bench/_work): the real session
  with its sub-agents and compaction, a 126k-token path.

    python bench/memory.py --workload agent --path 8192,16384 --budgets 1024,2048,4096
    python bench/memory.py --workload agent --path 16384 --budgets 2048 \
        --modes recompute,linear --no-whole --json --dtype bfloat16
    python bench/memory.py --workload claude-code --device cuda --model qwen3-0.6b --json
    python bench/memory.py --path 8192,16384 --budgets 2048 --modes recompute,linear \
        --no-whole --checkpointing --no-probe --stores gpu,host --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import numpy as np
from memory_inputs import (  # noqa: E402  (bench/memory_inputs.py, beside this file)
    AGENT_VOCAB,
    WORK,
    agent_tree_row,
    linear_predicted,
    longest_path_row,
    place,
    predicted,
    tree_row,
)

#: CUDA: the model of the last configuration (random init of a 1.7B model costs seconds)
_MODELS: dict[tuple, object] = {}


def measure(spec: dict, row: dict) -> dict:
    """One forward and backward of ``row``: peak bytes (exact live tensor bytes on the CPU,
    ``max_memory_allocated`` on CUDA), seconds, parts."""
    import contextlib

    import torch

    from treeprep.schemas.parts import stored_rows_peak
    from treeprep.trainer import TreeBatch, load_model
    from treeprep.trainer.config import bf16_autocast
    from treeprep.trainer.objective.loss import LossConfig, tree_loss
    from treeprep.trainer.parts import run_parts
    from treeprep.trainer.parts.host import HostPool
    from treeprep.trainer.parts.plan import part_layout
    from treeprep.trainer.run.memtrack import LiveBytes

    torch.manual_seed(0)
    dev = spec["device"]
    dtype = torch.float32 if spec.get("autocast") else getattr(torch, spec["dtype"])
    cast = bf16_autocast(torch.device(dev)) if spec.get("autocast") else None
    vocab = AGENT_VOCAB if spec["workload"] == "agent" else None
    tracker = LiveBytes() if dev == "cpu" else None
    pool = HostPool(dev, grad_depth=place(spec)[1])
    if tracker is not None:
        tracker.exclude(pool.owns)  # host RAM, not what a device would hold
    with tracker or contextlib.nullcontext():
        attn = spec["attn"]
        key = (spec["model"], str(dtype), dev, attn, vocab)
        model = _MODELS.get(key) if dev == "cuda" else None
        if model is None:
            model = load_model(spec["model"], dtype=dtype, device=dev, attn=attn, vocab_size=vocab)
        if dev == "cuda":  # one process serves every CUDA configuration: load each model once
            _MODELS.clear()
            _MODELS[key] = model
            model.zero_grad(set_to_none=True)
        if spec.get("checkpointing"):
            model.train()
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        batch = TreeBatch.from_trees([row], norm="token-mean", device=dev)
        if tracker is not None:
            tracker.track(*model.parameters(), *model.buffers())
            tracker.track(*[v for v in vars(batch).values() if isinstance(v, torch.Tensor)])
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        parts = prefix = 0
        kept = (0, 0, 0, 0)
        stacks: list[tuple[int, int, int, int]] = []
        head_rows = int(batch.targets().token.numel())
        if spec["budget"] is None:
            with cast() if cast is not None else contextlib.nullcontext():
                out = tree_loss(model, batch, loss="sft")
            out.loss.backward()
            del out
        else:
            with held_state() as held:
                res = run_parts(
                    model,
                    batch,
                    LossConfig("sft"),
                    budget=spec["budget"],
                    mode=spec["mode"],
                    attn=attn,
                    autocast=cast,
                    stores=place(spec)[0],
                    pool=pool,
                )
            parts, prefix = res.parts, res.prefix_rows
            layout = part_layout(batch, spec["budget"])
            head_rows = max(int(p.target_select.sum()) for p in layout.parts)
            stacks = layout.kept_stacks()
            kept = max(stacks)
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    peak_b = tracker.peak if tracker is not None else torch.cuda.max_memory_allocated()
    return {
        "tokens_tree": batch.num_tokens,
        "tokens_linear": batch.tokens_linear,
        "targets": int(batch.targets().token.numel()),
        "head_rows": head_rows,
        "longest_path": int((batch.position_ids.max() + 1).item()),
        "parts": parts or 1,
        "prefix_rows": prefix,
        "peak_bytes": int(peak_b),
        "device_peak_bytes": int(peak_b),
        "host_store_bytes": pool.peak,
        "handoff_state_bytes": held[0] if spec["budget"] is not None else 0,
        "stored_rows": stored_rows_peak(
            np.asarray(row["node_length"]), np.asarray(row["node_parent"]), spec["budget"]
        )
        if spec["budget"] is not None
        else 0,
        "kept_tokens": kept[0],
        "kept_grad_tokens": kept[1],
        "kept_running_rows": kept[2],
        "kept_stored_rows": kept[3],
        "kept_stacks": stacks if spec["budget"] is not None else [],
        "seconds": round(dt, 3),
    }


@contextlib.contextmanager
def held_state():
    """The most bytes the parts' hand-off stores (keys, values, their accumulators and linear
    states) hold at once during the run, counted from the stores themselves: yields a one-item
    list that holds it afterwards. Checked after every store and before every drop (the stack
    is deepest, and its accumulators fullest, just before its deepest part is dropped)."""
    from treeprep.trainer.parts import schedule, state

    best = [0]

    def count(run) -> None:
        n = 0
        for sts in run.states.values():
            for st in sts:
                ts = (
                    [st.k, st.v, st.gk, st.gv]
                    if isinstance(st, state.KVStore)
                    else [t for pair in st.states.values() for t in pair]
                    + [t for g in st.grads.values() for t in g]
                )
                n += sum(t.numel() * t.element_size() for t in ts if t is not None)
        best[0] = max(best[0], n)

    store, drop = schedule._Runner.store, schedule._Runner.drop

    def store_counted(self, c, ho) -> None:
        store(self, c, ho)
        count(self)

    def drop_counted(self, c) -> None:
        count(self)
        drop(self, c)

    schedule._Runner.store, schedule._Runner.drop = store_counted, drop_counted
    try:
        yield best
    finally:
        schedule._Runner.store, schedule._Runner.drop = store, drop


def child(spec: dict) -> dict:
    """One configuration in this (fresh) process, and for hand-off modes its hand-off probe:
    the tree's longest path as a one-path tree with every token trained (so that each part
    feeds the LM head the same rows), run as parts at the same budget whole and cut to half its
    length. The handed-over bytes per path token are the difference of the two peaks over the
    difference of the lengths: nothing else a part holds grows with the path."""
    row = tree_row(spec)
    r = measure(spec, longest_path_row(row) if spec["mode"] == "linear" else row)
    handoff = slope = 0.0  # whole tree or linear: nothing is handed over
    if spec["mode"] in ("recompute", "keep") and spec.get("no_probe"):
        # no probe (the GPU script's time limit): the tree's own stores over its longest path
        handoff = round(r["handoff_state_bytes"] / r["longest_path"], 1)
        slope = None
    elif spec["mode"] in ("recompute", "keep"):
        n = r["longest_path"]
        full = measure(spec, longest_path_row(row, train_all=True))
        half = measure(spec, longest_path_row(row, cut=n // 2, train_all=True))
        slope = round((full["peak_bytes"] - half["peak_bytes"]) / (n - n // 2), 1)
        handoff = round(full["handoff_state_bytes"] / n, 1)
    pred, pred_handoff, kv = predicted(spec, r)
    return {
        **spec,
        **r,
        "tokens_fed": r["tokens_tree"],
        "predicted_peak_bytes": pred,
        "predicted_over_measured": round(pred / r["peak_bytes"], 3),
        "handoff_bytes_per_path_token": handoff,
        "peak_bytes_per_path_token": slope,
        "predicted_handoff_bytes_per_path_token": pred_handoff,
        "kv_bytes_per_path_token": kv,
    }


def run_config(spec: dict) -> dict:
    if spec["mode"] == "linear" and spec.get("linear_model"):
        return linear_predicted(spec)
    if spec["device"] == "cuda":
        # CUDA peaks reset per configuration, so one process serves them all (and compiles once)
        import torch

        torch.cuda.empty_cache()
        try:
            return child(spec)
        except torch.OutOfMemoryError as e:
            return {**spec, "error": f"out of memory: {str(e).splitlines()[0]}"}
        except Exception as e:  # one failed configuration must not cost the others their figures
            return {**spec, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
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
    ap.add_argument("--modes", default="recompute,keep", help="recompute, keep and/or linear")
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-tree run")
    ap.add_argument("--model", default="tiny-qwen3", help="a preset, or several, comma-separated")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="weights and compute (default: bfloat16 on CUDA, float32 on CPU)",
    )
    ap.add_argument(
        "--autocast",
        action="store_true",
        help="float32 weights under bf16 autocast, as treeprep train runs bf16 (not --dtype)",
    )
    ap.add_argument(
        "--attn",
        default=None,
        help="attention backend (default: nodes on CPU, which keeps no score matrix as flex "
        "does on CUDA; auto elsewhere)",
    )
    ap.add_argument(
        "--checkpointing", action="store_true", help="activation checkpointing per decoder layer"
    )
    ap.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the hand-off probe (two more runs of the longest path): hand-off bytes per "
        "path token from the tree's own stores, no peak slope",
    )
    ap.add_argument(
        "--warmup",
        action="store_true",
        help="CUDA: one untimed small run first, so that compiling FlexAttention is not timed",
    )
    ap.add_argument("--stores", default="gpu", help="hand-off stores: gpu, host, host-sync")
    ap.add_argument(
        "--linear-model",
        action="store_true",
        help="do not run the linear trainer: its result is the memory model's peak "
        "(model_only), for a path too long to run in the time at hand",
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs of each configuration")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    modes = a.modes.split(",")
    if bad := set(modes) - {"recompute", "keep", "linear"}:
        ap.error(f"unknown modes {sorted(bad)}")
    stores = a.stores.split(",")
    if bad := set(stores) - {"gpu", "host", "host-sync"}:
        ap.error(f"unknown stores {sorted(bad)}")
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    attn = a.attn or ("nodes" if a.device == "cpu" else "auto")
    WORK.mkdir(parents=True, exist_ok=True)
    paths = [int(x) for x in a.path.split(",")] if a.workload == "agent" else [0]
    models = a.model.split(",")
    if a.warmup and a.device.startswith("cuda"):  # one compile serves every model (dynamic)
        _warm_up(a.workload, models[0], a.device, dtype, attn, a.checkpointing)
    results = []
    for model, path in ((m, p) for m in models for p in paths):
        base = {"workload": a.workload, "path": path, "model": model, "device": a.device,
                "dtype": "bfloat16" if a.autocast else dtype, "autocast": a.autocast,
                "attn": attn, "data": a.data,
                "checkpointing": a.checkpointing, "no_probe": a.no_probe,
                "linear_model": a.linear_model}  # fmt: skip
        specs = [] if a.no_whole else [{**base, "budget": None, "mode": "whole"}]
        if "linear" in modes:
            specs.append({**base, "budget": None, "mode": "linear"})
        specs += [
            {**base, "budget": int(b), "mode": m, "stores": st}
            for b in a.budgets.split(",")
            for m in modes
            if m != "linear"
            for st in stores
        ]
        ref = None
        for rnd, spec in ((r, sp) for r in range(a.rounds) for sp in specs):
            r = {**run_config(spec), "round": rnd}
            ran = "error" not in r and not r.get("model_only")
            if r["mode"] in ("whole", "linear") and ran and ref is None:
                ref = r
            if ran and ref is not None:
                r[f"time_vs_{ref['mode']}"] = round(r["seconds"] / ref["seconds"], 3)
                r[f"peak_vs_{ref['mode']}"] = round(r["peak_bytes"] / ref["peak_bytes"], 3)
            results.append(r)
            print(_line(r), file=sys.stderr if a.json else sys.stdout, flush=True)
            if a.json:  # each result as it comes, so that a run stopped at its limit keeps them
                print("RESULT " + json.dumps(r), file=sys.stderr, flush=True)
    for line in _summary(results):
        print(line, file=sys.stderr if a.json else sys.stdout, flush=True)
    if a.json:
        print(json.dumps(results, indent=2))


def _summary(results: list[dict]) -> list[str]:
    """Per model, dtype, budget and mode: median seconds per store place and their ratio, the
    device peak's growth from the shortest path to the longest, and its ratio to the linear
    trainer's peak on the longest path (module docstring)."""
    ok = [r for r in results if "error" not in r and not r.get("model_only")]
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in ok:
        key = (r["model"], r["dtype"], r["budget"], r["mode"])
        groups.setdefault(key, {}).setdefault((r.get("stores", "-"), r["path"]), []).append(r)
    lines = []
    for (model, dtype, budget, mode), runs in groups.items():
        if budget is None:
            continue
        paths = sorted({p for _, p in runs})
        for st in sorted({s for s, _ in runs}):
            lo, hi = runs.get((st, paths[0])), runs.get((st, paths[-1]))
            if not lo or not hi:
                continue
            sec = float(np.median([r["seconds"] for r in hi]))
            peak_lo, peak_hi = lo[0]["device_peak_bytes"], hi[0]["device_peak_bytes"]
            lin, how = runs_linear(results, model, dtype, paths[-1])
            vs = f", {peak_hi / lin:.2f}x linear{how}" if lin else ""
            lines.append(
                f"{model} {dtype} budget {budget} {mode} {st} stores: device peak "
                f"{peak_lo / 2**20:.1f} -> {peak_hi / 2**20:.1f} MiB "
                f"({peak_hi / peak_lo - 1:+.1%} from path {paths[0]} to {paths[-1]}{vs}), host "
                f"{hi[0]['host_store_bytes'] / 2**20:.1f} MiB, {sec:.2f} s (median of {len(hi)})"
            )
        for a, b in (("host", "gpu"), ("host-sync", "host")):
            num, den = runs.get((a, paths[-1])), runs.get((b, paths[-1]))
            if num and den:
                ratio = np.median([r["seconds"] for r in num]) / np.median(
                    [r["seconds"] for r in den]
                )
                lines.append(f"  {a} / {b} seconds at path {paths[-1]}: {ratio:.3f}x")
    return lines


def runs_linear(results: list[dict], model: str, dtype: str, path: int) -> tuple[int | None, str]:
    """The linear trainer's peak on ``path`` and how it is known: measured (``""``), or the
    memory model's (``--linear-model``); None without either."""
    for r in results:
        if (r["mode"], r["model"], r["dtype"], r["path"]) != ("linear", model, dtype, path):
            continue
        if r.get("model_only"):
            return int(r["predicted_peak_bytes"]), " (its peak from the memory model, not run)"
        if "error" not in r:
            return int(r["device_peak_bytes"]), ""
    return None, ""


def _warm_up(
    workload: str, model: str, device: str, dtype: str, attn: str, checkpointing: bool
) -> None:
    """One small hand-off run and one linear run, untimed: compiles FlexAttention (once per
    process, dynamic shapes) and loads the kernels before any configuration is timed. The rows
    are generated (ids below the agent vocabulary), the model is the workload's own, so that it
    is loaded once."""
    t0 = time.perf_counter()
    base = {"workload": workload, "path": 4096, "model": model, "device": device, "dtype": dtype,
            "attn": attn, "data": None, "checkpointing": checkpointing}  # fmt: skip
    row = agent_tree_row(4096)
    measure({**base, "budget": 2048, "mode": "recompute"}, row)
    measure({**base, "budget": None, "mode": "linear"}, longest_path_row(row))
    print(f"warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['workload']} path {r['path']} {r['mode']} budget {r['budget']}: {r['error']}"
    if r.get("model_only"):
        return (
            f"{r['workload']:<11} {r['dtype']:<8} path {r['longest_path']:>7} linear: not run, "
            f"the memory model's peak {r['predicted_peak_bytes'] / 2**20:.1f} MiB"
        )
    b = "-" if r["budget"] is None else f"{r['budget']}"
    st = (
        f" {r['stores']} stores (host {r['host_store_bytes'] / 2**20:.1f} MiB)"
        if r.get("stores")
        else ""
    )
    ho = r["handoff_bytes_per_path_token"]
    sl = r["peak_bytes_per_path_token"]
    ho_s = f"{ho:,.0f}" + ("" if sl is None else f" (peak {sl:,.0f})")
    return (
        f"{r['workload']:<11} {r['dtype']:<8} tree {r['tokens_tree']:>7} path "
        f"{r['longest_path']:>7} budget {b:>6} {r['mode']:<9}{st} parts {r['parts']:>4} "
        f"peak {r['peak_bytes'] / 2**20:>9.1f} MiB (model {r['predicted_over_measured']:.2f}x) "
        f"hand-off {ho_s} B/path token (K/V {r['kv_bytes_per_path_token']}) "
        f"{r['seconds']:>8.2f} s"
    )


if __name__ == "__main__":
    main()
