"""The build manifest, ``OUT/manifest.json``: written last, so its presence means the build is
whole.

It holds no timestamps and no absolute machine state, so the same inputs give the same bytes:
input paths are relative to the input root.

A manifest is also untrusted input (it may be edited or come from elsewhere): a shard path must be
a plain relative path inside the build folder (no ``..``, no absolute path), checked when the
manifest is read, and :func:`treeprep.schemas.shard.shard_paths` checks that links do not lead out.
"""

from __future__ import annotations

import hashlib
import os

from pydantic import (
    Field,
    field_validator,
)

from treeprep.errors import ShardError
from treeprep.schemas.base import FileModel
from treeprep.schemas.tokenizer import TokenizerIdentity


class InputEntry(FileModel):
    path: str
    bytes: int
    sha256: str
    format: str
    records_read: int
    records_rejected: int
    #: records the build's filters or deduplication left out
    records_filtered: int = 0

    _omit_default = ("records_filtered",)


def check_relative_path(path: str) -> str:
    """``path`` unchanged when it is a plain ``/``-separated path inside the build folder;
    ValueError otherwise (absolute, ``..``, backslashes, empty parts, NUL)."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or (len(path) > 1 and path[1] == ":")
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValueError(f"{path!r} is not a relative path inside the build folder")
    return path


class ShardEntry(FileModel):
    path: str
    bytes: int
    sha256: str
    trees: int
    tokens_tree: int
    tokens_linear: int

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return check_relative_path(v)


class DuplicateInput(FileModel):
    """A second path to an input file already read (a link, a repeated argument): not read."""

    path: str
    same_as: str


class ExcludedInput(FileModel):
    """A folder that a folder or glob input reached but that was not read: a build's output."""

    path: str
    reason: str


class HubDataset(FileModel):
    """A dataset read from the local Hugging Face cache (``build hf:ORG/NAME[@REVISION]``)."""

    #: ``ORG/NAME``
    id: str
    #: the commit of the snapshot read (what a branch or tag named resolved to)
    revision: str


class Counts(FileModel):
    records_read: int = 0
    records_in_trees: int = 0
    records_rejected: int = 0
    trees: int = 0
    sequences: int = 0
    nodes: int = 0
    tokens_linear: int = 0
    tokens_tree: int = 0
    #: records left out by a filter or as duplicates (``Manifest.filtered`` says why):
    #: ``records_read == records_in_trees + records_rejected + records_filtered``
    records_filtered: int = 0

    _omit_default = ("records_filtered",)


class Manifest(FileModel):
    schema_version: int
    treeprep_version: str
    shard_format: str = "arrow-ipc-zstd"
    tokenizer: TokenizerIdentity
    group_by: str = "group_id"
    inputs: list[InputEntry] = Field(default_factory=list)
    counts: Counts = Field(default_factory=Counts)
    shards: list[ShardEntry] = Field(default_factory=list)
    #: records per input format
    formats: dict[str, int] = Field(default_factory=dict)
    #: files found inside a folder or glob whose format was not recognised (README, LICENSE, ...)
    skipped_files: list[str] = Field(default_factory=list)
    #: files found inside a folder or glob that a format reads through its sessions, by that
    #: format (OpenCode storage's message, part and project files): not logs on their own
    companion_files: dict[str, list[str]] = Field(default_factory=dict)
    #: second paths to input files already read, each read once
    duplicate_inputs: list[DuplicateInput] = Field(default_factory=list)
    #: records left out, by reason: a filter (``before --since``, ...) or deduplication
    #: (``duplicate call``, ``duplicate tokens``)
    filtered: dict[str, int] = Field(default_factory=dict)
    #: what curation changed, by kind: secrets replaced (``redacted:<kind>``), calls whose
    #: reasoning was merged (``reasoning-merge:drop``/``fold``)
    curation: dict[str, int] = Field(default_factory=dict)
    #: calls in trees that the renderer normalized, by kind (:mod:`treeprep.render.coverage`):
    #: ``inline-think`` (the completion opened with an inline ``<think>`` block, which became its
    #: reasoning), ``whitespace`` (its text appears in the loss span only modulo the chat
    #: template's whitespace normalization), ``round-trip`` (its trained completion read back by
    #: the model's response parser: :attr:`response_parser`); each at most
    #: ``counts.records_in_trees``
    normalized: dict[str, int] = Field(default_factory=dict)
    #: calls in trees whose prompt lacks what the model saw, by format and kind
    #: (:mod:`treeprep.render.gaps`): ``no-system-prompt`` (no system or developer message),
    #: ``no-tool-schemas`` (the completion calls a tool and the prompt has no tool schemas); the
    #: logs hold none (Claude Code logs neither), and ``--system-prompt``/``--tools`` supply them
    prompt_gaps: dict[str, dict[str, int]] = Field(default_factory=dict)
    #: the kinds of :attr:`prompt_gaps` the build was given an option for (``--system-prompt``:
    #: ``no-system-prompt``, ``--tools``: ``no-tool-schemas``): a gap of such a kind is left
    #: by a format whose adapter takes no such option
    prompt_given: list[str] = Field(default_factory=list)
    #: the model's response parser every trained chat completion was read back with
    #: (:mod:`treeprep.render.response`); ``normalized["round-trip"]`` counts the calls in trees
    #: it read back, and a call it read back as another message is a reject
    response_parser: str | None = None
    #: why no response parser was used (no trained completion was read back), when none was
    response_parser_missing: str | None = None

    #: sha256 of the ``rejects.jsonl`` this build wrote beside the manifest, so a reader can tell
    #: it from another build's (swapped in, or edited); written only when the build rejected
    #: something (an empty rejects file is checked by its count, 0), and absent from manifests
    #: written before it existed, whose rejects are checked by their count only
    rejects_sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$")
    #: folders left out of discovery (``OUT``, other builds), written only when there are any
    excluded_inputs: list[ExcludedInput] = Field(default_factory=list)
    #: the Hub datasets read from the local cache, written only when there are any
    datasets: list[HubDataset] = Field(default_factory=list)

    _omit_default = (
        "datasets",
        "filtered",
        "curation",
        "excluded_inputs",
        "normalized",
        "prompt_gaps",
        "prompt_given",
        "companion_files",
        "response_parser",
        "response_parser_missing",
        "rejects_sha256",
    )


# --------------------------------------------------------------------------------------------
# reading: the one manifest reader both halves use
# --------------------------------------------------------------------------------------------


def manifest_bytes(out_dir: str) -> tuple[str, bytes]:
    """(path, bytes) of ``OUT/manifest.json``; ShardError when there is none (no finished
    build) or it cannot be read."""
    path = os.path.join(out_dir, "manifest.json")
    try:
        with open(path, "rb") as f:
            return path, f.read()
    except FileNotFoundError as e:
        raise ShardError(f"{out_dir}: no manifest.json; not a finished treeprep build") from e
    except OSError as e:
        raise ShardError(f"{path}: unreadable manifest ({e})") from e


def load_manifest(out_dir: str) -> Manifest:
    """Read and validate ``OUT/manifest.json`` (ShardError when the build is missing or
    unfinished, or the file is not a treeprep manifest)."""
    path, raw = manifest_bytes(out_dir)
    try:
        return Manifest.model_validate_json(raw)
    except ValueError as e:
        raise ShardError(f"{path}: not a valid treeprep manifest: {e}") from e


def manifest_sha256(out_dir: str) -> str:
    """sha256 of ``OUT/manifest.json``'s bytes: the identity of a build, which a plan records."""
    return hashlib.sha256(manifest_bytes(out_dir)[1]).hexdigest()
