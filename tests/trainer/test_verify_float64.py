"""Float64 verify that means it (issue 41, point 2): transformers casts RMSNorm, the rotary angles
and Qwen3.5's gated delta rule to float32 whatever the dtype, so ``verify --precision float64
--tol 1e-10`` failed on tiny-qwen3 (2.3e-8) and tiny-qwen3-5 (1.7e-7) though tree and linear agree
as well as the model allows. Under float64, verify keeps those casts in float64
(:func:`~treeprep.trainer.models.float64.keep_float64`), names what it patched, and tree and linear
agree to float64 rounding."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import random_group  # noqa: E402

from treeprep.trainer.models.float64 import keep_float64  # noqa: E402
from treeprep.trainer.models.load import load_model  # noqa: E402
from treeprep.trainer.verify import verify_gradients  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402


def _rows() -> list[dict]:
    rng = np.random.default_rng(0)
    return [build_tree(random_group(rng, n_seq=4, root_len=8, max_suffix=6)).to_row()]


@pytest.mark.parametrize(
    ("preset", "patched"),
    [
        ("tiny-qwen3", ["Qwen3RMSNorm"]),
        ("tiny-qwen3-5", ["Qwen3_5GatedDeltaNet", "Qwen3_5RMSNorm", "Qwen3_5RMSNormGated"]),
    ],
)
def test_float64_verify_agrees_to_float64_rounding(preset: str, patched: list[str]) -> None:
    model = load_model(preset, vocab_size=512, attn="dense", seed=1).double()
    rep = verify_gradients(model, _rows(), attn="dense", tol=1e-10)
    assert rep.ok, rep.reason
    assert rep.worst_rel < 1e-13 and rep.loss_rel < 1e-13, (rep.worst_rel, rep.loss_rel)
    assert rep.float64_kept == patched
    assert rep.to_dict()["float64_kept"] == patched


def test_the_patch_is_scoped_and_leaves_float32_alone() -> None:
    x64 = torch.ones(3, dtype=torch.float64)
    kept: set[str] = set()
    model = torch.nn.Linear(3, 3)
    with keep_float64(model, kept):
        assert x64.float().dtype == torch.float64 and x64.to(torch.float32).dtype == torch.float64
        assert x64.to("cpu", torch.float32).dtype == torch.float32  # a move too: not a cast only
        assert torch.ones(2).double().float().dtype == torch.float64
        assert torch.ones(2).dtype == torch.float32  # float32 made as float32 stays
    assert kept == {"the model"}  # cast outside any module's forward
    assert x64.float().dtype == torch.float32  # the block is over
    m32 = load_model("tiny-qwen3", vocab_size=512, attn="dense", seed=1)
    assert verify_gradients(m32, _rows(), attn="dense").float64_kept == []
