"""bench/head_cast: the LM head under bf16 autocast, cast whole against a block at a time.

One forward and backward of a float32 LM head (``hidden -> vocab``, no bias, its weight taking a
gradient as in training) on ``rows`` hidden states under bf16 autocast (no weight cache, as
``treeprep train`` runs it), two ways, interleaved round by round (the order alternating; the
first round dropped from the time medians):

* ``whole``: ``head(h)``, autocast's own cast of the whole weight, saved for the backward;
* ``blocks``: :func:`treeprep.trainer.objective.cast_head.head_logits` (one block of
  :func:`~treeprep.schemas.parts.head_weight_block_rows` vocabulary rows cast at a time).

The logits' gradient is a fixed random tensor (the loss's log-softmax is
``bench/head_memory.py``'s). Peak bytes beyond the weight, the inputs and the weight's float32
gradient: exact live tensor bytes on the CPU (:class:`~treeprep.trainer.run.memtrack.LiveBytes`),
the allocator's maximum on CUDA. Also: whether the logits are bit-identical, and each way's
hidden-state gradient error against float64.

    python bench/head_cast.py --vocab 151936 --hidden 4096 --rows 4096 --device cuda
    python bench/head_cast.py --vocab 32768 --hidden 512 --rows 256 --block-rows 3532

(``--block-rows 3532``: 9.3 blocks, as Qwen3-8B's head has at the trainer's block.)
"""

from __future__ import annotations

import argparse
import json

from ways import run_ways


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--block-rows",
        type=int,
        default=None,
        help="vocabulary rows per block (default: the trainer's, 2^26 weights)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    from treeprep.schemas import parts
    from treeprep.schemas.parts import head_weight_block_rows
    from treeprep.trainer.config import bf16_autocast
    from treeprep.trainer.objective.cast_head import head_logits

    dev = torch.device(a.device)
    if a.block_rows:
        parts.HEAD_WEIGHT_BLOCK_ELEMENTS = a.block_rows * a.hidden
    torch.manual_seed(0)
    head = torch.nn.Linear(a.hidden, a.vocab, bias=False, device=dev)
    h = torch.randn(a.rows, a.hidden, device=dev, requires_grad=True)
    g = torch.randn(a.rows, a.vocab, device=dev).bfloat16()
    head.weight.grad = torch.zeros_like(head.weight)  # accumulated into, as in a step
    ways = {"whole": lambda x: head(x), "blocks": lambda x: head_logits(head, x)}
    out: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    cast = bf16_autocast(dev)

    def run(name: str) -> None:
        h.grad = None
        with cast():
            logits = ways[name](h)
        logits.backward(g)
        out[name], grads[name] = logits.detach(), h.grad.detach().clone()

    fixed = (head.weight, head.weight.grad, h, g)
    peaks, med = run_ways(list(ways), run, rounds=a.rounds, device=dev, fixed=fixed)
    ref = (g.double() @ head.weight.detach().double()).cpu()
    err = {k: float((v.double().cpu() - ref).norm() / ref.norm()) for k, v in grads.items()}
    r = {
        "vocab": a.vocab, "hidden": a.hidden, "rows": a.rows, "device": a.device,
        "block_rows": min(a.vocab, head_weight_block_rows(a.hidden)),
        "peak_bytes": peaks, "seconds": med,
        "peak_blocks_over_whole": round(peaks["blocks"] / peaks["whole"], 3),
        "time_blocks_over_whole": round(med["blocks"] / med["whole"], 3),
        "logits_identical": bool(torch.equal(out["blocks"], out["whole"])),
        "hidden_grad_error": err,
    }  # fmt: skip
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"vocab {a.vocab} hidden {a.hidden} rows {a.rows} {a.device} (blocks of "
          f"{r['block_rows']} rows): peak whole {peaks['whole'] / 2**20:.1f} MiB, blocks "
          f"{peaks['blocks'] / 2**20:.1f} MiB: {r['peak_blocks_over_whole']}; time "
          f"{med['whole'] * 1e3:.1f} / {med['blocks'] * 1e3:.1f} ms: "
          f"{r['time_blocks_over_whole']}; logits identical: {r['logits_identical']}; "
          f"hidden-state gradient error whole {err['whole']:.2e}, "
          f"blocks {err['blocks']:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
