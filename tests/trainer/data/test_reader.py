"""trainer/data/reader.py: a build opened for training (``BuildReader``) and the model checked
against it (``model_for_build``, what train and verify both load their model with)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import ShardError  # noqa: E402
from treeprep.trainer.data.reader import ROW_COLUMNS, BuildReader, model_for_build  # noqa: E402
from treeprep.trainer.data.rows import NULL_ROW  # noqa: E402
from treeprep.trainer.models.load import load_model  # noqa: E402


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> BuildReader:
    root = tmp_path_factory.mktemp("reader")
    lines = [
        {"group_id": "g", "call_id": f"g/{k}", "prompt_token_ids": [5, 6, 7],
         "generation_token_ids": [200 + k, 201]}
        for k in range(2)
    ]  # fmt: skip
    (root / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    build(BuildConfig(inputs=[str(root / "r.jsonl")], out=str(root / "build")))
    return BuildReader(str(root / "build"))


def test_rows_are_read_with_the_row_columns(reader: BuildReader) -> None:
    (shard,) = reader.shard_names
    assert tuple(reader.tree(shard, 0)) == ROW_COLUMNS
    assert tuple(NULL_ROW) == ROW_COLUMNS  # an empty slot's row has the same columns
    assert reader.max_token_id() == 201


def test_a_folder_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="not a finished treeprep build"):
        BuildReader(str(tmp_path))


def test_a_presets_vocabulary_covers_the_build(reader: BuildReader) -> None:
    own = reader.manifest.tokenizer.vocab_size
    lm = model_for_build(reader, "tiny-qwen3")
    assert lm.config.vocab_size == max(own, 202)
    lm = model_for_build(reader, "tiny-qwen3", vocab_size=100)  # grown to the largest id
    assert lm.config.vocab_size == 202


def test_a_model_folder_too_small_for_the_build_is_refused(
    reader: BuildReader, tmp_path: Path
) -> None:
    load_model("tiny-qwen3", vocab_size=150).save_pretrained(tmp_path / "m")
    with pytest.raises(ShardError, match="token id 201 is outside the model's vocabulary"):
        model_for_build(reader, str(tmp_path / "m"))
    load_model("tiny-qwen3", vocab_size=300).save_pretrained(tmp_path / "ok")
    assert model_for_build(reader, str(tmp_path / "ok")).config.vocab_size == 300
