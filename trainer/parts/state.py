"""What a part hands over to its descendants, per layer, and how gradients come back.

A layer's hand-off state is a small object with two sides:

* :class:`AttentionState`: the post-rotary keys and values of the part's own tokens (positions
  are depths, so a descendant's queries see them exactly as in the whole tree);
* a linear-attention or state-space layer would hand over its conv and recurrent state at the
  part's boundary instead (the model-family work plugs in here: the same two calls, ``rows`` to
  slice what a descendant needs and ``accumulate`` to sum the gradients it returns).

:class:`HandOff` is the per-part exchange the attention glue calls once per layer
(:func:`treeprep.trainer.attention.hf.hf_tree_attention`): it records the layer's own keys and
values (graph tensors, for the part's backward) and returns the layer's prefix, leaf tensors with
``requires_grad`` gathered from the ancestor parts' stored states. After the part's backward the
leaves' gradients are scattered back into the producers' accumulators
(:meth:`HandOff.return_grads`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionState:
    """A part's keys and values for one layer, detached, plus their accumulated gradients."""

    k: torch.Tensor  # [1, G, T, D]
    v: torch.Tensor
    gk: torch.Tensor | None = None  # float32 (float64 for float64 k), from descendants
    gv: torch.Tensor | None = None

    def rows(self, local: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(local, device=self.k.device)
        return self.k.index_select(2, idx), self.v.index_select(2, idx)

    def accumulate(self, local: np.ndarray, gk: torch.Tensor, gv: torch.Tensor) -> None:
        idx = torch.as_tensor(local, device=self.k.device)
        acc = torch.float64 if self.k.dtype == torch.float64 else torch.float32
        if self.gk is None or self.gv is None:
            self.gk = torch.zeros(self.k.shape, dtype=acc, device=self.k.device)
            self.gv = torch.zeros(self.v.shape, dtype=acc, device=self.v.device)
        self.gk.index_add_(2, idx, gk.to(acc))
        self.gv.index_add_(2, idx, gv.to(acc))


class HandOff:
    """One part's exchange: prefix leaves in, own keys and values recorded (see module doc).

    A plain class, not a dataclass: wrappers that rebuild dataclasses and dicts in a module's
    inputs (FSDP2) must hand every layer this very object, or the records would go to copies."""

    __slots__ = ("own", "prefix")

    def __init__(self, prefix: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        #: per layer, the part's prefix (leaf tensors); empty for a part without prefix
        self.prefix = prefix
        #: per layer, the part's own keys and values as computed (graph tensors)
        self.own: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def exchange(
        self, layer: int | None, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if layer is None:
            raise RuntimeError("hand-off parts need attention modules with a layer_idx")
        self.own[layer] = (key, value)
        return self.prefix.get(layer)

    @classmethod
    def gather(
        cls,
        states: dict[int, list[AttentionState]],
        sources: list[tuple[int, np.ndarray]],
        layers: int,
        requires_grad: bool,
    ) -> HandOff:
        """The prefix of a part from its ancestors' stored ``states`` (part -> per layer)."""
        prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if sources:
            for li in range(layers):
                ks, vs = zip(*(states[p][li].rows(rows) for p, rows in sources), strict=True)
                k = torch.cat(ks, dim=2) if len(ks) > 1 else ks[0]
                v = torch.cat(vs, dim=2) if len(vs) > 1 else vs[0]
                prefix[li] = (k.requires_grad_(requires_grad), v.requires_grad_(requires_grad))
        return cls(prefix)

    def return_grads(
        self, states: dict[int, list[AttentionState]], sources: list[tuple[int, np.ndarray]]
    ) -> None:
        """Scatter the prefix leaves' gradients back into the producing parts' accumulators."""
        sizes = [len(r) for _, r in sources]
        for li, (pk, pv) in self.prefix.items():
            if pk.grad is None and pv.grad is None:
                continue
            gk = pk.grad if pk.grad is not None else torch.zeros_like(pk)
            gv = pv.grad if pv.grad is not None else torch.zeros_like(pv)
            for (p, rows), gk_s, gv_s in zip(
                sources, gk.split(sizes, dim=2), gv.split(sizes, dim=2), strict=True
            ):
                states[p][li].accumulate(rows, gk_s, gv_s)
