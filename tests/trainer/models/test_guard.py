"""The guard: every tiny family passes the probe; a broken model and unknown mixers are refused,
and ``train`` refuses them before the first step (``--no-probe`` skips only the probe)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_families import FAMILIES  # noqa: E402
from test_train import cfg, data  # noqa: E402, F401
from trainer_fixtures import tiny  # noqa: E402

from treeprep.errors import ModelRefused  # noqa: E402
from treeprep.trainer.models import check_structure, guard_model, load_model  # noqa: E402
from treeprep.trainer.run.loop import train  # noqa: E402


@pytest.mark.parametrize("name", list(FAMILIES.values()))
def test_every_family_passes_the_probe(name: str) -> None:
    rep = guard_model(tiny(name))
    assert rep is not None and rep.ok and rep.worst < 1e-5
    assert rep.tokens_tree < rep.tokens_linear


def _broken_hybrid() -> torch.nn.Module:
    """Qwen3.5 with its linear-attention layers scanning the packed sequence as one sequence."""
    m = load_model("tiny-qwen3-5", vocab_size=512)
    for mod in m.modules():
        if "forward" in mod.__dict__:
            del mod.forward
    return m


def test_probe_refuses_a_broken_model_naming_its_layers() -> None:
    with pytest.raises(ModelRefused, match=r"layers\.0 \(linear\)") as e:
        guard_model(_broken_hybrid())
    assert "layers.3 (attention)" in str(e.value)  # downstream layers are named after


class FooMixerAttention(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_structure_refuses_unknown_mixers() -> None:
    m = load_model("tiny-llama", vocab_size=512)
    m.model.layers[1].extra = FooMixerAttention()
    with pytest.raises(ModelRefused, match=r"model\.layers\.1\.extra \(FooMixerAttention\)"):
        check_structure(m)
    m2 = load_model("tiny-llama", vocab_size=512)
    m2.set_attn_implementation("sdpa")
    with pytest.raises(ModelRefused, match="not tree attention"):
        check_structure(m2)


def test_train_refuses_a_model_that_fails(data: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    import treeprep.trainer.data.reader as reader_mod

    def broken(*a, **k):
        return _broken_hybrid_vocab(k.get("vocab_size") or 512)

    monkeypatch.setattr(reader_mod, "load_model", broken)  # what train loads its model with
    with pytest.raises(ModelRefused, match="disagree"):
        train(cfg(data, tmp_path / "run", steps=1, model="tiny-qwen3-5"))
    assert not (tmp_path / "run" / "checkpoints").exists()
    # --no-probe skips the probe (the structure check still runs and passes here)
    res = train(cfg(data, tmp_path / "run2", steps=1, model="tiny-qwen3-5", probe=False))
    assert res.steps == 1


def _broken_hybrid_vocab(vocab: int) -> torch.nn.Module:
    m = load_model("tiny-qwen3-5", vocab_size=vocab, attn="dense")
    for mod in m.modules():
        if "forward" in mod.__dict__:
            del mod.forward
    return m
