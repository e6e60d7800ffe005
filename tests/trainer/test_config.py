"""trainer/config.py: every bad field is refused by name, the JSON form round-trips, the
precision mode's autocast, the settings handed to the components (DataConfig, LossConfig) and
the --cp refusal that config checks without importing the objective."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import TrainingError  # noqa: E402
from treeprep.modes import Cut, Loss, Norm, PartGraph, Precision  # noqa: E402
from treeprep.trainer.config import (  # noqa: E402
    DataConfig,
    LossConfig,
    TrainConfig,
    check_loss,
    config_dict,
    precision,
)


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**({"data": "d", "model": "tiny-qwen3", "run_dir": "r"} | kw))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("loss", "dpo", "loss 'dpo'; expected one of sft"),
        ("norm", "mean", "norm 'mean'"),
        ("layout", "flat", "layout 'flat'"),
        ("optimizer", "lion", "optimizer 'lion'; expected one of adamw, sgd"),
        ("precision", "fp8", "precision 'fp8'"),
        ("adv_norm", "zscore", "adv_norm 'zscore'"),
        ("kl_estimator", "k2", "kl_estimator 'k2'"),
        ("parallel", "zero3", "parallel 'zero3'; expected one of ddp, fsdp"),
        ("steps", 0, "steps must be >= 1, got 0"),
        ("epochs", 0, "epochs must be >= 1, got 0"),
        ("budget", 0, "budget and steps_of must be >= 1"),
        ("min_lr_ratio", 2.0, "min_lr_ratio must be in [0, 1]"),
        ("cut", "slice", "cut 'slice'; expected one of handoff, prefix"),
        ("cut", "recompute", "cut 'recompute'; expected one of handoff, prefix"),
        ("part_graph", "drop", "part_graph 'drop'; expected one of recompute, keep"),
        ("keep_tokens", -1, "keep_tokens must be >= 0, got -1"),
        ("handoff_accumulate", "fp16", "handoff_accumulate 'fp16'; expected one of model, float32"),
        ("attn", "paged", "attn 'paged'; expected one of auto, dense, nodes, flex, flash"),
        ("save_every", 0, "save_every must be >= 1"),
        ("clip_eps", 1.5, "clip_eps must be in [0, 1), got 1.5"),
        ("chunk", 0, "chunk must be >= 1"),
    ],
)
def test_a_bad_field_is_refused_by_name(field: str, value: object, match: str) -> None:
    with pytest.raises(TrainingError, match="^train config: " + re.escape(match)):
        _cfg(**{field: value})


def test_json_form_round_trips_and_prefetch_is_on_by_default() -> None:
    cfg = _cfg(betas=[0.8, 0.9], lora_targets=["q_proj"], steps=3)
    assert cfg.betas == (0.8, 0.9) and cfg.prefetch is True
    d = json.loads(json.dumps(config_dict(cfg)))
    assert d["prefetch"] is True and d["betas"] == [0.8, 0.9]
    assert TrainConfig(**d) == cfg
    assert TrainConfig(**(d | {"prefetch": False})).prefetch is False


def test_plain_strings_become_the_modes_and_json_holds_strings() -> None:
    cfg = _cfg(loss="grpo", norm="sum", cut="prefix", part_graph="keep", precision="float64")
    assert cfg.loss is Loss.grpo and cfg.norm is Norm.sum and cfg.cut is Cut.prefix
    assert cfg.part_graph is PartGraph.keep and cfg.precision is Precision.float64
    assert cfg.loss_config().loss is Loss.grpo
    text = json.dumps(config_dict(cfg))
    d = json.loads(text)
    assert (d["loss"], d["cut"], d["part_graph"]) == ("grpo", "prefix", "keep")
    assert type(d["loss"]) is str and '"norm": "sum"' in text


def test_precision_modes() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision(_cfg(), cpu) == ("float32", None)
    assert precision(_cfg(precision="float64"), cpu) == ("float64", None)
    name, autocast = precision(_cfg(), cuda)
    assert name == "bfloat16" and autocast is not None
    name, autocast = precision(_cfg(precision="bfloat16"), cpu)
    with autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.is_autocast_enabled("cpu")


def test_the_data_settings_are_the_run_fields_of_the_same_name() -> None:
    """What the data room receives: each DataConfig field is the TrainConfig field of its name,
    a value that differs from the default included (a field renamed on one side fails here)."""
    from dataclasses import fields

    cfg = _cfg(
        plan=None,
        budget=77,
        steps_of=3,
        seed=5,
        cut="prefix",
        group_by_prefix=True,
        epochs=2,
        layout="linear",
        norm="sum",
        adv_norm="rloo",
        share_prefixes=False,
    )
    got = DataConfig.from_train(cfg)
    assert {f.name: getattr(got, f.name) for f in fields(DataConfig)} == {
        "plan": None, "budget": 77, "steps_of": 3, "seed": 5, "cut": Cut.prefix,
        "group_by_prefix": True, "epochs": 2, "layout": "linear", "norm": Norm.sum,
        "adv_norm": "rloo", "share_prefixes": False,
    }  # fmt: skip
    with pytest.raises(AttributeError):
        got.loss  # noqa: B018  (the data room sees only its own settings)


def test_config_refuses_a_sequence_ratio_loss_under_cp_with_the_facts_table() -> None:
    from treeprep.modes import LOSS_FACTS

    assert _cfg(loss="grpo", cp=2).cp == 2
    with pytest.raises(TrainingError, match=r"--cp 2: gspo's sequence-level ratio .* or --cp 1"):
        _cfg(loss="gspo", cp=2)
    for name, facts in LOSS_FACTS.items():  # the function config calls, on every row
        if facts.context_parallel:
            check_loss(name, 4)
        else:
            with pytest.raises(TrainingError, match="sequence-level ratio"):
                check_loss(name, 4)


def test_loss_config_lives_in_config_and_the_objective_hands_it_on() -> None:
    from treeprep.trainer.objective import loss as objective_loss

    assert objective_loss.LossConfig is LossConfig
    assert _cfg(loss="ppo", clip_eps=0.1).loss_config() == LossConfig("ppo", clip_eps=0.1)
