"""Float64 that means it: a scoped patch keeping a float64 model in float64 where transformers
casts to float32.

transformers computes RMSNorm (``hidden_states.to(torch.float32)``, ``x.float()``), the rotary
embedding's angles (``inv_freq.float()``) and Qwen3.5's gated delta rule in float32 whatever the
model's dtype, so a float64 run is float64 only between those casts: tree and linear then agree
to about 1e-8 (tiny-qwen3) or 1e-7 (tiny-qwen3-5), not to float64 rounding, and ``treeprep
verify --precision float64 --tol 1e-10`` reported a false FAIL.

:func:`keep_float64` runs a block under a :class:`~torch.overrides.TorchFunctionMode` that turns
every cast of a float64 tensor to float32 (``.to(torch.float32)``, ``.to(dtype=...)``,
``.float()``, ``.type(torch.float32)``) into a no-op, and only that: casts of other dtypes, and
float32 tensors made in float32, are untouched, so a float32 model runs exactly as before. The
patch is scoped (the block, this thread) and says what it patched: the classes of the modules
whose forward asked for a kept cast (found through forward hooks, removed on exit), e.g.
``Qwen3RMSNorm``, ``Qwen3RotaryEmbedding``, ``Qwen3_5GatedDeltaNet``. Autograd follows (a kept
cast is the tensor itself), and a part recomputed in the backward runs in the same thread, under
the same mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["keep_float64"]

_F32 = (torch.float32, "torch.FloatTensor")


class _KeepFloat64(TorchFunctionMode):
    """Casts of float64 tensors to float32 return the tensor; ``where`` is told each time."""

    def __init__(self, where: list[str], kept: set[str]) -> None:
        super().__init__()
        self.where = where
        self.kept = kept

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            if _down_cast(func, args, kwargs):
                self.kept.add(self.where[-1] if self.where else "the model")
                return args[0]
        return func(*args, **kwargs)


def _down_cast(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func(*args, **kwargs)`` casts its tensor to float32 (and nothing else)."""
    if func is torch.Tensor.float:
        return True
    if func is torch.Tensor.type:
        target = args[1] if len(args) > 1 else kwargs.get("dtype")
        return target in _F32
    if func is torch.Tensor.to:
        rest = [a for a in args[1:] if not isinstance(a, bool)]
        dtype = kwargs.get("dtype")
        if dtype is None and len(rest) == 1 and isinstance(rest[0], torch.dtype):
            dtype = rest[0]
        moves = any(isinstance(a, (str, torch.device, torch.Tensor)) for a in rest)
        return dtype == torch.float32 and not moves and "device" not in kwargs
    return False


@contextmanager
def keep_float64(model: torch.nn.Module, kept: set[str]) -> Iterator[None]:
    """Run the block with float64 tensors kept in float64 where ``model``'s code casts them to
    float32 (module docstring); ``kept`` gets the classes of the modules patched as it runs."""
    where: list[str] = []

    def enter(module: torch.nn.Module, *_: Any) -> None:
        where.append(type(module).__name__)

    def leave(module: torch.nn.Module, *_: Any) -> None:
        if where:
            where.pop()

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        with _KeepFloat64(where, kept):
            yield
    finally:
        for h in handles:
            h.remove()
