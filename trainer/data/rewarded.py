"""The trees an RL loss can train: those with advantages, stored or from their rewards.

An RL loss (``ppo``, ``grpo``, ``gspo``) needs an advantage for every trained sequence: stored in
the shards, or computed from the rewards of the tree's trajectories
(:mod:`treeprep.trainer.batch.advantages`). A build of agent logs often mixes formats that
record rewards
(tau-bench, NeMo-Gym rollouts, token rollouts, datasets with a ``resolved`` column) with formats
that record none (Claude Code, Codex, Gemini CLI, ShareGPT ...); the bundled sample is such a
build. Before any plan is made, :func:`scan_rewards` reads the reward columns of every tree once
and finds the *unrewarded* trees: no stored advantage, and some trajectory without a reward. What
happens to them is ``unrewarded`` (:class:`~treeprep.modes.Unrewarded`):

* ``refuse`` (the default): the run is refused before the model loads, naming how many trees and
  sequences lack rewards, a few of their group ids, and the option that skips them;
* ``skip``: they are left out of every epoch's plan (and of the validation split), and the count
  goes to the run's start line and summary (``unrewarded_trees``, ``unrewarded_sequences``):
  never silently.

A tree whose rewards cannot be used (one trajectory with two different rewards) is a data error,
not an unrewarded tree: the run is refused with its reason under both modes. A tree with rewards
whose trajectories all scored the same trains with advantage 0 (no gradient), as GRPO defines it;
the loop counts those steps (``no_signal_steps``). SFT reads none of this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treeprep.errors import TrainingError, TreeprepError
from treeprep.modes import LOSS_FACTS, AdvNorm, Loss, Unrewarded
from treeprep.trainer.batch.advantages import group_advantages
from treeprep.trainer.data.reader import BuildReader

#: (shard, row): one tree of a build
Tree = tuple[str, int]

_COLUMNS = ("group_id", "seq_node", "seq_advantage", "seq_reward", "seq_trajectory_id")
_EXAMPLES = 3


@dataclass(frozen=True)
class RewardScan:
    """The unrewarded trees of a build (module docstring), and how many there are of what."""

    trees: int
    sequences: int
    #: the unrewarded trees, as (shard, row)
    unrewarded: frozenset[Tree]
    unrewarded_sequences: int
    #: the group ids of the first few unrewarded trees
    examples: tuple[str, ...]

    def describe(self) -> str:
        more = "..." if len(self.unrewarded) > len(self.examples) else ""
        return (
            f"{len(self.unrewarded)} of {self.trees} trees ({self.unrewarded_sequences} of "
            f"{self.sequences} sequences) have neither advantages nor rewards for every "
            f"trajectory (e.g. {', '.join(repr(g) for g in self.examples)}{more})"
        )


def scan_rewards(reader: BuildReader, adv_norm: AdvNorm | str = AdvNorm.grpo) -> RewardScan:
    """Every tree's advantages (reward columns only), the unrewarded ones collected; a tree whose
    rewards cannot be used raises :class:`TrainingError` with the reason."""
    unrewarded: set[Tree] = set()
    examples: list[str] = []
    n_trees = n_seq = n_unrewarded_seq = 0
    for shard in reader.shard_names:
        for row, tree in enumerate(reader.table(shard).select(list(_COLUMNS)).to_pylist()):
            n = len(tree["seq_node"])
            n_trees += 1
            n_seq += n
            try:
                adv = group_advantages(tree, adv_norm, name=f"{shard} tree {tree['group_id']!r}")
            except TreeprepError as e:
                raise TrainingError(f"{reader.out_dir}: {e}") from e
            if n and np.isnan(adv).all():
                unrewarded.add((shard, row))
                n_unrewarded_seq += n
                if len(examples) < _EXAMPLES:
                    examples.append(str(tree["group_id"]))
    return RewardScan(n_trees, n_seq, frozenset(unrewarded), n_unrewarded_seq, tuple(examples))


def rewarded_only(
    reader: BuildReader, loss: Loss, adv_norm: AdvNorm, unrewarded: Unrewarded
) -> RewardScan | None:
    """The scan of an RL run (None for SFT: nothing to check). Under ``refuse`` a build with an
    unrewarded tree is refused, naming the option that skips them; under ``skip`` one with no
    rewarded tree at all is refused (nothing would train)."""
    if not LOSS_FACTS[loss].rl:
        return None
    scan = scan_rewards(reader, adv_norm)
    if not scan.unrewarded:
        return scan
    if unrewarded == Unrewarded.refuse:
        raise TrainingError(
            f"{reader.out_dir}: {loss} needs an advantage (or the rewards of the group's "
            f"trajectories) for every trained sequence; {scan.describe()}. Train the trees that "
            "have them with --unrewarded skip (the others are left out, counted), or give "
            "those records rewards"
        )
    if len(scan.unrewarded) == scan.trees:
        raise TrainingError(
            f"{reader.out_dir}: {loss} with --unrewarded skip: no tree has advantages or "
            f"rewards ({scan.trees} trees); nothing to train"
        )
    return scan
