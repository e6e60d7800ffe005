"""The ``sampling`` hint (treeprep/formats/_samples.py) and the runs' branch reasons end to end:
tau-bench trials part as ``new-trial`` and GRPO samples as ``sampling``, where they used to be
``unknown`` (issue 53 item 11: 13 of 28 branches in the samples, explained nowhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeprep.formats import ReadOptions, get_format
from treeprep.schemas import Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data"


def _hints(fmt: str, path: Path) -> list[tuple[str, str | None]]:
    items = get_format(fmt).read(str(path), ReadOptions())
    return [(i.call_id, i.branch_reason) for i in items if not isinstance(i, Reject)]


def test_each_named_grpo_sample_starts_with_sampling() -> None:
    """The GRPO group names its four samples: each one's call says ``sampling``; the agent
    rollout names none (its group is one run), so its calls say nothing."""
    assert _hints("tokens", SAMPLES / "tokens.jsonl") == [
        *((f"grpo-mul-17x3/sample-{k}", "sampling") for k in range(4)),
        ("agent-sum-100/0", None),
        ("agent-sum-100/1", None),
    ]


def test_only_the_first_call_of_a_sample_is_hinted(tmp_path: Path) -> None:
    """A sample logged over several records (its calls interleaved with another's) is hinted
    once, on its first call: its later calls may leave its own path for another reason."""
    rows = [
        {"group_id": "g", "trajectory_id": t, "call_id": f"{t}/{k}", "prompt_token_ids": [1, k],
         "generation_token_ids": [2]}
        for k in (0, 1) for t in ("a", "b")
    ]  # fmt: skip
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _hints("tokens", path) == [
        ("a/0", "sampling"), ("b/0", "sampling"), ("a/1", None), ("b/1", None)
    ]  # fmt: skip


def test_each_nemo_gym_rollout_starts_with_sampling() -> None:
    """One NeMo-Gym record is one rollout of its task: its first call says ``sampling``, its
    later turns nothing of their own."""
    hints = _hints("openai-responses", SAMPLES / "openai_responses.jsonl")
    firsts = [why for cid, why in hints if cid.endswith("#0")]
    assert firsts and set(firsts) == {"sampling"}
    assert {why for cid, why in hints if not cid.endswith("#0")} <= {None}


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        ("tau_bench_shop.json", "new-trial"),
        ("tau2_bench_shop.json", "new-trial"),
        ("tokens.jsonl", "sampling"),
        ("openai_responses.jsonl", "sampling"),
    ],
)
def test_runs_part_with_their_reason_not_unknown(sample: str, reason: str, tmp_path: Path) -> None:
    from treeprep.build import BuildConfig, build
    from treeprep.stats import collect, summarize

    build(BuildConfig(inputs=[str(SAMPLES / sample)], out=str(tmp_path / "out")))
    by_reason = summarize(collect(str(tmp_path / "out")))["by_branch_reason"]
    assert set(by_reason) == {reason} and by_reason[reason]["branches"] >= 1


def _nemo_rollout(query: str, answer: str, reward: float) -> dict:
    """A NeMo-Gym rollout as files before ``_ng_task_index`` have them (its
    ``example_rollouts.jsonl``): no task index, no group, no sample id."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Answer in one sentence."},
                {"role": "user", "content": query},
            ]
        },
        "response": {
            "output": [
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": answer}]}
            ]
        },
        "reward": reward,
    }  # fmt: skip


def test_nemo_gym_rollouts_without_a_task_index_group_by_their_prompt(tmp_path: Path) -> None:
    """Regression: a NeMo-Gym file with no ``_ng_task_index`` put every rollout in the file's
    one group, so the rollouts of different tasks were one GRPO group (the trainer computes
    advantages per tree) and parted as ``unknown`` (8 branches in the real logs). Each prompt is
    now its own group, wherever its rollouts lie in the file, and they part as ``sampling``."""
    from treeprep.build import BuildConfig, build
    from treeprep.stats import collect, summarize

    rows = [
        _nemo_rollout("Why is the sky blue?", "Rayleigh scattering.", 1.0),
        _nemo_rollout("Why is grass green?", "Chlorophyll absorbs red and blue.", 1.0),
        _nemo_rollout("Why is the sky blue?", "Because the sea is.", 0.0),
        _nemo_rollout("Why is grass green?", "It is painted.", 0.0),
    ]
    path = tmp_path / "example_rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = [i for i in get_format("openai-responses").read(str(path), ReadOptions())]
    assert not any(isinstance(c, Reject) for c in calls)
    groups = [c.group_id for c in calls]
    assert groups[0] == groups[2] and groups[1] == groups[3] and groups[0] != groups[1]
    assert all(g.startswith("example_rollouts:prompt-") for g in groups)
    # the group names the prompt by content: the same with the keys in another order
    swapped = dict(reversed(list(rows[0]["responses_create_params"]["input"][1].items())))
    rows[0]["responses_create_params"]["input"][1] = swapped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = get_format("openai-responses").read(str(path), ReadOptions())
    assert [c.group_id for c in again] == groups

    build(BuildConfig(inputs=[str(path)], out=str(tmp_path / "out")))
    stats = summarize(collect(str(tmp_path / "out")))
    assert stats["trees"] == 2
    assert set(stats["by_branch_reason"]) == {"sampling"}
