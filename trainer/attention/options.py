"""What one attention layer adds to the tree rule: a sliding window, logit soft-capping, sinks.

Families differ per layer (the config's ``layer_types``): gpt-oss and Gemma 3 alternate sliding
and full layers, gpt-oss adds a learned *sink* logit per head (an extra column of the softmax that
takes probability mass and contributes no value), Gemma 2 style models soft-cap the scores
(``cap * tanh(s / cap)`` after scaling, before the mask). transformers hands all three to the
attention function as keywords; :class:`LayerOptions` carries them to the backend, and
:func:`softmax_rows` is the one place the sink column enters a softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerOptions:
    """A layer's extras (all optional; the default is plain tree attention)."""

    #: sliding window in depths: a query sees keys with depth[q] - depth[k] < window
    window: int | None = None
    #: attention logit soft-capping (scores become cap * tanh(scores / cap))
    softcap: float | None = None
    #: per query head sink logits [H] (gpt-oss ``s_aux``)
    sinks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"a sliding window must be >= 1, got {self.window}")

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None


PLAIN = LayerOptions()


def cap_scores(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Soft-capping of scaled scores (identity without a cap)."""
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def softmax_rows(s: torch.Tensor, sink_rows: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis, with one extra sink logit per row when given (dropped after):
    ``s`` [..., R, L], ``sink_rows`` broadcastable to [..., R, 1]."""
    if sink_rows is None:
        return torch.softmax(s, dim=-1)
    sink = sink_rows.to(s.dtype).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
