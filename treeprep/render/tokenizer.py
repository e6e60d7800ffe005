"""A Hugging Face tokenizer folder read with ``tokenizers`` and plain JSON, without transformers.

``AutoTokenizer.from_pretrained`` costs 2-3.5 s and 260-500 MB per process (mostly the import of
transformers), even to build a one-line input. Rendering needs much less: the ``tokenizers``
backend (``tokenizer.json``), the chat template (``chat_template.jinja``, which wins over the
``chat_template`` entry of ``tokenizer_config.json``, as in transformers), the named special
tokens the template may print (``bos_token``, ``eos_token``, ...) and the
``split_special_tokens`` flag. That is what :func:`load_folder` reads, in tens of milliseconds.
The folder's JSON files are read by :mod:`treeprep.schemas.tokenizer`, which also computes the
folder's identity (:func:`~treeprep.schemas.tokenizer.content_identity`) for the manifest and
for the trainer's check, which imports nothing of the renderer.

What transformers adds on top and is deliberately not reproduced: slow (sentencepiece) tokenizers,
``auto_map`` code, and the post-processor's BOS/EOS (rendering encodes with
``add_special_tokens=False``, as ``apply_chat_template`` does). The tests compare the ids and the
vocabulary size with ``AutoTokenizer`` on every tokenizer in ``../shared/data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treeprep.errors import TokenizerError
from treeprep.schemas.tokenizer import (
    folder_template,
    read_config,
    special_tokens,
    token_text,
)

__all__ = ["TokenizerFolder", "load_folder"]

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass
class TokenizerFolder:
    """What rendering needs from a tokenizer folder."""

    backend: Tokenizer
    #: the chat template source (None when the folder has none)
    chat_template: str | None
    #: ``bos_token`` etc. as strings, the variables a template sees
    special_tokens: dict[str, str]
    split_special_tokens: bool
    #: ``len(tokenizer)`` in transformers: the backend's vocabulary with added tokens
    vocab_size: int
    #: the config's ``response_template`` (transformers' response parser), when it has one
    response_template: dict[str, Any] | None = None


def load_folder(folder: str | Path) -> TokenizerFolder:
    """Read a tokenizer folder (only local files, every one a regular file); :class:`TokenizerError`
    when it is not one."""
    from tokenizers import AddedToken, Tokenizer

    from treeprep.io.paths import regular_folder

    folder = Path(folder)
    if not folder.is_dir():
        raise TokenizerError(f"{folder}: not a tokenizer folder (no such directory)")
    regular_folder(str(folder), "the tokenizer folder")  # a FIFO in it would hang the load
    tj = folder / "tokenizer.json"
    if not tj.is_file():
        raise TokenizerError(
            f"{folder}: expected a Hugging Face tokenizer folder with tokenizer.json"
        )
    try:
        backend = Tokenizer.from_file(str(tj))
    except Exception as e:  # the Rust side raises its own exception type
        raise TokenizerError(f"{tj}: cannot load the tokenizer: {e}") from e
    config = read_config(folder)
    # added tokens the config declares but tokenizer.json lacks are added, as transformers does
    decl = config.get("added_tokens_decoder")
    if isinstance(decl, dict):
        for _tid, spec in sorted(decl.items(), key=lambda kv: int(kv[0])):
            content = token_text(spec)
            if content is None or backend.token_to_id(content) is not None:
                continue
            tok = AddedToken(
                content,
                single_word=bool(spec.get("single_word", False)),
                lstrip=bool(spec.get("lstrip", False)),
                rstrip=bool(spec.get("rstrip", False)),
                normalized=bool(spec.get("normalized", not spec.get("special", False))),
                special=bool(spec.get("special", False)),
            )
            if tok.special:
                backend.add_special_tokens([tok])
            else:
                backend.add_tokens([tok])
    return TokenizerFolder(
        backend=backend,
        chat_template=folder_template(folder, config),
        special_tokens=special_tokens(config),
        split_special_tokens=bool(config.get("split_special_tokens", False)),
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        response_template=_response_template(config),
    )


def _response_template(config: dict[str, Any]) -> dict[str, Any] | None:
    t = config.get("response_template")
    return t if isinstance(t, dict) and t else None
