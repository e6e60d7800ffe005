"""The build manifest, ``OUT/manifest.json``: written last, so its presence means the build is
whole.

It holds no timestamps and no absolute machine state, so the same inputs give the same bytes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizerIdentity(_Model):
    #: "builtin-bytes" or the folder name of the Hugging Face tokenizer.
    name: str
    #: sha256 over the tokenizer files (tokenizer.json, tokenizer_config.json, ...) and template.
    sha256: str
    chat_template_sha256: str
    vocab_size: int
    #: the tokenizer folder as given on the command line (None for the built-in tokenizer)
    path: str | None = None


class InputEntry(_Model):
    path: str
    bytes: int
    sha256: str
    format: str
    records_read: int
    records_rejected: int


class ShardEntry(_Model):
    path: str
    bytes: int
    sha256: str
    trees: int
    tokens_tree: int
    tokens_linear: int


class Counts(_Model):
    records_read: int = 0
    records_in_trees: int = 0
    records_rejected: int = 0
    trees: int = 0
    sequences: int = 0
    nodes: int = 0
    tokens_linear: int = 0
    tokens_tree: int = 0


class Manifest(_Model):
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
