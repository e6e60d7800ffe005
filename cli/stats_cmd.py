"""``treeprep stats``: counts, overlap, attention work and the estimated speedup of a build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from treeprep.cli import options as opt
from treeprep.modes import Cut, Head


def stats_cmd(
    build: opt.BuildArg,
    *,
    model: Annotated[
        str | None,
        typer.Option(help="Model for the FLOP estimate: a preset (qwen3-8b, ...) or config.json."),
    ] = None,
    cut: opt.CutOpt = Cut.handoff,
    budget: Annotated[
        int | None, typer.Option(help="Plan packing in memory with this token budget.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(help="Report an existing plan folder (BUILD/plans/NAME).")
    ] = None,
    head: Annotated[
        Head,
        typer.Option(
            help="LM head in the estimate: on the trained targets (treeprep's trainer) or on "
            "every fed token (trainers that compute full logits)."
        ),
    ] = Head.targets,
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write distributions and speedups to a .png or .html file.")
    ] = None,
) -> None:
    """How much the trees share, and what tree training should save on this data."""
    from treeprep.flops import load_model
    from treeprep.stats import collect, compute_stats, write_plot

    out = build
    shape = load_model(model) if model else None
    collected = collect(str(out))
    stats = compute_stats(
        str(out),
        model=shape,
        budget=budget,
        plan=str(plan) if plan else None,
        cut=cut,
        head=head,
        collected=collected,
    )
    if shape is not None:
        stats["memory"] = _memory(shape, out, budget, str(model))
    if plot is not None:
        write_plot(collected, stats, str(plot))
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        _render(stats, out)
    if plot is not None:
        from rich.console import Console

        Console(stderr=True).print(f"wrote {plot}")


def _memory(shape: object, out: Path, budget: int | None, model: str) -> dict:
    """The memory model's prediction for the model on one H100 (bf16 autocast, AdamW, one rank)
    at ``budget`` (``--budget``; else the suggested one): the terms ``treeprep train --dry-run``
    adds up, and ``next``, that dry run's command, which takes the run's own set-up."""
    import shlex

    from treeprep.dry_run import BuildFacts, dry_run
    from treeprep.memory import GPUS, MemorySetup

    facts = BuildFacts.of(str(out))
    d = dry_run(shape, MemorySetup(parallel="ddp"), facts, GPUS["h100"], budget=budget)  # type: ignore[arg-type]
    keep = ("fits", "predicted_peak_bytes", "gpu", "gpu_memory_bytes", "budget", "budget_source",
            "activation_checkpointing", "terms", "handoff_bytes_per_path_token",
            "kv_bytes_per_path_token")  # fmt: skip
    cmd = ["treeprep", "train", str(out), "--model", model, "--dry-run"]
    cmd += ["--budget", str(budget)] if budget is not None else []
    return {k: d[k] for k in keep} | {
        "setup": "one H100, bf16 autocast, AdamW, one rank; treeprep train --dry-run for yours",
        "next": shlex.join(cmd),
    }


_SHORT = {
    "tokens_per_tree": "tokens/tree",
    "tokens_linear_per_tree": "linear tok/tree",
    "sequences_per_tree": "seqs/tree",
    "depth": "depth/tree",
    "branching": "branching",
    "sequence_length": "seq length",
}


def _render(s: dict, out: Path) -> None:
    """The stats for people: the metrics, then one table per breakdown."""
    from rich.console import Console

    con = Console()
    con.print(_metrics(s, out))
    if "memory" in s:  # the peak is one H100's: the dry run plans the user's GPUs and ranks
        con.print(f"peak on one H100; for your GPUs and ranks (add --world-size, --gpu): "
                  f"{s['memory']['next']}", soft_wrap=True,
                  highlight=False, markup=False)  # fmt: skip
    from treeprep.render.coverage import PARTIAL_TOOLS

    partial = s["normalized"].get(PARTIAL_TOOLS, 0)
    if partial:  # Codex built-ins next to its dynamic tools (issue 40 item 3)
        con.print(
            f"The tool list is partial: {partial:,} calls call a tool that their tool list does "
            "not declare, so their prompts lack that schema. Rebuild with the whole list: "
            "--tools FILE.",
            style="yellow", soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
    for note in s["prompt_notes"]:  # Claude Code logs no system prompt, no tools
        con.print(note, style="yellow", soft_wrap=True, highlight=False, markup=False)
    con.print(_distributions(s))
    con.print(_by_format(s))
    if s["by_branch_reason"]:
        con.print(_by_branch_reason(s))
        from treeprep.show import reason_legend

        for line in reason_legend(s["by_branch_reason"]):  # unknown's line: what to do
            con.print(line, style="dim", soft_wrap=True, highlight=False, markup=False)
    if "sharing" in s:
        con.print(_sharing_table(s["sharing"]))
    con.print(_speedups(s))


def _metrics(s: dict, out: Path) -> Any:
    from rich.console import Console

    from treeprep.cli.tables import metrics_table, normalized_label

    t = metrics_table(f"treeprep stats {out}")
    for k in ("records_read", "records_rejected", "trees", "sequences", "nodes", "branch_points"):
        t.add_row(k, f"{s[k]:,}")
    for reason, n in {**s["filtered"], **s["curation"]}.items():  # curation (build options)
        t.add_row(reason, f"{n:,}")
    for kind, n in s["normalized"].items():  # calls the renderer normalized
        t.add_row(normalized_label(kind, s["response_parser"]), f"{n:,}")
    if s.get("response_parser_missing"):
        t.add_row("calls read back by the model's parser", "none: no parser known")
    t.add_row("tokens_linear (N_flat)", f"{s['tokens_linear']:,}")
    t.add_row("tokens_tree (N_tree)", f"{s['tokens_tree']:,}")
    t.add_row("POR (potential overlap: 1 - N_tree / N_flat)", f"{s['por']:.3f}")
    t.add_row("ideal speedup (linear layers)", f"{s['ideal_speedup']:.2f}x")
    a = s["attention"]
    t.add_row("attention pairs linear / tree", f"{a['pairs_linear']:,} / {a['pairs_tree']:,}")
    t.add_row("attention ratio", f"{a['ratio']:.2f}x")
    t.add_row("trained targets linear / tree", f"{s['targets_linear']:,} / {s['targets_tree']:,}")
    m = s["model"]
    t.add_row(f"estimated speedup ({m['name']}, LM head on {s['head']})", f"{m['speedup']:.2f}x")
    if "packing" in s and "error" in s["packing"]:
        Console(stderr=True).print(f"[yellow]no packing figures:[/] {s['packing']['error']}")
    elif "packing" in s:
        p = s["packing"]
        t.add_row(f"tokens after packing (budget {p['budget']:,})", f"{p['tokens_pack']:,}")
        t.add_row("ERR (effective reuse: 1 - tokens fed / N_flat)", f"{p['err']:.3f}")
        t.add_row("padding waste", f"{p['padding_waste']:.3f}")
        t.add_row(f"speedup after packing ({m['name']})", f"{p['model_speedup']:.2f}x")
    if "memory" in s:
        mem = s["memory"]
        ck = ", checkpointing" if mem["activation_checkpointing"] else ""
        given = ", given" if mem["budget_source"] == "given" else ""
        t.add_row(
            f"peak per GPU ({mem['gpu']}, budget {mem['budget']:,}{given}{ck})",
            f"{mem['predicted_peak_bytes'] / 2**30:.1f} GiB" + ("" if mem["fits"] else " (no fit)"),
        )
        t.add_row(
            "hand-off state of the longest path", f"{mem['terms']['handoff'] / 2**30:.2f} GiB"
        )
    return t


def _distributions(s: dict) -> Any:
    from treeprep.cli.tables import columns_table

    cols = ["min", "p50", "p90", "p99", "max", "mean"]  # --json has p10 too
    rows = (
        [_SHORT.get(k, k), *[f"{q[c]:,.0f}" if c != "mean" else f"{q[c]:,.1f}" for c in cols]]
        for k, q in s["distributions"].items()
    )
    return columns_table("distributions", ["", *cols], rows, no_wrap=True)


#: the breakdown tables' figure columns: (header, the key in the breakdown's dicts, format spec)
_BY_FORMAT = (
    ("records", "records", ","),
    ("trees", "trees", ","),
    ("sequences", "sequences", ","),
    ("N_flat", "tokens_linear", ","),
    ("N_tree", "tokens_tree", ","),
    ("POR", "por", ".3f"),
)
_BY_BRANCH_REASON = (
    ("branches", "branches", ","),
    ("sequences", "sequences", ","),
    ("mean shared prefix", "shared_prefix_tokens_mean", ",.0f"),
)


def _by_format(s: dict) -> Any:
    return _breakdown("by input format", "format", s["by_format"], _BY_FORMAT)


def _by_branch_reason(s: dict) -> Any:
    return _breakdown("branches by reason", "reason", s["by_branch_reason"], _BY_BRANCH_REASON)


def _breakdown(
    title: str, by: str, rows: dict[str, dict], figures: tuple[tuple[str, str, str], ...]
) -> Any:
    """A table of one breakdown of the stats: a row per name (``-`` for none), its figures."""
    from treeprep.cli.tables import columns_table

    cells = ([name or "-", *(format(v[k], f) for _, k, f in figures)] for name, v in rows.items())
    return columns_table(title, [by, *(h for h, _, _ in figures)], cells)


def _speedups(s: dict) -> Any:
    from treeprep.cli.tables import columns_table

    rows = ([name, f"{v:.2f}x"] for name, v in s["speedup_by_model"].items())
    title = "estimated training speedup by model (unpacked)"
    return columns_table(title, ("model", "speedup"), rows)


def _sharing_table(x: dict) -> object:
    """Cross-tree sharing: the trees' common openings fed once (treeprep.pack.share)."""
    from treeprep.cli.tables import columns_table

    t = columns_table("prefixes shared across trees", ("layout", "tokens fed", "POR"))
    t.add_row("each tree alone (per-tree POR)", f"{x['tokens_tree']:,}", f"{x['por_tree']:.3f}")
    t.add_row("all trees merged", f"{x['tokens_shared_all']:,}", f"{x['por_shared_all']:.3f}")
    if "tokens_shared_budget" in x:
        t.add_row(
            f"consecutive trees merged within budget {x['budget']:,} (estimate)",
            f"{x['tokens_shared_budget']:,}",
            f"{x['por_shared_budget']:.3f}",
        )
    if "plan_err" in x:
        t.add_row(
            f"the plan's micro-batches merged (ERR; {x['plan_tokens_shared']:,} shared)",
            f"{x['plan_tokens_fed']:,}",
            f"{x['plan_err']:.3f}",
        )
    return t
