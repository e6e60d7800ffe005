"""Tokenizer identity: which tokenizer and chat template a build's token ids come from.

Both halves need it. The pipeline records it in the manifest when it renders; the trainer
recomputes it for a model folder's own tokenizer and refuses shards built with another one, and
copies the same files into a checkpoint. So the file list, the hash and the template lookup live
here, once, and a tokenizer folder hashes the same on both sides.

The hash covers the bytes of the tokenizer files present in the folder (name and length framed, so
two files cannot run into each other) plus the chat template actually used, which may come from
``tokenizer_config.json`` or a ``chat_template.jinja`` file. Nothing here loads a tokenizer: the
template lookup takes an already loaded Hugging Face tokenizer (duck-typed), so this module needs
no transformers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

#: files whose bytes make up a tokenizer's identity (those present in the folder)
TOKENIZER_FILES: tuple[str, ...] = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
)


class TokenizerIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: "builtin-bytes" or the folder name of the Hugging Face tokenizer.
    name: str
    #: sha256 over the tokenizer files (tokenizer.json, tokenizer_config.json, ...) and template.
    sha256: str
    chat_template_sha256: str
    vocab_size: int
    #: the tokenizer folder as given on the command line (None for the built-in tokenizer)
    path: str | None = None


def sha256_text(s: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes (the chat template's identity)."""
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def folder_sha256(folder: str | Path, template: str) -> str:
    """The identity hash of a tokenizer folder: its :data:`TOKENIZER_FILES` and the template."""
    folder = Path(folder)
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = folder / name
        if p.is_file():
            data = p.read_bytes()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
    h.update(b"chat_template\0")
    h.update(template.encode("utf-8"))
    return h.hexdigest()


def chat_template_of(tokenizer: Any) -> str | None:
    """The chat template a loaded Hugging Face tokenizer renders with (its ``"default"`` entry when
    it has several), or None when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None
