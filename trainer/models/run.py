"""Running a loaded model over packed trees: the decoder under a :class:`TreeMask`, and the head.

The decoder is called with ``position_ids`` = depths and the batch's
:class:`~treeprep.trainer.attention.TreeMask` as an extra keyword, which transformers passes down
to every attention call (and to every linear-attention layer). Because ``"treeprep"`` has no entry
in transformers' mask interface, transformers builds no causal mask of its own (and does not try
to detect packed sequences from the position ids).

Only the decoder runs over all T packed tokens; the LM head runs on the K predecessors of trained
targets (see :mod:`treeprep.trainer.objective.loss`), which is where a tree saves the
vocabulary-sized work.
:func:`output_head` is that head as the model's own forward applies it: with the final logit
soft-capping of the families that use one (Gemma 2/3 style ``cap * tanh(logits / cap)``).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from treeprep.trainer.attention.backends import choose_backend
from treeprep.trainer.attention.hf import ATTN_NAME, register_attention
from treeprep.trainer.attention.mask import TreeMask


class SoftcappedHead(torch.nn.Module):
    """An LM head followed by ``cap * tanh(logits / cap)`` (the model's final soft-capping)."""

    def __init__(self, head: torch.nn.Module, cap: float) -> None:
        super().__init__()
        self.head = head
        self.cap = float(cap)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.cap_logits(self.head(h))

    def cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The soft-capping applied to the inner head's logits."""
        return torch.tanh(logits / self.cap) * self.cap


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The LM head as the model's forward applies it (final soft-capping included)."""
    hf = cast(Any, model)  # a transformers model; nn.Module's __getattr__ stub: Tensor | Module
    head = hf.get_output_embeddings()
    cap = getattr(hf.config, "final_logit_softcapping", None)
    return SoftcappedHead(head, cap) if cap else head


def run_decoder(
    model: torch.nn.Module,
    input_ids_T: torch.Tensor,
    position_ids_T: torch.Tensor,
    tree_mask: TreeMask,
    context: Any = None,
) -> torch.Tensor:
    """The decoder over packed tokens under ``tree_mask``; final (normed) hidden states h_TE.
    With ``context`` (a :class:`~treeprep.trainer.context.ContextGroup`) the tokens are this
    rank's slice and every attention call exchanges heads for tokens with the group."""
    # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
    hf = cast(Any, model)
    if hf.config._attn_implementation != ATTN_NAME:
        register_attention()
        hf.set_attn_implementation(ATTN_NAME)
    out = hf.get_decoder()(
        input_ids=input_ids_T[None],
        position_ids=position_ids_T[None],
        use_cache=False,
        tree_mask=tree_mask,
        **({"cp_group": context} if context is not None else {}),
    )
    return out.last_hidden_state[0]


def decoder_hidden(model: torch.nn.Module, batch: Any, attn: str | None = None) -> torch.Tensor:
    """Run the decoder over the packed trees; returns the final hidden states h_TE (normed)."""
    attn = attn or getattr(model, "treeprep_attn", "auto")
    tm = TreeMask.from_batch(batch, choose_backend(batch.device, batch.num_tokens, attn))
    return run_decoder(model, batch.input_ids, batch.position_ids, tm)


def tree_logits(
    model: torch.nn.Module,
    batch: Any,
    positions: torch.Tensor | None = None,
    attn: str | None = None,
) -> torch.Tensor:
    """Logits at ``positions`` of the packed batch (all tokens when None), float32, [P, V]."""
    h = decoder_hidden(model, batch, attn)
    if positions is not None:
        h = h.index_select(0, positions)
    return output_head(model)(h).float()
