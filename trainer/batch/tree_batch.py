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
rows prepared by :func:`treeprep.trainer.batch.advantages.prepare_row` carry their trajectories'
token
counts from the whole tree, so a part of a tree keeps the tree's n_traj. The restored weight of
target t is ``w_t = sum_s count_s c_s m_s(t)``; the RL coefficients split the same sum by the sign
of the sequence advantage: ``adv_pos_t = sum_{A_s > 0} count_s c_s m_s(t) A_s`` and ``adv_neg_t``
likewise for A_s < 0, which restores the PPO/GRPO clipped loss exactly because the ratio r_t is
shared by all sequences through t.

Advantages come from ``seq_advantage``; where a tree has none but every trajectory has a reward,
the group advantage over the tree's *trajectories* (``adv_norm``: grpo, dr-grpo, rloo or none; see
:mod:`treeprep.trainer.batch.advantages`) is used, and every call of a trajectory carries it.
Sequences
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

The assembly itself (rows checked, laid out, coefficients summed) is host work in numpy,
:mod:`treeprep.trainer.batch.assembly`; this module holds the batch it fills and the copy of its
arrays to the device (on CUDA from pinned memory, non-blocking, so that a batch built in the
prefetch thread, :mod:`treeprep.trainer.data.prefetch`, overlaps the running step). Facts the
loss must check (a missing advantage or reference log-prob: :class:`Missing`) are found in numpy
there too, so the loss never reads a device tensor back to refuse a batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from treeprep.errors import TreeprepError
from treeprep.modes import AdvNorm, Layout, Norm
from treeprep.trainer.batch.assembly import Assembled, Missing, assemble, read_tree
from treeprep.trainer.batch.targets import Targets

__all__ = ["Missing", "TreeBatch"]


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
    #: what the loss refuses, found on the host at assembly (:class:`Missing`)
    missing: Missing
    #: why some tree's advantages from rewards are unknown (an RL loss refuses with it)
    advantage_errors: tuple[str, ...] = ()
    _totals: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _cache_targets: Targets | None = field(default=None, repr=False, compare=False)
    #: a one-tree batch that runs as hand-off parts: (part boundaries, part parents) from the plan
    part_cuts: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False)

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
        kw: dict[str, Any] = {}
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
        norm: Norm | str = Norm.sum,
        layout: Layout | str = Layout.tree,
        total_tokens: float | None = None,
        total_sequences: float | None = None,
        total_trajectories: float | None = None,
        adv_norm: AdvNorm | str = AdvNorm.grpo,
        device: str | torch.device = "cpu",
        share_prefixes: bool = False,
    ) -> TreeBatch:
        """Pack tree rows (shard rows as dicts, or :class:`treeprep.trie.Tree`-like objects).

        ``norm`` picks c_s (module docstring); ``total_tokens`` / ``total_sequences`` /
        ``total_trajectories`` override the batch's own N, S and Tr. ``adv_norm`` normalizes
        rewards into advantages over each tree's trajectories where a tree has no advantages.
        ``layout="linear"`` lays every sequence copy out on its own. ``share_prefixes`` merges
        the trees' common prefixes into one forest (:mod:`treeprep.pack.share`): the same
        sequences, coefficients and loss, the shared openings fed once.
        """
        norm = Norm.of(norm, "norm", TreeprepError)
        layout = Layout.of(layout, "layout", TreeprepError)
        adv_norm = AdvNorm.of(adv_norm, "adv_norm", TreeprepError)
        trees = [read_tree(r, i, adv_norm) for i, r in enumerate(rows)]
        if not trees:
            raise TreeprepError("a batch needs at least one tree")
        totals = (total_tokens, total_sequences, total_trajectories)
        a = assemble(trees, norm, layout, totals, share_prefixes)
        return _on_device(a, norm, layout, device)

    @classmethod
    def from_table(cls, table: Any, **kw: Any) -> TreeBatch:
        """Pack every row of a pyarrow table with the shard schema."""
        return cls.from_trees(table.to_pylist(), **kw)


def _tensor(x: np.ndarray, dtype: Any, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on CUDA through pinned memory with a non-blocking copy (the
    caching host allocator keeps the pinned buffer until the copy is done)."""
    t = torch.as_tensor(np.ascontiguousarray(x, dtype=dtype))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _on_device(a: Assembled, norm: str, layout: str, device: str | torch.device) -> TreeBatch:
    """The host arrays as the batch's tensors on ``device``."""
    dev = torch.device(device)
    tensors: dict[str, Any] = {k: _tensor(v, np.int64, dev) for k, v in a.ints.items()}
    tensors |= {k: _tensor(v, np.float64, dev) for k, v in a.floats.items()}
    return TreeBatch(
        **tensors,
        layout=layout,
        norm=norm,
        num_trees=a.num_trees,
        tokens_linear=a.tokens_linear,
        old_logp_spread=a.old_logp_spread,
        missing=a.missing,
        advantage_errors=a.advantage_errors,
        _totals=a.totals,
    )
