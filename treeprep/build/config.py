"""What a build is asked to do: :class:`BuildConfig`, and the part of it one file's work needs.

:class:`BuildConfig` is the whole request (inputs, OUT, tokenizer, limits, engine) and checks its
own fields. :class:`FileOptions` is the slice a stage-1 worker needs to render one input file
(format, group field, system prompt and tools files, template choices, the per-record limit): a
small frozen value, so it pickles into a pool process or a Ray actor as it is. This module is the
first of the build package: it imports nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treeprep import modes
from treeprep.errors import TreeprepError

__all__ = ["BuildConfig", "FileOptions"]


@dataclass(frozen=True)
class FileOptions:
    """The options stage 1 renders each file with (see :meth:`BuildConfig.file_options`)."""

    format: str | None = None
    group_by: str | None = None
    system_prompt: str | None = None
    tools: str | None = None
    native_templates: bool = True
    max_record_bytes: int = 16 << 20
    chat_template: str | None = None
    date: str | None = None
    #: ``--map``/``--map-file`` checked (a :class:`~treeprep.formats.trajectory.FieldMap`)
    field_map: Any = None
    # curation (treeprep.build.curate)
    since: str | None = None
    until: str | None = None
    model_name: str | None = None
    project: str | None = None
    redact: modes.Redact = modes.Redact.off
    reasoning_merge: modes.ReasoningMerge = modes.ReasoningMerge.off
    #: split turns of parallel tool calls when rendering (:mod:`treeprep.render.parallel`)
    parallel_calls: modes.ParallelCalls = modes.ParallelCalls.off
    #: check logged token ids against logged text (:mod:`treeprep.render.idcheck`)
    check_ids: bool = True


@dataclass
class BuildConfig:
    """What ``treeprep build`` does. Paths are kept as given (they go into the manifest)."""

    #: files, folders or globs; plain, ``.gz`` or ``.zst``
    inputs: list[str]
    #: the output folder (created; an earlier build's shards there are replaced)
    out: str
    #: a Hugging Face tokenizer folder; None uses the built-in byte-level ChatML tokenizer
    tokenizer: str | None = None
    #: force one input format for every file instead of detecting it per file
    format: str | None = None
    #: a record field whose value is the group id (default: the format's own group id)
    group_by: str | None = None
    #: processes rendering input files in parallel
    workers: int = 1
    #: stop with an error once more records than this are rejected (None: never)
    max_errors: int | None = None
    #: a file whose text is the system prompt, for formats whose logs hold none
    system_prompt: str | None = None
    #: a JSON file with a list of tool (function) schemas, for formats whose logs hold none
    tools: str | None = None
    #: render with a verified Python port of the chat template where there is one (False: jinja)
    native_templates: bool = True
    #: a jinja file to render with instead of the tokenizer's chat template
    chat_template: str | None = None
    #: the date (ISO 8601) a template's strftime_now reports for records without a timestamp
    date: str | None = None
    #: a shard is closed once it holds this many tree tokens
    shard_tokens: int = 32 * 1024 * 1024
    #: a JSONL record longer than this many bytes is rejected without being held in memory
    max_record_bytes: int = 16 << 20
    #: who runs the stages: this process and its pool, or Ray Data (:mod:`treeprep.build.ray`);
    #: the bytes written are the same
    engine: modes.Engine = modes.Engine.local
    #: the Ray cluster to join (``ray.init(address=...)``); None starts a local Ray
    ray_address: str | None = None
    #: ``--map KEY=VALUE`` field and role mapping for a chat-like dataset (trajectory-dataset)
    map: list[str] = field(default_factory=list)
    #: ``--map-file``: the same keys in a TOML file (``--map`` pairs win)
    map_file: str | None = None
    # curation (:mod:`treeprep.build.curate`, :mod:`treeprep.build.dedup`)
    #: keep only calls made at or after / at or before this ISO 8601 date or time
    since: str | None = None
    until: str | None = None
    #: keep only calls of this model (a name or a glob)
    model_name: str | None = None
    #: keep only calls made in this project (the working directory, or a folder above it; a glob)
    project: str | None = None
    #: replace secrets before rendering (``secrets``: detect-secrets, the ``redact`` extra)
    redact: modes.Redact = modes.Redact.off
    #: fit turns with text, reasoning and tool calls together into gpt-oss's template
    reasoning_merge: modes.ReasoningMerge = modes.ReasoningMerge.off
    #: render a turn of parallel tool calls as consecutive single-call turns (``split``: for
    #: templates that show only the first call, gpt-oss's; :mod:`treeprep.render.parallel`)
    parallel_calls: modes.ParallelCalls = modes.ParallelCalls.off
    #: leave out calls that repeat an earlier file's call (same identity or same tokens)
    dedup: bool = True
    #: reject calls whose logged token ids do not decode to their logged text (False: train
    #: logged ids unchecked, the behaviour before the check)
    check_ids: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TreeprepError("no inputs given")
        for name, least in (
            ("workers", 1),
            ("max_errors", 0),
            ("shard_tokens", 1),
            ("max_record_bytes", 1),
        ):
            value = getattr(self, name)
            if value is None and name == "max_errors":  # the one optional limit
                continue
            if not isinstance(value, int):
                raise TreeprepError(f"{name} must be an integer, got {value!r}")
            if value < least:
                raise TreeprepError(f"{name} must be >= {least}, got {value}")
        modes.coerce_modes(self, TreeprepError)
        self._check_paths()
        self.field_map()  # a bad map stops the build before anything is read
        from treeprep.render.template import parse_date

        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and parse_date(value) is None:
                raise TreeprepError(f"{name} {value!r}: expected an ISO 8601 date or time")

    def _check_paths(self) -> None:
        """The files the options name are regular files, before anything opens them (a FIFO
        would hang the build; :mod:`treeprep.io.paths`); a missing one is named when it is read.
        The tokenizer folder's files are checked where every tokenizer folder is read
        (:mod:`treeprep.render.tokenizer`)."""
        from treeprep.io.paths import regular_file

        for name in ("system_prompt", "tools", "chat_template", "map_file"):
            value = getattr(self, name)
            if value:
                regular_file(value, f"--{name.replace('_', '-')}", missing_ok=True)

    def field_map(self) -> Any:
        """The checked field map of ``--map``/``--map-file`` (None when neither is given)."""
        from treeprep.formats.trajectory import parse_map

        return parse_map(self.map or (), self.map_file)

    def file_options(self) -> FileOptions:
        """The options a stage-1 worker renders each file with.

        >>> BuildConfig(inputs=["logs"], out="o", format="openai").file_options().format
        'openai'
        """
        fmap = self.field_map()
        return FileOptions(
            format=self.format or ("trajectory-dataset" if fmap else None),
            field_map=fmap,
            group_by=self.group_by,
            system_prompt=self.system_prompt,
            tools=self.tools,
            native_templates=self.native_templates,
            max_record_bytes=self.max_record_bytes,
            chat_template=self.chat_template,
            date=self.date,
            since=self.since,
            until=self.until,
            model_name=self.model_name,
            project=self.project,
            redact=self.redact,
            reasoning_merge=self.reasoning_merge,
            parallel_calls=self.parallel_calls,
            check_ids=self.check_ids,
        )
