"""The live-bytes tracker against known allocations, and the memory model against it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.memory import MemorySetup, peak, shape_from_preset, terms  # noqa: E402
from treeprep.trainer.run.memtrack import LiveBytes  # noqa: E402


def test_known_allocation_pattern() -> None:
    with LiveBytes() as m:
        a = torch.ones(1000)  # 4000
        b = torch.ones(2000)  # 12000
        v = a[10:20]  # a view: nothing new
        del a  # the view keeps the storage
        c = torch.zeros(500, dtype=torch.float64)  # 16000: the peak
        del b
        d = torch.ones(100)  # 8400
        assert (m.current, m.peak) == (8400, 16000)
        del v, c, d
        assert m.current == 0


def test_backward_and_tracked_inputs() -> None:
    w = torch.randn(100, 100, requires_grad=True)
    x = torch.randn(50, 100)
    with LiveBytes() as m:
        m.track(w, x, w)  # counted once
        assert m.current == 60000
        y = (x @ w).tanh()  # the product dies, tanh keeps its output
        assert m.current == 80000
        y.sum().backward()
        assert m.current == 120000  # + w.grad
        assert m.peak > m.current


def test_model_within_15_percent_of_tiny_qwen3_parts() -> None:
    """A tiny-qwen3 tree (a long main thread, side branches) as hand-off parts in float32: the
    memory model against the exact peak of live tensor bytes."""
    from dataclasses import asdict

    from treeprep.sequence import Sequence
    from treeprep.trainer import TreeBatch, load_model
    from treeprep.trainer.models.presets import PRESETS
    from treeprep.trainer.objective.loss import LossConfig
    from treeprep.trainer.parts import part_layout, run_parts
    from treeprep.trie import build_tree

    rng = np.random.default_rng(0)
    prompt, seqs = rng.integers(0, 512, 200), []
    for _ in range(4):
        gen = rng.integers(0, 512, 150)
        toks = np.concatenate([prompt, gen]).astype(np.int32)
        seqs.append(Sequence("g", toks, [(len(prompt), len(toks))]))
        prompt = np.concatenate([toks, rng.integers(0, 512, 250)])
    row = build_tree(seqs).to_row()
    budget = 256
    with LiveBytes() as mem:
        model = load_model("tiny-qwen3", vocab_size=512, attn="nodes")
        batch = TreeBatch.from_trees([row], norm="token-mean", device="cpu")
        mem.track(*model.parameters())
        res = run_parts(model, batch, LossConfig("sft"), budget=budget, attn="nodes")
    assert res.parts > 3
    shape = shape_from_preset(asdict(PRESETS["tiny-qwen3"]), name="tiny", vocab=512)
    s = MemorySetup(precision="float32", parallel="ddp", optimizer_states=0,
                    accumulated_gradients=False)  # fmt: skip
    path = int(batch.position_ids.max()) + 1
    # the LM head runs on a part's trained targets: the most any part feeds it
    head_rows = max(int(p.target_select.sum()) for p in part_layout(batch, budget).parts)
    t = terms(shape, s, budget=budget, path=path, tree_tokens=batch.num_tokens, head_rows=head_rows)
    assert peak(t) == pytest.approx(mem.peak, rel=0.15)
