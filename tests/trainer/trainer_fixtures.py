"""Helpers for the trainer tests: random trees built by the real trie, cached tiny models.

Not a conftest: a unique module name cannot clash with other test folders.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trie import Tree, build_tree  # noqa: E402

VOCAB = 512
_MODELS: dict[str, torch.nn.Module] = {}


def tiny(name: str = "tiny-qwen3") -> torch.nn.Module:
    """A cached tiny preset with a 512-token vocabulary (float32, CPU)."""
    if name not in _MODELS:
        from treeprep.trainer import load_model

        _MODELS[name] = load_model(name, vocab_size=VOCAB, attn="dense", seed=1)
    return _MODELS[name]


def random_group(
    rng: np.random.Generator,
    *,
    n_seq: int = 5,
    root_len: int = 12,
    max_suffix: int = 10,
    roots: int = 1,
    logprobs: bool = True,
    advantages: bool = True,
    dup: bool = True,
    ref: bool = False,
) -> list[Sequence]:
    """Sequences that branch from earlier ones at random cuts (several roots, duplicates).

    Sequences belong to trajectories: a root starts one, a continuation stays in its source's
    trajectory or starts a new one (a resampled call); every call of a trajectory carries the
    trajectory's reward. ``ref`` adds reference log-probs."""
    seqs: list[Sequence] = []
    rewards: dict[str, float] = {}

    def traj(name: str) -> str:
        rewards.setdefault(name, float(rng.integers(0, 3)))
        return name

    for r in range(roots):
        t = traj(f"t{r}")
        seqs.append(_seq(rng, rng.integers(0, VOCAB, root_len), logprobs, advantages, ref, t))
    while len(seqs) < n_seq:
        src = seqs[int(rng.integers(0, len(seqs)))]
        cut = int(rng.integers(1, len(src.tokens) + 1))
        suffix = rng.integers(0, VOCAB, int(rng.integers(1, max_suffix + 1)))
        t = src.trajectory_id if rng.random() < 0.5 else traj(f"t{len(rewards)}")
        toks = np.concatenate([src.tokens[:cut], suffix])
        seqs.append(_seq(rng, toks, logprobs, advantages, ref, t))
    if dup:
        seqs.append(seqs[int(rng.integers(0, len(seqs)))])
    for s in seqs:
        s.reward = rewards[s.trajectory_id]
    return seqs


def _seq(rng, toks, logprobs: bool, advantages: bool, ref: bool, traj: str) -> Sequence:
    n = len(toks)
    a = int(rng.integers(0, n))
    b = int(rng.integers(a, n + 1))
    spans = [(a, b)]
    if b + 1 < n and rng.random() < 0.5:
        spans.append((b + 1, n))
    k = sum(e - s for s, e in spans)
    lp = -rng.random(k).astype(np.float32) * 3 if logprobs and rng.random() < 0.7 else None
    rlp = -rng.random(k).astype(np.float32) * 3 if ref else None
    adv = float(rng.normal()) if advantages else None
    return Sequence(
        "g", np.asarray(toks), spans, logprobs=lp, advantage=adv, trajectory_id=traj,
        ref_logprobs=rlp,
    )  # fmt: skip


def rows_of(*trees: Tree) -> list[dict]:
    return [t.to_row() for t in trees]


def group_tree(seed: int, **kw) -> Tree:
    return build_tree(random_group(np.random.default_rng(seed), **kw))


# --------------------------------------------------------------------------------------------
# random packed forests as attention masks (no trie: any pre-order shape)
# --------------------------------------------------------------------------------------------


def _forest_strategy():
    from hypothesis import strategies as st

    @st.composite
    def forests(draw, max_nodes: int = 24, max_len: int = 90):
        """Random pre-order forests ``(parent, length)``: each node hangs under a node on the
        current rightmost path (-1: a root)."""
        nn = draw(st.integers(1, max_nodes))
        parent: list[int] = []
        path: list[int] = []
        for n in range(nn):
            depth = draw(st.integers(0, len(path))) if n else 0
            path = path[:depth]
            parent.append(path[-1] if path else -1)
            path.append(n)
        length = [draw(st.integers(1, max_len)) for _ in range(nn)]
        return parent, length

    return forests


forests = _forest_strategy()


def forest_mask(parent: list[int], length: list[int], backend: str = "flex"):
    """A packed forest's TreeMask from pre-order parents and node lengths, with depths (so
    windowed layers can be checked too)."""
    from treeprep.trainer.attention import TreeMask

    nn = len(parent)
    last = list(range(nn))
    for n in range(nn - 1, -1, -1):
        if parent[n] >= 0:
            last[parent[n]] = max(last[parent[n]], last[n])
    ln = np.asarray(length, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64)
    depth = np.zeros(nn, dtype=np.int64)
    for n in range(nn):
        if parent[n] >= 0:
            depth[n] = depth[parent[n]] + ln[parent[n]]
    node = torch.as_tensor(np.repeat(np.arange(nn), ln))
    idx = torch.arange(int(ln.sum()))
    kd = torch.as_tensor(
        np.concatenate([np.arange(d, d + m) for d, m in zip(depth, ln, strict=True)])
    )
    return TreeMask(
        q_node=node,
        q_index=idx,
        k_node=node,
        k_last=torch.as_tensor(last)[node],
        k_index=idx,
        node_start=start,
        node_length=ln,
        node_parent=np.asarray(parent, dtype=np.int64),
        node_prefix=np.zeros(nn, dtype=np.int64),
        backend=backend,
        q_depth=kd,
        k_depth=kd,
    )


def bf16_autocast():  # noqa: ANN201
    """The bf16 autocast ``treeprep train`` runs, on the CPU (no weight cache)."""
    from treeprep.trainer.config import bf16_autocast as of_run

    return of_run(torch.device("cpu"))()


class Bf16Casts(TorchDispatchMode):
    """Hands :meth:`on_cast` every float32 -> bf16 copy an operator makes (autocast's casts of
    weights and inputs) while the mode is active."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        src = args[0] if args else None
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(src, torch.Tensor)
            and src.dtype == torch.float32
            and out.dtype == torch.bfloat16
        ):
            self.on_cast(out)
        return out

    def on_cast(self, out: torch.Tensor) -> None:
        raise NotImplementedError
