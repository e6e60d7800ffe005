"""How accurate bf16 hand-off training is, against the linear trainer it replaces (issue 24 item 2).

One generated agent session (bench/memory.py's ``agent`` workload) on a tiny model, on the CPU.
The reference is the gradient of the linearized loss in float64 (the whole tree, which equals
every sequence run alone to float64 rounding). Against it, the relative L2 error of the gradient
(all parameters together) of:

* ``linear bf16``: every sequence laid out on its own (the linear trainer), the model in bf16;
* ``parts bf16, model accumulators``: the tree as hand-off parts of ``--budget`` tokens, keys,
  values and their gradient accumulators in bf16 (the default);
* ``parts bf16, float32 accumulators``: the same with ``accumulate="float32"``.

The bar (issue 24): the tree with bf16 accumulators within 1.25x of the linear bf16 error.

``--autocast`` runs what ``treeprep train`` runs in bf16 instead: float32 weights under bf16
autocast (the parts store their keys and values in bf16, the attention's compute dtype, although
rotary leaves the keys float32), against the linear layout under the same autocast.

    python bench/bf16_accuracy.py --path 4096 --budget 512 [--autocast] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import AGENT_VOCAB, agent_tree_row  # noqa: E402

from treeprep.trainer import TreeBatch, load_model, tree_loss  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig  # noqa: E402
from treeprep.trainer.parts import run_parts  # noqa: E402


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.double().clone() for p in model.parameters() if p.grad is not None]


def _rel(a: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    num = sum(float((x - y).norm() ** 2) for x, y in zip(a, ref, strict=True)) ** 0.5
    return num / sum(float(y.norm() ** 2) for y in ref) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--path", type=int, default=4096)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--autocast", action="store_true", help="float32 weights, bf16 autocast")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    row = agent_tree_row(a.path, seed=a.seed)
    kw = {"vocab_size": AGENT_VOCAB, "attn": "nodes", "seed": a.seed}
    m64 = load_model(a.model, dtype=torch.float64, **kw)
    m16 = load_model(a.model, dtype=torch.float32 if a.autocast else torch.bfloat16, **kw)
    rounded = {k: v.to(torch.bfloat16) for k, v in m64.state_dict().items()}
    m16.load_state_dict({k: v.to(next(m16.parameters()).dtype) for k, v in rounded.items()})
    # the reference: the same bf16-rounded weights, in float64
    m64.load_state_dict({k: v.to(torch.float64) for k, v in rounded.items()})
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)) if (
        a.autocast) else None  # fmt: skip
    attn = "nodes"
    tree = TreeBatch.from_trees([row], norm="token-mean")
    lin = TreeBatch.from_trees([row], norm="token-mean", layout="linear")
    tree_loss(m64, tree, attn="nodes").loss.backward()
    ref = _grads(m64)
    out: dict[str, float | int] = {"tree_tokens": tree.num_tokens, "linear_tokens": lin.num_tokens}
    with cast() if cast is not None else contextlib.nullcontext():
        tree_loss(m16, lin, attn=attn).loss.backward()
    out["linear_bf16"] = _rel(_grads(m16), ref)
    for acc in ("model", "float32"):
        m16.zero_grad(set_to_none=True)
        run_parts(m16, tree, LossConfig("sft"), budget=a.budget, attn=attn, accumulate=acc,
                  autocast=cast)  # fmt: skip
        out[f"parts_bf16_{acc}_accumulators"] = _rel(_grads(m16), ref)
    out["ratio_model_accumulators"] = out["parts_bf16_model_accumulators"] / out["linear_bf16"]
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:34s} {v:.3e}" if isinstance(v, float) else f"{k:34s} {v}")


if __name__ == "__main__":
    main()
