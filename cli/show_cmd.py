"""``treeprep show``: draw one tree of a build (rich), or list the groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from treeprep.cli import options as opt


def show_cmd(
    build: opt.BuildArg,
    *,
    group: Annotated[
        str | None, typer.Option(help="Group (tree) id; default: the largest tree.")
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Tokenizer folder for previews (default: the one the build used)."),
    ] = None,
    max_nodes: Annotated[int, typer.Option(help="Draw at most this many segments.")] = 60,
    list_groups: Annotated[
        bool, typer.Option("--list", help="List the groups (trees) instead of drawing one.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the view as JSON.")] = False,
) -> None:
    """Draw one token tree: token counts, sequences per node, branch reasons, text previews."""
    from rich.console import Console

    from treeprep import show as sh

    out = build
    if list_groups:
        rows = sh.list_groups(str(out))
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        from treeprep.cli.tables import columns_table

        cols = ("group_id", "source_format", "sequences", "nodes", "tokens_tree")
        cells = ([r[c] if i < 2 else f"{r[c]:,}" for i, c in enumerate(cols)] for r in rows)
        Console().print(columns_table(f"trees in {out}", cols, cells, left=2))
        return
    view = sh.show(
        sh.ShowConfig(
            out=str(out),
            group=group,
            tokenizer=opt.plain(tokenizer),
            max_nodes=max_nodes,
        )
    )
    from treeprep.render.gaps import gap_notes
    from treeprep.schemas.manifest import load_manifest

    manifest = load_manifest(str(out))  # what the drawn tree's prompts lack (its format's line)
    fmt = view["source_format"]
    gaps = {k: v for k, v in manifest.prompt_gaps.items() if k == fmt}
    for note in gap_notes(gaps, manifest.prompt_given):
        Console(stderr=True).print(note, style="yellow", soft_wrap=True, highlight=False,
                                   markup=False)  # fmt: skip
    if as_json:
        typer.echo(json.dumps(view, indent=2, ensure_ascii=False))
        return
    if view.get("decoder_note"):
        Console(stderr=True).print(f"[yellow]previews show token ids: {view['decoder_note']}[/]")
    Console().print(sh.render_view(view))
    for line in sh.legend(view):
        Console().print(line, style="dim", highlight=False, markup=False, soft_wrap=True)
