"""The run's curves at its end: ``RUN/train.png``, the loss, the learning rate and the throughput
per step.

Drawn from ``metrics.jsonl`` (so a resumed run shows the whole run, not only its last leg) when
matplotlib, the ``plot`` extra, is installed; without it :func:`plot_run` returns None and the run
is unchanged (the plot is a convenience, the metrics file is the record). Written atomically.
"""

from __future__ import annotations

import json
import os
from typing import Any

from treeprep.atomic import commit, writing

PLOT_FILE = "train.png"


def _steps(metrics_path: str) -> list[dict[str, Any]]:
    rows = []
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in rows if "step" in r and "loss" in r]


def plot_run(run_dir: str) -> str | None:
    """Draw ``RUN/train.png`` from ``RUN/metrics.jsonl``; its path, or None without matplotlib
    or without a step."""
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = _steps(metrics_path)
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    fig, (ax_loss, ax_lr, ax_tps) = plt.subplots(1, 3, figsize=(15, 4))
    ax_loss.plot(steps, [r["loss"] for r in rows], label="train loss")
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if val:
        ax_loss.plot(*zip(*val, strict=True), "o-", label="val loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_title("loss")
    ax_loss.legend()
    ax_lr.plot(steps, [r.get("lr", 0.0) for r in rows])
    ax_lr.set_xlabel("step")
    ax_lr.set_title("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_tps.plot(steps, [r.get("tokens_per_s", 0.0) for r in rows], label="tokens/s (fed)")
    ax_tps.plot(
        steps, [r.get("linear_tokens_per_s", 0.0) for r in rows], label="linear-equivalent tokens/s"
    )
    ax_tps.set_xlabel("step")
    ax_tps.set_title("throughput")
    ax_tps.legend()
    fig.suptitle(os.path.basename(os.path.normpath(run_dir)))
    fig.tight_layout()
    path = os.path.join(run_dir, PLOT_FILE)
    tmp = path + ".tmp.png"
    with writing(path, tmp):
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
    commit(tmp, path)
    return path
