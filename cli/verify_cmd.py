"""``treeprep verify``: gradients on the tree layout versus the linear layout, before GPU hours.

Options to a :class:`~treeprep.trainer.verify.VerifyConfig`, the check
(:func:`~treeprep.trainer.verify.verify_build`), the report rendered. The check reads the first
``--groups`` trees of a build (skipping, and naming, trees whose linear layout is over
``--max-tokens``), loads the model checked against the build like ``train`` does (a model folder of
another tokenizer is refused), runs the chosen loss on the packed tries and on every sequence laid
out on its own, and prints the two loss values and the worst absolute and relative gradient
difference per parameter group. In float32, a group over ``--tol`` is measured against a float64 run
of the linear layout: it fails (exit code 1) only when the tree is further from float64 than the
per-sequence reference is (and more than ``--tol``), and the verdict says which. torch and the
trainer are imported inside the command only.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from treeprep.cli import options as opt
from treeprep.modes import Attn, PartGraph


def verify_cmd(
    build: opt.BuildArg,
    *,
    model: opt.ModelOpt,
    groups: Annotated[int, typer.Option(min=1, help="Trees to check, in shard order.")] = 4,
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
    attn: opt.AttnOpt = Attn.auto,
    tol: Annotated[
        float,
        typer.Option(help="Largest relative L2 difference allowed.", callback=opt.in_range(ge=0)),
    ] = 1e-5,
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
    from rich.console import Console

    from treeprep.trainer.verify import VerifyConfig, verify_build

    objective = {
        "loss": loss.value, "norm": norm.value, "adv_norm": adv_norm.value,
        "clip_eps": clip_eps, "clip_eps_high": clip_eps_high, "kl_coef": kl_coef,
        "kl_estimator": kl_estimator.value, "entropy_coef": entropy_coef, "chunk": chunk,
    }  # fmt: skip
    cfg = VerifyConfig(
        build=str(build), model=model, groups=groups, objective=objective, precision=precision,
        attn=attn, tol=tol, max_tokens=max_tokens, device=device, seed=seed, budget=budget,
        part_graph=part_graph,
    )  # fmt: skip
    err = Console(stderr=True)
    run = verify_build(cfg, log=lambda line: err.print(line, markup=False))
    rep = run.report
    if as_json:
        d = rep.to_dict()
        d["model"] = model
        d["trees"] = run.trees
        d["skipped"] = run.skipped
        d["budget"] = budget
        typer.echo(json.dumps(d, indent=2))
    else:
        _print_report(rep, tol)
    if not rep.ok:
        raise typer.Exit(1)


def _print_report(rep: Any, tol: float) -> None:
    """The verify report for people: the losses, a table per parameter group, a verdict."""
    from rich.console import Console

    from treeprep.cli.tables import columns_table

    con = Console()
    con.print(
        f"loss tree {rep.loss_tree:.8g}  linear {rep.loss_linear:.8g}  "
        f"(rel {rep.loss_rel:.2e}); tokens tree {rep.tokens_tree:,} linear "
        f"{rep.tokens_linear:,}; targets tree {rep.targets_tree:,} linear "
        f"{rep.targets_linear:,}"
    )
    has64 = rep.loss_64 is not None
    cols = ["group", "params", "grad norm", "max abs diff", "rel diff"]
    cols += ["tree vs f64", "linear vs f64"] if has64 else []
    t = columns_table(
        f"treeprep verify: gradients tree vs linear (tol {tol:g} relative)", [*cols, ""]
    )
    for g in rep.groups:
        f64 = [f"{g.rel_tree64:.2e}", f"{g.rel_lin64:.2e}"] if has64 else []
        mark = "[green]ok[/]" if g.rel <= tol else "[yellow]ok (f64)[/]"
        row = [g.name, f"{g.numel:,}", f"{g.grad_norm:.3e}", f"{g.max_abs:.2e}", f"{g.rel:.2e}"]
        t.add_row(*row, *f64, mark if g.passes(tol) else "[bold red]FAIL[/]")
    con.print(t)
    if has64:
        con.print(f"float64 reference loss {rep.loss_64:.8g}")
    if rep.float64_kept:
        kept = ", ".join(rep.float64_kept)
        con.print(f"float64 throughout: float32 casts kept in float64 in {kept}")
    verdict = "[green]PASS[/]" if rep.ok else "[bold red]FAIL[/]"
    con.print(
        f"{verdict}: worst rel {rep.worst_rel:.2e}, worst abs {rep.worst_abs:.2e}; {rep.reason}"
    )
