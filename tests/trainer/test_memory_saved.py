"""The memory model's per-layer activations against what autograd saves in a transformers layer.

``treeprep.memory.layer_activation_bytes`` is written from the layer's code; here the bytes the
second decoder layer hands to autograd (saved-tensor hooks, each storage once; the parameters,
and the rotary cos/sin that the first layer saved already, left out) are measured at two sequence
lengths, and their difference per token must equal the model exactly: Qwen3 (query/key norms)
and Llama shapes, in float32, in bf16 and under bf16 autocast over float32 weights (what
``treeprep train`` runs), with the ``nodes`` backend (what the CPU runs; the CUDA kernels save
the same queries, keys, values, output and log-sum-exp).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.memory import MemorySetup, layer_activation_bytes, shape_from_preset  # noqa: E402
from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trainer import TreeBatch, load_model  # noqa: E402
from treeprep.trainer.models.presets import PRESETS  # noqa: E402
from treeprep.trainer.objective.loss import tree_loss  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

VOCAB = 512


def _saved_by_layer(model, tokens: int, autocast: bool) -> int:
    """Bytes of the storages the second decoder layer saves for the backward of one
    ``tokens``-long sequence, beyond the parameters and what the first layer saved."""
    toks = np.random.default_rng(tokens).integers(0, VOCAB, tokens).astype(np.int32)
    batch = TreeBatch.from_trees([build_tree([Sequence("s", toks, [(1, tokens)])]).to_row()])
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: list[dict[int, int]] = [{}, {}]
    running: list[int | None] = [None]
    hooks = []
    for i, layer in enumerate(model.model.layers[:2]):
        hooks.append(layer.register_forward_pre_hook(lambda *_, i=i: running.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda *_: running.__setitem__(0, None)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if running[0] is not None and st.data_ptr() not in params:
            seen[running[0]].setdefault(st.data_ptr(), st.nbytes())
        return t

    cast = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=autocast)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
            tree_loss(model, batch, loss="sft", attn="nodes")
    finally:
        for h in hooks:
            h.remove()
    return sum(nb for ptr, nb in seen[1].items() if ptr not in seen[0])


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "autocast"])
def test_layer_activations_are_what_autograd_saves(preset: str, precision: str) -> None:
    autocast = precision == "autocast"
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    model = load_model(preset, vocab_size=VOCAB, dtype=dtype, attn="nodes", seed=0)
    a, b = 64, 160
    per_token = (_saved_by_layer(model, b, autocast) - _saved_by_layer(model, a, autocast)) / (
        b - a
    )
    m = shape_from_preset(asdict(PRESETS[preset]), name=preset, vocab=VOCAB)
    s = MemorySetup(precision="float32" if precision == "float32" else "bfloat16",
                    autocast=autocast, parallel="ddp")  # fmt: skip
    assert per_token == layer_activation_bytes(m, s)
