"""``verify`` checks the objective, not only the layouts (issue 54, item 2).

Both of verify's sides used to share the objective's code, so a wrong sequence-mean weight
passed (under 1e-6) where an independent reference saw 0.34. The per-sequence side is now
:mod:`treeprep.trainer.reference`, written from the definitions: each sequence alone through the
model's own forward. Mutations of the objective's normalizers and advantages must fail it; a
tree-mask or part-prefix off-by-one still does; the unmutated code passes at 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import group_tree, rows_of, tiny  # noqa: E402

from treeprep.trainer.attention import mask as mask_mod  # noqa: E402
from treeprep.trainer.batch import assembly  # noqa: E402
from treeprep.trainer.reference import reference_sequences  # noqa: E402
from treeprep.trainer.verify import verify_gradients  # noqa: E402

_coefficients = assembly._coefficients


def _rows() -> list[dict]:
    return rows_of(group_tree(21, n_seq=6, roots=2, ref=True), group_tree(22, n_seq=5, ref=True))


def _wrong_sequence_mean(norm, n_s, n_traj, big_n, big_s, big_tr):  # noqa: ANN001, ANN202
    """The sequence mean without each sequence's 1 / n_s: wrong the same way in every layout."""
    if norm == "sequence-mean":
        return np.where(n_s > 0, 1.0 / big_s, 0.0)
    return _coefficients(norm, n_s, n_traj, big_n, big_s, big_tr)


@pytest.mark.parametrize(("loss", "norm"), [("sft", "sequence-mean"), ("grpo", "sequence-mean")])
def test_a_wrong_normalizer_fails_verify(
    monkeypatch: pytest.MonkeyPatch, loss: str, norm: str
) -> None:
    rows = _rows()
    good = verify_gradients(tiny(), rows, loss=loss, norm=norm, attn="dense")
    assert good.ok and good.worst_rel < 1e-5 and good.loss_rel < 1e-5, good.to_dict()
    monkeypatch.setattr(assembly, "_coefficients", _wrong_sequence_mean)
    bad = verify_gradients(tiny(), rows, loss=loss, norm=norm, attn="dense")
    assert not bad.ok and bad.worst_rel > 1e-2, bad.to_dict()
    assert "treeprep is worse than the reference" in bad.reason, bad.reason


def test_a_wrong_advantage_split_fails_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clipped loss's negative-advantage sum dropped: the restored PPO coefficients are wrong
    while the batch's own layouts would still agree with each other."""
    units = assembly._units

    def no_negative(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        u = units(*a, **kw)
        u.adv_neg = np.zeros_like(u.adv_neg)
        return u

    monkeypatch.setattr(assembly, "_units", no_negative)
    rep = verify_gradients(tiny(), _rows(), loss="ppo", norm="token-mean", attn="dense")
    assert not rep.ok and rep.worst_rel > 1e-3 and rep.loss_rel > 1e-2, rep.to_dict()


def test_a_tree_mask_off_by_one_fails_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query sees the subtree just before its own node's (a sibling's tokens leak)."""

    def leaky(q_node, q_index, k_node, k_last, k_index, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        return visible(q_node, q_index, k_node, k_last + 1, k_index, *a, **kw)

    visible = mask_mod.visible
    monkeypatch.setattr(mask_mod, "visible", leaky)
    rep = verify_gradients(tiny(), _rows(), loss="sft", norm="sum", attn="dense")
    assert not rep.ok and rep.worst_rel > 1e-3, rep.to_dict()


def test_a_part_prefix_off_by_one_fails_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chain of a hand-off part sees one prefix row fewer than it should."""
    build = mask_mod.build_chains

    def short(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        c = build(*a, **kw)
        return mask_mod.Chains(c.start, c.end, c.segments, [max(p - 1, 0) for p in c.prefix])

    rows = _rows()
    good = verify_gradients(tiny(), rows, loss="sft", norm="sum", attn="nodes", budget=7)
    assert good.ok and good.worst_rel < 1e-5, good.to_dict()
    monkeypatch.setattr(mask_mod, "build_chains", short)
    bad = verify_gradients(tiny(), rows, loss="sft", norm="sum", attn="nodes", budget=7)
    assert not bad.ok and bad.worst_rel > 1e-3, bad.to_dict()


def test_the_reference_normalizers_follow_the_definitions() -> None:
    """c_s of every norm, by hand, on a tree of known lengths and copies."""
    rows = _rows()
    seqs = reference_sequences(rows, norm="sum", adv_norm="grpo", rl=False)
    n = np.array([len(s.depths) for s in seqs], dtype=float)
    cnt = np.array([s.count for s in seqs], dtype=float)
    # duplicates merged by the trie are counted; a sequence without a target counts in no mean
    assert (cnt > 1).any() and (n == 0).any()
    with np.errstate(divide="ignore"):
        seq_mean = np.where(n > 0, 1.0 / (cnt[n > 0].sum() * n), 0.0)
    for norm, want in [
        ("sum", np.ones(len(n))),
        ("token-mean", np.full(len(n), 1.0 / (cnt * n).sum())),
        ("sequence-mean", seq_mean),
    ]:
        got = [s.coef for s in reference_sequences(rows, norm=norm, adv_norm="grpo", rl=False)]
        np.testing.assert_allclose(got, want, rtol=1e-15)
    # trajectory-mean: each trajectory's coefficients times its targets sum to 1 / Tr
    tm = reference_sequences(rows, norm="trajectory-mean", adv_norm="grpo", rl=False)
    total = sum(s.coef * s.count * len(s.depths) for s in tm)
    assert total == pytest.approx(1.0)
