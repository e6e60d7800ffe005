"""The flex backend on CPU: its interval-built block mask equals ``create_block_mask``'s, its
forward equals ``dense`` (with and without handed-over prefix rows), it compiles once for
micro-batches of different lengths, and the real Claude Code session's block mask is small."""

from __future__ import annotations

import glob
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from trainer_fixtures import forest_mask as tree_mask  # noqa: E402
from trainer_fixtures import forests  # noqa: E402

from treeprep.trainer.attention import TreeMask, tree_attention, tree_mask_mod, visible  # noqa: E402
from treeprep.trainer.attention.flex import (  # noqa: E402
    BLOCK,
    block_classes,
    block_mask,
    block_mask_bytes,
    compiled_flex,
    flex_forward,
    padded,
)

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"


# --------------------------------------------------------------------------------------------
# random trees, and parts of them with handed-over prefix rows
# --------------------------------------------------------------------------------------------


def part_mask(full: TreeMask, a: int, b: int) -> tuple[TreeMask, torch.Tensor]:
    """Tokens a..b-1 of ``full`` as a part: its prefix rows are the keys before a that token a
    sees (the ancestors of its first token), as the hand-off passes them. Returns the part's
    mask and the rows of ``full``'s keys it uses (prefix rows, then a..b-1)."""
    # the rule on the one query row a (never a T x T mask: the real session's tree is 378k long)
    row = visible(full.q_node[a], full.q_index[a], full.k_node[:a], full.k_last[:a],
                  full.k_index[:a])  # fmt: skip
    rows = torch.cat([torch.nonzero(row).flatten(), torch.arange(a, b)])
    p = len(rows) - (b - a)
    part = TreeMask(
        q_node=full.q_node[a:b],
        q_index=full.q_index[a:b],
        k_node=full.k_node[rows],
        k_last=full.k_last[rows],
        k_index=full.k_index[rows],
        node_start=np.zeros(0, dtype=np.int64),
        node_length=np.zeros(0, dtype=np.int64),
        node_parent=np.zeros(0, dtype=np.int64),
        node_prefix=np.zeros(0, dtype=np.int64),
        backend="flex",
        prefix_len=p,
    )
    return part, rows


def reference_classes(tm: TreeMask) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) per block from ``create_block_mask`` (it evaluates every pair)."""
    bm = flex_mod.create_block_mask(
        tree_mask_mod(padded(tm)), None, None, tm.num_tokens, tm.num_keys, device="cpu"
    )
    return _dense_classes(bm)


def _dense_classes(bm) -> tuple[torch.Tensor, torch.Tensor]:
    """Block classes read back from a BlockMask's index tensors (``to_dense`` for each kind)."""
    partial = flex_mod.BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices).to_dense()
    full = flex_mod.BlockMask.from_kv_blocks(bm.full_kv_num_blocks, bm.full_kv_indices).to_dense()
    return partial[0, 0].bool(), full[0, 0].bool()


def _check_against_create_block_mask(tm: TreeMask) -> None:
    want_partial, want_full = reference_classes(tm)
    got = block_mask(tm)
    got_partial, got_full = _dense_classes(got)
    assert torch.equal(got_partial, want_partial)
    assert torch.equal(got_full, want_full)
    assert got.seq_lengths == (tm.num_tokens, tm.num_keys)
    # and the classes really are what they claim: empty blocks hold no visible pair, full
    # blocks only visible pairs (a direct check on the dense mask, padded with False)
    qb, kb = want_partial.shape
    d = torch.zeros(qb * BLOCK, kb * BLOCK, dtype=torch.bool)
    d[: tm.num_tokens, : tm.num_keys] = tm.dense()
    blocks = d.view(qb, BLOCK, kb, BLOCK).permute(0, 2, 1, 3).reshape(qb, kb, -1)
    assert torch.equal(blocks.all(-1), got_full)
    assert torch.equal(blocks.any(-1), got_full | got_partial)


# --------------------------------------------------------------------------------------------
# the block mask
# --------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests())
def test_block_mask_equals_create_block_mask(forest) -> None:
    _check_against_create_block_mask(tree_mask(*forest))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(), st.data())
def test_block_mask_with_prefix_rows_equals_create_block_mask(forest, data) -> None:
    full = tree_mask(*forest)
    t = full.num_tokens
    a = data.draw(st.integers(0, t - 1))
    b = data.draw(st.integers(a + 1, t))
    part, _ = part_mask(full, a, b)
    _check_against_create_block_mask(part)


def test_block_mask_on_whole_blocks_and_one_long_node() -> None:
    """Lengths that are multiples of 128 (no padding: full blocks on the diagonal's left) and a
    single 1000-token node (one causal sequence: the linear layout)."""
    for parent, length in ([[-1, 0, 0, 2], [128, 256, 128, 384]], [[-1], [1000]]):
        tm = tree_mask(parent, length)
        _check_against_create_block_mask(tm)
        _, full = block_classes(tm)
        assert full.any()


def test_block_mask_refuses_queries_out_of_order() -> None:
    from treeprep.errors import TreeprepError

    tm = tree_mask([-1, 0], [3, 3])
    tm.q_node = tm.q_node.flip(0)
    with pytest.raises(TreeprepError, match="depth-first order"):
        block_classes(tm)


# --------------------------------------------------------------------------------------------
# the forward
# --------------------------------------------------------------------------------------------


def _qkv(t: int, p: int, seed: int, h: int = 4, g: int = 2, d: int = 16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, t, d, generator=gen)
    k = torch.randn(1, g, p + t, d, generator=gen)
    v = torch.randn(1, g, p + t, d, generator=gen)
    return q, k, v


def _flex_vs_dense(tm: TreeMask, seed: int) -> None:
    p = tm.prefix_len
    q, k, v = _qkv(tm.num_tokens, p, seed)
    pre = (k[:, :, :p], v[:, :, :p]) if p else None
    own_k, own_v = k[:, :, p:], v[:, :, p:]
    ref = tree_attention(q, own_k, own_v, tm, backend="dense", prefix=pre)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tree_attention(q, own_k, own_v, tm, backend="flex", prefix=pre)
    # float32: both sum the same few hundred products in different orders
    assert (out - ref).abs().max().item() < 2e-6


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(max_nodes=16, max_len=70), st.integers(0, 2**16))
def test_flex_forward_equals_dense(forest, seed) -> None:
    _flex_vs_dense(tree_mask(*forest), seed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(max_nodes=16, max_len=70), st.data())
def test_flex_forward_with_prefix_rows_equals_dense(forest, data) -> None:
    full = tree_mask(*forest)
    t = full.num_tokens
    a = data.draw(st.integers(0, t - 1))
    b = data.draw(st.integers(a + 1, t))
    part, _ = part_mask(full, a, b)
    _flex_vs_dense(part, data.draw(st.integers(0, 2**16)))


def test_flex_compiles_once_for_varying_lengths() -> None:
    """Consecutive micro-batches of different lengths (and different masks) reuse one dynamo
    graph; the first has 2 query blocks, as many as there are key/value heads, which plain
    ``dynamic=True`` would specialise. Counted with dynamo's counting backend (recompiles are
    dynamo's decision; inductor on CPU would take minutes to build the kernel)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    fn = compiled_flex(counter)
    assert compiled_flex(counter) is fn
    outs = []
    for i, (parent, length) in enumerate(
        (
            [[-1, 0, 0], [100, 50, 80]],
            [[-1, 0, 1, 0], [200, 60, 60, 90]],
            [[-1, -1], [70, 300]],
            [[-1, 0], [1000, 20]],
        )
    ):
        tm = tree_mask(parent, length)
        q, k, v = _qkv(tm.num_tokens, 0, i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = flex_forward(q, k, v, tm, 0.25, fn)
        ref = tree_attention(q, k, v, tm, backend="dense", scale=0.25)
        assert (out - ref).abs().max().item() < 2e-6
        outs.append(counter.frame_count)
    assert outs == [1, 1, 1, 1]


# --------------------------------------------------------------------------------------------
# the real session tree
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude_code_tree(tmp_path_factory) -> dict:
    logs, tok = SHARED / "logs" / "claude-code", SHARED / "tokenizers" / "qwen3"
    if not (logs.is_dir() and tok.is_dir()):
        pytest.skip("../shared/data is absent")
    from treeprep.build import BuildConfig, build

    out = tmp_path_factory.mktemp("cc") / "build"
    build(BuildConfig(inputs=[str(logs)], out=str(out), tokenizer=str(tok)))
    import pyarrow as pa

    shard = sorted(glob.glob(os.path.join(out, "shards", "*.arrow")))[0]
    with pa.memory_map(shard) as src:
        table = pa.ipc.open_file(src).read_all()
    i = int(np.argmax(table["tokens_tree"].to_numpy()))
    return {c: table[c][i].as_py() for c in ("node_parent", "node_length")}


def test_claude_code_block_mask_is_under_one_percent_of_t2(claude_code_tree) -> None:
    """The session's largest tree (378k tokens) at a 131,072-token budget: its first 131,072
    tokens in depth-first order, a part with no prefix, and the rest as a part whose prefix rows
    are handed over; neither block mask costs 1% of T^2 bytes."""
    full = tree_mask(claude_code_tree["node_parent"], claude_code_tree["node_length"])
    budget = 131072
    assert full.num_tokens > budget
    for a, b in ((0, budget), (full.num_tokens - budget, full.num_tokens)):
        part, _ = part_mask(full, a, b)
        bm = block_mask(part)
        assert block_mask_bytes(bm) < 0.01 * part.num_tokens**2
        partial, fullb = block_classes(part)
        assert partial.any() and fullb.any()
