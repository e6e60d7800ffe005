"""trainer/data/plans.py ``validate_plan``: a plan that does not describe the build exactly is
refused, naming the step, rank and micro-batch (or the tree) and what is wrong.

A small build of three groups (two GRPO groups of three samples, one two-call agent chain) is
planned in memory with the real packer (which ``validate_plan`` accepts), then one thing is broken
per test: a part names another shard, a node outside its tree, a tree or a sequence is dropped or
doubled, a micro-batch computes more than the budget.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import ShardError  # noqa: E402
from treeprep.trainer.data.plans import EpochPlan, make_plan, validate_plan  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402

BUDGET = 64


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> BuildReader:
    root = tmp_path_factory.mktemp("plan-batches")
    lines = []
    for g in range(2):
        prompt = list(range(40 + g, 60 + g))
        for k in range(3):
            lines.append(
                {
                    "group_id": f"grpo-{g}",
                    "call_id": f"grpo-{g}/{k}",
                    "prompt_token_ids": prompt,
                    "generation_token_ids": [70 + k + j for j in range(6 + k)],
                }
            )
    first = list(range(80, 92))
    second = [*first, 33, 34, 35, 36]
    for c, (prompt, gen) in enumerate([(first, [33, 34, 35]), (second, [37, 38])]):
        lines.append(
            {
                "group_id": "agent",
                "call_id": f"a/{c}",
                "prompt_token_ids": prompt,
                "generation_token_ids": gen,
            }
        )
    (root / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    build(BuildConfig(inputs=[str(root / "r.jsonl")], out=str(root / "build")))
    return BuildReader(str(root / "build"))


def _plan(reader: BuildReader) -> EpochPlan:
    return make_plan(reader, budget=BUDGET)


def _parts(plan: EpochPlan) -> list:
    return [p for st in plan.steps for p in st.parts]


def _replace_first(plan: EpochPlan, **kw) -> EpochPlan:
    """The plan with its first part's fields replaced."""
    mb = plan.steps[0].slots[0][0]
    mb[0] = dataclasses.replace(mb[0], **kw)
    return plan


def test_the_packers_plan_is_valid(reader: BuildReader) -> None:
    plan = _plan(reader)
    validate_plan(reader, plan)
    assert len({(p.shard, p.row) for p in _parts(plan)}) == 3


def test_a_shard_of_another_build_is_refused(reader: BuildReader) -> None:
    plan = _replace_first(_plan(reader), shard="shards/other.arrow")
    with pytest.raises(ShardError, match=r"step 0, rank 0, micro-batch 0: shard .*not part"):
        validate_plan(reader, plan)


def test_a_node_outside_its_tree_is_refused(reader: BuildReader) -> None:
    plan = _plan(reader)
    first = plan.steps[0].slots[0][0][0]
    plan = _replace_first(plan, nodes=(*first.nodes, 10_000), handoff_cuts=())
    with pytest.raises(ShardError, match="a part names a node outside its tree"):
        validate_plan(reader, plan)


def test_an_omitted_tree_is_refused(reader: BuildReader) -> None:
    plan = _plan(reader)
    mb = plan.steps[0].slots[0][0]
    gone = mb.pop(0)
    if not any(p.row == gone.row and p.shard == gone.shard for p in _parts(plan)):
        with pytest.raises(ShardError, match=f"row {gone.row} is a tree of the build the plan"):
            validate_plan(reader, plan)
    else:  # the tree was cut: its other parts remain, and its sequences are missing
        with pytest.raises(ShardError, match="every sequence exactly once"):
            validate_plan(reader, plan)


def test_a_sequence_trained_twice_is_refused(reader: BuildReader) -> None:
    plan = _plan(reader)
    first = plan.steps[0].slots[0][0][0]
    plan = _replace_first(plan, seqs=(*first.seqs, first.seqs[0]))
    with pytest.raises(ShardError, match="every sequence exactly once"):
        validate_plan(reader, plan)


def test_a_micro_batch_over_the_budget_is_refused(reader: BuildReader) -> None:
    plan = _plan(reader)
    plan = dataclasses.replace(plan, budget=1)
    with pytest.raises(ShardError, match="over the budget of 1|at most 1 tokens"):
        validate_plan(reader, plan)
