"""Trajectories of a tree, and RL advantages from rewards normalized over them.

In agent RL a *sample* is a whole trajectory: one run of the agent on a task, its main thread and
its sub-agents, many LLM calls. A tree (a group, ``group_id``) holds the calls of one or several
trajectories (a GRPO group of G samples); the shards name each call's trajectory in
``seq_trajectory_id``. Advantages computed from rewards are therefore normalized over the group's
trajectories, each counted once however many calls it made (and however many exact duplicate
entries the trie merged), and every call of a trajectory carries its trajectory's advantage.
Normalizing over sequences instead would count a two-call trajectory twice in the group mean and
std: rewards [1, 0, 0, 0] with a two-call winner give +1.22 / -0.82 per sequence, against +1.73 /
-0.58 per trajectory.

A trajectory's reward is the one reward its calls carry (a call without one inherits it: agent
logs often put the reward on the last call only); calls of one trajectory with different rewards
are refused, since a per-call reward is not a sample's reward. With rewards r_1..r_G of the
group's G trajectories, mean m and population standard deviation sd:

* ``grpo``: ``A_i = (r_i - m) / (sd + 1e-6)`` (DeepSeekMath's GRPO);
* ``dr-grpo``: ``A_i = r_i - m`` (Dr. GRPO: no division by the std);
* ``rloo``: ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) (r_i - m)`` (leave-one-out baseline);
* ``none``: ``A_i = r_i``.

Such a refusal is lazy: :func:`prepare_row` and the batch keep the reason and leave the tree's
advantages unknown, and only an RL loss refuses the batch, with that reason (an SFT run on the same
shards goes on).

A group of one trajectory has no baseline: ``grpo``, ``dr-grpo`` and ``rloo`` give it advantage 0
(no gradient), which is what (r - m) gives. Explicit advantages in the shards win: rewards are
used only when no sequence of the tree has an advantage, and only when every trajectory has a
reward (otherwise advantages stay unknown and the RL losses refuse the batch).

The same module counts each trajectory's trained targets (duplicates counted), which the
``trajectory-mean`` normalization needs: ``c_s = 1 / (Tr * n_traj(s))``. Both are computed on the
whole tree, before a plan cuts it into parts or lays its sequences out one by one
(:func:`prepare_row`), so every part carries the tree's numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from treeprep.errors import TreeprepError
from treeprep.modes import AdvNorm


def _get(row: Any, key: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(key, default)
    return getattr(row, key, default)


def trajectory_index(row: Any) -> np.ndarray:
    """Per sequence entry, the index of its trajectory in the tree (first appearance order).
    A row without ``seq_trajectory_id`` counts every entry as its own trajectory."""
    ids = _get(row, "seq_trajectory_id")
    n = len(_get(row, "seq_node"))
    if ids is None:
        return np.arange(n, dtype=np.int64)
    if len(ids) != n:
        raise TreeprepError(
            f"tree {_get(row, 'group_id')!r}: {len(ids)} trajectory ids for {n} sequences"
        )
    seen: dict[str, int] = {}
    return np.array([seen.setdefault(str(t), len(seen)) for t in ids], dtype=np.int64)


def trained_targets(spans: Any) -> int:
    """Trained targets of one sequence: trained depths except depth 0 (no predecessor)."""
    if spans is None or len(spans) == 0:
        return 0
    sp = np.asarray(spans, dtype=np.int64)
    a, b = sp[0::2], sp[1::2]
    return int((b - np.maximum(a, 1)).clip(min=0).sum())


def trajectory_tokens(row: Any, traj: np.ndarray | None = None) -> np.ndarray:
    """Per sequence entry, the trained targets of its whole trajectory (duplicates counted)."""
    t = trajectory_index(row) if traj is None else traj
    counts = np.asarray(_get(row, "seq_count"), dtype=np.float64)
    n = np.array([trained_targets(s) for s in _get(row, "seq_loss_spans")], dtype=np.float64)
    per_traj = np.bincount(t, weights=counts * n, minlength=int(t.max()) + 1 if len(t) else 0)
    return per_traj[t] if len(t) else np.zeros(0)


def normalize(rewards: np.ndarray, adv_norm: str) -> np.ndarray:
    """Advantages of a group's trajectory rewards (one per trajectory; module docstring)."""
    adv_norm = AdvNorm.of(adv_norm, "adv_norm", TreeprepError)
    r = np.asarray(rewards, dtype=np.float64)
    if adv_norm == "none":
        return r.copy()
    g = len(r)
    if g < 2:
        return np.zeros(g)
    centred = r - r.mean()
    if adv_norm == "dr-grpo":
        return centred
    if adv_norm == "rloo":
        return centred * (g / (g - 1))
    return centred / (np.sqrt((centred**2).mean()) + 1e-6)


def group_advantages(row: Any, adv_norm: str = "grpo", name: str | None = None) -> np.ndarray:
    """Per sequence entry, its advantage as a float64 array (NaN where unknown): the stored
    advantages, or when the tree has none, its trajectories' rewards normalized by ``adv_norm``."""
    where = name or f"tree {_get(row, 'group_id')!r}"
    adv_raw = _get(row, "seq_advantage")
    rew_raw = _get(row, "seq_reward")
    adv = np.array([np.nan if a is None else float(a) for a in adv_raw], dtype=np.float64)
    if not np.isnan(adv).all() or not len(adv):
        return adv
    rew = np.array([np.nan if r is None else float(r) for r in rew_raw], dtype=np.float64)
    if len(rew) != len(adv):
        raise TreeprepError(f"{where}: seq_reward and seq_advantage disagree in length")
    traj = trajectory_index(row)
    ids = _get(row, "seq_trajectory_id")
    n_traj = int(traj.max()) + 1
    t_rew = np.full(n_traj, np.nan)
    for s in np.flatnonzero(~np.isnan(rew)):
        t = int(traj[s])
        if np.isnan(t_rew[t]):
            t_rew[t] = rew[s]
        elif t_rew[t] != rew[s]:
            tid = ids[s] if ids is not None else str(s)
            raise TreeprepError(
                f"{where}: trajectory {tid!r} has calls with rewards {t_rew[t]:g} and {rew[s]:g}; "
                "a trajectory (one sample) has one reward. Give each sample its own "
                "trajectory_id, or give advantages"
            )
    if np.isnan(t_rew).any():
        return adv  # some trajectory has no reward: advantages stay unknown
    return normalize(t_rew, adv_norm)[traj]


def prepare_row(row: Mapping[str, Any], adv_norm: str = "grpo") -> dict[str, Any]:
    """A copy of a whole tree's row with its advantages filled from rewards (when it has none)
    and ``seq_trajectory_tokens`` added, so that parts and single sequences cut from it keep the
    tree's group statistics."""
    out = dict(row)
    try:
        adv = group_advantages(row, adv_norm)
    except TreeprepError as e:
        adv = np.full(len(row["seq_node"]), np.nan)
        out["advantage_error"] = str(e)
    out["seq_advantage"] = [None if np.isnan(a) else float(a) for a in adv]
    out["seq_trajectory_tokens"] = trajectory_tokens(row).tolist()
    if out.get("seq_trajectory_id") is None:
        out["seq_trajectory_id"] = [str(i) for i in range(len(row["seq_node"]))]
    return out
