"""trainer/run/step.py: one optimizer step equals the hand-written forward, backward, clip and
update;
a non-finite loss stops before the update; the schedules' shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import VOCAB, random_group  # noqa: E402

from treeprep.errors import TrainingError  # noqa: E402
from treeprep.trainer import TreeBatch, load_model, tree_loss  # noqa: E402
from treeprep.trainer import distributed as dist_mod  # noqa: E402
from treeprep.trainer.config import TrainConfig  # noqa: E402
from treeprep.trainer.run.step import (  # noqa: E402
    LossModule,
    Schedule,
    StepLossAndCounts,
    Stepper,
    lr_factor,
    make_optimizer,
)
from treeprep.trie import build_tree  # noqa: E402

ALONE = dist_mod.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _cfg(**kw) -> TrainConfig:
    base = dict(data="unused", model="tiny-qwen3", run_dir="unused", optimizer="sgd", lr=0.5,
                grad_clip=0.05, attn="dense", norm="sequence-mean")  # fmt: skip
    return TrainConfig(**(base | kw))


def _batches(seed: int) -> list[list[TreeBatch]]:
    """One rank, two micro-batches, normalized over both (the step's totals)."""
    rng = np.random.default_rng(seed)
    rows = [build_tree(random_group(rng, n_seq=4)).to_row() for _ in range(2)]
    return [[TreeBatch.from_trees([r], norm="sequence-mean", total_sequences=8.0) for r in rows]]


def _setup(cfg: TrainConfig):
    lm = load_model("tiny-qwen3", vocab_size=VOCAB, attn="dense", seed=3)
    module = LossModule(lm, {"loss": "sft", "attn": None})
    params = [p for p in module.parameters() if p.requires_grad]
    opt = make_optimizer(cfg, params, torch.device("cpu"))
    return Stepper(cfg, ALONE, module, params, opt, Schedule.of(cfg, 4), budget=4096), lm


def test_a_step_is_accumulate_clip_update() -> None:
    cfg = _cfg()
    stepper, lm = _setup(cfg)
    ref, _ = _setup(cfg)
    batches = _batches(0)
    res = stepper.run(batches, has_parts=False, where="step 1", last_ckpt=None)
    # by hand: the micro-batches' losses summed, their gradients accumulated, clipped, SGD
    ref_lm = ref.wrapped.lm
    losses = [tree_loss(ref_lm, b, loss="sft") for b in batches[0]]
    for out in losses:
        out.loss.backward()
    params = [p for p in ref_lm.parameters() if p.requires_grad]
    norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
    with torch.no_grad():
        for p in params:
            p -= cfg.lr * p.grad
    assert res.grad_norm == norm > cfg.grad_clip  # the clip was active
    assert res.sums.loss == float(sum(out.loss.detach() for out in losses))
    assert res.lr == cfg.lr and stepper.step == 1  # the first update at the peak rate
    assert res.sums.micro_batches == 2
    assert res.sums.tokens == sum(b.num_tokens for b in batches[0])
    assert res.sums.targets == sum(b.num_targets for b in batches[0])
    for (name, a), b in zip(lm.named_parameters(), ref_lm.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=name)
    assert all(p.grad is None for p in stepper.params)  # dropped after the update


def test_a_non_finite_loss_stops_before_the_update() -> None:
    stepper, lm = _setup(_cfg())
    with torch.no_grad():
        lm.get_output_embeddings().weight[5] = float("nan")
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    with pytest.raises(TrainingError, match=r"^step 7 \(epoch 1\): loss nan .*checkpoint: ck-6"):
        stepper.run(_batches(1), has_parts=False, where="step 7 (epoch 1)", last_ckpt="ck-6")
    torch.testing.assert_close(lm.state_dict(), before, rtol=0, atol=0, equal_nan=True)


def test_counts_alone_reduce_to_themselves() -> None:
    c = StepLossAndCounts(torch.tensor(2.5, dtype=torch.float64), 10, 30, 7, 2, {"entropy": 1.0})
    r = c.reduce(ALONE)
    assert (r.loss, r.tokens, r.tokens_linear, r.targets, r.micro_batches) == (2.5, 10, 30, 7, 2)
    assert isinstance(r.loss, float) and r.extra == {"entropy": 1.0}


def test_warmup_then_cosine_to_the_floor() -> None:
    assert [lr_factor(s, 10, 2, 0.1) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, 10, 2, 0.1) == 1.0  # the cosine starts at the top
    assert lr_factor(6, 10, 2, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(10, 10, 2, 0.1) == pytest.approx(0.1)
    assert lr_factor(50, 10, 2, 0.1) == pytest.approx(0.1)  # past the end: stays at the floor
    assert lr_factor(0, 1, 0, 0.0) == 1.0


def test_linear_and_constant_after_the_warmup() -> None:
    assert [lr_factor(s, 6, 2, 0.0, "linear") for s in range(7)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    )
    assert [lr_factor(s, 6, 2, 0.1, "constant") for s in range(7)] == [0.5] + [1.0] * 6


def test_warmup_ratio_rounds_up_to_whole_steps() -> None:
    assert Schedule.of(_cfg(warmup_ratio=0.1), 25).warmup == 3  # TRL: ceil(0.1 * 25)
    assert Schedule.of(_cfg(warmup_steps=4), 25).warmup == 4
    with pytest.raises(TrainingError, match="warmup_steps or warmup_ratio"):
        _cfg(warmup_steps=4, warmup_ratio=0.1)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), 0.0, -1e-4])
def test_a_learning_rate_that_is_not_a_positive_number_is_refused(lr: float) -> None:
    with pytest.raises(TrainingError, match="lr must be a finite number > 0"):
        _cfg(lr=lr)


def test_the_rate_is_set_from_the_step_whatever_the_optimizer_holds() -> None:
    """A resumed optimizer carries the old run's last rate; the update uses the schedule's."""
    cfg = _cfg(optimizer="adamw", lr=3e-4)
    stepper, _ = _setup(cfg)
    stepper.step = 2
    stepper.opt.param_groups[0]["lr"] = 123.0  # what a loaded optimizer state may hold
    res = stepper.run(_batches(2), has_parts=False, where="step 3", last_ckpt=None)
    assert res.lr == Schedule.of(cfg, 4).lr(2) == pytest.approx(3e-4 * 0.55)
    assert stepper.step == 3


def test_a_changed_schedule_says_where_it_continues() -> None:
    five, ten = Schedule.of(_cfg(lr=3e-4), 5), Schedule.of(_cfg(lr=3e-4), 10)
    assert (
        ten.resumed_line(five.state_dict(), 5) == "lr schedule now over 10 steps; step 6 at 1.65e-4"
    )
    assert ten.resumed_line(ten.state_dict(), 5) is None


def test_a_float16_grad_scaler_step_equals_the_unscaled_step_and_skips_an_overflow() -> None:
    """--precision float16's grad scaler: gradients scaled by a power of two in backward and
    unscaled before the clip give the very update of a run without it; a scale that overflows
    the gradients skips the update (weights unchanged, the step counted) and halves the scale."""
    cfg = _cfg()
    plain, lm = _setup(cfg)
    scaled, lm16 = _setup(cfg)
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    batches = _batches(0)
    a = plain.run(batches, has_parts=False, where="step 1", last_ckpt=None)
    b = scaled.run(batches, has_parts=False, where="step 1", last_ckpt=None)
    assert (a.grad_norm, a.sums.loss) == (b.grad_norm, b.sums.loss)
    torch.testing.assert_close(lm16.state_dict(), lm.state_dict(), rtol=0, atol=0)
    big, lm_big = _setup(cfg)
    big.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # the gradients overflow
    before = {k: v.clone() for k, v in lm_big.state_dict().items()}
    res = big.run(batches, has_parts=False, where="step 1", last_ckpt=None)
    assert not math.isfinite(res.grad_norm) and math.isfinite(res.sums.loss)
    assert (big.step, big.skipped, big.scaler.get_scale()) == (1, 1, 2.0**126)
    torch.testing.assert_close(lm_big.state_dict(), before, rtol=0, atol=0)
    assert all(p.grad is None for p in big.params)


def test_float16_is_refused_in_one_line_on_the_cpu_and_under_fsdp() -> None:
    from treeprep.trainer.config import precision

    with pytest.raises(TrainingError, match=r"float16 needs a CUDA GPU .* on cpu: use float32$"):
        precision(_cfg(precision="float16"), torch.device("cpu"))
    with pytest.raises(TrainingError, match="under fsdp use bfloat16"):
        _cfg(precision="float16", parallel="fsdp")
    assert precision(_cfg(precision="float16"), torch.device("cuda"))[0] == "float16"
