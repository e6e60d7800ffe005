"""What a renderer is loaded from, and the identity it records (``treeprep.render.identity``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeprep.errors import TokenizerError
from treeprep.render import builtin as bt
from treeprep.render.identity import load_builtin, load_tokenizer_folder, read_template_file
from treeprep.schemas.tokenizer import sha256_text

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_builtin_identity_names_the_template_it_renders_with() -> None:
    own = load_builtin(None, limits=None, date=None).identity
    given = load_builtin(TEMPLATE, limits=None, date=None).identity
    assert own.chat_template_sha256 == sha256_text(bt.CHAT_TEMPLATE)
    assert given.chat_template_sha256 == sha256_text(TEMPLATE)
    # a given template changes what the build was rendered with, so the identity differs too
    assert own.sha256 == bt.builtin_sha256() != given.sha256
    assert own.path is None and own.vocab_size == bt.VOCAB_SIZE


def test_a_folder_without_a_template_is_refused_with_its_path(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(
        str(tmp_path / "tokenizer.json")
    )
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no chat template"):
        load_tokenizer_folder(tmp_path, None, limits=None, date=None)
    loaded = load_tokenizer_folder(tmp_path, TEMPLATE, limits=None, date=None)
    assert loaded.identity.chat_template_sha256 == sha256_text(TEMPLATE)
    assert loaded.identity.path == str(tmp_path)
    assert loaded.response_template is None  # a given template has no parser of the folder's


def test_template_file_read_errors_name_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "t.jinja"
    empty.write_text("  \n")
    with pytest.raises(TokenizerError, match=r"t\.jinja:1: expected a jinja chat template"):
        read_template_file(empty)
    with pytest.raises(TokenizerError, match="cannot read"):
        read_template_file(tmp_path / "missing.jinja")
    (tmp_path / "ok.jinja").write_text(TEMPLATE)
    assert read_template_file(tmp_path / "ok.jinja") == TEMPLATE
