"""Tree rows to the packed arrays of one micro-batch, on the host, in numpy.

What the arrays mean (layout, targets, the restored weights and RL coefficients) is the contract
of :class:`~treeprep.trainer.batch.tree_batch.TreeBatch`, written down in that module's
docstring; this module computes them, in steps that each hold one idea:

1. :func:`read_tree` checks a row (shard row dict, or a :class:`treeprep.trie.Tree`-like object)
   with the schema's :func:`~treeprep.schemas.shard.validate_tree_row` and turns it into arrays,
   with the tree's advantages (given, or from rewards over its trajectories) and each
   trajectory's trained targets;
2. :func:`_pack` lays the trees out: each tree once (tree layout) or every copy of every sequence
   on its own (linear layout), and records each sequence entry's packed targets; the root-to-node
   token paths come from :func:`treeprep.treeindex.path_offsets`;
3. :func:`_node_arrays` gives every token its node and predecessor;
4. :func:`_normalizers` the c_s of ``norm``, then the (sequence, target) pairs, the per-target
   weights, and :func:`_units` the RL units with their advantage sums;
5. :class:`Missing`: what an RL loss or a KL penalty would refuse, found here, so that the loss
   never reads a device tensor back to check it.

Cost: numpy throughout; Python loops run per tree, per sequence and per node of a path, never per
token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treeprep.errors import TreeprepError
from treeprep.pack.share import Forest, merge_forest
from treeprep.schemas.shard import validate_tree_row
from treeprep.trainer.batch.advantages import (
    group_advantages,
    trajectory_index,
    trajectory_tokens,
)
from treeprep.treeindex import path_offsets


def _get(row: Any, key: str) -> Any:
    if isinstance(row, Mapping):
        return row[key]
    return getattr(row, key)


def _opt(row: Any, key: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(key)
    return getattr(row, key, None)


def _per_token(raw: Any, n: int) -> list[np.ndarray | None]:
    """Per sequence, a float64 array of one value per trained token (or None)."""
    if raw is None:
        return [None] * n
    return [None if v is None else np.asarray(v, dtype=np.float64) for v in raw]


@dataclass
class TreeArrays:
    """One tree's arrays, validated (:func:`read_tree`)."""

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


def read_tree(row: Any, index: int, adv_norm: str = "grpo") -> TreeArrays:
    """One row as arrays, checked (:func:`treeprep.schemas.shard.validate_tree_row`), with its
    advantages and each trajectory's trained targets."""
    name = f"tree {index} ({_get(row, 'group_id')!r})"
    validate_tree_row(row, name)

    def i32(k: str) -> np.ndarray:
        return np.asarray(_get(row, k), dtype=np.int64)

    ids = i32("input_ids")
    parent, offset, length = i32("node_parent"), i32("node_offset"), i32("node_length")
    depth, last = i32("node_depth"), i32("node_last")
    seq_node = i32("seq_node")
    ns = len(seq_node)
    counts = i32("seq_count")
    spans = [
        np.asarray(s if s is not None else [], dtype=np.int64) for s in _get(row, "seq_loss_spans")
    ]
    lps = _per_token(_get(row, "seq_logprobs"), ns)
    refs = _per_token(_opt(row, "seq_ref_logprobs"), ns)
    adv_raw = _get(row, "seq_advantage")
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
    return TreeArrays(
        name, ids, parent, offset, length, depth, last, seq_node, counts, spans, lps, refs, adv,
        traj, traj_tok, error,
    )  # fmt: skip


@dataclass(frozen=True)
class Missing:
    """Which inputs of an RL loss or a KL penalty some part of the batch lacks, found in numpy when
    the batch is assembled, so that the loss checks them
    (:func:`~treeprep.trainer.objective.loss.check_inputs`) without reading device tensors back (a
    host-device sync per micro-batch)."""

    #: some RL unit has a NaN ``adv_pos`` / ``adv_neg`` (a sequence without advantage)
    unit_advantage: bool = False
    #: some sequence entry has a NaN ``seq_advantage``
    seq_advantage: bool = False
    #: some RL unit has no reference log-prob
    ref_logp: bool = False


def _trained_depths(spans: np.ndarray) -> np.ndarray:
    if not len(spans):
        return np.zeros(0, dtype=np.int64)
    parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(spans[0::2], spans[1::2], strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass
class _Packed:
    """The packed sequence being laid out: per tree (tree layout) or per sequence copy (linear
    layout), its tokens, positions and nodes with global ids; and per sequence entry, the packed
    indices of its trained targets and its per-sequence values."""

    ids: list[np.ndarray] = field(default_factory=list)
    pos: list[np.ndarray] = field(default_factory=list)
    start: list[np.ndarray] = field(default_factory=list)
    length: list[np.ndarray] = field(default_factory=list)
    parent: list[np.ndarray] = field(default_factory=list)
    last: list[np.ndarray] = field(default_factory=list)
    tok_base: int = 0
    node_base: int = 0
    tokens_linear: int = 0
    targets: list[np.ndarray] = field(default_factory=list)
    lp: list[np.ndarray | None] = field(default_factory=list)
    ref: list[np.ndarray | None] = field(default_factory=list)
    cnt: list[int] = field(default_factory=list)
    traj: list[tuple[int, int]] = field(default_factory=list)
    traj_tok: list[float] = field(default_factory=list)
    adv: list[float] = field(default_factory=list)
    tree: list[int] = field(default_factory=list)

    def add_tree(self, t: TreeArrays) -> None:
        """The whole tree as it is (tree layout): node ids and offsets shifted."""
        self.ids.append(t.input_ids)
        self.pos.append(
            np.repeat(t.node_depth, t.node_length)
            + np.arange(len(t.input_ids))
            - np.repeat(t.node_offset, t.node_length)
        )
        self.start.append(t.node_offset + self.tok_base)
        self.length.append(t.node_length)
        self.parent.append(np.where(t.node_parent >= 0, t.node_parent + self.node_base, -1))
        self.last.append(t.node_last + self.node_base)
        self.tok_base += len(t.input_ids)
        self.node_base += len(t.node_parent)

    def add_forest(self, f: Forest) -> None:
        """Every tree merged into one forest (``share``): shared openings laid out once."""
        self.ids.append(f.input_ids)
        self.pos.append(f.position_ids)
        self.start.append(f.node_start)
        self.length.append(f.node_length)
        self.parent.append(f.node_parent)
        self.last.append(f.node_last)
        self.tok_base = len(f.input_ids)
        self.node_base = len(f.node_start)

    def add_path(self, ids: np.ndarray) -> int:
        """One sequence copy as its own one-node tree (linear layout); its first packed index."""
        n, base = len(ids), self.tok_base
        self.ids.append(ids)
        self.pos.append(np.arange(n, dtype=np.int64))
        self.start.append(np.array([base], dtype=np.int64))
        self.length.append(np.array([n], dtype=np.int64))
        self.parent.append(np.array([-1], dtype=np.int64))
        self.last.append(np.array([self.node_base], dtype=np.int64))
        self.tok_base += n
        self.node_base += 1
        return base

    def add_entry(
        self, t: TreeArrays, ti: int, s: int, tgt: np.ndarray, keep: np.ndarray, cnt: int
    ) -> None:
        """Sequence ``s`` of tree ``ti`` (or one copy of it), trained at packed indices ``tgt``
        (``keep``: which of its trained depths are targets)."""
        lp, ref = t.seq_logprobs[s], t.seq_ref[s]
        self.targets.append(tgt)
        self.lp.append(None if lp is None else lp[keep])
        self.ref.append(None if ref is None else ref[keep])
        self.traj.append((ti, int(t.seq_traj[s])))
        self.traj_tok.append(float(t.seq_traj_tokens[s]))
        self.cnt.append(cnt)
        self.adv.append(float(t.seq_advantage[s]))
        self.tree.append(ti)


def _pack(trees: list[TreeArrays], layout: str, share: bool = False) -> _Packed:
    """Lay the trees out (module docstring): in the tree layout each tree once (with ``share``,
    the trees merged into one forest, :mod:`treeprep.pack.share`), in the linear layout every copy
    of every sequence on its own; each entry with its packed targets."""
    pk = _Packed()
    forest = None
    if layout == "tree" and share and len(trees) > 1:
        forest = merge_forest(
            [t.input_ids for t in trees],
            [t.node_parent for t in trees],
            [t.node_offset for t in trees],
            [t.node_length for t in trees],
        )
    for ti, t in enumerate(trees):
        paths = path_offsets(t.node_parent, t.node_offset, t.node_length, t.seq_node)
        pk.tokens_linear += int(
            sum(len(p) * int(c) for p, c in zip(paths, t.seq_count, strict=True))
        )
        for s, path in enumerate(paths):
            depths = _trained_depths(t.seq_spans[s])
            if len(depths) and (depths[-1] > len(path) or (depths >= len(path)).any()):
                raise TreeprepError(f"{t.name}: sequence {s} has a loss span past its length")
            keep = depths > 0  # a path's first token has no predecessor: never a target
            if layout == "tree":
                at = path[depths[keep]]
                tgt = at + pk.tok_base if forest is None else forest.token_map[ti][at]
                pk.add_entry(t, ti, s, tgt, keep, int(t.seq_count[s]))
                continue
            for _ in range(int(t.seq_count[s])):
                base = pk.add_path(t.input_ids[path])
                pk.add_entry(t, ti, s, depths[keep] + base, keep, 1)
        if layout == "tree" and forest is None:
            pk.add_tree(t)
    if forest is not None:
        pk.add_forest(forest)
    return pk


def _node_arrays(pk: _Packed) -> dict[str, np.ndarray]:
    """The packed token and node arrays, with each token's node and predecessor."""
    input_ids = np.concatenate(pk.ids)
    node_start = np.concatenate(pk.start)
    node_length = np.concatenate(pk.length)
    node_parent = np.concatenate(pk.parent)
    prev = np.arange(len(input_ids), dtype=np.int64) - 1
    pp = np.maximum(node_parent, 0)
    prev[node_start] = np.where(node_parent >= 0, node_start[pp] + node_length[pp] - 1, -1)
    return {
        "input_ids": input_ids,
        "position_ids": np.concatenate(pk.pos),
        "token_node": np.repeat(np.arange(len(node_start), dtype=np.int64), node_length),
        "node_start": node_start,
        "node_length": node_length,
        "node_parent": node_parent,
        "node_last": np.concatenate(pk.last),
        "prev": prev,
    }


def _normalizers(
    pk: _Packed, norm: str, totals: tuple[float | None, float | None, float | None]
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """(n_s, c_s, (N, S, Tr) of this batch alone) per sequence entry; ``totals`` override N, S
    and Tr in c_s where given."""
    n_s = np.array([len(x) for x in pk.targets], dtype=np.float64)
    cnt = np.array(pk.cnt, dtype=np.float64)
    n_traj = np.array(pk.traj_tok, dtype=np.float64)
    own = (
        float((cnt * n_s).sum()),
        float(cnt[n_s > 0].sum()),
        float(len({k for k, n in zip(pk.traj, n_traj, strict=True) if n > 0})),
    )
    big_n, big_s, big_tr = (o if g is None else float(g) for o, g in zip(own, totals, strict=True))
    return n_s, _coefficients(norm, n_s, n_traj, big_n, big_s, big_tr), own


@dataclass
class _Units:
    """RL units: (target, old log-prob, reference log-prob) triples, so that sequences
    disagreeing on a shared target's old (or reference) log-prob keep their own ratio; U == K when
    they agree (the usual case)."""

    target: np.ndarray  # [U] index into the K targets
    old: np.ndarray  # [U] NaN where none is stored
    ref: np.ndarray  # [U] NaN where none is stored
    weight: np.ndarray  # [U]
    adv_pos: np.ndarray  # [U] NaN where a sequence of the unit has no advantage
    adv_neg: np.ndarray  # [U]


def _units(
    pair_target: np.ndarray,
    pair_lp: np.ndarray,
    pair_ref: np.ndarray,
    pair_coef: np.ndarray,
    pair_adv: np.ndarray,
) -> _Units:
    """Group the (sequence, target) pairs into units and sum their coefficients (``pair_coef``:
    count_s c_s; ``pair_adv``: A_s, NaN where unknown)."""
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
    finite = np.nan_to_num(pair_adv, nan=0.0)
    adv_pos = np.bincount(pair_unit, weights=pair_coef * np.maximum(finite, 0.0), minlength=U)
    adv_neg = np.bincount(pair_unit, weights=pair_coef * np.minimum(finite, 0.0), minlength=U)
    bad_adv = np.isnan(pair_adv)
    if bad_adv.any():
        bad = np.bincount(pair_unit, weights=bad_adv.astype(np.float64), minlength=U) > 0
        adv_pos[bad] = np.nan
        adv_neg[bad] = np.nan
    return _Units(
        target=ts[new],
        old=np.where(np.isinf(ks[new]), np.nan, ks[new]),
        ref=np.where(np.isinf(rs[new]), np.nan, rs[new]),
        weight=np.bincount(pair_unit, weights=pair_coef, minlength=U),
        adv_pos=adv_pos,
        adv_neg=adv_neg,
    )


def _spread(pair_target: np.ndarray, pair_lp: np.ndarray, k: int) -> float:
    """The largest disagreement of old log-probs on one target (0 without old log-probs)."""
    has_lp = ~np.isnan(pair_lp)
    if not has_lp.any():
        return 0.0
    hi = np.full(k, -np.inf)
    lo = np.full(k, np.inf)
    np.maximum.at(hi, pair_target[has_lp], pair_lp[has_lp])
    np.minimum.at(lo, pair_target[has_lp], pair_lp[has_lp])
    ok = np.isfinite(hi)
    return float((hi[ok] - lo[ok]).max())


@dataclass
class Assembled:
    """One micro-batch on the host: the arrays of a :class:`~treeprep.trainer.batch.TreeBatch` by
    field name (int64 ones in ``ints``, float64 ones in ``floats``) and its other fields."""

    ints: dict[str, np.ndarray]
    floats: dict[str, np.ndarray]
    num_trees: int
    tokens_linear: int
    old_logp_spread: float
    advantage_errors: tuple[str, ...]
    missing: Missing
    totals: tuple[float, float, float]  # this batch's own (N, S, Tr)


def assemble(
    trees: list[TreeArrays],
    norm: str,
    layout: str,
    totals: tuple[float | None, float | None, float | None],
    share: bool = False,
) -> Assembled:
    """Lay ``trees`` out and compute every coefficient (the batch module's docstring);
    ``totals`` override the batch's own (N, S, Tr) where given; ``share`` merges the trees'
    common prefixes into one forest (tree layout only)."""
    pk = _pack(trees, layout, share)
    nodes = _node_arrays(pk)
    n_s, coef, own = _normalizers(pk, norm, totals)
    cnt = np.array(pk.cnt, dtype=np.float64)
    adv = np.array(pk.adv, dtype=np.float64)

    # pairs and per-target sums
    pair_tok = np.concatenate(pk.targets) if pk.targets else np.zeros(0, dtype=np.int64)
    pair_seq = np.repeat(np.arange(len(pk.targets), dtype=np.int64), n_s.astype(np.int64))
    target_index, pair_target = np.unique(pair_tok, return_inverse=True)
    K = len(target_index)
    if K and (nodes["prev"][target_index] < 0).any():
        raise TreeprepError("a trained target has no predecessor (batch invariant broken)")
    pair_coef = (coef * cnt)[pair_seq]
    pair_lp = _flat(pk.targets, pk.lp)
    units = _units(pair_target, pair_lp, _flat(pk.targets, pk.ref), pair_coef, adv[pair_seq])
    # what the loss refuses, found here on the host so that the loss never syncs to ask
    missing = Missing(
        unit_advantage=bool(np.isnan(units.adv_pos).any() or np.isnan(units.adv_neg).any()),
        seq_advantage=bool(np.isnan(adv).any()),
        ref_logp=bool(np.isnan(units.ref).any()),
    )
    ints = nodes | {
        "target_index": target_index,
        "unit_target": units.target,
        "pair_seq": pair_seq,
        "pair_target": pair_target,
        "seq_count": cnt,
        "seq_tree": np.array(pk.tree, dtype=np.int64),
        "seq_trained": n_s,
    }
    floats = {
        "weight": np.bincount(pair_target, weights=pair_coef, minlength=K),
        "unit_weight": units.weight,
        "adv_pos": units.adv_pos,
        "adv_neg": units.adv_neg,
        "old_logp": units.old,
        "ref_logp": units.ref,
        "pair_old_logp": pair_lp,
        "seq_coef": coef,
        "seq_advantage": adv,
    }
    return Assembled(
        ints,
        floats,
        num_trees=len(trees),
        tokens_linear=pk.tokens_linear,
        old_logp_spread=_spread(pair_target, pair_lp, K),
        advantage_errors=tuple(t.advantage_error for t in trees if t.advantage_error),
        missing=missing,
        totals=own,
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
