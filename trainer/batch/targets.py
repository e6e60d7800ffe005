"""The trained targets of a batch (or of one hand-off part) and their restored coefficients.

Shape legend: K targets, U RL units, P (sequence, target) pairs, S sequence entries.

A :class:`~treeprep.trainer.batch.TreeBatch` computes every coefficient once for its whole
packed layout (see its module docstring); :class:`Targets` is the part of it that the loss reads:
which hidden row predicts each target (``pred``), the target token, the per-target weight, the RL
units, the (sequence, target) pairs and the per-sequence normalizers. :meth:`Targets.select`
keeps a subset of the targets with their units and pairs (indices renumbered), which is how a
hand-off part trains exactly its own share of the tree's loss: the coefficients are the tree's,
so the parts' losses sum to the whole tree's loss term for term.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch


@dataclass
class Targets:
    pred: torch.Tensor  # [K] int64, row of the hidden states that predicts the target
    token: torch.Tensor  # [K] int64
    weight: torch.Tensor  # [K] float64, w_t
    unit_target: torch.Tensor  # [U] int64, index into the K targets
    unit_weight: torch.Tensor  # [U] float64
    adv_pos: torch.Tensor  # [U] float64
    adv_neg: torch.Tensor  # [U] float64
    old_logp: torch.Tensor  # [U] float64, NaN where none is stored
    ref_logp: torch.Tensor  # [U] float64, NaN where none is stored
    pair_seq: torch.Tensor  # [P] int64
    pair_target: torch.Tensor  # [P] int64, index into the K targets
    pair_old_logp: torch.Tensor  # [P] float64
    seq_coef: torch.Tensor  # [S] float64
    seq_count: torch.Tensor  # [S] int64
    seq_advantage: torch.Tensor  # [S] float64

    @property
    def num_targets(self) -> int:
        return int(self.pred.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.seq_coef.shape[0])

    def to(self, device: str | torch.device) -> Targets:
        return Targets(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, keep_K: np.ndarray, pred_k: np.ndarray) -> Targets:
        """The targets where ``keep_K`` is true, predicted from rows ``pred_k`` (one per kept
        target), with their units and pairs; sequences are kept whole (pairs index them)."""
        dev = self.pred.device
        keep = torch.as_tensor(keep_K, device=dev)
        new_id = torch.cumsum(keep.long(), 0) - 1
        u_keep = keep.index_select(0, self.unit_target)
        p_keep = keep.index_select(0, self.pair_target)
        return Targets(
            pred=torch.as_tensor(np.ascontiguousarray(pred_k, dtype=np.int64), device=dev),
            token=self.token[keep],
            weight=self.weight[keep],
            unit_target=new_id.index_select(0, self.unit_target)[u_keep],
            unit_weight=self.unit_weight[u_keep],
            adv_pos=self.adv_pos[u_keep],
            adv_neg=self.adv_neg[u_keep],
            old_logp=self.old_logp[u_keep],
            ref_logp=self.ref_logp[u_keep],
            pair_seq=self.pair_seq[p_keep],
            pair_target=new_id.index_select(0, self.pair_target)[p_keep],
            pair_old_logp=self.pair_old_logp[p_keep],
            seq_coef=self.seq_coef,
            seq_count=self.seq_count,
            seq_advantage=self.seq_advantage,
        )
