"""``treeprep export-model``: a run's model as a standalone Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from treeprep.cli import options as opt


def export_model_cmd(
    run: Annotated[Path, typer.Argument(help="The run folder (treeprep train -o RUN).")],
    *,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="New folder to write (or an earlier export to replace)."),
    ],
    step: Annotated[
        int | None, typer.Option(help="The checkpoint's step (default: the newest).")
    ] = None,
    merge: Annotated[
        bool, typer.Option(help="LoRA runs: write the base with the adapter merged in.")
    ] = False,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Tokenizer folder to include (default: the model's, else the build's)."),
    ] = None,
) -> None:
    """Write a run's model (weights, config, generation config, tokenizer and chat template) to a
    folder that AutoModelForCausalLM / AutoPeftModelForCausalLM and AutoTokenizer load from any
    working directory. Every finished run also writes RUN/final this way."""
    import transformers
    from rich.console import Console

    from treeprep.trainer.run.export import export_model

    transformers.utils.logging.disable_progress_bar()  # no tqdm bars: one line when written
    path = export_model(str(run), str(out), step=step, merge=merge, tokenizer=opt.plain(tokenizer))
    Console(stderr=True).print(f"wrote {path}", soft_wrap=True, highlight=False, markup=False)
