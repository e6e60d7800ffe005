"""Issue 25 item 6: evaluation on held-out whole trees (``val_fraction``) or another build
(``eval_data``).

``val_loss`` is checked against an independent computation: plain transformers on every held-out
sequence alone (float32, the checkpoint's weights), the loss summed over each sequence's trained
targets, duplicates counted, divided as the run's ``norm`` says.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import CheckpointError, TrainingError  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.evaluate import TrainSplit, held_out  # noqa: E402
from treeprep.trainer.run.loop import TrainConfig, train  # noqa: E402


def _chains(path: Path, seed: int, groups: int = 12) -> None:
    """Agent chains (each call's prompt extends the previous call), one tree per group, some
    calls repeated (duplicates count)."""
    rng = np.random.default_rng(seed)
    lines = []
    for g in range(groups):
        prompt = rng.integers(32, 127, int(rng.integers(10, 30))).tolist()
        for c in range(int(rng.integers(2, 5))):
            gen = rng.integers(32, 127, int(rng.integers(5, 15))).tolist()
            call = {"group_id": f"g{g}", "call_id": f"g{g}/{c}", "prompt_token_ids": prompt,
                    "generation_token_ids": gen}  # fmt: skip
            lines.append(call)
            if c == 0 and g % 3 == 0:
                lines.append(call | {"call_id": f"g{g}/{c}-again"})
            prompt = prompt + gen + rng.integers(32, 127, int(rng.integers(3, 8))).tolist()
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _build(root: Path, seed: int) -> Path:
    _chains(root / f"chains-{seed}.jsonl", seed)
    out = root / f"build-{seed}"
    build(BuildConfig(inputs=[str(root / f"chains-{seed}.jsonl")], out=str(out)))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("eval-data"), 0)


def cfg(data: Path, run: Path, **kw) -> TrainConfig:
    base = dict(data=str(data), model="tiny-qwen3", run_dir=str(run), budget=96, lr=3e-3,
                device="cpu", attn="dense", keep=None, save_minutes=None)  # fmt: skip
    return TrainConfig(**(base | kw))


def _all_trees(reader: BuildReader) -> set[tuple[str, int]]:
    return {(s, r) for s in reader.shard_names for r in range(reader.table(s).num_rows)}


def reference_loss(model_dir: str, reader: BuildReader, trees: set, norm: str) -> float:
    """Plain transformers, one sequence at a time, on the trees' sequences."""
    import transformers as tf

    lm = tf.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    total, denom = 0.0, 0.0
    for shard, row in sorted(trees):
        t = reader.tree(shard, row)
        ids, parent = t["input_ids"], t["node_parent"]
        for s, node in enumerate(t["seq_node"]):
            path = []
            while node != -1:
                path.append(node)
                node = parent[node]
            off, ln = t["node_offset"], t["node_length"]
            toks = [i for v in reversed(path) for i in ids[off[v] : off[v] + ln[v]]]
            sp = t["seq_loss_spans"][s]
            pairs = zip(sp[0::2], sp[1::2], strict=True)
            pos = [d for a, b in pairs for d in range(max(a, 1), b)]
            if not pos:
                continue
            with torch.no_grad():
                logits = lm(torch.tensor([toks])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            ce = -sum(float(logp[d - 1, toks[d]]) for d in pos)
            count = t["seq_count"][s]
            if norm == "token-mean":
                total, denom = total + count * ce, denom + count * len(pos)
            else:  # sequence-mean
                total, denom = total + count * ce / len(pos), denom + count
    return total / denom


def test_held_out_trees_are_seeded_whole_and_never_trained(data: Path) -> None:
    reader = BuildReader(str(data))
    held = held_out(reader, 0.25, seed=7)
    assert len(held) == 3 and held == held_out(reader, 0.25, seed=7)
    assert held != held_out(reader, 0.25, seed=8)
    split = TrainSplit(cfg(data, Path("unused")), reader, 1, None, held=held)
    for epoch in range(3):  # every epoch's plan (another shuffle each) leaves them out
        trained = {(p.shard, p.row) for st in split.get(epoch).steps for p in st.parts}
        assert trained.isdisjoint(held) and trained | held == _all_trees(reader)
    with pytest.raises(TrainingError, match="leaves nothing to train"):
        held_out(reader, 0.99, seed=0)


@pytest.mark.parametrize("norm", ["token-mean", "sequence-mean"])
def test_val_loss_equals_plain_transformers_on_the_held_out_trees(
    data: Path, tmp_path: Path, norm: str
) -> None:
    res = train(cfg(data, tmp_path / "run", steps=3, val_fraction=0.25, eval_every=2, norm=norm))
    got = [m.extra.get("val_loss") for m in res.history]
    assert got[0] is None and got[1] is not None and got[2] is not None  # every 2 steps, the end
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x.get("val_loss") for x in lines] == got
    reader = BuildReader(str(data))
    held = held_out(reader, 0.25, seed=0)
    mdir = ckpt_mod.open_checkpoint(res.checkpoint).model_dir
    want = reference_loss(str(mdir), reader, set(held), norm)
    assert got[2] == pytest.approx(want, rel=1e-5)
    assert got[1] != got[2]  # the weights moved between the two evaluations


def test_eval_data_is_another_build(data: Path, tmp_path: Path) -> None:
    other = _build(tmp_path, 1)
    res = train(cfg(data, tmp_path / "run", steps=2, eval_data=str(other)))
    reader = BuildReader(str(other))
    mdir = ckpt_mod.open_checkpoint(res.checkpoint).model_dir
    want = reference_loss(str(mdir), reader, _all_trees(reader), "token-mean")
    assert res.history[-1].extra["val_loss"] == pytest.approx(want, rel=1e-5)
    assert "val_loss" not in res.history[0].extra


def test_resume_keeps_the_split(data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(cfg(data, run, steps=1, val_fraction=0.25))
    with pytest.raises(CheckpointError, match="val_fraction was 0.25 .* is 0.5"):
        train(cfg(data, run, steps=2, val_fraction=0.5, resume="auto"))
    res = train(cfg(data, run, steps=2, val_fraction=0.25, resume="auto", eval_every=1))
    assert res.steps == 2 and "val_loss" in res.history[-1].extra


def test_bad_evaluation_settings_are_refused(data: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="val_fraction must be in"):
        cfg(data, tmp_path, val_fraction=1.0)
    with pytest.raises(TrainingError, match="not both"):
        cfg(data, tmp_path, val_fraction=0.1, eval_data=str(data))
    with pytest.raises(TrainingError, match="eval_every must be >= 1, with"):
        cfg(data, tmp_path, eval_every=5)


def test_cli_options_and_the_per_step_line(data: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from treeprep.cli.app import app

    run = tmp_path / "run"
    args = ["train", str(data), "--model", "tiny-qwen3", "--steps", "2", "--out", str(run),
            "--budget", "96", "--device", "cpu", "--attn", "dense",
            "--val-fraction", "0.25", "--eval-every", "1"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    # no terminal here: the plain per-step lines carry val_loss
    assert "step 1/2 " in r.output and r.output.count(" val_loss ") == 2
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(x["val_loss"], float) for x in lines)
    config = json.loads((run / "config.json").read_text())
    assert config["val_fraction"] == 0.25 and config["eval_every"] == 1


def test_a_build_without_tokenizer_warns(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from treeprep.cli.app import app

    _chains(tmp_path / "c.jsonl", 0, groups=2)
    r = CliRunner().invoke(app, ["build", str(tmp_path / "c.jsonl"), "-o", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "no --tokenizer: the built-in byte tokenizer's ids suit only the tiny" in r.output
