"""Trees of one micro-batch merged into one forest (issue 29): exactly the loss and gradients of
the trees laid out one by one, and of every sequence run alone.

Random groups are given shared openings (a common "system prompt", a longer common "policy" for
some, none for one), so the merged forest shares roots and splits nodes inside them. Tolerances are
the project's: 1e-5 relative in float32, 1e-10 in float64.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_rl import model_of  # noqa: E402  (float64 with float64 norms: that module's doc)
from trainer_fixtures import VOCAB, random_group, rows_of, tiny  # noqa: E402

from treeprep.trainer import TreeBatch, tree_loss, verify_gradients  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

LOSSES = ["sft", "ppo", "grpo", "gspo"]
NORMS = ["sum", "sequence-mean", "token-mean", "trajectory-mean"]


def shared_rows(seed: int, n_trees: int = 4, ref: bool = False) -> list[dict]:
    """``n_trees`` groups; all but the last open with the same tokens, the first two with a longer
    common opening (trained on 6 of its tokens, so trees share targets); the last shares
    nothing."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, 9)
    policy = np.concatenate([system, rng.integers(0, VOCAB, 5)])
    rows = []
    for g in range(n_trees):
        opening = policy if g < 2 else system if g < n_trees - 1 else np.zeros(0, dtype=np.int64)
        seqs = []
        for s in random_group(rng, n_seq=4, roots=1 + g % 2, max_suffix=6, ref=ref):
            k = len(opening)
            spans = [(a + k, b + k) for a, b in s.loss_spans if b > a]
            lp, rlp = s.logprobs, s.ref_logprobs
            if g < 2:  # trained inside the shared opening
                spans = [(3, 9), *spans]
                lp = None if lp is None else np.concatenate([-np.arange(1, 7) / 7, lp])
                rlp = None if rlp is None else np.concatenate([-np.arange(1, 7) / 5, rlp])
            toks = np.concatenate([opening, s.tokens]).astype(np.int64)
            seqs.append(
                dataclasses.replace(
                    s, group_id=f"g{g}", tokens=toks, loss_spans=spans, logprobs=lp,
                    ref_logprobs=rlp,
                )
            )  # fmt: skip
        rows.extend(rows_of(build_tree(seqs)))
    return rows


def _grads(model, batch, loss):
    model.zero_grad(set_to_none=True)
    kw = {"kl_coef": 0.05, "entropy_coef": 0.01} if loss == "ppo" else {}
    out = tree_loss(model, batch, loss=loss, attn="dense", clip_eps=0.1, **kw)
    out.loss.backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return float(out.loss.detach()), g.double()


def test_merged_batch_feeds_shared_openings_once() -> None:
    rows = shared_rows(1)
    plain = TreeBatch.from_trees(rows)
    merged = TreeBatch.from_trees(rows, share_prefixes=True)
    assert merged.num_tokens <= plain.num_tokens - 2 * 9 - 5  # 3 copies of 9, 1 of 5 saved
    assert merged.tokens_linear == plain.tokens_linear
    assert merged.num_sequences == plain.num_sequences
    assert torch.equal(merged.seq_tree, plain.seq_tree)
    assert torch.equal(merged.seq_coef, plain.seq_coef)
    # one target shared across trees carries the sum of the trees' weights
    assert float(merged.weight.sum()) == pytest.approx(float(plain.weight.sum()), rel=1e-12)
    assert merged.num_targets < plain.num_targets


def test_trees_sharing_nothing_lay_out_as_before() -> None:
    rows = shared_rows(2, n_trees=1) + shared_rows(3, n_trees=1)
    plain = TreeBatch.from_trees(rows)
    merged = TreeBatch.from_trees(rows, share_prefixes=True)
    for f in ("input_ids", "position_ids", "node_start", "node_parent", "node_last", "prev"):
        assert torch.equal(getattr(plain, f), getattr(merged, f)), f
    assert torch.equal(plain.weight, merged.weight)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("norm", NORMS)
def test_merged_gradients_equal_linear(loss: str, norm: str) -> None:
    """Against every sequence run alone (the linear layout: plain transformers per sequence)."""
    kw = {"kl_coef": 0.05, "entropy_coef": 0.01} if loss == "ppo" else {}
    rows = shared_rows(11, ref=True)
    rep = verify_gradients(
        tiny(), rows, loss=loss, norm=norm, attn="dense", share_prefixes=True, **kw
    )
    assert rep.tokens_tree < TreeBatch.from_trees(rows).num_tokens
    assert rep.ok and rep.worst_rel < 1e-5 and rep.loss_rel < 1e-5, rep.to_dict()


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("norm", NORMS)
def test_merged_gradients_equal_unmerged(loss: str, norm: str) -> None:
    """Merged against the trees one by one: 1e-5 in float32, 1e-10 in float64, same totals."""
    rows = shared_rows(21, ref=True)
    totals = {"total_tokens": 40.0, "total_sequences": 9.0, "total_trajectories": 6.0}
    kw = totals if norm != "sum" else {}
    for m, rtol in ((model_of(torch.float32), 1e-5), (model_of(torch.float64), 1e-10)):
        plain = TreeBatch.from_trees(rows, norm=norm, **kw)
        merged = TreeBatch.from_trees(rows, norm=norm, share_prefixes=True, **kw)
        lp, gp = _grads(m, plain, loss)
        lm, gm = _grads(m, merged, loss)
        assert ((gm - gp).norm() / gp.norm()).item() < rtol
        assert abs(lm - lp) <= rtol * max(abs(lp), 1e-3)


def test_online_step_merges_groups_with_the_same_loss() -> None:
    """``build_step`` (item 5): GRPO groups with one system prompt, merged in one micro-batch."""
    from treeprep.trainer.online import Rollout, build_step

    rng = np.random.default_rng(7)
    system = rng.integers(0, VOCAB, 20).tolist()
    rollouts = []
    for g in range(3):
        task = rng.integers(0, VOCAB, 5).tolist()
        for k in range(3):
            out = rng.integers(0, VOCAB, 6).tolist()
            ids = system + task + out
            mask = [0] * (len(ids) - 6) + [1] * 6
            lp = (-rng.random(len(ids))).tolist()
            rollouts.append(Rollout(ids, mask, lp, reward=float(k), group_id=f"g{g}"))
    model = tiny()
    kw = {"norm": "sequence-mean", "budget": 4096}
    plain = build_step(rollouts, **kw, share_prefixes=False)
    merged = build_step(rollouts, **kw)
    assert len(merged.micro_batches) == len(plain.micro_batches) == 1
    assert merged.micro_batches[0].num_tokens == plain.micro_batches[0].num_tokens - 2 * 20
    _, gp = _grads(model, plain.micro_batches[0], "grpo")
    _, gm = _grads(model, merged.micro_batches[0], "grpo")
    assert ((gm - gp).norm() / gp.norm()).item() < 1e-5
