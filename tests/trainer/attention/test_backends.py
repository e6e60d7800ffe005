"""Attention backends agree: dense (reference) == nodes (forward and backward) == flex (forward)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import group_tree, rows_of  # noqa: E402

from treeprep.trainer import TreeBatch, TreeMask, tree_attention  # noqa: E402
from treeprep.trainer.attention import build_chains  # noqa: E402


def _qkv(t: int, h: int = 4, g: int = 2, d: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, t, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, g, t, d, generator=gen, dtype=torch.float64)
    v = torch.randn(1, g, t, d, generator=gen, dtype=torch.float64)
    return q, k, v


def _batch():
    return TreeBatch.from_trees(rows_of(group_tree(3, n_seq=7, roots=2), group_tree(4)))


def _brute_mask(b: TreeBatch) -> torch.Tensor:
    """i attends j iff j's node is on i's root path and j <= i: walk parents, no pre/last trick."""
    t = b.num_tokens
    node, parent = b.token_node.tolist(), b.node_parent.tolist()
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        anc, v = set(), node[i]
        while v >= 0:
            anc.add(v)
            v = parent[v]
        for j in range(i + 1):
            m[i, j] = node[j] in anc
    return m


def test_dense_mask_is_the_ancestor_relation() -> None:
    b = _batch()
    assert torch.equal(TreeMask.from_batch(b, "dense").dense(), _brute_mask(b))


def test_chains_cover_each_nodes_root_path() -> None:
    """Every query's visible keys are its chain's ancestor segments plus its chain's own tokens
    up to itself (no gather): checked against the brute-force ancestor walk."""
    b = _batch()
    tm = TreeMask.from_batch(b, "dense")
    ch = build_chains(tm.node_start, tm.node_length, tm.node_parent, tm.node_prefix)
    m = _brute_mask(b)
    assert sorted(ch.start) == ch.start and ch.end[-1] == b.num_tokens
    for c in range(len(ch.start)):
        keys = [j for a, e in ch.segments[c] for j in range(a, e)]
        for i in range(ch.start[c], ch.end[c]):
            want = torch.nonzero(m[i]).flatten().tolist()
            assert keys + list(range(ch.start[c], i + 1)) == want


@pytest.mark.parametrize("backend", ["nodes", "flex"])
def test_backends_equal_dense_forward(backend: str) -> None:
    b = _batch()
    q, k, v = _qkv(b.num_tokens)
    if backend == "flex":
        q, k, v = q.float(), k.float(), v.float()
    tm = TreeMask.from_batch(b, "dense")
    ref = tree_attention(q, k, v, tm, backend="dense")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tree_attention(q, k, v, tm, backend=backend)
    tol = 1e-12 if q.dtype == torch.float64 else 1e-6
    assert (out - ref).abs().max().item() < tol


def test_nodes_backend_equals_dense_backward() -> None:
    b = _batch()
    tm = TreeMask.from_batch(b, "dense")
    grads = []
    for backend in ("dense", "nodes"):
        q, k, v = (x.requires_grad_() for x in _qkv(b.num_tokens, seed=5))
        out = tree_attention(q, k, v, tm, backend=backend)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append([q.grad, k.grad, v.grad])
    for a, c in zip(*grads, strict=True):
        assert (a - c).abs().max().item() < 1e-12


def test_nodes_backend_chunks_long_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import treeprep.trainer.attention.nodes as att

    b = _batch()
    q, k, v = _qkv(b.num_tokens, seed=2)
    tm = TreeMask.from_batch(b, "dense")
    ref = tree_attention(q, k, v, tm, backend="dense")
    monkeypatch.setattr(att, "NODE_CHUNK", 3)
    out = tree_attention(q, k, v, tm, backend="nodes")
    assert (out - ref).abs().max().item() < 1e-12


def test_auto_choice_and_overrides() -> None:
    from treeprep.errors import TreeprepError
    from treeprep.trainer import choose_backend

    assert choose_backend("cpu", 100) == "dense"
    assert choose_backend("cpu", 100_000) == "nodes"
    assert choose_backend("cpu", 100, num_keys=150) == "nodes"  # a hand-off part reads in place
    assert choose_backend("cuda", 100) == "flex"
    assert choose_backend("cpu", 100, "nodes") == "nodes"
    with pytest.raises(
        TreeprepError, match="^attention backend 'paged'; expected one of auto, dense"
    ):
        choose_backend("cpu", 100, "paged")
    with pytest.raises(TreeprepError, match="flash"):
        choose_backend("cpu", 100, "flash")


def test_nodes_runs_whole_root_paths_as_one_causal_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The linear layout (every sequence a one-node tree) is padding-free causal attention: one
    ``is_causal`` SDPA call per sequence, however long, never the chunked masked path."""
    import treeprep.trainer.attention.nodes as att

    b = TreeBatch.from_trees(rows_of(group_tree(3, n_seq=7, roots=2)), layout="linear")
    assert int((b.node_parent < 0).sum()) == b.num_nodes  # every node a root: one per sequence
    q, k, v = _qkv(b.num_tokens, seed=3)
    tm = TreeMask.from_batch(b, "dense")
    ref = tree_attention(q, k, v, tm, backend="dense")
    monkeypatch.setattr(att, "NODE_CHUNK", 3)
    calls = []
    monkeypatch.setattr(att, "_chunk_attention", lambda *a: calls.append(a))
    out = tree_attention(q, k, v, tm, backend="nodes")
    assert not calls
    assert (out - ref).abs().max().item() < 1e-12


def test_nodes_takes_mixed_dtypes_under_autocast() -> None:
    """Under bf16 autocast rotary leaves queries and keys float32 while values are bf16; the
    fused CPU kernel takes one dtype, so ``nodes`` runs its math path there (it raised
    "expected scalar type Float but found BFloat16"), and agrees with ``dense``."""
    b = _batch()
    q, k, v = _qkv(b.num_tokens)
    q, k, v = q.float(), k.float(), v.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = tree_attention(q, k, v, TreeMask.from_batch(b, "dense"))
        out = tree_attention(q, k, v, TreeMask.from_batch(b, "nodes"))
    rel = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert rel < 1e-2, rel  # bf16 rounding of two summation orders
