"""Helpers for the trainer tests: random trees built by the real trie, cached tiny models.

Not a conftest: a unique module name cannot clash with other test folders.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

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
) -> list[Sequence]:
    """Sequences that branch from earlier ones at random cuts (several roots, duplicates)."""
    seqs: list[Sequence] = []
    for r in range(roots):
        seqs.append(_seq(rng, rng.integers(0, VOCAB, root_len), logprobs, advantages, r))
    while len(seqs) < n_seq:
        src = seqs[int(rng.integers(0, len(seqs)))].tokens
        cut = int(rng.integers(1, len(src) + 1))
        suffix = rng.integers(0, VOCAB, int(rng.integers(1, max_suffix + 1)))
        seqs.append(_seq(rng, np.concatenate([src[:cut], suffix]), logprobs, advantages, 0))
    if dup:
        seqs.append(seqs[int(rng.integers(0, len(seqs)))])
    return seqs


def _seq(rng, toks, logprobs: bool, advantages: bool, salt: int) -> Sequence:
    n = len(toks)
    a = int(rng.integers(0, n))
    b = int(rng.integers(a, n + 1))
    spans = [(a, b)]
    if b + 1 < n and rng.random() < 0.5:
        spans.append((b + 1, n))
    k = sum(e - s for s, e in spans)
    lp = -rng.random(k).astype(np.float32) * 3 if logprobs and rng.random() < 0.7 else None
    adv = float(rng.normal()) if advantages else None
    return Sequence("g", np.asarray(toks), spans, logprobs=lp, advantage=adv, reward=float(salt))


def rows_of(*trees: Tree) -> list[dict]:
    return [t.to_row() for t in trees]


def group_tree(seed: int, **kw) -> Tree:
    return build_tree(random_group(np.random.default_rng(seed), **kw))
