"""bench/build: ``treeprep build`` against the naive pipeline, side by side in one run.

The workload is generated: agent sessions of 40 calls each, logged per call as OpenAI chat JSONL
(one line per call holding the whole growing context, as LiteLLM-style proxies log them), with tool
calls and tool results of realistic sizes. The total is at least ``--mb`` megabytes, split over
several files so that ``--workers`` can use several cores.

Printed, for each pipeline: input MB/s, unique tokens/s (``tokens_tree`` per second), linear tokens
per second, and peak RSS. The naive pipeline renders and tokenizes every call whole with the same
tokenizer (``apply_chat_template(..., tokenize=True)``) and does nothing else; it runs on a prefix
of the workload (``--naive-mb``) because it is slow, and its throughput is a rate, so the ratio is
fair. Each pipeline runs in its own subprocess so that peak RSS is its own.

    python bench/build.py --tokenizer ../shared/data/tokenizers/qwen3 --mb 200 --workers 2

With ``--engine ray`` it compares the engines instead: ``--engine local`` and ``--engine ray`` on
the same workload with 1 and ``--workers`` workers, run interleaved, each in its own subprocess
(the Ray runs start their own local Ray, as ``treeprep build --engine ray`` does, and that start
is part of their time), then both engines on a small input (``--small-mb``) for Ray's fixed
overhead. It also checks that the two engines wrote the same shards.

    python bench/build.py --engine ray --tokenizer ../shared/data/tokenizers/qwen3 --mb 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

from report import print_result

WORDS = (
    "the a of to and in is for on with that this file function return value error test import "
    "class def self none true false list dict string path line number result output input config "
    "update check run build install module package version python numpy torch tensor shape data "
    "agent tool call response message user assistant system token tree prefix cache batch step"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    lines = []
    while n_words > 0:
        k = min(n_words, rng.randint(4, 14))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)))
        n_words -= k
    return "\n".join(lines)


def generate(folder: str, mb: float, files: int, seed: int = 0) -> list[str]:
    """Write >= ``mb`` MB of per-call JSONL from 40-call sessions into ``files`` files."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    paths = [os.path.join(folder, f"calls-{i:02d}.jsonl") for i in range(files)]
    handles = [open(p, "w", encoding="utf-8") for p in paths]
    target = int(mb * 1e6)
    written = 0
    session = 0
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} tool",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string"}},
                    "required": ["arg"],
                },
            },
        }
        for name in ("bash", "read_file", "edit_file")
    ]
    while written < target:
        f = handles[session % files]
        messages = [
            {"role": "system", "content": "You are a coding agent.\n" + _text(rng, 120)},
            {"role": "user", "content": _text(rng, 60)},
        ]
        for call in range(40):
            tc_id = f"call_{session}_{call}"
            completion = {
                "role": "assistant",
                "content": _text(rng, rng.randint(10, 60)),
                "tool_calls": [
                    {
                        "id": tc_id,
                        "type": "function",
                        "function": {
                            "name": rng.choice(["bash", "read_file", "edit_file"]),
                            "arguments": json.dumps({"arg": _text(rng, 6)}),
                        },
                    }
                ],
            }
            rec = {
                "group_id": f"session-{session}",
                "call_id": f"s{session}-c{call}",
                "messages": messages,
                "tools": tools,
                "completion": completion,
            }
            line = json.dumps(rec) + "\n"
            f.write(line)
            written += len(line.encode())
            messages = messages + [
                completion,
                {
                    "role": "tool",
                    "tool_call_id": tc_id,
                    "content": _text(rng, rng.randint(40, 400)),
                },
            ]
        session += 1
    for h in handles:
        h.close()
    return paths


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


def run_treeprep(
    paths: list[str], out: str, tokenizer: str | None, workers: int, engine: str = "local"
) -> dict:
    from treeprep.build import BuildConfig, build

    if os.path.exists(out):  # a fresh build each time, not a resume
        import shutil

        shutil.rmtree(out)
    t0, c0 = time.perf_counter(), _cpu_s()
    m = build(
        BuildConfig(inputs=paths, out=out, tokenizer=tokenizer, workers=workers, engine=engine)
    )
    dt = time.perf_counter() - t0
    return {
        "seconds": dt,
        "cpu_seconds": _cpu_s() - c0,
        "shards_sha256": [e.sha256 for e in m.shards],
        "bytes": sum(i.bytes for i in m.inputs),
        "calls": m.counts.records_in_trees,
        "tokens_tree": m.counts.tokens_tree,
        "tokens_linear": m.counts.tokens_linear,
        "peak_rss_mb": _peak_rss_mb(),
    }


def run_naive(paths: list[str], tokenizer: str | None, limit_bytes: int, with_prompt: bool) -> dict:
    """Parse every call and tokenize it whole with apply_chat_template; count tokens.

    With ``with_prompt`` it also renders the generation prompt, as a pipeline that produces the same
    output as treeprep (ids and the loss mask) must.
    """
    if tokenizer is None:
        from treeprep.render.builtin import load_builtin

        tok = load_builtin()  # the built-in tokenizer wrapped for transformers
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    t0, c0 = time.perf_counter(), _cpu_s()
    n_bytes = 0
    calls = 0
    tokens = 0
    for p in paths:
        with open(p, "rb") as f:
            for line in f:
                rec = json.loads(line)
                ids = tok.apply_chat_template(
                    rec["messages"] + [rec["completion"]],
                    tools=rec["tools"],
                    tokenize=True,
                    return_dict=False,
                )
                if with_prompt:  # the loss mask needs where the completion starts
                    prompt = tok.apply_chat_template(
                        rec["messages"],
                        tools=rec["tools"],
                        tokenize=True,
                        add_generation_prompt=True,
                        return_dict=False,
                    )
                    assert ids[: len(prompt)] == prompt
                tokens += len(ids)
                calls += 1
                n_bytes += len(line)
                if n_bytes >= limit_bytes:
                    break
        if n_bytes >= limit_bytes:
            break
    dt = time.perf_counter() - t0
    return {
        "seconds": dt,
        "cpu_seconds": _cpu_s() - c0,
        "bytes": n_bytes,
        "calls": calls,
        "tokens_linear": tokens,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokenizer", default=None, help="HF tokenizer folder (default: built-in)")
    ap.add_argument("--mb", type=float, default=200.0, help="workload size in MB")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--naive-mb", type=float, default=20.0, help="prefix the naive run processes")
    ap.add_argument("--work", default="bench/_work/build")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--engine", choices=["local", "ray"], default="local", help="ray: compare the engines"
    )
    ap.add_argument("--small-mb", type=float, default=0.5, help="--engine ray: the small input")
    ap.add_argument("--repeats", type=int, default=1, help="--engine ray: rounds (best is kept)")
    ap.add_argument("--_child", choices=["treeprep", "naive", "naive-full"], help=argparse.SUPPRESS)
    ap.add_argument("--_data", default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    data = args._data or os.path.join(args.work, "data")
    if args._child:
        print(json.dumps(_child_run(args, data)))
        return
    total_mb, gen_s = _fresh_workload(args, data)
    if args.engine == "ray":
        small = generate(os.path.join(args.work, "small"), args.small_mb, 2, seed=1)
        compare_engines(args, total_mb, os.path.dirname(small[0]))
    else:
        compare_pipelines(args, total_mb, gen_s)


def _child_run(args: argparse.Namespace, data: str) -> dict:
    """One measured run, in this (child) process: treeprep or the naive pipeline."""
    paths = sorted(os.path.join(data, p) for p in os.listdir(data))
    if args._child == "treeprep":
        tag = f"{os.path.basename(data)}-{args.engine}-w{args.workers}"
        out = os.path.join(args.work, f"out-{tag}")
        return run_treeprep(paths, out, args.tokenizer, args.workers, args.engine)
    lim = int(args.naive_mb * 1e6)
    return run_naive(paths, args.tokenizer, lim, args._child == "naive")


def _fresh_workload(args: argparse.Namespace, data: str) -> tuple[float, float]:
    """Generate the workload anew under ``data``: (its size in MB, seconds it took)."""
    if os.path.exists(data):
        import shutil

        shutil.rmtree(args.work)
    t0 = time.perf_counter()
    paths = generate(data, args.mb, args.files)
    gen_s = time.perf_counter() - t0
    return sum(os.path.getsize(p) for p in paths) / 1e6, gen_s


def _spawn(
    args: argparse.Namespace,
    kind: str,
    workers: int,
    engine: str = "local",
    data: str | None = None,
) -> dict:
    """Run this script as a child measuring one pipeline (its own process: its own peak RSS)."""
    cmd = [sys.executable, __file__, "--_child", kind, "--work", args.work]
    cmd += ["--workers", str(workers), "--naive-mb", str(args.naive_mb), "--engine", engine]
    if data:
        cmd += ["--_data", data]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare_pipelines(args: argparse.Namespace, total_mb: float, gen_s: float) -> None:
    """treeprep (1 and ``--workers`` workers) against the naive pipeline, on the workload."""
    naive = _spawn(args, "naive", 1)
    naive_full = _spawn(args, "naive-full", 1)
    tp1 = _spawn(args, "treeprep", 1)
    tpw = _spawn(args, "treeprep", args.workers) if args.workers > 1 else tp1
    rows = [
        _pipeline_row(name, r, cores)
        for name, r, cores in (
            ("naive: ids + loss mask (1 core)", naive, 1),
            ("naive: full render only (1 core)", naive_full, 1),
            ("treeprep --workers 1", tp1, 1),
            (f"treeprep --workers {args.workers}", tpw, args.workers),
        )
    ]
    naive_rate = rows[0]["input_mb_per_s"]
    summary = {
        "workload_mb": round(total_mb, 1),
        "generate_s": round(gen_s, 1),
        "tokens_linear": tp1["tokens_linear"],
        "tokens_tree": tp1["tokens_tree"],
        "speedup_vs_naive_1core": round(rows[2]["input_mb_per_s"] / naive_rate, 1),
        "speedup_vs_naive_workers": round(rows[3]["input_mb_per_s"] / naive_rate, 1),
        "speedup_vs_naive_full_only_1core": round(
            rows[2]["input_mb_per_s"] / rows[1]["input_mb_per_s"], 1
        ),
        "cpu_speedup_vs_naive_1core": round(
            rows[2]["input_mb_per_cpu_s"] / rows[0]["input_mb_per_cpu_s"], 1
        ),
        "rows": rows,
    }
    note = (
        f"tokens_linear {tp1['tokens_linear']:,}  tokens_tree {tp1['tokens_tree']:,}  "
        f"throughput vs naive (ids + loss mask): {summary['speedup_vs_naive_1core']}x (1 core), "
        f"{summary['speedup_vs_naive_workers']}x ({args.workers} workers); "
        f"vs naive full render only: {summary['speedup_vs_naive_full_only_1core']}x (1 core)"
    )
    title = f"bench/build: {total_mb:.0f} MB of 40-call sessions"
    print_result(summary, rows, title=title, as_json=args.json, notes=(note,))


def _pipeline_row(name: str, r: dict, cores: int) -> dict:
    """One pipeline's rates from its run."""
    mbps = r["bytes"] / 1e6 / r["seconds"]
    return {
        "pipeline": name,
        "input_mb": round(r["bytes"] / 1e6, 1),
        "seconds": round(r["seconds"], 2),
        "input_mb_per_s": round(mbps, 2),
        "input_mb_per_s_per_core": round(mbps / cores, 2),
        # MB per CPU-second: the per-core rate even on a shared, loaded machine
        "input_mb_per_cpu_s": round(r["bytes"] / 1e6 / r["cpu_seconds"], 2),
        "unique_tokens_per_s": round(r.get("tokens_tree", 0) / r["seconds"]),
        "linear_tokens_per_s": round(r["tokens_linear"] / r["seconds"]),
        "peak_rss_mb": round(r["peak_rss_mb"]),
    }


def compare_engines(args: argparse.Namespace, total_mb: float, small: str) -> None:
    """--engine ray: local against ray, interleaved, on the workload and on a small input."""
    runs = [
        ("workload", None, 1),
        ("workload", None, args.workers),
        ("small", small, args.workers),
    ]
    best: dict[tuple, dict] = {}
    for _ in range(args.repeats):
        for label, data, workers in runs:
            for engine in ("local", "ray"):  # interleaved: both see the same machine load
                r = _spawn(args, "treeprep", workers, engine, data)
                key = (label, engine, workers)
                if key not in best or r["seconds"] < best[key]["seconds"]:
                    best[key] = r
    rows = []
    for label, _, workers in runs:
        loc, ray = best[(label, "local", workers)], best[(label, "ray", workers)]
        if loc["shards_sha256"] != ray["shards_sha256"]:
            raise SystemExit(f"{label}: the engines wrote different shards")
        rows.append(
            {
                "input": label,
                "input_mb": round(loc["bytes"] / 1e6, 1),
                "workers": workers,
                "local_s": round(loc["seconds"], 2),
                "ray_s": round(ray["seconds"], 2),
                "local_mb_per_s": round(loc["bytes"] / 1e6 / loc["seconds"], 2),
                "ray_mb_per_s": round(ray["bytes"] / 1e6 / ray["seconds"], 2),
                "ray_over_local": round(ray["seconds"] / loc["seconds"], 2),
                "ray_minus_local_s": round(ray["seconds"] - loc["seconds"], 2),
                "same_shards": True,
            }
        )
    title = f"bench/build --engine ray: {total_mb:.0f} MB workload, {args.small_mb} MB small"
    result = {"workload_mb": round(total_mb, 1), "rows": rows}
    print_result(result, rows, title=title, as_json=args.json)


if __name__ == "__main__":
    main()
