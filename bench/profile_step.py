"""bench/profile_step: where a training step's time goes, tree layout against linear, side by side.

Trains the same build, model and budget with both layouts for ``--steps`` optimizer steps under
``torch.profiler`` (the whole run, its first step's compilation included: the loop has no per-step
hook; on a GPU only device kernels are counted, so the host's set-up does not enter the shares),
and prints for each layout the top kernels by self time on the device (CUDA kernels on a GPU,
CPU operators on the CPU) and the share of the step spent in attention (kernels whose names are
those of SDPA's flash, cuDNN and memory-efficient kernels, FlexAttention's Triton templates,
flash-attn, or this project's CPU block kernel). The interesting figure is attention's share in the
tree step against the linear baseline's: tree attention must not cost more per (query, key) pair.

    python bench/profile_step.py --device cuda --model qwen3-1.7b --budget 32768 --json
    python bench/profile_step.py --device cpu --model tiny-qwen3 --vocab 512 --budget 2048
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: substrings (lower case) of the kernel and operator names that are attention
ATTENTION = (
    "flash",
    "fmha",
    "cudnn_sdpa",
    "attention",
    "triton_tem_fused",  # FlexAttention's compiled templates
    "flex_attention",
)


def _profile(data: Path, work: Path, layout: str, a: argparse.Namespace) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from treeprep.trainer.run.loop import TrainConfig, train

    cuda = a.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    cfg = TrainConfig(
        data=str(data),
        model=a.model,
        run_dir=str(work / f"profile-{layout}"),
        overwrite=True,
        layout=layout,
        budget=a.budget,
        steps=a.steps,
        vocab_size=a.vocab,
        precision="bfloat16" if cuda else "float32",
        device=a.device,
        attn=a.attn,
        save_final=False,
        save_minutes=None,
    )
    with profile(activities=acts, record_shapes=False) as prof:
        res = train(cfg)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    if cuda:
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(getattr(e, key) for e in events)
    attn = sum(getattr(e, key) for e in events if any(s in e.key.lower() for s in ATTENTION))
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[: a.top]
    return {
        "layout": layout,
        "steps": len(res.history),
        "seconds": sum(m.seconds for m in res.history),
        "tokens_linear": sum(m.tokens_linear for m in res.history),
        "total_us": total,
        "attention_share": attn / total if total else 0.0,
        "top": [
            {"name": e.key[:120], "us": getattr(e, key), "share": getattr(e, key) / total}
            for e in top
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="qwen3-1.7b")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--budget", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--attn", default="auto")
    ap.add_argument("--workload", choices=["sample", "agent"], default="agent")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--work", default=str(ROOT / "bench" / "_work" / "profile"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import train as bench_train  # bench/train.py: the same generated workloads

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    scale = "gpu" if a.device.startswith("cuda") else "cpu"
    data = bench_train.ensure_build(a.workload, work, scale)
    out = {lay: _profile(data, work, lay, a) for lay in ("tree", "linear")}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for lay, r in out.items():
        print(
            f"{lay}: {r['steps']} steps, {r['seconds']:.2f} s, attention "
            f"{r['attention_share']:.1%} of device time"
        )
        for t in r["top"]:
            print(f"  {t['share']:6.1%}  {t['us'] / 1e3:10.1f} ms  {t['name']}")


if __name__ == "__main__":
    main()
