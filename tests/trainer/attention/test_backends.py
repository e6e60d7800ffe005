"""Attention backends agree with ``dense``, the reference: one conformance test over the
:data:`BACKENDS` table (forward and backward in float64, with and without a hand-off part's
prefix), on every device the table says each backend trains on, and the table agrees with the
``Attn`` mode."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import group_tree, rows_of  # noqa: E402

from treeprep.modes import ATTN_FACTS, Attn  # noqa: E402
from treeprep.trainer import TreeBatch, TreeMask, tree_attention  # noqa: E402
from treeprep.trainer.attention import BACKENDS, build_chains  # noqa: E402
from treeprep.trainer.parts.plan import part_layout  # noqa: E402
from treeprep.trainer.parts.schedule import part_mask  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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


def test_the_table_agrees_with_the_mode() -> None:
    """Every ``Attn`` member but ``auto`` has one row of facts and one backend, under its name."""
    names = set(Attn) - {Attn.auto}
    assert set(BACKENDS) == set(ATTN_FACTS) == names
    assert all(b.name == n and b.facts is ATTN_FACTS[n] for n, b in BACKENDS.items())


def _case(device: str, dtype: torch.dtype, with_prefix: bool, grad: bool, seed: int = 5):
    """(mask, q, own k, own v, prefix segments) of one batch, or, ``with_prefix``, of the
    deepest hand-off part of one tree cut at a small budget (its prefix as two segments)."""
    if not with_prefix:
        b = _batch().to(device)
        tm = TreeMask.from_batch(b, "dense")
        p = 0
    else:
        b = TreeBatch.from_trees(rows_of(group_tree(3, n_seq=7, roots=1))).to(device)
        layout = part_layout(b, 24)
        spec = max(layout.parts, key=lambda sp: len(sp.prefix_rows))
        tm = part_mask(b, spec, "dense", None)
        p = len(spec.prefix_rows)
        assert p > 1 and spec.num_tokens > 1
    q, k, v = _qkv(tm.num_tokens + p, seed=seed)
    q = q[:, :, p:]
    q, k, v = (x.to(device, dtype).requires_grad_(grad) for x in (q, k, v))
    cut = p // 2
    segs = ((k[:, :, :cut], v[:, :, :cut]), (k[:, :, cut:p], v[:, :, cut:p])) if p else None
    return tm, q, k, v, segs, p


def _run(name: str, device: str, dtype: torch.dtype, with_prefix: bool, grad: bool):
    tm, q, k, v, segs, p = _case(device, dtype, with_prefix, grad)
    with torch.set_grad_enabled(grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tree_attention(q, k[:, :, p:], v[:, :, p:], tm, backend=name, prefix=segs)
    if not grad:
        return out.double().cpu(), []
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * w).sum().backward()
    return out.double().cpu(), [x.grad.double().cpu() for x in (q, k, v)]


@pytest.mark.parametrize("with_prefix", [False, True], ids=["own", "prefix"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BACKENDS))
def test_backend_equals_dense_forward_and_backward(name: str, device: str, with_prefix) -> None:
    """Outputs and the gradients of q, k, v (prefix rows included) against ``dense`` in
    float64: to float64 rounding, or bf16's for a backend that computes in bf16."""
    backend = BACKENDS[name]
    if backend.refusal(device) or device not in backend.facts.devices:
        pytest.skip(f"{name} does not train on {device} here")
    dtype = torch.float64 if backend.facts.float64 else torch.bfloat16
    ref, ref_grads = _run("dense", device, torch.float64, with_prefix, grad=True)
    out, grads = _run(name, device, dtype, with_prefix, grad=True)
    tol = 1e-12 if dtype == torch.float64 else 3e-2
    for a, c in zip([out, *grads], [ref, *ref_grads], strict=True):
        assert (a - c).abs().max().item() < tol * max(1.0, c.abs().max().item())


@pytest.mark.parametrize("with_prefix", [False, True], ids=["own", "prefix"])
@pytest.mark.parametrize("name", [n for n, f in ATTN_FACTS.items() if "cpu" in f.forward_devices])
def test_forward_only_backend_equals_dense_on_cpu(name: str, with_prefix: bool) -> None:
    """A backend that runs only its forward on CPU (``forward_devices``), in float32."""
    ref, _ = _run("dense", "cpu", torch.float64, with_prefix, grad=False)
    out, _ = _run(name, "cpu", torch.float32, with_prefix, grad=False)
    assert (out - ref).abs().max().item() < 2e-6


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
