"""Issue 12 item 6: Liger's fused linear cross-entropy against the chunked LM head.

The fused path (:mod:`treeprep.trainer.objective.fused_head`) must give the chunked head's
per-target
log-probs and, for an arbitrary per-target upstream gradient, its gradients of the hidden states,
the head's weight and bias: 1e-5 relative in float32. Then the same through treeprep's SFT and PPO
losses (restored weights, clipped surrogate, KL against reference log-probs) on a tiny model.

Without a GPU the Liger kernels run under Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set for the whole session by ``tests/conftest.py``: Triton reads it when
first imported, which peft does long before this module), and the fused path's device list is
widened to ``cpu`` for the test. The module is skipped where liger-kernel
(the ``liger`` extra) is not installed. When to take the path is tested without Liger.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import random_group  # noqa: E402

from treeprep.trainer import TreeBatch, load_model  # noqa: E402
from treeprep.trainer.batch.targets import Targets  # noqa: E402
from treeprep.trainer.models.run import SoftcappedHead  # noqa: E402
from treeprep.trainer.objective import fused_head  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig, head_logprobs, loss_with_config  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

HAVE_LIGER = fused_head.liger_function() is not None
needs_liger = pytest.mark.skipif(not HAVE_LIGER, reason="liger-kernel (the liger extra) missing")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_an_installed_liger_keeps_the_per_row_backward() -> None:
    """A Liger release without ``token_grad_output`` would silently fall back to the chunked head
    (and skip every test below): when liger-kernel is installed, it must be the verified API."""
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel (the liger extra) missing")
    assert HAVE_LIGER, "liger-kernel lacks fused_linear_cross_entropy_forward(token_grad_output=)"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _targets(pred: torch.Tensor, token: torch.Tensor) -> Targets:
    """Only ``pred`` and ``token`` are read by :func:`head_logprobs`; the rest is empty."""
    rest = {f: torch.zeros(0) for f in Targets.__dataclass_fields__ if f not in ("pred", "token")}
    return Targets(pred=pred, token=token, **rest)


def _head_run(head, h, tgt, g, monkeypatch, fused: bool):
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", (DEV.type,) if fused else ())
    head.zero_grad(set_to_none=True)
    hh = h.detach().clone().requires_grad_(True)
    t = _targets(torch.arange(len(tgt), device=DEV), tgt)
    lp, ent = head_logprobs(head, hh, t, chunk=16)
    (g * lp).sum().backward()
    params = [p for p in (head.weight, head.bias) if p is not None and p.requires_grad]
    return lp.detach(), ent if ent is None else ent.detach(), [hh.grad] + [p.grad for p in params]


@needs_liger
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("k", [1, 37, 70])
def test_fused_logprobs_and_gradients_equal_chunked_head(monkeypatch, bias, k) -> None:
    gen = torch.Generator().manual_seed(k + 100 * bias)
    e, v = 24, 1000  # v > e: Liger splits the rows into several chunks
    head = torch.nn.Linear(e, v, bias=bias).to(DEV)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, e, generator=gen) * 0.7)
        if bias:
            head.bias.copy_(torch.randn(v, generator=gen))
    h = torch.randn(k, e, generator=gen).to(DEV)
    tgt = torch.randint(0, v, (k,), generator=gen).to(DEV)
    g = torch.randn(k, generator=gen, dtype=torch.float32).to(DEV)  # any per-target upstream
    lp_c, ent_c, gr_c = _head_run(head, h, tgt, g, monkeypatch, fused=False)
    lp_f, ent_f, gr_f = _head_run(head, h, tgt, g, monkeypatch, fused=True)
    assert ent_f is None and torch.isfinite(ent_c).all()
    assert rel(lp_f, lp_c) < 1e-5, rel(lp_f, lp_c)
    for a, b in zip(gr_f, gr_c, strict=True):
        assert rel(a, b) < 1e-5, rel(a, b)


@needs_liger
def test_fused_head_with_a_frozen_weight(monkeypatch) -> None:
    """An adapter run freezes the head: only the hidden states get a gradient."""
    gen = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(16, 300, bias=False).to(DEV).requires_grad_(False)
    h = torch.randn(21, 16, generator=gen).to(DEV)
    tgt = torch.randint(0, 300, (21,), generator=gen).to(DEV)
    g = torch.randn(21, generator=gen).to(DEV)
    lp_c, _, gr_c = _head_run(head, h, tgt, g, monkeypatch, fused=False)
    lp_f, ent_f, gr_f = _head_run(head, h, tgt, g, monkeypatch, fused=True)
    assert ent_f is None and head.weight.grad is None and len(gr_f) == 1
    assert rel(lp_f, lp_c) < 1e-5 and rel(gr_f[0], gr_c[0]) < 1e-5, rel(gr_f[0], gr_c[0])


def _batch(seed: int, norm: str) -> TreeBatch:
    rng = np.random.default_rng(seed)
    groups = []
    for gi in range(2):
        seqs = random_group(rng, n_seq=6, roots=1 + gi, ref=True)
        for s in seqs:
            s.group_id = f"g{gi}"
        groups.append(seqs)
    return TreeBatch.from_trees([build_tree(g).to_row() for g in groups], norm=norm, device=DEV)


def _loss_grads(model, batch, cfg):
    model.zero_grad(set_to_none=True)
    out = loss_with_config(model, batch, cfg, attn="dense")
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out, grads


CASES = [
    ("sft", "token-mean", {}),
    ("ppo", "sequence-mean", {"clip_eps": 0.1, "kl_coef": 0.05, "kl_estimator": "k3"}),
    ("grpo", "trajectory-mean", {"clip_eps_high": 0.3, "kl_coef": 0.1, "kl_estimator": "k1"}),
]


@needs_liger
@pytest.mark.parametrize(("loss", "norm", "knobs"), CASES)
def test_treeprep_losses_through_fused_head_equal_chunked(monkeypatch, loss, norm, knobs) -> None:
    model = load_model("tiny-qwen3", vocab_size=512, attn="dense", seed=5).to(DEV)
    batch = _batch(11, norm)
    cfg = LossConfig(loss, **knobs)  # type: ignore[arg-type]
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", ())
    ref, g_ref = _loss_grads(model, batch, cfg)
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", (DEV.type,))
    out, g_out = _loss_grads(model, batch, cfg)
    assert rel(out.token_logp.detach(), ref.token_logp.detach()) < 1e-5
    lo, lr = float(out.loss.detach()), float(ref.loss.detach())
    assert abs(lo - lr) <= 1e-5 * abs(lr)
    assert set(g_out) == set(g_ref)
    num = sum(float(((g_out[n].double() - g_ref[n].double()) ** 2).sum()) for n in g_ref)
    den = sum(float((g_ref[n].double() ** 2).sum()) for n in g_ref)
    assert (num / den) ** 0.5 < 1e-5, (num / den) ** 0.5
    assert g_ref["lm_head.weight"].norm() > 0
    assert "entropy_sum" not in out.metrics and torch.isfinite(ref.metrics["entropy_sum"])
    for k, v in ref.metrics.items():
        if k != "entropy_sum":
            assert torch.allclose(out.metrics[k], v, rtol=1e-5, atol=1e-7), k


def test_fused_path_only_where_it_is_exact(monkeypatch) -> None:
    """Every case outside the tested one runs the chunked head (Liger or not)."""
    monkeypatch.setattr(fused_head, "liger_function", lambda: object())
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", ("cpu",))
    head = torch.nn.Linear(8, 50)
    h = torch.randn(5, 8, requires_grad=True)
    assert fused_head.use_fused(head, h, False)
    assert not fused_head.use_fused(head, h, True)  # an entropy term needs its gradient
    assert not fused_head.use_fused(head, h[:0], False)
    assert not fused_head.use_fused(SoftcappedHead(head, 30.0), h, False)
    f64 = torch.nn.Linear(8, 50, dtype=torch.float64)
    assert not fused_head.use_fused(f64, h.double(), False)
    bf16 = torch.nn.Linear(8, 50, dtype=torch.bfloat16)
    assert not fused_head.use_fused(bf16, h.bfloat16(), False)
    with torch.no_grad():
        assert not fused_head.use_fused(head, h, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_head.use_fused(head, h, False)
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", ("cuda",))
    assert not fused_head.use_fused(head, h, False)
    monkeypatch.setattr(fused_head, "DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(fused_head, "liger_function", lambda: None)
    assert not fused_head.use_fused(head, h, False)
