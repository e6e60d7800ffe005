"""cli/renames.py: old spellings of options and values are refused, naming the new ones."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from treeprep.cli.app import app
from treeprep.cli.renames import refusal


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["train", "b", "--model", "m", "--handoff", "keep"],
            "--handoff was renamed: use --part-graph",
        ),
        (
            ["verify", "b", "--model", "m", "--handoff=keep"],
            "--handoff was renamed: use --part-graph",
        ),
        (
            ["pack", "b", "--budget", "9", "--cut", "recompute"],
            "--cut recompute was renamed: use --cut prefix",
        ),
        (["stats", "b", "--cut=recompute"], "--cut recompute was renamed: use --cut prefix"),
        (
            ["train", "b", "--model", "m", "--cut", "recompute"],
            "--cut recompute was renamed: use --cut prefix",
        ),
        (["export", "b", "--output", "x.jsonl"], "--output was renamed: use --out"),
        (["show", "b", "g1"], "'g1' is an option now: use --group g1"),
        (
            ["show", "b", "--tokenizer", "t", "g1", "--json"],
            "'g1' is an option now: use --group g1",
        ),
    ],
)
def test_old_spellings_are_refused_with_the_new_one(args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())


def test_new_spellings_and_option_values_are_not_mistaken_for_old_ones() -> None:
    valued = {"--group", "--tokenizer", "--max-nodes"}
    assert refusal("show", ["b", "--group", "g1", "--tokenizer", "t"], valued, 1) is None
    assert refusal("show", ["b", "--list", "--json"], valued, 1) is None
    assert (
        refusal("train", ["b", "--handoff-accumulate", "float32", "--part-graph", "keep"]) is None
    )
    assert refusal("pack", ["b", "--cut", "prefix", "--name", "recompute"]) is None
    assert refusal("export", ["b", "-o", "x"]) is None


@pytest.mark.parametrize(
    ("given", "ours"),
    [
        ("--learning-rate", "--lr"),
        ("--learning_rate", "--lr"),
        ("--gradient-accumulation-steps", "--steps-of (micro-batches per rank per optimizer step)"),
        ("--num-train-epochs", "--epochs"),
        ("--per-device-train-batch-size", "--budget (tokens per micro-batch"),
    ],
)
def test_other_trainers_names_get_did_you_mean(given: str, ours: str) -> None:
    """Issue 39 item 5: the names TRL and LLaMA-Factory users type point at treeprep's own."""
    r = CliRunner().invoke(app, ["train", "b", given, "2"], env={"COLUMNS": "250"})
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert f"{given} is not an option of treeprep train; did you mean {ours}" in said


def test_a_config_key_of_another_trainer_gets_did_you_mean(tmp_path) -> None:  # noqa: ANN001
    cfg = tmp_path / "run.toml"
    cfg.write_text("learning_rate = 1e-4\n")
    r = CliRunner().invoke(app, ["train", "b", "--config", str(cfg)], env={"COLUMNS": "250"})
    assert r.exit_code == 2  # a usage error of --config
    said = " ".join(r.output.split())
    assert f"{cfg}: unknown key 'learning_rate': did you mean --lr?" in said


def test_treeprep_s_own_aliases_are_not_taken_for_other_trainers_names() -> None:
    known = {"--warmup", "--warmup-steps"}
    assert refusal("train", ["b", "--warmup-steps", "4"], known, 1, known) is None
