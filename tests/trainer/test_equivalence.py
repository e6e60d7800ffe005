"""A tree trains exactly like its linearized sequences: logits per path, gradients per loss.

Tolerances are float32 rounding: path logits within 2e-6 absolute (measured about 3e-7), gradient
groups within 1e-5 relative L2 (measured about 5e-7), and a wrong weight on one shared token is
shown to land orders of magnitude above that.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from trainer_fixtures import group_tree, random_group, rows_of, tiny  # noqa: E402

from treeprep.modes import ATTN_FACTS  # noqa: E402
from treeprep.trainer import TreeBatch, tree_logits, tree_loss, verify_gradients  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

FAMILIES = ["tiny-qwen3", "tiny-llama", "tiny-qwen2", "tiny-qwen3-moe"]
#: every backend that runs its forward on CPU (the table's facts)
CPU_BACKENDS = [n for n, f in ATTN_FACTS.items() if "cpu" in f.devices + f.forward_devices]


def _path_positions(b: TreeBatch, tree, s: int, node_base: int = 0) -> torch.Tensor:
    nodes = tree.path_nodes(int(tree.seq_node[s]))
    return torch.cat(
        [
            torch.arange(
                int(b.node_start[n + node_base]),
                int(b.node_start[n + node_base]) + int(b.node_length[n + node_base]),
            )
            for n in nodes
        ]
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", CPU_BACKENDS)
def test_every_path_logits_equal_the_path_alone(family: str, attn: str) -> None:
    model = tiny(family)
    t1, t2 = group_tree(11, n_seq=6, roots=2), group_tree(12, n_seq=4)
    b = TreeBatch.from_trees(rows_of(t1, t2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logits = tree_logits(model, b, attn=attn)
        model.set_attn_implementation("sdpa")
        try:
            worst = 0.0
            for tree, base in ((t1, 0), (t2, t1.num_nodes)):
                for s in range(tree.num_sequences):
                    ids = torch.as_tensor(tree.sequence_tokens(s), dtype=torch.long)[None]
                    ref = model(input_ids=ids).logits[0].float()
                    got = logits[_path_positions(b, tree, s, base)]
                    worst = max(worst, (got - ref).abs().max().item())
        finally:
            model.set_attn_implementation("treeprep")
    assert worst < 2e-6, worst


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("loss", ["sft", "ppo", "gspo"])
@pytest.mark.parametrize("norm", ["sum", "sequence-mean", "token-mean"])
def test_gradients_equal_linear(family: str, loss: str, norm: str) -> None:
    rows = rows_of(group_tree(21, n_seq=6, roots=2, ref=True), group_tree(22, n_seq=5, ref=True))
    kw = {"kl_coef": 0.05, "entropy_coef": 0.01} if loss == "ppo" else {}
    rep = verify_gradients(tiny(family), rows, loss=loss, norm=norm, attn="dense", **kw)
    assert rep.tokens_tree < rep.tokens_linear
    assert rep.targets_tree < rep.targets_linear
    assert rep.ok, rep.to_dict()
    assert rep.worst_rel < 1e-5 and rep.loss_rel < 1e-5


def test_grpo_group_advantages_and_missing_old_logprobs() -> None:
    rng = np.random.default_rng(5)
    seqs = random_group(rng, n_seq=6, logprobs=False, advantages=False)
    rows = rows_of(build_tree(seqs))
    rep = verify_gradients(tiny(), rows, loss="grpo", norm="sequence-mean", attn="dense")
    assert rep.ok and rep.worst_rel < 1e-5, rep.to_dict()


def test_a_wrong_weight_on_one_token_is_caught() -> None:
    """Give one shared target the weight of a single sequence (the naive tree trainer's mistake)."""
    model = tiny()
    tree = group_tree(31, n_seq=6)
    rows = rows_of(tree)
    lin = TreeBatch.from_trees(rows, norm="sum", layout="linear")
    good = TreeBatch.from_trees(rows, norm="sum")
    k = int(torch.argmax(good.weight))
    assert good.weight[k] > 1  # a target shared by several sequences
    bad = TreeBatch.from_trees(rows, norm="sum")
    bad.weight[k] = 1.0

    def grads(batch):
        model.zero_grad(set_to_none=True)
        tree_loss(model, batch, attn="dense").loss.backward()
        g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
        return g

    g_lin, g_good, g_bad = grads(lin), grads(good), grads(bad)
    rel_good = ((g_good - g_lin).norm() / g_lin.norm()).item()
    rel_bad = ((g_bad - g_lin).norm() / g_lin.norm()).item()
    assert rel_good < 1e-5
    assert rel_bad > 100 * 1e-5, rel_bad


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n_seq=st.integers(1, 7),
    roots=st.integers(1, 2),
    loss=st.sampled_from(["sft", "ppo"]),
    norm=st.sampled_from(["sum", "sequence-mean", "token-mean"]),
)
def test_random_trees_restore_gradients(seed, n_seq, roots, loss, norm) -> None:
    rng = np.random.default_rng(seed)
    trees = [
        build_tree(random_group(rng, n_seq=max(n_seq, roots), roots=roots, max_suffix=6))
        for _ in range(2)
    ]
    rep = verify_gradients(
        tiny(), rows_of(*trees), loss=loss, norm=norm, attn="dense", clip_eps=0.1
    )
    if rep.targets_linear == 0:
        return
    assert rep.ok and rep.worst_rel < 1e-5, rep.to_dict()


def test_regression_a_cancelling_rl_loss_is_compared_at_its_magnitude() -> None:
    """Hypothesis found it in a clean-clone run: a PPO loss of 7.1e-4 whose terms (advantages of
    both signs) sum to 0.43 in absolute value rounds in float32 at the terms' scale; compared to
    its own tiny value the tree and linear losses differed by 1.3e-5 while every gradient agreed
    at 3.6e-7. The loss is compared relative to its terms' absolute sum (``loss_mass``)."""
    rng = np.random.default_rng(56)
    trees = [build_tree(random_group(rng, n_seq=4, roots=2, max_suffix=6)) for _ in range(2)]
    rep = verify_gradients(
        tiny(), rows_of(*trees), loss="ppo", norm="sequence-mean", attn="dense", clip_eps=0.1
    )
    assert rep.loss_mass > 100 * abs(rep.loss_linear)
    assert rep.ok and rep.loss_rel < 1e-6, rep.to_dict()
    # a loss that really differs, at the terms' scale, still fails
    bad = dataclasses.replace(rep, loss_tree=rep.loss_linear + 1e-3 * rep.loss_mass)
    assert not bad.ok and "the loss differs" in bad.reason
