"""GRPO on the bundled sample (issue 27 item 7): trees without rewards are refused, or skipped
with ``--unrewarded skip`` and counted (:mod:`treeprep.trainer.data.rewarded`).

Most of the sample's formats record no reward (Claude Code, Codex, Gemini CLI, ShareGPT ...);
tau-bench, tau2, the token rollouts, NeMo-Gym rollouts and a few chat logs do. The expected
counts are read from the shards' columns here, not from the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from treeprep.build import BuildConfig, build
from treeprep.errors import TrainingError
from treeprep.shards import iter_trees
from treeprep.trainer.run.loop import TrainConfig, train

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "b"
    build(BuildConfig(inputs=[str(ROOT / "sample_data")], out=str(out)))
    return out


def _rewarded(out: Path) -> tuple[list[bool], list[int]]:
    """Per tree: has every trajectory of it a reward (on some call: agent logs put it on the last
    one), or the tree an advantage; and its linear tokens."""
    has, linear = [], []
    for tree in iter_trees(str(out)):
        ids = tree.seq_trajectory_id or [str(i) for i in range(len(tree.seq_reward))]
        rewarded = {t for t, r in zip(ids, tree.seq_reward, strict=True) if r is not None}
        advantage = any(a is not None for a in tree.seq_advantage)
        has.append(advantage or rewarded == set(ids))
        linear.append(int(np.dot(tree.seq_length, tree.seq_count)))
    return has, linear


def _cfg(data: Path, run: Path, **kw: object) -> TrainConfig:
    base: dict = dict(data=str(data), model="tiny-qwen3", run_dir=str(run), loss="grpo",
                      device="cpu", attn="dense", lr=1e-3, warmup_steps=0, keep=None)  # fmt: skip
    return TrainConfig(**(base | kw))


def test_grpo_on_the_sample_is_refused_naming_the_option(sample: Path, tmp_path: Path) -> None:
    has, _ = _rewarded(sample)
    with pytest.raises(TrainingError) as e:
        train(_cfg(sample, tmp_path / "run", steps=2))
    msg = str(e.value)
    assert f"{has.count(False)} of {len(has)} trees" in msg and "--unrewarded skip" in msg
    assert not (tmp_path / "run").exists()  # refused before the run folder is written


def test_grpo_on_the_sample_trains_the_rewarded_trees(sample: Path, tmp_path: Path) -> None:
    """Three steps through the CLI (the sample's first two rewarded steps hold only groups of
    equal rewards: no advantage): nonzero loss and gradients, the skipped trees in the
    summary."""
    from treeprep.cli.app import app

    has, linear = _rewarded(sample)
    run = tmp_path / "run"
    args = ["train", str(sample), "--model", "tiny-qwen3", "--loss", "grpo", "--steps", "3",
            "--unrewarded", "skip", "--out", str(run), "--device", "cpu", "--attn", "dense",
            "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{") :])
    assert out["steps"] == 3
    assert out["unrewarded_trees"] == has.count(False) > 0
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(s["loss"] != 0.0 for s in steps) and any(s["grad_norm"] > 0 for s in steps)
    # a whole epoch trains exactly the rewarded trees' sequences
    res = train(_cfg(sample, tmp_path / "epoch", epochs=1, unrewarded="skip"))
    assert sum(m.tokens_linear for m in res.history) == sum(
        n for n, h in zip(linear, has, strict=True) if h
    )
    assert res.unrewarded_trees == has.count(False)
    assert res.unrewarded_sequences > 0


def test_sft_on_the_sample_reads_no_rewards(sample: Path, tmp_path: Path) -> None:
    res = train(_cfg(sample, tmp_path / "sft", loss="sft", steps=1))
    assert res.steps == 1 and res.unrewarded_trees == 0


def test_skip_does_not_hide_rewards_that_disagree(tmp_path: Path) -> None:
    """One trajectory with rewards 1 and 0 is a data error, not a tree without rewards: refused
    under skip too, with the reason."""
    msgs = [{"role": "user", "content": "q"}]
    recs = [
        {"group_id": "g", "call_id": f"c{i}", "messages": msgs,
         "completion": {"role": "assistant", "content": f"a{i}"}, "reward": float(i)}
        for i in range(2)
    ]  # fmt: skip
    src = tmp_path / "r.jsonl"
    src.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in recs))
    build(BuildConfig(inputs=[str(src)], out=str(tmp_path / "b")))
    with pytest.raises(TrainingError, match="has calls with rewards 0 and 1"):
        train(_cfg(tmp_path / "b", tmp_path / "run", steps=1, unrewarded="skip"))
