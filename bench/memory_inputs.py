"""bench/memory.py's inputs: the trees it runs (a generated agent session, the real Claude Code
session, a tree's longest path as the linear baseline) and the memory model's prediction of each
run's peak (:mod:`treeprep.memory`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "memory"
#: the generated workload's vocabulary (small, so that the decoder, not the LM head, dominates)
AGENT_VOCAB = 8192


def agent_tree_row(path_tokens: int, seed: int = 0) -> dict:
    """A generated agent session as a shard row (the real trie builds it)."""
    from treeprep.sequence import Sequence
    from treeprep.trie import build_tree

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, AGENT_VOCAB, 1500)
    seqs = []
    while len(prompt) < path_tokens:
        tries = 2 if rng.random() < 0.2 else 1
        for _ in range(tries):
            gen = rng.integers(0, AGENT_VOCAB, int(rng.integers(100, 400)))
            toks = np.concatenate([prompt, gen])
            seqs.append(Sequence("s", toks, [(len(prompt), len(toks))]))
        tool = rng.integers(0, AGENT_VOCAB, int(rng.integers(300, 900)))
        prompt = np.concatenate([toks, tool])
    return build_tree(seqs).to_row()


def claude_code_row(data: str | None) -> dict:
    import pyarrow.ipc as ipc

    if data is None:
        out = WORK / "claude-code"
        if not (out / "manifest.json").exists():
            subprocess.run(
                [sys.executable, "-m", "treeprep.cli", "build",
                 str(ROOT.parent / "shared/data/logs/claude-code"),
                 "--tokenizer", str(ROOT.parent / "shared/data/tokenizers/qwen3"),
                 "-o", str(out)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        data = str(out)
    best: dict | None = None
    for p in sorted(Path(data, "shards").glob("*.arrow")):
        with open(p, "rb") as f:
            t = ipc.open_file(f).read_all()
        n = t.column("input_ids").to_pylist()
        i = int(np.argmax([len(x) for x in n]))
        if best is None or len(n[i]) > len(best["input_ids"]):
            best = t.slice(i, 1).to_pylist()[0]
    assert best is not None, f"{data}: no trees"
    return best


def longest_path_row(row: dict, *, cut: int | None = None, train_all: bool = False) -> dict:
    """The linear baseline's input: the tree's longest sequence (a root-to-node path) with its
    trained spans, as a one-path tree (one ``is_causal`` call per layer, no parts). ``cut``
    keeps its first tokens, ``train_all`` trains every token (the hand-off probe)."""
    from treeprep.sequence import Sequence
    from treeprep.trie import build_tree

    s = int(np.argmax(row["seq_length"]))
    node, chain = int(row["seq_node"][s]), []
    while node >= 0:
        chain.append(node)
        node = int(row["node_parent"][node])
    ids = row["input_ids"]
    toks = np.concatenate(
        [ids[row["node_offset"][n] : row["node_offset"][n] + row["node_length"][n]]
         for n in reversed(chain)]
    ).astype(np.int32)[: row["seq_length"][s]]  # fmt: skip
    flat = row["seq_loss_spans"][s]
    spans = [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]
    if cut is not None:
        toks = toks[:cut]
    if train_all:
        spans = [(1, len(toks))]
    return build_tree([Sequence("linear", toks, spans)]).to_row()


def shape_of(model: str, vocab: int | None):
    """The memory model's shape of a trainer preset (or a flops preset / config folder)."""
    from dataclasses import asdict

    from treeprep.flops import load_model
    from treeprep.memory import shape_from_preset
    from treeprep.trainer.models.presets import PRESETS

    if model not in PRESETS:
        return load_model(model)
    return shape_from_preset(asdict(PRESETS[model]), name=model, vocab=vocab)


def predicted(spec: dict, r: dict) -> tuple[int, int, int]:
    """(predicted peak, handed-over bytes and K/V bytes per path token) of the memory model; for
    ``keep``, the largest over the layout's stacks (:meth:`PartLayout.kept_stacks`)."""
    if spec["mode"] == "keep" and r.get("kept_stacks"):
        outs = [
            _predicted(
                spec,
                {
                    **r,
                    "kept_tokens": t,
                    "kept_grad_tokens": g,
                    "kept_running_rows": h,
                    "kept_stored_rows": s,
                },
            )  # fmt: skip
            for t, g, h, s in r["kept_stacks"]
        ]
        return max(outs)
    return _predicted(spec, r)


def _predicted(spec: dict, r: dict) -> tuple[int, int, int]:
    from treeprep.memory import (
        MemorySetup,
        handoff_bytes_per_path_token,
        kv_bytes_per_path_token,
        peak,
        terms,
    )

    vocab = AGENT_VOCAB if spec["workload"] == "agent" else None
    m = shape_of(spec["model"], vocab)
    mode = spec["mode"] if spec["mode"] in ("recompute", "keep") else "recompute"
    s = MemorySetup(
        stores=place(spec)[0],
        precision="bfloat16" if spec.get("autocast") else spec["dtype"],
        autocast=bool(spec.get("autocast")),
        parallel="ddp",
        optimizer_states=0,  # one forward and backward: its gradients, no optimizer
        accumulated_gradients=True,  # all live by the last layer's backward, and across parts
        activation_checkpointing=bool(spec.get("checkpointing")),
        part_graph=mode,
    )
    budget = spec["budget"] or r["tokens_tree"]
    t = terms(
        m,
        s,
        budget=budget,
        path=r["longest_path"],
        tree_tokens=r["tokens_tree"],
        # keep: the peak comes with the deepest stack, while its last part runs its head
        head_rows=r["kept_running_rows"] if mode == "keep" else r["head_rows"],
        kept=(r["kept_tokens"], r["kept_grad_tokens"], r["kept_stored_rows"])
        if mode == "keep"
        else None,
        stored_rows=r["stored_rows"],
    )
    return (
        peak(t, checkpointing=s.activation_checkpointing),
        handoff_bytes_per_path_token(m, s),
        kv_bytes_per_path_token(m, s),
    )


def place(spec: dict) -> tuple[str, int]:
    """(``stores`` for the trainer, the host pool's gradient depth) of a spec's store place."""
    from treeprep.trainer.parts.host import GRAD_DEPTH

    st = spec.get("stores") or "gpu"
    return ("host", 0) if st == "host-sync" else (st, GRAD_DEPTH)


def tree_row(spec: dict) -> dict:
    """The tree a configuration runs: the generated agent session or the Claude Code session."""
    if spec["workload"] == "agent":
        return agent_tree_row(spec["path"])
    return claude_code_row(spec.get("data"))


def linear_predicted(spec: dict) -> dict:
    """The linear trainer on ``spec``'s longest path as the memory model puts it, not run: its
    tokens and ``predicted_peak_bytes`` (``model_only``). For a path the GPU calls have no time
    to run linearly (262k tokens at 1.7B: about as long as the tree's own run)."""
    from treeprep.trainer import TreeBatch

    row = longest_path_row(tree_row(spec))
    batch = TreeBatch.from_trees([row], norm="token-mean", device="cpu")
    n = int(batch.num_tokens)
    r = {"tokens_tree": n, "longest_path": n, "head_rows": int(batch.targets().token.numel()),
         "stored_rows": 0, "kept_tokens": 0, "kept_grad_tokens": 0, "kept_stored_rows": 0,
         "kept_running_rows": 0}  # fmt: skip
    return {**spec, **r, "model_only": True, "predicted_peak_bytes": predicted(spec, r)[0]}
