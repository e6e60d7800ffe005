"""What a part hands over to its descendants, per layer, and how gradients come back.

A layer's hand-off state is a small object with two sides:

* :class:`AttentionState`: the post-rotary keys and values of the part's own tokens (positions
  are depths, so a descendant's queries see them exactly as in the whole tree);
* :class:`LinearState`: a linear-attention layer's conv and recurrent states at the end of each of
  the part's node pieces, keyed by the tree index of the piece's last token
  (:mod:`treeprep.trainer.models.hybrid`); a descendant piece reads the one at its predecessor.
  Both kinds offer ``accumulate`` (sum the gradients descendants return) and ``backward_pairs``
  (the part's own graph tensors with those gradients, for its backward).

:class:`HandOff` is the per-part exchange the attention glue calls once per layer
(:func:`treeprep.trainer.attention.hf.hf_tree_attention`): it records the layer's own keys and
values (graph tensors, for the part's backward) and returns the layer's prefix, leaf tensors with
``requires_grad`` gathered from the ancestor parts' stored states. After the part's backward the
leaves' gradients are scattered back into the producers' accumulators
(:meth:`HandOff.return_grads`). Linear-attention layers call :meth:`HandOff.linear_state` and
:meth:`HandOff.record_linear` instead; their leaves are made on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def backward_pairs(self, ho: HandOff, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.gk is None or self.gv is None:
            return []
        k, v = ho.own[layer]
        return [(k, self.gk.to(k.dtype)), (v, self.gv.to(v.dtype))]


@dataclass
class LinearState:
    """A part's linear-attention states for one layer (detached), by the tree index of the last
    token of each node piece, plus the gradients descendants returned for them."""

    states: dict[int, tuple[torch.Tensor, torch.Tensor]]
    grads: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def accumulate(self, key: int, gconv: torch.Tensor, grec: torch.Tensor) -> None:
        g = self.grads.get(key)
        if g is None:
            self.grads[key] = [gconv.float().clone(), grec.float().clone()]
        else:
            g[0] += gconv.float()
            g[1] += grec.float()

    def backward_pairs(self, ho: HandOff, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        own = ho.linear_own.get(layer, {})
        out = []
        for key, (gc, gr) in self.grads.items():
            conv, rec = own[key]
            out += [(conv, gc.to(conv.dtype)), (rec, gr.to(rec.dtype))]
        return out


LayerState = AttentionState | LinearState


class HandOff:
    """One part's exchange: prefix leaves in, own keys and values recorded (see module doc).

    A plain class, not a dataclass: wrappers that rebuild dataclasses and dicts in a module's
    inputs (FSDP2) must hand every layer this very object, or the records would go to copies."""

    __slots__ = (
        "linear_leaves",
        "linear_own",
        "linear_sources",
        "own",
        "prefix",
        "requires_grad",
    )

    def __init__(
        self,
        prefix: dict[int, tuple[torch.Tensor, torch.Tensor]],
        *,
        linear_sources: dict[int, list[tuple[int, LinearState]]] | None = None,
        requires_grad: bool = False,
    ) -> None:
        #: per layer, the part's prefix (leaf tensors); empty for a part without prefix
        self.prefix = prefix
        #: per layer, the part's own keys and values as computed (graph tensors)
        self.own: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: linear-attention layers: the ancestors' stored states (part, state) per layer
        self.linear_sources = linear_sources or {}
        #: linear-attention leaves made so far: (layer, key) -> (part, conv leaf, recurrent leaf)
        self.linear_leaves: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor]] = {}
        #: per layer, the part's own linear-attention states by key (graph tensors)
        self.linear_own: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.requires_grad = requires_grad

    def linear_state(self, layer: int, key: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state after tree token ``key`` for ``layer``, as leaves (made once per part)."""
        hit = self.linear_leaves.get((layer, key))
        if hit is None:
            for part, st in self.linear_sources.get(layer, []):
                if key in st.states:
                    conv, rec = st.states[key]
                    hit = (
                        part,
                        conv.detach().requires_grad_(self.requires_grad),
                        rec.detach().requires_grad_(self.requires_grad),
                    )
                    break
            else:
                raise RuntimeError(f"layer {layer}: no handed-over state after token {key}")
            self.linear_leaves[(layer, key)] = hit
        return hit[1], hit[2]

    def record_linear(
        self, layer: int, key: int, conv: torch.Tensor, recurrent: torch.Tensor
    ) -> None:
        self.linear_own.setdefault(layer, {})[key] = (conv, recurrent)

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
        states: dict[int, list[LayerState]],
        sources: list[tuple[int, np.ndarray]],
        layers: int,
        requires_grad: bool,
    ) -> HandOff:
        """The prefix of a part from its ancestors' stored ``states`` (part -> per layer)."""
        prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        linear: dict[int, list[tuple[int, LinearState]]] = {}
        if sources:
            for li in range(layers):
                first = states[sources[0][0]][li]
                if isinstance(first, LinearState):
                    linear[li] = [(p, states[p][li]) for p, _ in sources]  # type: ignore[misc]
                    continue
                ks, vs = zip(
                    *(states[p][li].rows(rows) for p, rows in sources),  # type: ignore[union-attr]
                    strict=True,
                )
                k = torch.cat(ks, dim=2) if len(ks) > 1 else ks[0]
                v = torch.cat(vs, dim=2) if len(vs) > 1 else vs[0]
                prefix[li] = (k.requires_grad_(requires_grad), v.requires_grad_(requires_grad))
        return cls(prefix, linear_sources=linear, requires_grad=requires_grad)

    def return_grads(
        self, states: dict[int, list[LayerState]], sources: list[tuple[int, np.ndarray]]
    ) -> None:
        """Scatter the prefix leaves' gradients back into the producing parts' accumulators."""
        for (li, key), (p, conv, rec) in self.linear_leaves.items():
            if conv.grad is None and rec.grad is None:
                continue
            gc = conv.grad if conv.grad is not None else torch.zeros_like(conv)
            gr = rec.grad if rec.grad is not None else torch.zeros_like(rec)
            st = states[p][li]
            assert isinstance(st, LinearState)
            st.accumulate(key, gc, gr)
        sizes = [len(r) for _, r in sources]
        for li, (pk, pv) in self.prefix.items():
            if pk.grad is None and pv.grad is None:
                continue
            gk = pk.grad if pk.grad is not None else torch.zeros_like(pk)
            gv = pv.grad if pv.grad is not None else torch.zeros_like(pv)
            for (p, rows), gk_s, gv_s in zip(
                sources, gk.split(sizes, dim=2), gv.split(sizes, dim=2), strict=True
            ):
                st = states[p][li]
                assert isinstance(st, AttentionState)
                st.accumulate(rows, gk_s, gv_s)
