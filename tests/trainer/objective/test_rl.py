"""Issue 16: RL as agent trainers run it, checked against a per-sequence reference written here.

The reference runs plain transformers (SDPA) on one sequence at a time and applies the textbook
per-token objective with its own advantage code (rewards normalized over a group's trajectories),
its own normalizers and its own KL and entropy terms; treeprep's tree loss must give the same
gradients: 1e-5 relative in float32, 1e-10 in float64.

transformers' RMSNorm computes in float32 whatever the weights' dtype (``hidden_states.to(
torch.float32)``), which caps any float64 run of its models near 1e-8 (tree against linear as
well as against the reference). The float64 tests therefore give the tiny model a norm with the
same formula kept in float64 (:func:`_float64_norms`), used by the tree and the reference alike;
everything treeprep computes (coefficients, logits, loss, hand-off accumulators) is float64.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import VOCAB, random_group  # noqa: E402

from treeprep.errors import TreeprepError  # noqa: E402
from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trainer import TreeBatch, load_model, tree_loss  # noqa: E402
from treeprep.trainer.batch.advantages import normalize  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig  # noqa: E402
from treeprep.trainer.parts import run_parts  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

_MODELS: dict[torch.dtype, torch.nn.Module] = {}


def _float64_norms(model: torch.nn.Module) -> None:
    """RMSNorm's formula without the float32 round trip (module docstring)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        var = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(var + self.variance_epsilon))

    for mod in model.modules():
        if type(mod).__name__.endswith("RMSNorm"):
            mod.forward = forward.__get__(mod)  # type: ignore[method-assign]


def model_of(dtype: torch.dtype) -> torch.nn.Module:
    if dtype not in _MODELS:
        m = load_model("tiny-qwen3", vocab_size=VOCAB, attn="dense", seed=3, dtype=dtype)
        if dtype == torch.float64:
            _float64_norms(m)
        _MODELS[dtype] = m
    return _MODELS[dtype]


# ---- the reference ---------------------------------------------------------------------------


def ref_advantages(groups: list[list[Sequence]], adv_norm: str) -> list[list[float]]:
    out = []
    for seqs in groups:
        if all(s.advantage is not None for s in seqs):
            out.append([float(s.advantage) for s in seqs])  # type: ignore[arg-type]
            continue
        names = list(dict.fromkeys(s.trajectory_id for s in seqs))
        r = np.array([next(s.reward for s in seqs if s.trajectory_id == n) for n in names])
        g, m = len(r), r.mean()
        if adv_norm == "grpo":
            a = (r - m) / (r.std() + 1e-6) if g > 1 else np.zeros(g)
        elif adv_norm == "dr-grpo":
            a = r - m if g > 1 else np.zeros(g)
        elif adv_norm == "rloo":
            a = np.array([r[i] - np.delete(r, i).mean() for i in range(g)]) if g > 1 else 0 * r
        else:
            a = r
        by = dict(zip(names, a, strict=True))
        out.append([float(by[s.trajectory_id]) for s in seqs])
    return out


def trained_positions(s: Sequence) -> np.ndarray:
    pos = np.concatenate([np.arange(a, b) for a, b in s.loss_spans] or [np.zeros(0, int)])
    return pos.astype(np.int64)


def reference_grads(
    model, groups, *, loss, norm, adv_norm, cfg: LossConfig
) -> tuple[float, dict[str, torch.Tensor]]:
    """sum over sequences of c_s sum_t l_s(t), one sequence at a time through plain SDPA."""
    advs = ref_advantages(groups, adv_norm)
    seqs = [(s, a) for g, aa in zip(groups, advs, strict=True) for s, a in zip(g, aa, strict=True)]
    n_s = [int((trained_positions(s) > 0).sum()) for s, _ in seqs]
    big_n = sum(n_s)
    big_s = sum(1 for n in n_s if n)
    traj_n: dict[tuple[int, str], int] = {}
    k = 0
    for gi, g in enumerate(groups):
        for s in g:
            traj_n[(gi, s.trajectory_id)] = traj_n.get((gi, s.trajectory_id), 0) + n_s[k]
            k += 1
    big_tr = sum(1 for v in traj_n.values() if v)
    traj_of = [(gi, s.trajectory_id) for gi, g in enumerate(groups) for s in g]
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    lo, hi = 1 - cfg.clip_eps, 1 + eps_high
    dtype = next(model.parameters()).dtype
    model.zero_grad(set_to_none=True)
    model.set_attn_implementation("sdpa")
    total = 0.0
    try:
        for i, ((s, adv), n) in enumerate(zip(seqs, n_s, strict=True)):
            if n == 0:
                continue
            c = {
                "sum": 1.0,
                "token-mean": 1.0 / big_n,
                "sequence-mean": 1.0 / (big_s * n),
                "trajectory-mean": 1.0 / (big_tr * traj_n[traj_of[i]]),
            }[norm]
            ids = torch.as_tensor(s.tokens, dtype=torch.long)[None]
            logits = model(input_ids=ids).logits[0]
            if logits.dtype != torch.float64:
                logits = logits.float()
            logp_all = torch.log_softmax(logits, -1)
            pos = trained_positions(s)
            keep = pos > 0
            p = torch.as_tensor(pos[keep])
            lp = logp_all[p - 1].gather(1, ids[0, p][:, None])[:, 0]
            old = (
                lp.detach()
                if s.logprobs is None
                else torch.as_tensor(s.logprobs[keep], dtype=lp.dtype)
            )
            if loss == "sft":
                per = -lp
            elif loss == "gspo":
                ratio = torch.exp((lp - old).sum() / n)
                per_seq = -torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv) * n
                per = per_seq / n * torch.ones_like(lp)
            else:
                r = torch.exp(lp - old)
                per = -torch.minimum(r * adv, r.clamp(lo, hi) * adv)
            if cfg.kl_coef:
                ref = torch.as_tensor(s.ref_logprobs[keep], dtype=lp.dtype)
                kl = lp - ref if cfg.kl_estimator == "k1" else torch.exp(ref - lp) - (ref - lp) - 1
                per = per + cfg.kl_coef * kl
            if cfg.entropy_coef:
                rows = logp_all[p - 1]
                per = per - cfg.entropy_coef * -(rows.exp() * rows).sum(-1)
            term = c * per.sum()
            term.backward()
            total += float(term.detach())
    finally:
        model.set_attn_implementation("treeprep")
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert dtype == next(model.parameters()).dtype
    return total, grads


def tree_grads(model, groups, *, loss, norm, adv_norm, cfg, budget=None):
    rows = [build_tree(g).to_row() for g in groups]
    model.zero_grad(set_to_none=True)
    b = TreeBatch.from_trees(rows, norm=norm, adv_norm=adv_norm)
    full = LossConfig(loss, **{k: getattr(cfg, k) for k in
                               ("clip_eps", "clip_eps_high", "kl_coef", "entropy_coef",
                                "kl_estimator")})  # fmt: skip
    if budget is None:
        out = tree_loss(model, b, loss=loss, attn="dense", clip_eps=cfg.clip_eps,
                        clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef,
                        entropy_coef=cfg.entropy_coef, kl_estimator=cfg.kl_estimator)  # fmt: skip
        out.loss.backward()
        total = float(out.loss.detach())
    else:
        total = 0.0
        n_tok, n_seq, n_tr = b.totals()
        for row in rows:
            one = TreeBatch.from_trees([row], norm=norm, adv_norm=adv_norm, total_tokens=n_tok,
                                       total_sequences=n_seq, total_trajectories=n_tr)  # fmt: skip
            total += float(run_parts(model, one, full, budget=budget, attn="dense").loss)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return total, grads


def rel_diff(a: dict, b: dict) -> float:
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in b)
    den = sum(float((b[k].double() ** 2).sum()) for k in b)
    assert set(a) == set(b)
    return (num / den) ** 0.5


def groups_of(seed: int, *, advantages: bool = False) -> list[list[Sequence]]:
    rng = np.random.default_rng(seed)
    out = []
    for gi in range(2):
        seqs = random_group(rng, n_seq=7, roots=1 + gi, advantages=advantages, ref=True)
        for s in seqs:
            s.group_id = f"g{gi}"
        out.append(seqs)
    return out


CASES = [
    # loss, norm, adv_norm, knobs
    ("grpo", "token-mean", "grpo", {"clip_eps": 0.1, "clip_eps_high": 0.3}),
    ("grpo", "trajectory-mean", "rloo", {"clip_eps": 0.2, "kl_coef": 0.1, "kl_estimator": "k1"}),
    ("ppo", "sequence-mean", "dr-grpo", {"kl_coef": 0.05, "kl_estimator": "k3"}),
    ("grpo", "sum", "none", {"entropy_coef": 0.02, "clip_eps_high": 0.28}),
    ("gspo", "trajectory-mean", "grpo", {"clip_eps": 0.05, "kl_coef": 0.1, "entropy_coef": 0.01}),
    ("sft", "trajectory-mean", "grpo", {}),
]


@pytest.mark.parametrize(("loss", "norm", "adv_norm", "knobs"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tree_equals_per_sequence_reference(loss, norm, adv_norm, knobs, dtype) -> None:
    model = model_of(dtype)
    groups = groups_of(7)
    cfg = LossConfig(loss, **knobs)
    kw = {"loss": loss, "norm": norm, "adv_norm": adv_norm, "cfg": cfg}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr, gr = reference_grads(model, groups, **kw)
    lt, gt = tree_grads(model, groups, **kw)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert abs(lt - lr) <= tol * max(abs(lr), 1e-12) + (1e-15 if dtype == torch.float64 else 0)
    assert rel_diff(gt, gr) < tol, rel_diff(gt, gr)


@pytest.mark.parametrize(("loss", "norm", "adv_norm", "knobs"), [CASES[1], CASES[3], CASES[4]])
def test_handoff_parts_equal_per_sequence_reference_float64(loss, norm, adv_norm, knobs) -> None:
    model = model_of(torch.float64)
    groups = groups_of(8)
    cfg = LossConfig(loss, **knobs)
    kw = {"loss": loss, "norm": norm, "adv_norm": adv_norm, "cfg": cfg}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr, gr = reference_grads(model, groups, **kw)
    lt, gt = tree_grads(model, groups, budget=16, **kw)
    assert abs(lt - lr) <= 1e-10 * abs(lr)
    assert rel_diff(gt, gr) < 1e-10


def test_clipping_is_active_in_the_cases() -> None:
    """The clip terms are exercised: some ratios leave [1 - eps, 1 + eps_high]."""
    b = TreeBatch.from_trees([build_tree(g).to_row() for g in groups_of(7)], norm="token-mean")
    out = tree_loss(model_of(torch.float32), b, loss="grpo", attn="dense", clip_eps=0.1,
                    clip_eps_high=0.3)  # fmt: skip
    assert 0 < float(out.metrics["clip_count"]) < float(out.metrics["units"])


def _traj_seq(traj: str, toks: list[int], reward: float) -> Sequence:
    return Sequence("g", np.array(toks), [(2, len(toks))], reward=reward, trajectory_id=traj)


def test_group_advantages_are_per_trajectory_not_per_sequence() -> None:
    """The issue's example: rewards [1, 0, 0, 0], the winner made two calls."""
    seqs = [
        _traj_seq("a", [1, 2, 3, 4], 1.0),
        _traj_seq("a", [1, 2, 3, 4, 9, 5, 6], 1.0),  # the winner's second call
        _traj_seq("b", [1, 2, 7, 8], 0.0),
        _traj_seq("c", [1, 2, 9, 9], 0.0),
        _traj_seq("d", [1, 2, 5, 5], 0.0),
    ]
    row = build_tree(seqs).to_row()
    got = {
        n: TreeBatch.from_trees([row], adv_norm=n).seq_advantage.numpy()
        for n in ("grpo", "dr-grpo", "rloo", "none")
    }
    order = row["seq_trajectory_id"]
    want = {
        "grpo": {"a": 0.75 / np.sqrt(0.1875) - 0, "b": -0.25 / np.sqrt(0.1875)},
        "dr-grpo": {"a": 0.75, "b": -0.25},
        "rloo": {"a": 1.0, "b": -1 / 3},
        "none": {"a": 1.0, "b": 0.0},
    }
    for n, w in want.items():
        for s, t in enumerate(order):
            expect = w["a"] if t == "a" else w["b"]
            assert got[n][s] == pytest.approx(expect, rel=1e-5), (n, t)
    assert got["grpo"][order.index("a")] == pytest.approx(1.732, abs=1e-3)
    assert got["grpo"][order.index("b")] == pytest.approx(-0.577, abs=1e-3)
    assert np.allclose(normalize(np.array([5.0]), "grpo"), [0.0])


def test_conflicting_rewards_in_a_trajectory_refuse_rl_but_not_sft() -> None:
    seqs = [_traj_seq("a", [1, 2, 3, 4], 1.0), _traj_seq("a", [1, 2, 3, 5], 0.0)]
    b = TreeBatch.from_trees([build_tree(seqs).to_row()])
    model = model_of(torch.float32)
    tree_loss(model, b, loss="sft", attn="dense")
    with pytest.raises(TreeprepError, match="trajectory 'a' has calls with rewards"):
        tree_loss(model, b, loss="grpo", attn="dense")


def test_kl_without_reference_logprobs_is_refused() -> None:
    rng = np.random.default_rng(1)
    seqs = random_group(rng, n_seq=4, ref=False)
    b = TreeBatch.from_trees([build_tree(seqs).to_row()])
    with pytest.raises(TreeprepError, match="reference log-probs"):
        tree_loss(model_of(torch.float32), b, loss="ppo", attn="dense", kl_coef=0.1)


def test_trajectory_mean_weights_by_hand() -> None:
    # trajectory a: two calls with 2 + 3 trained targets; trajectory b: one call with 1
    s1 = Sequence("g", np.array([1, 2, 3]), [(1, 3)], trajectory_id="a")
    s2 = Sequence("g", np.array([1, 2, 3, 4, 5, 6]), [(3, 6)], trajectory_id="a")
    s3 = Sequence("g", np.array([1, 7]), [(1, 2)], trajectory_id="b")
    b = TreeBatch.from_trees([build_tree([s1, s2, s3]).to_row()], norm="trajectory-mean")
    # c = 1 / (Tr * n_traj): Tr = 2, n_a = 5, n_b = 1
    w = dict(zip(b.target_index.tolist(), b.weight.tolist(), strict=True))
    assert w[b.target_index.tolist()[0]] == pytest.approx(1 / 10)
    assert sorted(w.values()) == pytest.approx(sorted([0.1] * 5 + [0.5]))
    assert sum(w.values()) == pytest.approx(1.0)
    assert b.weight.dtype == torch.float64
