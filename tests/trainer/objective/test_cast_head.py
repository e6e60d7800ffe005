"""Issue 37 item 5: the LM head under autocast casts its weight a vocabulary block at a time.

Against autocast's own ``head(h)`` (one matmul on a bf16 copy of the whole weight): the same
logits bit for bit, the same weight gradient bit for bit, and an input gradient at least as close
to float64 (it is summed in float32 and not rounded to bf16); no cast of the weight larger than
one block is ever made, where autocast makes a whole one. Then a tiny model's SFT loss under
autocast, head chunks checkpointed, against float64.
"""

from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import Bf16Casts, bf16_autocast, random_group  # noqa: E402

from treeprep.schemas import parts  # noqa: E402
from treeprep.trainer import TreeBatch, load_model  # noqa: E402
from treeprep.trainer.models.run import SoftcappedHead  # noqa: E402
from treeprep.trainer.objective import cast_head  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig, loss_with_config  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

K, E, V = 11, 32, 50


class Casts(Bf16Casts):
    """The float32 -> bf16 copies made of tensors of width ``E`` (weight rows, never the [K, E]
    input: K is no block's row count here), their largest row count, and the most rows of
    them alive at once."""

    def __init__(self, rows_not: int) -> None:
        super().__init__()
        self.rows_not = rows_not
        self.largest = 0
        self.alive: list = []
        self.most_alive = 0

    def on_cast(self, out: torch.Tensor) -> None:
        if out.ndim == 2 and out.shape[1] == E and out.shape[0] != self.rows_not:
            self.largest = max(self.largest, out.shape[0])
            self.alive = [r for r in self.alive if r() is not None] + [weakref.ref(out)]
            self.most_alive = max(self.most_alive, sum(r().shape[0] for r in self.alive))


def _grads(out: torch.Tensor, h: torch.Tensor, head: torch.nn.Module, g: torch.Tensor):
    return torch.autograd.grad(out, [h, *head.parameters()], g.to(out.dtype))


def _reference(h: torch.Tensor, head: torch.nn.Linear, g: torch.Tensor, cap: float | None):
    """Float64 logits' gradients of the same head."""
    h64 = h.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in head.parameters()]
    out = torch.nn.functional.linear(h64, *p64)
    if cap is not None:
        out = torch.tanh(out / cap) * cap
    return torch.autograd.grad(out, [h64, *p64], g.double())


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("rows", [7, 10, 50, 64], ids=["ragged", "even", "whole", "over"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("cap", [None, 5.0], ids=["plain", "softcapped"])
def test_blocks_give_autocasts_values(monkeypatch, rows: int, bias: bool, cap: float | None):
    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", rows * E)
    torch.manual_seed(rows + 100 * bias)
    lin = torch.nn.Linear(E, V, bias=bias)
    head = lin if cap is None else SoftcappedHead(lin, cap)
    h = torch.randn(K, E, requires_grad=True)
    g = torch.randn(K, V)
    with bf16_autocast():
        want = head(h)
        with Casts(rows_not=K) as casts:
            got = cast_head.head_logits(head, h)
            g_got = _grads(got, h, lin, g)
    g_want = _grads(want, h, lin, g)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    assert casts.largest == min(rows, V) and casts.most_alive <= min(rows, V)
    ref = _reference(h, lin, g, cap)
    assert g_got[0].dtype == torch.float32
    assert _rel(g_got[0], ref[0]) <= _rel(g_want[0], ref[0])  # the input's: summed in float32
    assert torch.equal(g_got[1], g_want[1])  # the weight's: autocast's bf16 product
    if bias:
        assert _rel(g_got[2], ref[2]) <= _rel(g_want[2], ref[2])


def test_autocast_alone_casts_the_whole_weight() -> None:
    """What the blocks avoid, seen by the same probe (so the probe can fail)."""
    lin = torch.nn.Linear(E, V, bias=False)
    h = torch.randn(K, E, requires_grad=True)
    with bf16_autocast(), Casts(rows_not=K) as casts:
        lin(h).sum().backward()
    assert casts.largest == V


def test_other_heads_run_as_they_are() -> None:
    """No autocast, float64, an input of more than two dimensions, a non-Linear head: the head's
    own call, bit for bit."""
    lin = torch.nn.Linear(E, V)
    h = torch.randn(K, E)
    assert torch.equal(cast_head.head_logits(lin, h), lin(h))
    lin64 = torch.nn.Linear(E, V, dtype=torch.float64)
    with bf16_autocast():
        assert not cast_head._blockable(lin64, h.double(), torch.bfloat16)
        assert not cast_head._blockable(lin, h[None], torch.bfloat16)
        assert not cast_head._blockable(torch.nn.Sequential(lin), h, torch.bfloat16)
        assert not cast_head._blockable(lin, h, torch.float32)
        assert cast_head._blockable(lin, h, torch.bfloat16)
        assert cast_head._blockable(lin, h.bfloat16(), torch.bfloat16)
        seq = torch.nn.Sequential(lin)
        assert torch.equal(cast_head.head_logits(seq, h), seq(h))


def test_float32_sums_of_half_products() -> None:
    """``accumulate`` adds ``a @ b`` to a float32 sum: on this CPU through float32 copies, which
    the product of the same bf16 values in float64 matches to float32 rounding."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 40, generator=g).bfloat16()
    b = torch.randn(40, 5, generator=g).bfloat16()
    acc = torch.ones(6, 5)
    cast_head.accumulate(acc, a, b)
    want = 1 + a.double() @ b.double()
    assert _rel(acc, want) < 1e-6
    assert cast_head._has_float32_output("cpu", torch.bfloat16) in (True, False)


def _batch():
    import numpy as np

    rng = np.random.default_rng(5)
    groups = [random_group(rng, n_seq=5, roots=1) for _ in range(2)]
    return TreeBatch.from_trees([build_tree(gr).to_row() for gr in groups], norm="token-mean")


def _model_grads(model, batch, cfg, autocast: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    if autocast:
        with bf16_autocast():
            out = loss_with_config(model, batch, cfg, attn="dense")
    else:
        out = loss_with_config(model, batch, cfg, attn="dense")
    out.loss.backward()
    return {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}


def _err(g: dict, ref: dict) -> float:
    num = sum(float(((g[n] - ref[n]) ** 2).sum()) for n in ref)
    return (num / sum(float((ref[n] ** 2).sum()) for n in ref)) ** 0.5


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_model_loss_under_autocast(monkeypatch, tied: bool) -> None:
    """A tiny Qwen3's SFT gradients under bf16 autocast, the head in chunks of 8 rows under
    checkpointing and blocks of 96 vocabulary rows: within 1.25x of autocast's whole-weight
    error against float64 (issue 24's bar for bf16 changes), and within 2.5%."""
    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", 96 * 64)
    model = load_model("tiny-qwen3", vocab_size=512, attn="dense", seed=5)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
        assert model.lm_head.weight is model.model.embed_tokens.weight
    batch = _batch()
    cfg = LossConfig(loss="sft", chunk=8)
    assert batch.targets().pred.numel() > cfg.chunk  # several checkpointed head chunks
    blocked = _model_grads(model, batch, cfg, autocast=True)
    monkeypatch.setattr(cast_head, "_blockable", lambda *a: False)
    whole = _model_grads(model, batch, cfg, autocast=True)
    ref = _model_grads(model.double(), batch, cfg, autocast=False)
    err, err_whole = _err(blocked, ref), _err(whole, ref)
    assert err <= 1.25 * err_whole and err < 0.025, (err, err_whole)
