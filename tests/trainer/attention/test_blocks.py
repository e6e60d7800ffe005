"""The fused block attention of the ``nodes`` backend: one softmax over several key blocks, each
run through SDPA's CPU flash kernel and merged by log-sum-exp, equals the softmax over their union
written out by hand (forward and every gradient), and the ``nodes`` backend built on it equals
``dense`` on random forests while it never writes a score matrix (plain layers) or keeps the math
path (layers with a window)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from trainer_fixtures import forest_mask, forests  # noqa: E402

import treeprep.trainer.attention.nodes as nodes_mod  # noqa: E402
from treeprep.trainer.attention import PLAIN, LayerOptions, TreeMask, tree_attention  # noqa: E402
from treeprep.trainer.attention.blocks import block_attention  # noqa: E402


def _union_reference(q, ks, vs, scale: float, causal_last: bool):
    """softmax(q K^T * scale + mask) V over the concatenated blocks, GQA by repeating keys."""
    r = q.shape[1] // ks[0].shape[1]
    k = torch.cat(ks, dim=2).repeat_interleave(r, dim=1)
    v = torch.cat(vs, dim=2).repeat_interleave(r, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    n, lk = q.shape[2], k.shape[2]
    mask = torch.ones(n, lk, dtype=torch.bool)
    if causal_last:
        mask[:, lk - n :] = torch.ones(n, n, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 40), min_size=0, max_size=4),
    st.integers(1, 33),
    st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_block_attention_equals_softmax_over_the_union(sizes, n, heads, causal_last, seed) -> None:
    h, g = heads
    d = 8
    gen = torch.Generator().manual_seed(seed)
    sizes = [*sizes, n]  # the last block is the queries' own rows (causal when asked)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    q = rand(1, h, n, d)
    ks = [rand(1, g, m, d) for m in sizes]
    vs = [rand(1, g, m, d) for m in sizes]
    w = torch.randn(1, h, n, d, generator=gen, dtype=torch.float64)
    outs, grads = [], []
    for fn in (block_attention, None):
        if fn is None:
            o = _union_reference(q, ks, vs, 0.37, causal_last)
        else:
            o = fn(q, ks, vs, 0.37, causal_last=causal_last)
        (o * w).sum().backward()
        outs.append(o.detach())
        grads.append([x.grad.clone() for x in (q, *ks, *vs)])
        for x in (q, *ks, *vs):
            x.grad = None
    assert (outs[0] - outs[1]).abs().max().item() < 1e-12
    for a, b in zip(*grads, strict=True):
        assert (a - b).abs().max().item() < 1e-12


def test_block_attention_float32_relative() -> None:
    """float32, the bar: 1e-5 relative to the float64 reference."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 8, 300, 32, generator=gen)
    ks = [torch.randn(1, 2, m, 32, generator=gen) for m in (700, 5, 300)]
    vs = [torch.randn(1, 2, m, 32, generator=gen) for m in (700, 5, 300)]
    got = block_attention(q, ks, vs, 32**-0.5, causal_last=True)
    ref = _union_reference(
        q.double(), [k.double() for k in ks], [v.double() for v in vs], 32**-0.5, True
    )
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-5


# --------------------------------------------------------------------------------------------
# the nodes backend on random forests
# --------------------------------------------------------------------------------------------


def _run(tm: TreeMask, backend: str, seed: int, opts: LayerOptions = PLAIN):
    gen = torch.Generator().manual_seed(seed)
    t = tm.num_tokens
    q, k, v = (
        torch.randn(1, h, t, 8, generator=gen, dtype=torch.float64).requires_grad_()
        for h in (4, 2, 2)
    )
    o = tree_attention(q, k, v, tm, backend=backend, opts=opts)
    (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
    return o.detach(), [q.grad, k.grad, v.grad]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(max_nodes=14, max_len=40), st.integers(1, 7), st.integers(0, 2**16))
def test_nodes_equals_dense_on_random_forests(forest, chunk, seed) -> None:
    tm = forest_mask(*forest, backend="nodes")
    calls: list[object] = []
    old_chunk, old_math = nodes_mod.NODE_CHUNK, nodes_mod._chunk_attention
    nodes_mod.NODE_CHUNK = chunk
    nodes_mod._chunk_attention = lambda *a: calls.append(a)  # type: ignore[assignment]
    try:
        got, got_g = _run(tm, "nodes", seed)
    finally:
        nodes_mod.NODE_CHUNK, nodes_mod._chunk_attention = old_chunk, old_math
    ref, ref_g = _run(tm, "dense", seed)
    assert not calls  # plain layers on CPU never take the math path
    assert (got - ref).abs().max().item() < 1e-12
    for a, b in zip(got_g, ref_g, strict=True):
        assert (a - b).abs().max().item() < 1e-12


def test_nodes_keeps_the_math_path_for_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sliding window changes the scores: those layers run the masked math path (and still
    equal dense); the fused kernel is for plain layers only."""
    tm = forest_mask([-1, 0, 1, 0, -1], [30, 12, 9, 20, 15], backend="nodes")
    opts = LayerOptions(window=17)
    fused: list[object] = []
    real = nodes_mod.block_attention
    monkeypatch.setattr(
        nodes_mod, "block_attention", lambda *a, **k: fused.append(a) or real(*a, **k)
    )
    monkeypatch.setattr(nodes_mod, "NODE_CHUNK", 8)
    got, got_g = _run(tm, "nodes", 3, opts)
    ref, ref_g = _run(tm, "dense", 3, opts)
    assert not fused
    assert (got - ref).abs().max().item() < 1e-12
    for a, b in zip(got_g, ref_g, strict=True):
        assert (a - b).abs().max().item() < 1e-12
