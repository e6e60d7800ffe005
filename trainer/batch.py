"""Tree rows to one packed micro-batch: tokens, positions, mask metadata and loss weights.

Layout. Every tree of the micro-batch is appended to one packed sequence (batch dimension 1). A
tree's nodes are in DFS pre-order and each node's tokens are contiguous (the shard layout), so the
packed sequence is the concatenation of the trees' ``input_ids``. Node ids are made global by
offsetting each tree's pre-order numbers (and ``node_last``) by the nodes before it, so the O(1)
ancestor test ``pre[j] <= pre[i] <= last[j]`` never crosses trees. Position ids are depths: token k
of node n sits at ``node_depth[n] + k``, so siblings reuse positions and rotary embeddings equal
those of each path run alone.

Targets. A loss term belongs to a *target* token j and is computed from the logits of its
predecessor ``prev(j)``: j-1 inside a node, the parent's last token for a node's first token, none
for a root's first token (that token is never a target, in the tree and in the linear layout alike,
so it does not count in ``n_s`` either). The batch keeps only the K trained targets
(``target_index``, sorted) and every per-token coefficient is a length-K array over them.

Weights (NOTES section 4). Each sequence s has a trained mask m_s (its loss spans, in depth
coordinates), a multiplicity (``seq_count``: exact duplicates merged by the trie) and a normalizer
c_s from ``norm``:

* ``sum``: c_s = 1;
* ``token-mean``: c_s = 1 / N, N the trained targets of all sequences (duplicates counted);
* ``sequence-mean``: c_s = 1 / (S n_s), n_s the trained targets of s and S the sequences with at
  least one (duplicates counted); with one group per micro-batch this is GRPO's 1 / (G |o_i|);
* ``trajectory-mean``: c_s = 1 / (Tr n_traj(s)), n_traj(s) the trained targets of the whole
  trajectory s belongs to (all its calls, duplicates counted) and Tr the trajectories with at least
  one: every sample's token mean, averaged over samples (a long trajectory weighs as much as a
  short one, and one call does not weigh more because the trajectory made fewer calls).

``total_tokens`` / ``total_sequences`` / ``total_trajectories`` override N, S and Tr, so that a
training loop can normalise by a whole optimizer step's counts while it feeds several micro-batches;
rows prepared by :func:`treeprep.trainer.advantages.prepare_row` carry their trajectories' token
counts from the whole tree, so a part of a tree keeps the tree's n_traj. The restored weight of
target t is ``w_t = sum_s count_s c_s m_s(t)``; the RL coefficients split the same sum by the sign
of the sequence advantage: ``adv_pos_t = sum_{A_s > 0} count_s c_s m_s(t) A_s`` and ``adv_neg_t``
likewise for A_s < 0, which restores the PPO/GRPO clipped loss exactly because the ratio r_t is
shared by all sequences through t.

Advantages come from ``seq_advantage``; where a tree has none but every trajectory has a reward,
the group advantage over the tree's *trajectories* (``adv_norm``: grpo, dr-grpo, rloo or none; see
:mod:`treeprep.trainer.advantages`) is used, and every call of a trajectory carries it. Sequences
with neither leave NaN, and the RL losses refuse them.

Coefficients are stored in float64 (the loss casts them to its own dtype): a float64 run is
float64 end to end.

Old log-probs (``seq_logprobs``, one per trained token of a sequence) are scattered to targets.
Sequences sharing a target normally agree on its old log-prob, but a sampler is not
bit-deterministic across batches, so they may not. The clipped loss is exact either way: the RL
coefficients live on *units*, one per (target, distinct old log-prob) pair, so each disagreeing
value keeps its own ratio (U == K when all agree; :attr:`TreeBatch.old_logp_spread` reports the
largest disagreement seen). A unit with no stored value is NaN and the loss uses the current,
detached log-prob there (ratio 1). Reference log-probs (``seq_ref_logprobs``, for the KL penalty)
take part in the same key: a unit is a (target, old log-prob, reference log-prob) triple.

Pairs. For sequence-level objectives the batch also lists every (sequence, target) incidence:
``pair_seq[p]`` and ``pair_target[p]`` (indices into the K targets). That is N_flat-trained small
integers, cheap next to the model, and it lets any per-sequence statistic be gathered from the tree
with autograd's fan-out restoring the gradient.

The linear layout (``layout="linear"``) is the same assembler fed with every sequence copy as its
own one-node tree: the baseline a linearizing trainer would run, packed by documents.

Cost: numpy throughout; Python loops run per tree, per sequence and per node of a path, never per
token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import torch

from treeprep.errors import TreeprepError
from treeprep.trainer.advantages import (
    ADV_NORMS,
    group_advantages,
    trajectory_index,
    trajectory_tokens,
)
from treeprep.trainer.targets import Targets

Norm = Literal["sum", "sequence-mean", "token-mean", "trajectory-mean"]
Layout = Literal["tree", "linear"]
NORMS: tuple[str, ...] = ("sum", "sequence-mean", "token-mean", "trajectory-mean")
LAYOUTS: tuple[str, ...] = ("tree", "linear")


def _get(row: Any, key: str) -> Any:
    if isinstance(row, Mapping):
        return row[key]
    return getattr(row, key)


def _opt(row: Any, key: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(key)
    return getattr(row, key, None)


def _per_token(raw: Any, spans: list[np.ndarray], name: str, what: str) -> list[np.ndarray | None]:
    """Per sequence, a float64 array of one value per trained token (or None)."""
    out: list[np.ndarray | None] = []
    for s, sp in enumerate(spans):
        v = None if raw is None else raw[s]
        if v is None:
            out.append(None)
            continue
        arr = np.asarray(v, dtype=np.float64)
        n_tr = int((sp[1::2] - sp[0::2]).sum()) if len(sp) else 0
        if len(arr) != n_tr:
            raise TreeprepError(
                f"{name}: sequence {s} has {len(arr)} {what} for {n_tr} trained tokens"
            )
        out.append(arr)
    return out


@dataclass
class _Tree:
    """One tree's arrays, validated, plus per-sequence paths (packed offsets of each depth)."""

    name: str
    input_ids: np.ndarray
    node_parent: np.ndarray
    node_offset: np.ndarray
    node_length: np.ndarray
    node_depth: np.ndarray
    node_last: np.ndarray
    seq_node: np.ndarray
    seq_count: np.ndarray
    seq_spans: list[np.ndarray]
    seq_logprobs: list[np.ndarray | None]
    seq_ref: list[np.ndarray | None]
    seq_advantage: np.ndarray  # float64, NaN where unknown
    seq_traj: np.ndarray  # int64, trajectory index within the tree
    seq_traj_tokens: np.ndarray  # float64, trained targets of the whole trajectory
    advantage_error: str | None  # why advantages from rewards could not be computed

    def path_index(self, node: int, cache: dict[int, np.ndarray]) -> np.ndarray:
        """Offsets (into this tree's ``input_ids``) of the root-to-``node`` path, by depth."""
        hit = cache.get(node)
        if hit is not None:
            return hit
        chain = []
        v = node
        while v >= 0 and v not in cache:
            chain.append(v)
            v = int(self.node_parent[v])
        parts = [cache[v]] if v >= 0 else []
        out = parts[0] if parts else np.zeros(0, dtype=np.int64)
        for u in reversed(chain):
            o = int(self.node_offset[u])
            own = np.arange(o, o + int(self.node_length[u]), dtype=np.int64)
            out = np.concatenate([out, own])
            cache[u] = out
        return out


def _read_tree(row: Any, index: int, adv_norm: str = "grpo") -> _Tree:
    name = f"tree {index} ({_get(row, 'group_id')!r})"

    def i32(k: str) -> np.ndarray:
        return np.asarray(_get(row, k), dtype=np.int64)

    ids = i32("input_ids")
    parent, offset, length = i32("node_parent"), i32("node_offset"), i32("node_length")
    depth, last = i32("node_depth"), i32("node_last")
    nn = len(parent)
    if not (len(offset) == len(length) == len(depth) == len(last) == nn) or nn == 0:
        raise TreeprepError(f"{name}: node_* columns disagree in length or are empty")
    if (length <= 0).any():
        raise TreeprepError(f"{name}: a node has no tokens (node_length must be >= 1)")
    expect_off = np.concatenate([[0], np.cumsum(length)[:-1]])
    if not np.array_equal(offset, expect_off) or int(length.sum()) != len(ids):
        raise TreeprepError(f"{name}: nodes are not contiguous in DFS order over input_ids")
    ar = np.arange(nn)
    if ((parent >= ar) | (parent < -1)).any():
        raise TreeprepError(f"{name}: node_parent must point to an earlier node (pre-order) or -1")
    if ((last < ar) | (last >= nn)).any():
        raise TreeprepError(f"{name}: node_last out of range")
    has_p = parent >= 0
    pdep = np.where(has_p, depth[np.maximum(parent, 0)] + length[np.maximum(parent, 0)], 0)
    if not np.array_equal(depth, pdep):
        raise TreeprepError(f"{name}: node_depth is not the parent's depth plus its length")
    seq_node = i32("seq_node")
    ns = len(seq_node)
    counts = i32("seq_count")
    spans_raw = _get(row, "seq_loss_spans")
    lps_raw = _get(row, "seq_logprobs")
    refs_raw = _opt(row, "seq_ref_logprobs")
    adv_raw = _get(row, "seq_advantage")
    if not (len(counts) == len(spans_raw) == len(lps_raw) == len(adv_raw) == ns):
        raise TreeprepError(f"{name}: seq_* columns disagree in length")
    if refs_raw is not None and len(refs_raw) != ns:
        raise TreeprepError(f"{name}: seq_ref_logprobs disagrees in length")
    if ((seq_node < 0) | (seq_node >= nn)).any():
        raise TreeprepError(f"{name}: seq_node out of range")
    spans = [np.asarray(s if s is not None else [], dtype=np.int64) for s in spans_raw]
    for s, sp in enumerate(spans):
        if len(sp) % 2:
            raise TreeprepError(f"{name}: sequence {s} has an odd number of loss span bounds")
    lps = _per_token(lps_raw, spans, name, "log-probs")
    refs = _per_token(refs_raw, spans, name, "reference log-probs")
    traj = trajectory_index(row)
    prepared = _opt(row, "seq_trajectory_tokens")
    error = _opt(row, "advantage_error")
    if prepared is not None:  # a part of a prepared tree: the whole tree's numbers
        adv = np.array([np.nan if a is None else float(a) for a in adv_raw], dtype=np.float64)
        traj_tok = np.asarray(prepared, dtype=np.float64)
    else:
        try:
            adv = group_advantages(row, adv_norm, name)
        except TreeprepError as e:  # refused by the RL losses only (advantages module doc)
            adv, error = np.full(ns, np.nan), str(e)
        traj_tok = trajectory_tokens(row, traj)
    return _Tree(
        name, ids, parent, offset, length, depth, last, seq_node, counts, spans, lps, refs, adv,
        traj, traj_tok, error,
    )  # fmt: skip


@dataclass
class TreeBatch:
    """One packed micro-batch. Tensors on one device; shapes in the comments.

    T packed tokens, Nn nodes, K trained targets, U RL units (a target and one old log-prob
    value; U == K unless sequences disagree), S sequence entries, P (sequence, target) pairs.
    """

    input_ids: torch.Tensor  # [T] int64
    position_ids: torch.Tensor  # [T] int64, depths
    token_node: torch.Tensor  # [T] int64, global pre-order node id
    node_start: torch.Tensor  # [Nn] int64, packed offset of the node's first token
    node_length: torch.Tensor  # [Nn] int64
    node_parent: torch.Tensor  # [Nn] int64, global id or -1
    node_last: torch.Tensor  # [Nn] int64, global subtree end
    prev: torch.Tensor  # [T] int64, predecessor index or -1
    target_index: torch.Tensor  # [K] int64, sorted packed indices of trained targets
    weight: torch.Tensor  # [K] float64, w_t
    unit_target: torch.Tensor  # [U] int64, index into the K targets of each RL unit
    unit_weight: torch.Tensor  # [U] float64, w_t restricted to the unit's sequences
    adv_pos: torch.Tensor  # [U] float64, sum of positive c_s A_s over the unit's sequences
    adv_neg: torch.Tensor  # [U] float64, sum of negative c_s A_s
    old_logp: torch.Tensor  # [U] float64, the unit's old log-prob, NaN where none is stored
    ref_logp: torch.Tensor  # [U] float64, the unit's reference log-prob, NaN where none
    pair_seq: torch.Tensor  # [P] int64
    pair_target: torch.Tensor  # [P] int64, index into the K targets
    pair_old_logp: torch.Tensor  # [P] float64, NaN where absent
    seq_coef: torch.Tensor  # [S] float64, c_s
    seq_count: torch.Tensor  # [S] int64, multiplicity
    seq_advantage: torch.Tensor  # [S] float64, NaN where unknown
    seq_tree: torch.Tensor  # [S] int64, which input tree the entry comes from
    seq_trained: torch.Tensor  # [S] int64, n_s: the entry's trained targets
    layout: str
    norm: str
    num_trees: int
    tokens_linear: int  # what a linearizing trainer feeds for the same sequences
    old_logp_spread: float  # largest disagreement of old log-probs on a shared target
    #: why some tree's advantages from rewards are unknown (an RL loss refuses with it)
    advantage_errors: tuple[str, ...] = ()
    _totals: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _cache_targets: Targets | None = field(default=None, repr=False, compare=False)
    #: a one-tree batch that runs as hand-off parts: (part boundaries, part parents) from the plan
    handoff: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.node_start.shape[0])

    @property
    def num_targets(self) -> int:
        return int(self.target_index.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.seq_coef.shape[0])

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: str | torch.device) -> TreeBatch:
        """A copy with every tensor on ``device``."""
        kw = {}
        for f in fields(self):
            if f.name.startswith("_cache"):
                continue
            v = getattr(self, f.name)
            kw[f.name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return TreeBatch(**kw)

    def totals(self) -> tuple[float, float, float]:
        """(N, S, Tr): this batch's trained targets, trained sequences (duplicates counted) and
        trained trajectories (the normalizers it would use on its own)."""
        return self._totals

    def targets(self) -> Targets:
        """What the loss reads: predecessor rows, target tokens and the coefficients."""
        t = self._cache_targets
        if t is None:
            t = Targets(
                pred=self.prev.index_select(0, self.target_index),
                token=self.input_ids.index_select(0, self.target_index),
                weight=self.weight,
                unit_target=self.unit_target,
                unit_weight=self.unit_weight,
                adv_pos=self.adv_pos,
                adv_neg=self.adv_neg,
                old_logp=self.old_logp,
                ref_logp=self.ref_logp,
                pair_seq=self.pair_seq,
                pair_target=self.pair_target,
                pair_old_logp=self.pair_old_logp,
                seq_coef=self.seq_coef,
                seq_count=self.seq_count,
                seq_advantage=self.seq_advantage,
            )
            self._cache_targets = t
        return t

    @classmethod
    def from_trees(
        cls,
        rows: Iterable[Any],
        *,
        norm: Norm = "sum",
        layout: Layout = "tree",
        total_tokens: float | None = None,
        total_sequences: float | None = None,
        total_trajectories: float | None = None,
        adv_norm: str = "grpo",
        device: str | torch.device = "cpu",
    ) -> TreeBatch:
        """Pack tree rows (shard rows as dicts, or :class:`treeprep.trie.Tree`-like objects).

        ``norm`` picks c_s (module docstring); ``total_tokens`` / ``total_sequences`` /
        ``total_trajectories`` override the batch's own N, S and Tr. ``adv_norm`` normalizes
        rewards into advantages over each tree's trajectories where a tree has no advantages.
        ``layout="linear"`` lays every sequence copy out on its own.
        """
        if norm not in NORMS:
            raise TreeprepError(f"unknown norm {norm!r}; expected one of {', '.join(NORMS)}")
        if layout not in LAYOUTS:
            raise TreeprepError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
        if adv_norm not in ADV_NORMS:
            raise TreeprepError(
                f"unknown adv_norm {adv_norm!r}; expected one of {', '.join(ADV_NORMS)}"
            )
        trees = [_read_tree(r, i, adv_norm) for i, r in enumerate(rows)]
        if not trees:
            raise TreeprepError("a batch needs at least one tree")
        totals = (total_tokens, total_sequences, total_trajectories)
        return _assemble(trees, norm, layout, totals, device)

    @classmethod
    def from_table(cls, table: Any, **kw: Any) -> TreeBatch:
        """Pack every row of a pyarrow table with the shard schema."""
        return cls.from_trees(table.to_pylist(), **kw)


def _trained_depths(spans: np.ndarray) -> np.ndarray:
    if not len(spans):
        return np.zeros(0, dtype=np.int64)
    parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(spans[0::2], spans[1::2], strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _assemble(
    trees: list[_Tree],
    norm: str,
    layout: str,
    totals: tuple[float | None, float | None, float | None],
    device: str | torch.device,
) -> TreeBatch:
    ids_parts: list[np.ndarray] = []
    pos_parts: list[np.ndarray] = []
    start_parts: list[np.ndarray] = []
    len_parts: list[np.ndarray] = []
    parent_parts: list[np.ndarray] = []
    last_parts: list[np.ndarray] = []
    # per sequence entry: packed indices of its trained targets, their old log-probs, count, A_s
    seq_targets: list[np.ndarray] = []
    seq_lp: list[np.ndarray | None] = []
    seq_ref: list[np.ndarray | None] = []
    seq_cnt: list[int] = []
    seq_traj: list[tuple[int, int]] = []
    seq_traj_tok: list[float] = []
    seq_adv: list[float] = []
    seq_tree: list[int] = []
    tok_base = 0
    node_base = 0
    tokens_linear = 0

    for ti, t in enumerate(trees):
        cache: dict[int, np.ndarray] = {}
        paths = [t.path_index(int(v), cache) for v in t.seq_node]
        tokens_linear += int(sum(len(p) * int(c) for p, c in zip(paths, t.seq_count, strict=True)))
        for s, path in enumerate(paths):
            depths = _trained_depths(t.seq_spans[s])
            if len(depths) and (depths[-1] > len(path) or (depths >= len(path)).any()):
                raise TreeprepError(f"{t.name}: sequence {s} has a loss span past its length")
            lp = t.seq_logprobs[s]
            ref = t.seq_ref[s]
            keep = depths > 0  # a path's first token has no predecessor: never a target
            copies = int(t.seq_count[s]) if layout == "linear" else 1
            for _ in range(copies):
                if layout == "tree":
                    tgt = path[depths[keep]] + tok_base
                else:
                    n = len(path)
                    ids_parts.append(t.input_ids[path])
                    pos_parts.append(np.arange(n, dtype=np.int64))
                    start_parts.append(np.array([tok_base], dtype=np.int64))
                    len_parts.append(np.array([n], dtype=np.int64))
                    parent_parts.append(np.array([-1], dtype=np.int64))
                    last_parts.append(np.array([node_base], dtype=np.int64))
                    tgt = depths[keep] + tok_base
                    tok_base += n
                    node_base += 1
                seq_targets.append(tgt)
                seq_lp.append(None if lp is None else lp[keep])
                seq_ref.append(None if ref is None else ref[keep])
                seq_traj.append((ti, int(t.seq_traj[s])))
                seq_traj_tok.append(float(t.seq_traj_tokens[s]))
                seq_cnt.append(int(t.seq_count[s]) if layout == "tree" else 1)
                seq_adv.append(float(t.seq_advantage[s]))
                seq_tree.append(ti)
        if layout == "tree":
            nn = len(t.node_parent)
            ids_parts.append(t.input_ids)
            pos_parts.append(
                np.repeat(t.node_depth, t.node_length)
                + np.arange(len(t.input_ids))
                - np.repeat(t.node_offset, t.node_length)
            )
            start_parts.append(t.node_offset + tok_base)
            len_parts.append(t.node_length)
            parent_parts.append(np.where(t.node_parent >= 0, t.node_parent + node_base, -1))
            last_parts.append(t.node_last + node_base)
            tok_base += len(t.input_ids)
            node_base += nn

    input_ids = np.concatenate(ids_parts)
    position_ids = np.concatenate(pos_parts)
    node_start = np.concatenate(start_parts)
    node_length = np.concatenate(len_parts)
    node_parent = np.concatenate(parent_parts)
    node_last = np.concatenate(last_parts)
    T = len(input_ids)
    token_node = np.repeat(np.arange(len(node_start), dtype=np.int64), node_length)
    prev = np.arange(T, dtype=np.int64) - 1
    has_p = node_parent >= 0
    pp = np.maximum(node_parent, 0)
    prev[node_start] = np.where(has_p, node_start[pp] + node_length[pp] - 1, -1)

    # normalizers
    n_s = np.array([len(x) for x in seq_targets], dtype=np.float64)
    cnt = np.array(seq_cnt, dtype=np.float64)
    n_traj = np.array(seq_traj_tok, dtype=np.float64)
    own = (
        float((cnt * n_s).sum()),
        float(cnt[n_s > 0].sum()),
        float(len({k for k, n in zip(seq_traj, n_traj, strict=True) if n > 0})),
    )
    big_n, big_s, big_tr = (o if g is None else float(g) for o, g in zip(own, totals, strict=True))
    coef = _coefficients(norm, n_s, n_traj, big_n, big_s, big_tr)

    # pairs and per-target sums
    pair_tok = np.concatenate(seq_targets) if seq_targets else np.zeros(0, dtype=np.int64)
    pair_seq = np.repeat(np.arange(len(seq_targets), dtype=np.int64), n_s.astype(np.int64))
    target_index, pair_target = np.unique(pair_tok, return_inverse=True)
    K = len(target_index)
    if K and (prev[target_index] < 0).any():
        raise TreeprepError("a trained target has no predecessor (batch invariant broken)")
    pc = (coef * cnt)[pair_seq]
    adv = np.array(seq_adv, dtype=np.float64)
    pa_ = adv[pair_seq]
    weight = np.bincount(pair_target, weights=pc, minlength=K)
    finite = np.nan_to_num(pa_, nan=0.0)
    bad_adv = np.isnan(pa_)

    # RL units: (target, old log-prob, reference log-prob) triples, so that sequences disagreeing
    # on a shared target's old (or reference) log-prob keep their own ratio; U == K when they
    # agree (the usual case)
    pair_lp = _flat(seq_targets, seq_lp)
    pair_ref = _flat(seq_targets, seq_ref)
    key = np.where(np.isnan(pair_lp), np.inf, pair_lp)  # log-probs are <= 0: inf is free
    rkey = np.where(np.isnan(pair_ref), np.inf, pair_ref)
    order = np.lexsort((rkey, key, pair_target))
    ks, rs, ts = key[order], rkey[order], pair_target[order]
    new = np.ones(len(ts), dtype=bool)
    if len(ts) > 1:
        new[1:] = (ts[1:] != ts[:-1]) | (ks[1:] != ks[:-1]) | (rs[1:] != rs[:-1])
    pair_unit = np.empty(len(ts), dtype=np.int64)
    pair_unit[order] = np.cumsum(new) - 1
    U = int(new.sum())
    unit_target = ts[new]
    unit_old = np.where(np.isinf(ks[new]), np.nan, ks[new])
    unit_ref = np.where(np.isinf(rs[new]), np.nan, rs[new])
    unit_weight = np.bincount(pair_unit, weights=pc, minlength=U)
    adv_pos = np.bincount(pair_unit, weights=pc * np.maximum(finite, 0.0), minlength=U)
    adv_neg = np.bincount(pair_unit, weights=pc * np.minimum(finite, 0.0), minlength=U)
    if bad_adv.any():
        bad = np.bincount(pair_unit, weights=bad_adv.astype(np.float64), minlength=U) > 0
        adv_pos[bad] = np.nan
        adv_neg[bad] = np.nan
    spread = 0.0
    has_lp = ~np.isnan(pair_lp)
    if has_lp.any():
        hi = np.full(K, -np.inf)
        lo = np.full(K, np.inf)
        np.maximum.at(hi, pair_target[has_lp], pair_lp[has_lp])
        np.minimum.at(lo, pair_target[has_lp], pair_lp[has_lp])
        ok = np.isfinite(hi)
        spread = float((hi[ok] - lo[ok]).max())

    def t64(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x, dtype=np.int64), device=device)

    def f64(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x, dtype=np.float64), device=device)

    return TreeBatch(
        input_ids=t64(input_ids),
        position_ids=t64(position_ids),
        token_node=t64(token_node),
        node_start=t64(node_start),
        node_length=t64(node_length),
        node_parent=t64(node_parent),
        node_last=t64(node_last),
        prev=t64(prev),
        target_index=t64(target_index),
        weight=f64(weight),
        unit_target=t64(unit_target),
        unit_weight=f64(unit_weight),
        adv_pos=f64(adv_pos),
        adv_neg=f64(adv_neg),
        old_logp=f64(unit_old),
        ref_logp=f64(unit_ref),
        pair_seq=t64(pair_seq),
        pair_target=t64(pair_target),
        pair_old_logp=f64(pair_lp),
        seq_coef=f64(coef),
        seq_count=t64(cnt),
        seq_advantage=f64(adv),
        seq_tree=t64(np.array(seq_tree, dtype=np.int64)),
        seq_trained=t64(n_s),
        layout=layout,
        norm=norm,
        num_trees=len(trees),
        tokens_linear=tokens_linear,
        old_logp_spread=spread,
        advantage_errors=tuple(t.advantage_error for t in trees if t.advantage_error),
        _totals=own,
    )


def _flat(seq_targets: list[np.ndarray], per_seq: list[np.ndarray | None]) -> np.ndarray:
    """Per (sequence, target) pair, the sequence's value for it (NaN where it has none)."""
    if not seq_targets:
        return np.zeros(0)
    return np.concatenate(
        [
            np.full(len(x), np.nan) if v is None else v
            for x, v in zip(seq_targets, per_seq, strict=True)
        ]
    )


def _coefficients(
    norm: str, n_s: np.ndarray, n_traj: np.ndarray, big_n: float, big_s: float, big_tr: float
) -> np.ndarray:
    """c_s per sequence entry for ``norm`` (module docstring)."""
    if norm == "sum":
        return np.ones(len(n_s))
    if norm == "token-mean":
        return np.full(len(n_s), 1.0 / big_n if big_n > 0 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        if norm == "sequence-mean":
            return np.where(n_s > 0, 1.0 / (n_s * big_s), 0.0)
        return np.where((n_s > 0) & (n_traj > 0), 1.0 / (n_traj * big_tr), 0.0)
