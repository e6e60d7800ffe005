"""``treeprep export``: every sequence back out of the trees as JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_cmd(
    out: Annotated[Path, typer.Argument(help="A treeprep build folder.")],
    dest: Annotated[Path, typer.Option("-o", "--output", help="JSONL file to write.")],
    group: Annotated[
        list[str] | None, typer.Option(help="Only these group ids (repeatable).")
    ] = None,
) -> None:
    """Write every input sequence (input_ids, loss_mask, ...) back out, one line each."""
    from rich.console import Console

    from treeprep.export import export_sequences

    n = export_sequences(str(out), str(dest), groups=group or None)
    Console(stderr=True).print(f"wrote {n:,} sequences to {dest}")
