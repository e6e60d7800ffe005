"""``treeprep build``: logs in, token tries and Arrow shards out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from treeprep.cli import options as opt
from treeprep.cli.tables import counted, normalized_label
from treeprep.modes import (
    DisabledThinking,
    Engine,
    Harmony,
    ParallelCalls,
    ReasoningMerge,
    Redact,
    Server,
)

if TYPE_CHECKING:
    from treeprep.build import BuildConfig

#: the help panel of the curation options
_CURATE: dict[str, Any] = {"rich_help_panel": "Curation"}


def build_cmd(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="Log files, folders or globs (.gz/.zst ok), or hf:ORG/NAME[@REV]: a dataset "
            "already in the local Hugging Face cache."
        ),
    ],
    out: Annotated[str, typer.Option("-o", "--out", help="Output folder (path or file:// URL).")],
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Hugging Face tokenizer folder, or a hub id in the local HF cache (default: "
            "built-in byte-level ChatML, for the tiny presets only)."
        ),
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Force one input format (default: detect).")
    ] = None,
    group_by: Annotated[
        str | None, typer.Option(help="Record field whose value is the group (tree) id.")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Processes rendering input files.")] = 1,
    max_errors: Annotated[
        int | None, typer.Option(min=0, help="Stop with exit code 1 past this many rejects.")
    ] = None,
    system_prompt: Annotated[
        Path | None, typer.Option(help="System prompt file, for logs that hold none.")
    ] = None,
    tools: Annotated[
        Path | None, typer.Option(help="JSON file of tool schemas, for logs that hold none.")
    ] = None,
    native_templates: Annotated[
        bool,
        typer.Option(
            "--native-templates/--no-native-templates",
            help="Render known chat templates with their verified Python port (faster, checked "
            "against jinja); --no-native-templates renders every call with jinja.",
        ),
    ] = True,
    max_record_mb: Annotated[
        float,
        typer.Option(
            help="Reject a JSONL record (line) longer than this many MiB without reading it "
            "into memory (rendering costs about 150x a record's size).",
            callback=opt.in_range(gt=0),
        ),
    ] = 16.0,
    chat_template: Annotated[
        Path | None,
        typer.Option(
            help="Jinja chat template file to render with instead of the tokenizer's (e.g. one "
            "that keeps tool calls the tokenizer's template drops).",
        ),
    ] = None,
    date: Annotated[
        str | None,
        typer.Option(
            help="Date (ISO 8601) a template's strftime_now reports for records without a "
            "timestamp (default 2025-01-01), so builds are the same on any day.",
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            help="Who runs the build: this machine's process pool, or Ray Data (the ray extra); "
            "both write the same bytes."
        ),
    ] = Engine.local,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join with --engine ray (default: start a local Ray)."),
    ] = None,
    field_map: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            help="Field/role mapping for a chat-like dataset, KEY=VALUE, repeatable: "
            "messages=trajectory, content=text, role.ai=assistant, mask=mask (reads every file "
            "as trajectory-dataset).",
        ),
    ] = None,
    map_file: Annotated[
        Path | None, typer.Option(help="TOML file of the same mapping keys ([roles] table).")
    ] = None,
    check_ids: Annotated[
        bool,
        typer.Option(
            "--check-ids/--no-check-ids",
            help="Reject calls whose logged token ids do not decode to their logged text with "
            "--tokenizer (ATIF, tokens, NeMo-Gym); a file where most fail stops the build. "
            "--no-check-ids trains logged ids unchecked.",
        ),
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the manifest counts as JSON.")
    ] = False,
    # curation (treeprep.build.curate, treeprep.build.dedup)
    since: Annotated[
        str | None,
        typer.Option(help="Keep calls made at or after this ISO 8601 date/time.", **_CURATE),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Keep calls made at or before this ISO 8601 date/time.", **_CURATE),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="Keep calls of this model (name or glob).", **_CURATE)
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            help="Keep calls made in this project (working directory, a folder above it, or a "
            "glob).",
            **_CURATE,
        ),
    ] = None,
    redact: Annotated[
        Redact,
        typer.Option(
            help="Replace secrets (API keys, tokens, private keys) before rendering, with "
            "detect-secrets (the redact extra).",
            **_CURATE,
        ),
    ] = Redact.off,
    reasoning_merge: Annotated[
        ReasoningMerge,
        typer.Option(
            help="Turns with text, reasoning and tool calls together (Claude) for gpt-oss: drop "
            "their reasoning in the history (a completion keeps it: refused), or fold the text "
            "into it (completion too).",
            **_CURATE,
        ),
    ] = ReasoningMerge.off,
    parallel_calls: Annotated[
        ParallelCalls,
        typer.Option(
            help="Turns of parallel tool calls for templates that render only the first "
            "(gpt-oss): split them into consecutive single-call turns (counted in the curation "
            "counts).",
            **_CURATE,
        ),
    ] = ParallelCalls.off,
    server: Annotated[
        Server,
        typer.Option(
            help="The inference server that served the logged calls: how it gave the template "
            "a message of several text parts (vllm: joined with a newline; sglang: with a "
            "space; each passes them as a list to a template that loops over them; llama.cpp: "
            "a newline, a list only to a template that renders nothing else); vllm renders "
            "gpt-oss with Harmony, not its template.",
        ),
    ] = Server.vllm,
    harmony: Annotated[
        Harmony,
        typer.Option(
            help="For gpt-oss on vLLM: the Harmony library vLLM rendered the prompts with "
            "(oss-harmony from vLLM 0.31 on; openai-harmony in 0.30 and before). They write a "
            "tool result's header differently.",
        ),
    ] = Harmony.oss,
    default_chat_template_kwargs: Annotated[
        str | None,
        typer.Option(
            help="The server's default chat-template kwargs, a JSON object, as it was started "
            "with (vLLM's and SGLang's --default-chat-template-kwargs, llama.cpp's "
            """--chat-template-kwargs), e.g. '{"enable_thinking": false}'; a request's own """
            "override them.",
        ),
    ] = None,
    reasoning_effort_map: Annotated[
        str | None,
        typer.Option(
            help="vLLM's --reasoning-effort-map as the server was started with, a JSON object "
            """(e.g. '{"xhigh": "max"}'): the effort each requested one was rendered as.""",
        ),
    ] = None,
    anthropic_disabled_thinking_effort: Annotated[
        DisabledThinking,
        typer.Option(
            help="vLLM's --anthropic-disabled-thinking-effort as the server was started with: "
            "the effort its Messages endpoint sent for a request that turned thinking off "
            "(auto: probed from the template, as vLLM does).",
        ),
    ] = DisabledThinking.auto,
    sglang_version: Annotated[
        str | None,
        typer.Option(
            help="With --server sglang: the SGLang version that served the calls (e.g. 0.5.9). "
            "Its models rewrite the request's tools before the template prints them, and how "
            "changed in 0.5.9, 0.5.11 and 0.5.23 (default: 0.5.23, the newest read).",
        ),
    ] = None,
    dedup: Annotated[
        bool,
        typer.Option(
            "--dedup/--no-dedup",
            help="Leave out calls that repeat an earlier file's call or token sequence.",
            **_CURATE,
        ),
    ] = True,
) -> None:
    """Render logs with the model's chat template, deduplicate them into tries, write shards."""
    from treeprep.build import BuildConfig, FileOptions

    file = FileOptions(
        format=fmt,
        group_by=group_by,
        system_prompt=opt.plain(system_prompt),
        tools=opt.plain(tools),
        native_templates=native_templates,
        max_record_bytes=max(1, int(max_record_mb * (1 << 20))),  # MiB, checked > 0
        chat_template=opt.plain(chat_template),
        date=date,
        map=tuple(field_map or ()),
        map_file=opt.plain(map_file),
        since=since,
        until=until,
        model_name=model_name,
        project=project,
        redact=redact,
        reasoning_merge=reasoning_merge,
        parallel_calls=parallel_calls,
        server=server,
        harmony=harmony,
        check_ids=check_ids,
        default_chat_template_kwargs=default_chat_template_kwargs,
        reasoning_effort_map=reasoning_effort_map,
        anthropic_disabled_thinking_effort=anthropic_disabled_thinking_effort,
        sglang_version=sglang_version,
    )
    cfg = BuildConfig(
        inputs=inputs,
        out=out,
        file=file,
        tokenizer=opt.plain(tokenizer),
        workers=workers,
        max_errors=max_errors,
        engine=engine,
        ray_address=ray_address,
        dedup=dedup,
    )
    from rich.console import Console

    if engine is Engine.ray:
        _quiet_ray()
    err = Console(stderr=True)
    if tokenizer is None:
        err.print(
            "warning: no --tokenizer: the built-in byte tokenizer's ids suit only the tiny "
            "presets (random weights); `treeprep train` refuses this build for a model with its "
            "own tokenizer. For a real model, build with --tokenizer MODEL_FOLDER_OR_HUB_ID",
            style="yellow", soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
    seen: dict[str, tuple[int, int]] = {}  # the last (done, total) of each stage
    try:
        manifest = _build_with_progress(cfg, err, seen)
    except KeyboardInterrupt:
        err.print(_interrupted(seen, out), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    if "reused" in seen:
        n, total = seen["reused"]
        err.print(
            f"reused the finished work of {n:,} of {total:,} input files from an earlier run "
            f"(in {out}/.work: same file, options and tokenizer)",
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip
    _report_skipped(manifest, err)
    if as_json:
        typer.echo(json.dumps(manifest.counts.model_dump(), indent=2))
    else:
        _print_manifest(manifest, out, err)
    _report_gaps(manifest, err)


def _report_gaps(manifest: Any, err: Any) -> None:
    """One line per format whose trees lack a system prompt or tool schemas, with the options
    that supply them (:func:`~treeprep.render.gaps.gap_notes`), on ``err``."""
    from treeprep.render.gaps import gap_notes

    for note in gap_notes(manifest.prompt_gaps, manifest.prompt_given):
        err.print(note, style="yellow", soft_wrap=True, highlight=False, markup=False)


def _print_manifest(manifest: Any, out: str, err: Any) -> None:
    """The build's counts as a table on stdout; rejects and repeated inputs noted on stderr."""
    from rich.console import Console
    from rich.table import Table

    c = manifest.counts
    t = Table(title=f"treeprep build -> {out}", show_header=False)
    for k, v in c.model_dump().items():
        t.add_row(k, f"{v:,}")
    por = 1 - c.tokens_tree / c.tokens_linear if c.tokens_linear else 0.0
    t.add_row("por", f"{por:.3f}")
    t.add_row("ideal_speedup", f"{c.tokens_linear / c.tokens_tree:.2f}x" if c.tokens_tree else "-")
    t.add_row("shards", str(len(manifest.shards)))
    Console().print(t)
    if c.records_rejected:
        err.print(f"[yellow]{c.records_rejected} records rejected: see {out}/rejects.jsonl[/]")
    for reason, n in manifest.filtered.items():
        err.print(f"{n:,} records left out: {reason}", highlight=False, markup=False)
    for kind, n in manifest.curation.items():
        err.print(f"curation: {kind}: {n:,}", highlight=False, markup=False)
    for kind, n in manifest.normalized.items():
        what = normalized_label(kind, manifest.response_parser)
        err.print(f"{what}: {n:,}", highlight=False, markup=False)
    if manifest.response_parser_missing:
        err.print(
            f"warning: {manifest.response_parser_missing}; no trained completion was read back "
            "by the model's own parser (give the tokenizer a response_template)",
            style="yellow", soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
    if manifest.duplicate_inputs:
        err.print(
            f"[yellow]{len(manifest.duplicate_inputs)} input paths lead to files already read "
            "(links, repeated arguments): each file was read once; see duplicate_inputs in "
            f"{out}/manifest.json[/]"
        )


def _report_skipped(manifest: Any, err: Any) -> None:
    """Files of no known format, on stderr (``manifest.skipped_files``); files a format reads
    with its sessions (``manifest.companion_files``: OpenCode storage's message and part files)
    are counted apart, without the ``--format`` hint."""
    for fmt, names in manifest.companion_files.items():
        err.print(
            f"{counted(len(names), 'file')} belong{'s' if len(names) == 1 else ''} to {fmt} "
            "sessions (read with them, or holding no calls): "
            "not logs on their own",
            highlight=False,
        )
    skipped = manifest.skipped_files
    if not skipped:
        return
    shown = skipped[:20]
    more = f" (and {len(skipped) - len(shown)} more)" if len(skipped) > len(shown) else ""
    err.print(
        f"[yellow]{counted(len(skipped), 'file')} of no known format "
        f"{'was' if len(skipped) == 1 else 'were'} skipped{more}; name one with "
        "--format to read it as that format:[/]",
        highlight=False,
    )
    for path in shown:
        err.print(f"  {path}", highlight=False, markup=False)


def _quiet_ray() -> None:
    """Ray Data logs every dataset execution at INFO on stderr, over the progress bars; it sets
    its loggers' levels when imported, so they are lowered after importing it."""
    import logging

    try:
        import ray.data  # noqa: F401
    except ImportError:
        return  # the build says what to install
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _interrupted(seen: dict[str, tuple[int, int]], out: str) -> str:
    """The line for a build stopped by Ctrl-C: what it kept, and how to go on."""
    done, total = seen.get("render", (0, 0))
    if total and done == total:
        kept = f"the work of every input file ({total:,}) is kept"
    else:
        kept = f"the work of {done:,} of {total:,} input files is kept" if total else "nothing kept"
    return (
        f"interrupted: {kept} (in {out}/.work), and {out} holds no new build; run the same "
        "command again to go on (finished files are not redone)"
    )


def _build_with_progress(cfg: BuildConfig, err: Any, seen: dict[str, tuple[int, int]]) -> Any:
    """Run the build with a progress bar per stage on stderr; ``seen`` gets each stage's last
    (done, total)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from treeprep.build import build

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            seen[stage] = (done, total)
            if stage == "reused":
                return  # said once the build is done
            if stage not in tasks:
                label = {
                    "render": "rendering files",
                    "trees": "building trees",
                    "shards": "writing shards",
                }.get(stage, stage)
                tasks[stage] = bar.add_task(label, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        return build(cfg, on_progress=on_progress)
