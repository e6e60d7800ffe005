"""What a build is asked to do: :class:`BuildConfig`, which holds the :class:`FileOptions`.

:class:`FileOptions` is everything stage 1 renders one input file with (format, group field,
system prompt and tools files, template choices, the per-record limit, the field map, curation):
a small frozen value, so it pickles into a pool process or a Ray actor as it is. It is also what
a file's work is keyed by: :func:`treeprep.build.jobs.options_digest` hashes every one of its
fields (a field marked :data:`FILE` by the content of the file it names), so an option declared
here enters the key without being listed anywhere else.

:class:`BuildConfig` is the whole request: inputs, OUT, tokenizer, the engine and the limits
that do not change what a file renders to, and ``file``, the :class:`FileOptions`. Each checks
its own fields. This module is the first of the build package: it imports nothing of it.

Adding a build option: a field here (in :class:`FileOptions` when stage 1 reads it), its
``typer`` option and keyword in ``cli/build_cmd.py``, and the code that uses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from treeprep import modes
from treeprep.errors import TreeprepError

__all__ = ["FILE", "BuildConfig", "FileOptions", "file_fields"]

#: field metadata of an option that names a file: checked to be a regular file, and keyed by
#: the file's content (its path is not what the work depends on)
FILE: dict[str, Any] = {"file": True}


@dataclass(frozen=True)
class FileOptions:
    """The options stage 1 renders each file with; every field is part of the work key."""

    #: force one input format for every file instead of detecting it per file
    format: str | None = None
    #: a record field whose value is the group id (default: the format's own group id)
    group_by: str | None = None
    #: a file whose text is the system prompt, for formats whose logs hold none
    system_prompt: str | None = field(default=None, metadata=FILE)
    #: a JSON file with a list of tool (function) schemas, for formats whose logs hold none
    tools: str | None = field(default=None, metadata=FILE)
    #: render with a verified Python port of the chat template where there is one (False: jinja)
    native_templates: bool = True
    #: a JSONL record longer than this many bytes is rejected without being held in memory
    max_record_bytes: int = 16 << 20
    #: a jinja file to render with instead of the tokenizer's chat template
    chat_template: str | None = field(default=None, metadata=FILE)
    #: the date (ISO 8601) a template's strftime_now reports for records without a timestamp
    date: str | None = None
    #: ``--map KEY=VALUE`` field and role mapping for a chat-like dataset (trajectory-dataset)
    map: tuple[str, ...] = ()
    #: ``--map-file``: the same keys in a TOML file (``--map`` pairs win)
    map_file: str | None = field(default=None, metadata=FILE)
    # curation (:mod:`treeprep.build.curate`)
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
    #: the inference server that served the logged calls: how a prompt's message of several text
    #: parts reached the template (:mod:`treeprep.render.text_parts`)
    server: modes.Server = modes.Server.vllm
    #: the Harmony library vLLM rendered gpt-oss with: how its prompts' tool results' headers
    #: read (:mod:`treeprep.render.harmony_headers`)
    harmony: modes.Harmony = modes.Harmony.oss
    #: reject calls whose logged token ids do not decode to their logged text (False: train
    #: logged ids unchecked, the behaviour before the check; :mod:`treeprep.render.idcheck`)
    check_ids: bool = True
    #: the server's default chat-template kwargs, a JSON object (vLLM's and SGLang's
    #: ``--default-chat-template-kwargs``, llama.cpp's ``--chat-template-kwargs``): a request's
    #: own override them (:mod:`treeprep.render.template_kwargs`)
    default_chat_template_kwargs: str | None = None
    #: vLLM's ``--reasoning-effort-map``, a JSON object: the effort each requested one renders as
    reasoning_effort_map: str | None = None
    #: vLLM's ``--anthropic-disabled-thinking-effort``: the effort its Messages endpoint sends
    #: for thinking turned off (``auto``: probed from the template)
    anthropic_disabled_thinking_effort: modes.DisabledThinking = modes.DisabledThinking.auto
    #: the SGLang version that served the calls (``--server sglang``): which dump of the tools
    #: its models handed the template (:mod:`treeprep.render.server_tools`; None: the newest read)
    sglang_version: str | None = None

    def __post_init__(self) -> None:
        value = self.max_record_bytes
        if not isinstance(value, int):
            raise TreeprepError(f"max_record_bytes must be an integer, got {value!r}")
        if value < 1:
            raise TreeprepError(f"max_record_bytes must be >= 1, got {value}")
        object.__setattr__(self, "map", tuple(self.map))  # a list given: the frozen value
        modes.coerce_modes(self, TreeprepError)
        self._check_paths()
        self.field_map()  # a bad map stops the build before anything is read
        self.server_settings()  # so do bad server settings
        self.sglang()
        from treeprep.render.dates import parse_date

        for name in ("since", "until"):
            when = getattr(self, name)
            if when is not None and parse_date(when) is None:
                raise TreeprepError(f"{name} {when!r}: expected an ISO 8601 date or time")

    def _check_paths(self) -> None:
        """The files the options name are regular files, before anything opens them (a FIFO
        would hang the build; :mod:`treeprep.io.paths`); a missing one is named when it is read.
        The tokenizer folder's files are checked where every tokenizer folder is read
        (:mod:`treeprep.render.tokenizer`)."""
        from treeprep.io.paths import regular_file

        for name in file_fields(self):
            value = getattr(self, name)
            if value:
                regular_file(value, f"--{name.replace('_', '-')}", missing_ok=True)

    def sglang(self) -> tuple[int, int, int]:
        """The checked ``--sglang-version`` (the newest read when not given).

        >>> FileOptions(server="sglang", sglang_version="0.5.9").sglang()
        (0, 5, 9)
        """
        from treeprep.render.server_tools import SGLANG_NEWEST, parse_sglang_version

        if self.sglang_version is None:
            return SGLANG_NEWEST
        if self.server is not modes.Server.sglang:
            raise TreeprepError(
                f"--sglang-version is SGLang's; --server {self.server.value} has none"
            )
        return parse_sglang_version(self.sglang_version)

    def server_settings(self) -> tuple[dict[str, Any] | None, dict[str, str] | None, str]:
        """(the server's default chat-template kwargs, vLLM's effort map, vLLM's effort for
        thinking turned off), checked.

        >>> FileOptions(reasoning_effort_map='{"xhigh": "max"}').server_settings()
        (None, {'xhigh': 'max'}, 'auto')
        """
        from treeprep.render.template_kwargs import EFFORTS

        kwargs = _json_object(self.default_chat_template_kwargs, "--default-chat-template-kwargs")
        effort_map = _json_object(self.reasoning_effort_map, "--reasoning-effort-map")
        disabled = self.anthropic_disabled_thinking_effort
        vllm_only = {
            "--reasoning-effort-map": effort_map is not None,
            "--anthropic-disabled-thinking-effort": disabled is not modes.DisabledThinking.auto,
        }
        given = [name for name, on in vllm_only.items() if on]
        if given and self.server is not modes.Server.vllm:
            raise TreeprepError(
                f"{given[0]} is vLLM's option; --server {self.server.value} has none"
            )
        if effort_map is None:
            return kwargs, None, disabled.value
        if not all(isinstance(v, str) for v in effort_map.values()):
            raise TreeprepError("--reasoning-effort-map: expected an object of strings")
        if unknown := sorted(set(effort_map) - set(EFFORTS)):
            raise TreeprepError(
                f"--reasoning-effort-map: unknown efforts {unknown}; expected some of "
                f"{', '.join(EFFORTS)} (vLLM refuses others)"
            )
        return kwargs, effort_map, disabled.value

    def field_map(self) -> Any:
        """The checked field map of ``--map``/``--map-file`` (None when neither is given)."""
        from treeprep.formats.trajectory import parse_map

        return parse_map(self.map, self.map_file)

    def read_format(self) -> str | None:
        """The format every file is read as (None: detected per file); a field map reads every
        file as ``trajectory-dataset``.

        >>> FileOptions(map=("messages=turns",)).read_format()
        'trajectory-dataset'
        """
        return self.format or ("trajectory-dataset" if self.map or self.map_file else None)


def _json_object(text: str | None, option: str) -> dict[str, Any] | None:
    """The JSON object ``text`` that ``option`` gives (None: not given)."""
    if text is None:
        return None
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise TreeprepError(f"{option}: expected a JSON object, got {text!r} ({e})") from e
    if not isinstance(value, dict):
        raise TreeprepError(f"{option}: expected a JSON object, got {text!r}")
    return value


def file_fields(options: FileOptions) -> list[str]:
    """The fields of ``options`` that name a file (marked :data:`FILE`).

    >>> file_fields(FileOptions())
    ['system_prompt', 'tools', 'chat_template', 'map_file']
    """
    return [f.name for f in dataclasses.fields(options) if f.metadata.get("file")]


@dataclass
class BuildConfig:
    """What ``treeprep build`` does. Paths are kept as given (they go into the manifest).

    >>> BuildConfig(inputs=["logs"], out="o", file=FileOptions(format="openai")).file.format
    'openai'
    """

    #: files, folders or globs; plain, ``.gz`` or ``.zst``
    inputs: list[str]
    #: the output folder (created; an earlier build's shards there are replaced)
    out: str
    #: what stage 1 renders each file with (and what its work is keyed by)
    file: FileOptions = field(default_factory=FileOptions)
    #: a Hugging Face tokenizer folder; None uses the built-in byte-level ChatML tokenizer
    tokenizer: str | None = None
    #: processes rendering input files in parallel
    workers: int = 1
    #: stop with an error once more records than this are rejected (None: never)
    max_errors: int | None = None
    #: a shard is closed once it holds this many tree tokens
    shard_tokens: int = 32 * 1024 * 1024
    #: who runs the stages: this process and its pool, or Ray Data (:mod:`treeprep.build.ray`);
    #: the bytes written are the same
    engine: modes.Engine = modes.Engine.local
    #: the Ray cluster to join (``ray.init(address=...)``); None starts a local Ray
    ray_address: str | None = None
    #: leave out calls that repeat an earlier file's call (same identity or same tokens;
    #: :mod:`treeprep.build.dedup`, between the stages)
    dedup: bool = True

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TreeprepError("no inputs given")
        if not isinstance(self.file, FileOptions):
            raise TreeprepError(f"file must be a FileOptions, got {self.file!r}")
        for name, least in (("workers", 1), ("max_errors", 0), ("shard_tokens", 1)):
            value = getattr(self, name)
            if value is None and name == "max_errors":  # the one optional limit
                continue
            if not isinstance(value, int):
                raise TreeprepError(f"{name} must be an integer, got {value!r}")
            if value < least:
                raise TreeprepError(f"{name} must be >= {least}, got {value}")
        modes.coerce_modes(self, TreeprepError)
