"""``treeprep export``: every sequence back out of the trees, as JSONL, Parquet or an HF dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from treeprep.cli import options as opt
from treeprep.modes import ExportFormat


def export_cmd(
    build: opt.BuildArg,
    *,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="File (jsonl, parquet) or new folder (hf) to write."),
    ],
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="jsonl, parquet, or hf (a folder datasets.load_from_disk opens; the hf extra).",
        ),
    ] = ExportFormat.jsonl,
    text: Annotated[
        bool,
        typer.Option(
            "--text/--no-text", help="Add each sequence's rendered text (the ids decoded)."
        ),
    ] = True,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Tokenizer folder for --text (default: the one the build names)."),
    ] = None,
    group: Annotated[
        list[str] | None, typer.Option(help="Only these group ids (repeatable).")
    ] = None,
) -> None:
    """Write every input sequence (input_ids, loss_mask, text, ...) back out, for other
    trainers."""
    from rich.console import Console

    from treeprep.export import build_decoder, export_sequences

    decode = build_decoder(str(build), opt.plain(tokenizer)) if text else None
    n = export_sequences(str(build), str(out), groups=group or None, fmt=fmt, decode=decode)
    Console(stderr=True).print(f"wrote {n:,} sequences to {out} ({fmt})")
