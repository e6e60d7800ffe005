"""bench/head_memory: the loss's LM-head chunk, the log-softmax chain against blocks of rows.

One forward and backward of an LM head (``hidden -> vocab``, no bias) and the targets' log-probs
with the entropy metric, two ways, interleaved round by round (the order alternating; the first
round dropped from the time medians):

* ``chain``: what the loss ran before 2026-11-26: ``log_softmax`` of the whole chunk's float32
  logits through autograd, ``gather``, and ``-(exp(ls) * ls).sum()`` for the entropy;
* ``blocks``: :func:`treeprep.trainer.objective.target_logp.target_logprobs` (a block of rows at a
time).

The head's weight takes no gradient (a weight-sized term of its own, the same either way; the
hidden states' gradient is computed). Peak bytes beyond the weights and inputs: exact live
tensor bytes on the CPU (:class:`~treeprep.trainer.run.memtrack.LiveBytes`), the allocator's
maximum on CUDA; with the memory model's :func:`~treeprep.memory.lm_head_bytes` beside the
blocks' figure.

    python bench/head_memory.py --vocab 151936 --rows 256,4096 --dtype bfloat16 --device cpu
"""

from __future__ import annotations

import argparse
import json

from ways import run_ways


def chain(logits, target):  # noqa: ANN001, ANN201
    """The log-softmax chain the loss ran before (``trainer/objective/loss.py`` of 6065f12)."""
    import torch

    x = logits if logits.dtype == torch.float64 else logits.float()
    ls = torch.log_softmax(x, dim=-1)
    lp = ls.gather(1, target[:, None])[:, 0]
    src = ls.detach()
    return lp, -(src.exp() * src).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rows", default="256,4096", help="head rows per chunk (comma-separated)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    from treeprep.memory import lm_head_bytes
    from treeprep.trainer.objective.target_logp import target_logprobs

    dev, dt = torch.device(a.device), getattr(torch, a.dtype)
    ways = {"chain": chain, "blocks": lambda lg, t: target_logprobs(lg, t, False)}
    torch.manual_seed(0)
    head = torch.nn.Linear(a.hidden, a.vocab, bias=False, device=dev, dtype=dt)
    head.weight.requires_grad_(False)  # the chunk's own term: its weight gradient is another
    out = []
    for rows in [int(r) for r in a.rows.split(",")]:
        h = torch.randn(rows, a.hidden, device=dev, dtype=dt, requires_grad=True)
        target = torch.randint(0, a.vocab, (rows,), device=dev)
        values: dict[str, torch.Tensor] = {}

        def run(name: str, h=h, target=target, values=values) -> None:  # noqa: ANN001
            h.grad = None
            lp, _ = ways[name](head(h), target)
            lp.sum().backward()
            values[name] = lp.detach().float()

        fixed = (head.weight, h, target)
        peaks, med = run_ways(list(ways), run, rounds=a.rounds, device=dev, fixed=fixed)
        c = torch.finfo(dt).bits // 8
        r = {
            "vocab": a.vocab, "hidden": a.hidden, "rows": rows, "dtype": a.dtype,
            "device": a.device, "peak_bytes": peaks, "seconds": med,
            "model_blocks_bytes": lm_head_bytes(a.vocab, rows, c),
            "peak_blocks_over_chain": round(peaks["blocks"] / peaks["chain"], 3),
            "time_blocks_over_chain": round(med["blocks"] / med["chain"], 3),
            "max_abs_logp_difference": float((values["blocks"] - values["chain"]).abs().max()),
        }  # fmt: skip
        out.append(r)
        if not a.json:
            print(f"rows {rows:5d} {a.dtype} {a.device}: peak chain {peaks['chain'] / 2**20:9.1f} "
                  f"MiB, blocks {peaks['blocks'] / 2**20:9.1f} MiB (model "
                  f"{r['model_blocks_bytes'] / 2**20:.1f}): {r['peak_blocks_over_chain']}; time "
                  f"{med['chain'] * 1e3:.1f} / {med['blocks'] * 1e3:.1f} ms: "
                  f"{r['time_blocks_over_chain']}; max |d log p| "
                  f"{r['max_abs_logp_difference']:.2e}", flush=True)  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
