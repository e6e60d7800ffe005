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


if os.environ.get("PYTEST_XDIST_WORKER"):
    # one intra-op thread per worker: the workers share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch as _torch

        _torch.set_num_threads(1)
    except ImportError:
        pass


#: the files that take longest (about 30 s to 3 minutes each on a 2-core machine), run first:
#: with one worker per core the longest files started last would leave one core idle at the end
HEAVY_FIRST = (
    "tests/treeprep/build/test_ray.py",
    "tests/trainer/run/test_rank_fault.py",
    "tests/trainer/run/test_train_dist.py",
    "tests/trainer/test_fsdp_parts.py",
    "tests/trainer/models/test_families.py",
    "tests/adversarial/test_adv_out.py",
    "tests/trainer/test_context.py",
    "tests/trainer/run/test_preemption.py",
    "tests/trainer/parts/test_handoff_state.py",
    "tests/trainer/data/test_tokenizer_identity.py",
    "tests/treeprep/render/test_gpt_oss.py",
    "tests/treeprep/render/test_no_empty_reply.py",
    "tests/trainer/run/test_train.py",
    "tests/treeprep/render/test_native.py",
    "tests/trainer/run/test_resume.py",
    "tests/trainer/attention/test_flex.py",
)


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    """Order the collected files heaviest first (:data:`HEAVY_FIRST`), the rest as collected."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    root = str(config.rootpath)

    def weight(item) -> int:  # noqa: ANN001
        path = str(item.path)[len(root) + 1 :]
        return rank.get(path, len(HEAVY_FIRST))

    items.sort(key=weight)
