"""TreeBatch: exact layout, predecessors, restored weights and RL coefficients, by hand."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import TreeprepError  # noqa: E402
from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trainer import TreeBatch  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402

# two sequences sharing [1, 2, 3]: A = [1 2 3 4 5] (trains 3..5), B = [1 2 3 6] (trains 2..4)
A = Sequence("g", np.array([1, 2, 3, 4, 5]), [(3, 5)], advantage=2.0, logprobs=np.array([-1, -2]))
B = Sequence("g", np.array([1, 2, 3, 6]), [(2, 4)], advantage=-1.0, logprobs=np.array([-3, -4]))


def tree_row():
    return build_tree([A, B, A]).to_row()  # A twice: merged with seq_count 2


def test_tree_layout_positions_nodes_and_predecessors() -> None:
    b = TreeBatch.from_trees([tree_row()], norm="sum")
    # pre-order: [1 2 3] -> [4 5] and [6] (children by first token)
    assert b.input_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert b.position_ids.tolist() == [0, 1, 2, 3, 4, 3]
    assert b.token_node.tolist() == [0, 0, 0, 1, 1, 2]
    assert b.node_last.tolist() == [2, 1, 2]
    # token 6 (index 5) is predicted by token 3 (index 2), not by token 5 (index 4)
    assert b.prev.tolist() == [-1, 0, 1, 2, 3, 2]
    # targets: A trains depths 3,4 -> idx 3,4; B trains depths 2,3 -> idx 2,5
    assert b.target_index.tolist() == [2, 3, 4, 5]
    assert b.weight.tolist() == [1.0, 2.0, 2.0, 1.0]
    assert b.adv_pos.tolist() == [0.0, 4.0, 4.0, 0.0]
    assert b.adv_neg.tolist() == [-1.0, 0.0, 0.0, -1.0]
    assert b.old_logp.tolist() == [-3.0, -1.0, -2.0, -4.0]
    assert b.tokens_linear == 5 * 2 + 4


def test_sequence_and_token_mean_coefficients() -> None:
    b = TreeBatch.from_trees([tree_row()], norm="sequence-mean")
    # S = 3 sequences (A counted twice), n_A = n_B = 2: c = 1/6 each
    assert np.allclose(b.weight.numpy(), [1 / 6, 2 / 6, 2 / 6, 1 / 6])
    b = TreeBatch.from_trees([tree_row()], norm="token-mean")
    assert np.allclose(b.weight.numpy(), [1 / 6, 2 / 6, 2 / 6, 1 / 6])  # N = 2*2 + 2 = 6
    b = TreeBatch.from_trees([tree_row()], norm="token-mean", total_tokens=12)
    assert np.allclose(b.weight.numpy(), [1 / 12, 2 / 12, 2 / 12, 1 / 12])


def test_root_first_token_is_never_a_target() -> None:
    s = Sequence("g", np.array([7, 8, 9]), [(0, 3)])
    b = TreeBatch.from_trees([build_tree([s]).to_row()], norm="sequence-mean")
    assert b.target_index.tolist() == [1, 2]
    assert np.allclose(b.weight.numpy(), [0.5, 0.5])  # n_s counts predictable tokens only


def test_linear_layout_repeats_each_copy_as_its_own_document() -> None:
    b = TreeBatch.from_trees([tree_row()], norm="sum", layout="linear")
    assert b.input_ids.tolist() == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 6]
    assert b.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert b.prev.tolist() == [-1, 0, 1, 2, 3, -1, 5, 6, 7, 8, -1, 10, 11, 12]
    assert b.target_index.tolist() == [3, 4, 8, 9, 12, 13]
    assert b.weight.tolist() == [1.0] * 6
    assert b.num_tokens == b.tokens_linear


def test_two_trees_do_not_see_each_other() -> None:
    b = TreeBatch.from_trees([tree_row(), tree_row()])
    assert b.node_last.tolist() == [2, 1, 2, 5, 4, 5]
    assert b.prev.tolist()[6] == -1
    from treeprep.trainer import TreeMask

    m = TreeMask.from_batch(b, "dense").dense()
    assert not m[6:, :6].any() and not m[:6, 6:].any()


def test_disagreeing_old_logprobs_become_separate_units() -> None:
    a2 = Sequence("g", np.array([1, 2, 3, 4, 5]), [(3, 5)], advantage=1.0, logprobs=[-1.5, -2])
    b = TreeBatch.from_trees([build_tree([A, a2]).to_row()])
    assert b.num_targets == 2 and b.unit_target.tolist() == [0, 0, 1]
    assert b.old_logp.tolist() == [-1.5, -1.0, -2.0]
    assert b.adv_pos.tolist() == [1.0, 2.0, 3.0]
    assert b.old_logp_spread == pytest.approx(0.5)


def test_grpo_advantages_from_rewards() -> None:
    s1 = Sequence("g", np.array([1, 2, 3]), [(1, 3)], reward=1.0, trajectory_id="a")
    s2 = Sequence("g", np.array([1, 2, 4]), [(2, 3)], reward=0.0, trajectory_id="b")
    b = TreeBatch.from_trees([build_tree([s1, s2]).to_row()])
    assert np.allclose(b.seq_advantage.numpy(), [1.0, -1.0], atol=1e-5)


def test_bad_rows_are_refused_with_the_tree_named() -> None:
    row = tree_row()
    row["node_depth"] = [0, 3, 4]
    with pytest.raises(TreeprepError, match=r"tree 0 \('g'\).*node_depth"):
        TreeBatch.from_trees([row])
    row = tree_row()
    row["seq_loss_spans"] = [[3, 9]] + row["seq_loss_spans"][1:]
    row["seq_logprobs"] = [None] * len(row["seq_logprobs"])
    with pytest.raises(TreeprepError, match="past its length"):
        TreeBatch.from_trees([row])
    with pytest.raises(TreeprepError, match="^norm 'mean'; expected one of sum, "):
        TreeBatch.from_trees([tree_row()], norm="mean")


def test_missing_inputs_are_found_on_the_host_and_refused_without_reading_the_device() -> None:
    """Issue 12: the loss's input checks read facts the assembly found in numpy; the batch here
    lives on the meta device, whose tensors cannot be read at all, and is still checked."""
    from treeprep.trainer.batch import Missing
    from treeprep.trainer.objective.loss import LossConfig, check_inputs

    # C: a sequence with neither advantage nor reward, beside A (advantage 2)
    c = Sequence("g", np.array([1, 2, 3, 7]), [(3, 4)])
    bare = TreeBatch.from_trees([build_tree([A, c]).to_row()]).to("meta")
    assert bare.missing == Missing(unit_advantage=True, seq_advantage=True, ref_logp=True)
    check_inputs(bare, LossConfig("sft"))  # sft needs none of them
    with pytest.raises(TreeprepError, match=r"^ppo needs an advantage .*; some sequences in"):
        check_inputs(bare, LossConfig("ppo"))
    with pytest.raises(TreeprepError, match="^gspo needs an advantage"):
        check_inputs(bare, LossConfig("gspo"))
    with pytest.raises(TreeprepError, match="^kl_coef needs the reference log-probs"):
        check_inputs(bare, LossConfig("sft", kl_coef=0.1))
    # C shares no target with A: a unit is NaN only where one of its sequences lacks A_s
    b = TreeBatch.from_trees([build_tree([A, c]).to_row()])
    bad_units = torch.isnan(b.adv_pos)
    assert bad_units.any() and not bad_units.all()
    ok = TreeBatch.from_trees([tree_row()]).to("meta")
    assert ok.missing == Missing(unit_advantage=False, seq_advantage=False, ref_logp=True)
    for loss in ("ppo", "grpo", "gspo"):
        check_inputs(ok, LossConfig(loss))  # type: ignore[arg-type]
