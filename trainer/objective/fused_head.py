"""The LM head and log-softmax through Liger's fused linear cross-entropy, where it is exact.

:func:`treeprep.trainer.objective.loss.head_logprobs` needs per-target log-probs with a gradient for
an
arbitrary per-target upstream (the restored SFT weights, the clipped RL surrogates, the KL terms).
Liger's ``LigerFusedLinearCrossEntropyFunction`` with ``reduction="none"`` returns the per-row
cross-entropy ``lse - x_y`` (so ``log p = -loss``) and, since the version that added
``token_grad_output`` to ``fused_linear_cross_entropy_forward``, defers its gradient to the
backward pass: there it recomputes each chunk's logits and scales every row's logit gradient by
that row's upstream value before the projections sum over rows. That is the exact gradient for
any per-row upstream, not only a scalar one. Without the deferral (Liger's own path for
``reduction="mean"``/``"sum"`` in 0.8.5, and versions lacking that argument) the gradient is formed
in the forward pass and only scaled afterwards by one upstream value, so :func:`liger_function`
refuses a Liger without ``token_grad_output``.

What the fused path cannot give is the entropy of the predicting distribution: the kernel keeps
only the log-sum-exp and the target's logit of each row. The path is therefore taken only when the
loss has no entropy term, and it returns no entropies (None): the step then logs no ``entropy``
metric rather than a made-up value. Computing the exact entropies in an extra no-grad
pass would bring back the chunk x V float32 logits and one more head matmul, which is what the
fused path is there to avoid.

Liger's forward reads the number of non-ignored targets with ``.item()``: one host-device sync
per head call, and one more in the backward's recomputation (the chunked head has none).

It is taken only where it was checked against the chunked head at 1e-5 relative (float32, under
Triton's interpreter; ``tests/trainer/objective/test_fused_head.py``): CUDA tensors, autograd on, a
plain
``torch.nn.Linear`` head (with or without bias) whose weight and input are float32 outside
autocast. Everything else (float64, bfloat16 autocast, soft-capped heads, adapter-wrapped heads,
no-grad passes, an entropy term) runs the chunked head.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from treeprep.errors import TreeprepError

#: device types the fused path is used on (the test widens it to run the kernels on CPU)
DEVICE_TYPES: tuple[str, ...] = ("cuda",)


@functools.cache
def liger_function() -> Any | None:
    """Liger's functional fused linear cross-entropy, or None where Liger is not installed or
    predates the per-row backward (module docstring)."""
    try:
        from liger_kernel.ops import fused_linear_cross_entropy as ops
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        return None
    params = inspect.signature(ops.fused_linear_cross_entropy_forward).parameters
    if "token_grad_output" not in params:
        return None
    return liger_fused_linear_cross_entropy


def use_fused(head: torch.nn.Module, h_KE: torch.Tensor, entropy: bool) -> bool:
    """Whether :func:`fused_logprobs` computes this head's log-probs exactly (module docstring)."""
    if entropy or not torch.is_grad_enabled() or h_KE.device.type not in DEVICE_TYPES:
        return False
    if h_KE.ndim != 2 or h_KE.shape[0] == 0:
        return False
    if type(head) is not torch.nn.Linear or type(head.weight) is not torch.nn.Parameter:
        return False
    bias = head.bias
    if bias is not None and type(bias) is not torch.nn.Parameter:
        return False
    f32 = torch.float32
    if h_KE.dtype != f32 or head.weight.dtype != f32 or (bias is not None and bias.dtype != f32):
        return False
    if torch.is_autocast_enabled(h_KE.device.type):
        return False
    return liger_function() is not None


def fused_logprobs(
    head: torch.nn.Module, h_KE: torch.Tensor, tgt_K: torch.Tensor
) -> tuple[torch.Tensor, None]:
    """Log-probs [K] of ``tgt_K`` under ``head`` applied to ``h_KE`` through Liger, and None for
    the entropies (the fused kernel does not compute them)."""
    fn = liger_function()
    if fn is None:
        raise TreeprepError("fused_logprobs needs liger-kernel with the per-row backward")
    loss = fn(h_KE.contiguous(), head.weight, tgt_K.contiguous(), bias=head.bias, reduction="none")
    return -loss, None
