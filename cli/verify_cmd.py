"""``treeprep verify``: gradients on the tree layout versus the linear layout, before GPU hours.

Reads the first ``--groups`` trees of a build (skipping, and naming, trees whose linear layout is
over ``--max-tokens``), runs the chosen loss on the packed tries and on every sequence laid out on
its own, and prints the two loss values and the worst absolute and relative gradient difference per
parameter group. In float32, a group over ``--tol`` is measured against a float64 run of the
linear layout: it fails (exit code 1) only when the tree is further from float64 than the
per-sequence reference is (and more than ``--tol``), and the verdict says which. torch and the
trainer are imported inside the command only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from treeprep.cli import options as opt
from treeprep.errors import TreeprepError
from treeprep.modes import PartGraph


def _select_rows(out: Path, groups: int, max_tokens: int) -> tuple[list[dict], list[str]]:
    from treeprep.schemas.shard import open_shard, shard_paths

    rows: list[dict] = []
    skipped: list[str] = []
    for path in shard_paths(str(out)):
        table = open_shard(path)
        lin = table.column("tokens_linear").to_pylist()
        for i, n in enumerate(lin):
            if len(rows) >= groups:
                return rows, skipped
            row = table.slice(i, 1).to_pylist()[0]
            if n > max_tokens:
                skipped.append(f"{row['group_id']} ({n:,} linear tokens)")
                continue
            rows.append(row)
    return rows, skipped


def verify_cmd(
    build: opt.BuildArg,
    *,
    model: opt.ModelOpt,
    groups: Annotated[int, typer.Option(help="Trees to check, in shard order.")] = 4,
    loss: opt.LossOpt = opt.DEFAULT_LOSS,
    norm: opt.NormOpt = opt.DEFAULT_NORM,
    adv_norm: opt.AdvNormOpt = opt.DEFAULT_ADV_NORM,
    clip_eps: opt.ClipEpsOpt = opt.DEFAULT_CLIP_EPS,
    clip_eps_high: opt.ClipEpsHighOpt = None,
    kl_coef: opt.KlCoefOpt = 0.0,
    kl_estimator: opt.KlEstimatorOpt = opt.DEFAULT_KL_ESTIMATOR,
    entropy_coef: opt.EntropyCoefOpt = 0.0,
    chunk: opt.ChunkOpt = opt.DEFAULT_CHUNK,
    precision: Annotated[
        str, typer.Option(help="float32, or float64 (weights, coefficients and loss).")
    ] = "float32",
    attn: opt.AttnOpt = opt.Attn.auto,
    tol: Annotated[float, typer.Option(help="Largest relative L2 difference allowed.")] = 1e-5,
    max_tokens: Annotated[
        int, typer.Option(help="Skip trees whose linear layout has more tokens than this.")
    ] = 65536,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[int, typer.Option(help="Seed of a preset's random weights.")] = 0,
    budget: Annotated[
        int | None,
        typer.Option(
            help="Run every tree over this many tokens as hand-off parts (the tree side)."
        ),
    ] = None,
    part_graph: opt.PartGraphOpt = PartGraph.recompute,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check that the tree loss restores the linearized gradients exactly (with --budget: that
    trees executed as hand-off parts do)."""
    objective = opt.objective(locals())
    out = build
    from rich.console import Console

    err = Console(stderr=True)
    if groups < 1:
        raise TreeprepError(f"--groups must be >= 1, got {groups}")
    rows, skipped = _select_rows(out, groups, max_tokens)
    for s in skipped:
        err.print(f"[yellow]skipped {s}: over --max-tokens[/]")
    if not rows:
        raise TreeprepError(f"{out}: no tree within --max-tokens {max_tokens:,} to verify")

    from treeprep.trainer import verify_gradients

    if precision not in ("float32", "float64"):
        raise TreeprepError(f"--precision {precision!r}: expected float32 or float64")
    err.print(f"loading {model} ...")
    m = _load_model(out, rows, model, precision, device, attn.value, seed)
    if budget is not None and budget < 1:
        raise TreeprepError(f"--budget must be >= 1, got {budget}")
    split = (
        ""
        if budget is None
        else f", hand-off parts of <= {budget:,} tokens (part graph: {part_graph})"
    )
    what = f"{loss.value}, {norm.value}, attention {attn.value}{split}"
    err.print(f"verifying {len(rows)} trees: {what} ...")
    rep = verify_gradients(
        m, rows, attn=attn.value, tol=tol, budget=budget, part_graph=part_graph, **objective
    )
    if as_json:
        d = rep.to_dict()
        d["model"] = model
        d["trees"] = [r["group_id"] for r in rows]
        d["skipped"] = skipped
        d["budget"] = budget
        typer.echo(json.dumps(d, indent=2))
    else:
        _print_report(rep, tol)
    if not rep.ok:
        raise typer.Exit(1)


def _load_model(
    out: Path, rows: list[dict], model: str, precision: str, device: str, attn: str, seed: int
) -> Any:
    """The model to verify with: a preset's vocabulary grows to the rows' largest token id; a
    model folder whose vocabulary is smaller than that is refused (another tokenizer's shards)."""
    import torch

    from treeprep.trainer import PRESETS, load_model

    dtype = torch.float64 if precision == "float64" else torch.float32
    vocab = None
    if model in PRESETS:
        top = max(max(r["input_ids"]) for r in rows) + 1
        vocab = max(PRESETS[model].vocab_size, top)
    m = load_model(model, dtype=dtype, device=device, attn=attn, seed=seed, vocab_size=vocab)
    if model not in PRESETS:
        top = max(max(r["input_ids"]) for r in rows)
        if top >= m.config.vocab_size:
            raise TreeprepError(
                f"{out}: token id {top} is outside the model's vocabulary "
                f"({m.config.vocab_size}); were the shards built with another tokenizer?"
            )
    return m


def _print_report(rep: Any, tol: float) -> None:
    """The verify report for people: the losses, a table per parameter group, a verdict."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(
        f"loss tree {rep.loss_tree:.8g}  linear {rep.loss_linear:.8g}  "
        f"(rel {rep.loss_rel:.2e}); tokens tree {rep.tokens_tree:,} linear "
        f"{rep.tokens_linear:,}; targets tree {rep.targets_tree:,} linear "
        f"{rep.targets_linear:,}"
    )
    t = Table(title=f"treeprep verify: gradients tree vs linear (tol {tol:g} relative)")
    has64 = rep.loss_64 is not None
    cols = ["group", "params", "grad norm", "max abs diff", "rel diff"]
    cols += ["tree vs f64", "linear vs f64"] if has64 else []
    for c in [*cols, ""]:
        t.add_column(c, justify="left" if c == "group" else "right")
    for g in rep.groups:
        f64 = [f"{g.rel_tree64:.2e}", f"{g.rel_lin64:.2e}"] if has64 else []
        mark = "[green]ok[/]" if g.rel <= tol else "[yellow]ok (f64)[/]"
        row = [g.name, f"{g.numel:,}", f"{g.grad_norm:.3e}", f"{g.max_abs:.2e}", f"{g.rel:.2e}"]
        t.add_row(*row, *f64, mark if g.passes(tol) else "[bold red]FAIL[/]")
    con.print(t)
    if has64:
        con.print(f"float64 reference loss {rep.loss_64:.8g}")
    verdict = "[green]PASS[/]" if rep.ok else "[bold red]FAIL[/]"
    con.print(
        f"{verdict}: worst rel {rep.worst_rel:.2e}, worst abs {rep.worst_abs:.2e}; {rep.reason}"
    )
