"""``treeprep verify`` on shards built from real logs (Qwen3 tokenizer) and from generated trees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import group_tree  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from treeprep.cli.app import app  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
QWEN3 = DATA / "tokenizers" / "qwen3"
# small multi-node trees from real logs: a Claude Code session with tool calls, a sub-agent
REAL_LOGS = [
    DATA / "logs" / "claude-code" / "tool_heavy.jsonl",
    DATA / "logs" / "claude-code" / "subagent.jsonl",
]


def _write_build(out: Path, trees) -> None:
    """A finished build of ready trees: shards and a manifest (of the builtin byte tokenizer)."""
    from treeprep.schemas import SCHEMA_VERSION
    from treeprep.schemas.manifest import Counts, Manifest, ShardEntry, TokenizerIdentity
    from treeprep.shards import write_shard

    (out / "shards").mkdir(parents=True)
    size, sha = write_shard(trees, str(out / "shards" / "00000.arrow"))
    nseq = sum(int(t.seq_count.sum()) for t in trees)
    tt, tl = sum(t.tokens_tree for t in trees), sum(t.tokens_linear for t in trees)
    m = Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version="test",
        tokenizer=TokenizerIdentity(
            name="builtin-bytes", sha256="0", chat_template_sha256="0", vocab_size=256
        ),
        counts=Counts(
            records_read=nseq, records_in_trees=nseq, records_rejected=0, trees=len(trees),
            sequences=nseq, nodes=sum(t.num_nodes for t in trees), tokens_linear=tl,
            tokens_tree=tt,
        ),
        shards=[ShardEntry(path="shards/00000.arrow", bytes=size, sha256=sha, trees=len(trees),
                           tokens_tree=tt, tokens_linear=tl)],
    )  # fmt: skip
    (out / "manifest.json").write_text(m.model_dump_json(indent=2))


def test_verify_passes_on_generated_shards(tmp_path: Path) -> None:
    _write_build(tmp_path, [group_tree(41, n_seq=6, roots=2), group_tree(42)])
    r = CliRunner().invoke(
        app, ["verify", str(tmp_path), "--model", "tiny-qwen3", "--loss", "ppo", "--json"]
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout[r.stdout.index("{") :])
    assert rep["ok"] and rep["worst_rel"] < 1e-5
    assert rep["tokens_tree"] < rep["tokens_linear"]
    assert {g["name"] for g in rep["groups"]} >= {"embed_tokens", "layers.1.mlp", "lm_head"}


def test_verify_fails_past_the_tolerance(tmp_path: Path) -> None:
    _write_build(tmp_path, [group_tree(43, n_seq=6)])
    r = CliRunner().invoke(app, ["verify", str(tmp_path), "--model", "tiny-qwen3", "--tol", "0"])
    assert r.exit_code == 1
    assert "FAIL" in r.stdout


@pytest.mark.skipif(not QWEN3.exists(), reason="../shared/data is not present")
def test_verify_refuses_a_model_of_another_tokenizer(tmp_path: Path) -> None:
    """A model folder whose tokenizer is not the build's is refused, as train refuses it (verify
    loaded it and passed: its vocabulary was large enough for the build's token ids)."""
    from treeprep.trainer.models.load import load_model

    _write_build(tmp_path / "build", [group_tree(44)])
    mdir = tmp_path / "model"
    load_model("tiny-qwen3", vocab_size=151936).save_pretrained(mdir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3 / f, mdir / f)
    r = CliRunner().invoke(app, ["verify", str(tmp_path / "build"), "--model", str(mdir)])
    assert r.exit_code != 0
    # the build was made with the built-in byte tokenizer: refused for a model with its own
    assert "made without --tokenizer" in str(r.exception), r.output


def test_verify_refuses_a_folder_without_a_build(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["verify", str(tmp_path), "--model", "tiny-qwen3"])
    assert r.exit_code != 0


@pytest.mark.skipif(not QWEN3.exists(), reason="../shared/data is not present")
@pytest.mark.parametrize("norm", ["sum", "sequence-mean"])
def test_verify_on_real_logs_with_qwen3(
    tmp_path_factory: pytest.TempPathFactory, norm: str
) -> None:
    out = tmp_path_factory.getbasetemp() / "real_build"
    if not (out / "manifest.json").exists():
        from treeprep.build import BuildConfig, build

        m = build(
            BuildConfig(inputs=[str(p) for p in REAL_LOGS], out=str(out), tokenizer=str(QWEN3))
        )
        assert m.counts.trees >= 2 and m.counts.tokens_tree < m.counts.tokens_linear
    r = CliRunner().invoke(
        app,
        ["verify", str(out), "--model", "tiny-qwen3", "--norm", norm, "--groups", "8", "--json"],
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout[r.stdout.index("{") :])
    assert rep["ok"] and rep["worst_rel"] < 1e-5 and rep["targets_tree"] > 100
