"""The loss's log-probs and entropies, a block of rows at a time
(treeprep.trainer.objective.target_logp).

Against torch's own ``log_softmax`` chain (the values bit for bit, the gradients to float
rounding), against numerical derivatives in float64 (``gradcheck``), and its memory against the
memory model's ``lm_head_bytes``, counted exactly with the live-bytes tracker.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from treeprep.memory import lm_head_bytes  # noqa: E402
from treeprep.schemas import parts  # noqa: E402
from treeprep.trainer.objective import target_logp  # noqa: E402
from treeprep.trainer.objective.target_logp import TargetLogProb, target_logprobs  # noqa: E402
from treeprep.trainer.run.memtrack import LiveBytes  # noqa: E402


def _reference(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the loss computed before: one log-softmax of the whole chunk, through autograd."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    ls = torch.log_softmax(x, dim=-1)
    return ls.gather(1, target[:, None])[:, 0], -(ls.exp() * ls).sum(-1)


@pytest.mark.parametrize("block", [20, 1 << 24])
def test_gradcheck_float64(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "HEAD_BLOCK_ELEMENTS", block)  # 20: blocks of 2 rows
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    t = torch.randint(0, 7, (5,), generator=gen)
    assert torch.autograd.gradcheck(lambda a: TargetLogProb.apply(a, t), (x,))
    assert torch.autograd.gradcheck(lambda a: TargetLogProb.apply(a, t)[0], (x,))
    assert torch.autograd.gradcheck(lambda a: TargetLogProb.apply(a, t)[1], (x,))


CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
)


@pytest.mark.parametrize(
    ("dtype", "one_pass"), [("float32", None), ("bfloat16", None), ("bfloat16", True)]
)
@pytest.mark.parametrize("block", [3000, 1 << 24])
@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_equals_the_log_softmax_chain(
    dtype: str,
    one_pass: bool | None,
    block: int,
    entropy: bool,
    device: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(one_pass: the casting ops CUDA runs in one pass, here on the CPU too)"""
    monkeypatch.setattr(parts, "HEAD_BLOCK_ELEMENTS", block)  # 3000: blocks of 3 rows
    if one_pass is not None:
        monkeypatch.setattr(target_logp, "_one_pass", lambda t: one_pass)
    gen = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(64, 1000, generator=gen)).to(getattr(torch, dtype)).to(device)
    t = torch.randint(0, 1000, (64,), generator=gen).to(device)
    w = torch.randn(64, generator=gen).to(device)
    v = torch.randn(64, generator=gen).to(device)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    lp, ent = target_logprobs(a, t, entropy)
    lp_ref, ent_ref = _reference(b, t)
    if device == "cpu":  # the same row-wise kernels: bit for bit
        assert torch.equal(lp, lp_ref) and torch.equal(ent, ent_ref)
    else:  # CUDA may pick its reduction's layout by the number of rows
        torch.testing.assert_close(lp, lp_ref, rtol=1e-6, atol=0.0)
        torch.testing.assert_close(ent, ent_ref, rtol=1e-6, atol=0.0)
    assert ent.requires_grad is entropy
    loss = (w * lp).sum() + ((v * ent).sum() if entropy else 0.0)
    loss_ref = (w * lp_ref).sum() + ((v * ent_ref).sum() if entropy else 0.0)
    loss.backward()
    loss_ref.backward()
    assert a.grad is not None and b.grad is not None and a.grad.dtype == x.dtype
    rel = (a.grad.double() - b.grad.double()).norm() / b.grad.double().norm()
    assert rel < (1e-6 if dtype == "float32" else 1e-2), rel  # bf16: the gradients' own rounding


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_memory_is_the_models_and_a_quarter_of_the_chain(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """256 rows of a 32,768-entry vocabulary in blocks of 32 rows: the peak beyond the logits is
    the memory model's ``lm_head_bytes`` less the logits; the log-softmax chain holds 16 bytes
    per row and vocabulary entry."""
    monkeypatch.setattr(parts, "HEAD_BLOCK_ELEMENTS", 1 << 20)
    k, vocab = 256, 32768
    dt = getattr(torch, dtype)
    peaks = {}
    for name, fn in [("blocks", lambda a, t: target_logprobs(a, t, False)), ("chain", _reference)]:
        a = torch.randn(k, vocab, dtype=dt).requires_grad_(True)
        t = torch.randint(0, vocab, (k,))
        with LiveBytes() as mem:
            mem.track(a)
            lp, _ = fn(a, t)
            lp.sum().backward()
        peaks[name] = mem.peak
    c = torch.finfo(dt).bits // 8
    model = lm_head_bytes(vocab, k, c)
    assert abs(peaks["blocks"] - model) <= 0.01 * model, (peaks, model)
    assert peaks["chain"] >= k * vocab * 16
    print(f"{dtype}: blocks {peaks['blocks'] / (k * vocab):.2f} B, chain "
          f"{peaks['chain'] / (k * vocab):.2f} B per row and vocabulary entry")  # fmt: skip
