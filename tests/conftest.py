"""Session-wide test set-up.

Triton reads ``TRITON_INTERPRET`` when it is first imported, and peft imports Triton (through its
LoRA variants) long before the Liger tests run: without a GPU the flag must be set for the whole
session, or Liger's kernels, imported later under the interpreter, call jit functions that Triton
compiled for a GPU ("Cannot call @triton.jit'd outside of the scope of a kernel"). Nothing else
here uses Triton on the CPU (torch.compile's CPU backend generates C++).
"""

from __future__ import annotations

import os


def _no_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


if _no_gpu():
    os.environ["TRITON_INTERPRET"] = "1"
