"""Issue 25 item 7: the tokenizer identity by content, old manifests, hub ids, the byte tokenizer.

A build records its tokenizer's identity by content (vocabulary, merges, added and special
tokens, chat template): a model folder holding the same tokenizer re-saved by transformers'
``save_pretrained`` trains on it; one changed merge or token is refused. Manifests written before
the identity by content are still read and compared by the files' bytes. ``--model`` takes a hub
id found in the local HF cache (a fake cache in tmp_path; nothing is downloaded).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import ShardError, TreeprepError  # noqa: E402
from treeprep.trainer.data.reader import BuildReader, model_for_build  # noqa: E402
from treeprep.trainer.models.load import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
pytestmark = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


@pytest.fixture(scope="module")
def qwen_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen-build") / "out"
    build(BuildConfig(inputs=[str(ROOT / "sample_data" / "openai_chat.jsonl")], out=str(out),
                      tokenizer=str(QWEN3)))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder with the Qwen3 vocabulary and no tokenizer files."""
    d = tmp_path_factory.mktemp("weights") / "m"
    load_model("tiny-qwen3", vocab_size=151936).save_pretrained(d)
    return d


def _model_with(weights: Path, tokenizer: Path, dest: Path) -> Path:
    shutil.copytree(weights, dest)
    for f in tokenizer.iterdir():
        if f.is_file() and not f.name.startswith(("LICENSE", "npm")):
            shutil.copy(f, dest / f.name)
    return dest


def _resaved(tmp_path: Path) -> Path:
    from transformers import AutoTokenizer

    d = tmp_path / "resaved"
    AutoTokenizer.from_pretrained(str(QWEN3)).save_pretrained(str(d))
    return d


def test_a_resaved_tokenizer_is_the_same_tokenizer(
    qwen_build: Path, weights: Path, tmp_path: Path
) -> None:
    reader = BuildReader(str(qwen_build))
    assert reader.manifest.tokenizer.content_sha256 is not None
    resaved = _resaved(tmp_path)
    # the files differ (transformers rewrites them), the identity by content does not
    assert (resaved / "tokenizer.json").read_bytes() != (QWEN3 / "tokenizer.json").read_bytes()
    mdir = _model_with(weights, resaved, tmp_path / "model")
    assert model_for_build(reader, str(mdir)).config.vocab_size == 151936


@pytest.mark.parametrize("change", ["merge", "token", "template"])
def test_one_changed_merge_token_or_template_is_another_tokenizer(
    qwen_build: Path, weights: Path, tmp_path: Path, change: str
) -> None:
    tok = tmp_path / "tok"
    shutil.copytree(_resaved(tmp_path), tok)
    tj = json.loads((tok / "tokenizer.json").read_text(encoding="utf-8"))
    if change == "merge":
        tj["model"]["merges"][100] = list(reversed(tj["model"]["merges"][100]))
    elif change == "token":
        vocab = tj["model"]["vocab"]
        a, b = "Ġthe", "Ġand"
        vocab[a], vocab[b] = vocab[b], vocab[a]
    else:
        p = tok / "chat_template.jinja"
        p.write_text(p.read_text(encoding="utf-8") + " ", encoding="utf-8")
    (tok / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    mdir = _model_with(weights, tok, tmp_path / "model")
    with pytest.raises(ShardError, match="content sha256.*another tokenizer"):
        model_for_build(BuildReader(str(qwen_build)), str(mdir))


def test_old_manifests_compare_the_files_bytes(
    qwen_build: Path, weights: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(qwen_build, old)
    m = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    del m["tokenizer"]["content_sha256"]  # what a build before the identity by content wrote
    (old / "manifest.json").write_text(json.dumps(m, indent=2), encoding="utf-8")
    reader = BuildReader(str(old))
    assert reader.manifest.tokenizer.content_sha256 is None
    same = _model_with(weights, QWEN3, tmp_path / "same")
    assert model_for_build(reader, str(same)).config.vocab_size == 151936
    resaved = _model_with(weights, _resaved(tmp_path), tmp_path / "resaved-model")
    with pytest.raises(ShardError, match="file bytes, an older manifest"):
        model_for_build(reader, str(resaved))


def _fake_cache(root: Path, repo: str, folder: Path) -> Path:
    """A Hugging Face hub cache holding ``folder`` as the main revision of ``repo``."""
    entry = root / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("0" * 40)
    shutil.copytree(folder, entry / "snapshots" / ("0" * 40))
    return root


def test_hub_ids_from_the_local_cache(
    qwen_build: Path, weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mdir = _model_with(weights, QWEN3, tmp_path / "model")
    cache = _fake_cache(tmp_path / "hub", "acme/tiny-qwen", mdir)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reader = BuildReader(str(qwen_build))
    assert model_for_build(reader, "acme/tiny-qwen").config.vocab_size == 151936
    with pytest.raises(TreeprepError, match="acme/absent: not a local folder.*hf download"):
        model_for_build(reader, "acme/absent")
    # --tokenizer takes a cached hub id too: the same identity as the folder
    from treeprep.render import Renderer

    ident = Renderer.load("acme/tiny-qwen").identity_by_content()
    assert ident.name == "acme/tiny-qwen"
    assert ident.content_sha256 == reader.manifest.tokenizer.content_sha256


def test_the_byte_tokenizer_is_refused_for_a_model_with_its_own(
    weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bytes"
    build(BuildConfig(inputs=[str(ROOT / "sample_data" / "openai_chat.jsonl")], out=str(out)))
    mdir = _model_with(weights, QWEN3, tmp_path / "model")
    with pytest.raises(ShardError, match="built-in byte tokenizer, which only suits the tiny"):
        model_for_build(BuildReader(str(out)), str(mdir))
