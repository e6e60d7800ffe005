"""``treeprep export``: every sequence back out of the trees as JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from treeprep.cli import options as opt


def export_cmd(
    build: opt.BuildArg,
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")],
    group: Annotated[
        list[str] | None, typer.Option(help="Only these group ids (repeatable).")
    ] = None,
) -> None:
    """Write every input sequence (input_ids, loss_mask, ...) back out, one line each."""
    from rich.console import Console

    from treeprep.export import export_sequences

    n = export_sequences(str(build), str(out), groups=group or None)
    Console(stderr=True).print(f"wrote {n:,} sequences to {out}")
