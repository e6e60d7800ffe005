"""tau-bench and tau2-bench adapters on the real trajectories and our samples."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from treeprep.formats import detect_format
from treeprep.formats.base import ReadOptions
from treeprep.formats.tau_bench import FORMATS, tau2_system_prompt
from treeprep.schemas import ChatCall, Reject

TAU, TAU2 = FORMATS
ROOT = Path(__file__).resolve().parents[3]
LOGS = ROOT / ".." / "shared" / "data" / "logs"
real = pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/data is absent")


def _split(spec, path, opts=None):
    items = list(spec.read(str(path), opts or ReadOptions()))
    return [i for i in items if isinstance(i, ChatCall)], [
        i for i in items if isinstance(i, Reject)
    ]


@real
def test_real_tau_bench():
    path = LOGS / "tau-bench" / "historical_trajectories__gpt-4o-airline.json"
    assert detect_format(str(path), path.read_bytes()[:65536]) is TAU
    calls, rej = _split(TAU, path)
    assert rej == [] and len(calls) == 2454
    groups = collections.Counter(c.group_id for c in calls)
    assert len(groups) == 50  # 50 tasks x 4 trials, one tree per task
    assert [c.branch_reason for c in calls].count("new-trial") == 150
    assert calls[0].source_line == 2 and calls[0].messages[0].role == "system"


@real
def test_real_tau2_bench():
    path = LOGS / "tau2-bench" / "feature-gym__gpt-4.1_airline_default_gpt-4.1_1trials.json"
    assert detect_format(str(path), path.read_bytes()[:65536]) is TAU2
    calls, rej = _split(TAU2, path)
    assert rej == [] and len(calls) == 206 and len({c.group_id for c in calls}) == 20
    policy = json.loads(path.read_text())["info"]["environment_info"]["policy"]
    assert calls[0].messages[0].content == tau2_system_prompt(policy)
    # the orchestrator's greeting is context, never a call
    assert calls[0].messages[1].content == "Hi! How can I help you today?"
    assert all(c.completion.content != "Hi! How can I help you today?" for c in calls)
    assert max(len(c.completion.tool_calls or []) for c in calls) == 12


def test_sample_tau_bench():
    calls, rej = _split(TAU, ROOT / "sample_data" / "tau_bench_shop.json")
    assert rej == [] and len(calls) == 15
    assert [c.call_id for c in calls if c.branch_reason == "new-trial"] == [
        "task-0/trial-1/0",
        "task-1/trial-1/0",
    ]
    assert {c.reward for c in calls if c.call_id.startswith("task-0/trial-1")} == {0.0}
    par = next(c for c in calls if c.completion.tool_calls and len(c.completion.tool_calls) == 2)
    assert [t.function.name for t in par.completion.tool_calls] == ["cancel_order", "get_user"]


def test_sample_tau2_bench():
    calls, rej = _split(TAU2, ROOT / "sample_data" / "tau2_bench_shop.json")
    assert rej == [] and len(calls) == 4
    assert calls[0].tools[0]["function"]["name"] == "get_order"
    assert calls[0].completion.tool_calls[1].function.arguments == {"order_id": "#W300"}
    assert [m.tool_call_id for m in calls[1].messages if m.role == "tool"] == ["c0a", "c0b"]
    assert [c.branch_reason for c in calls] == [None, None, "new-trial", None]


def test_bad_entries(tmp_path):
    p = tmp_path / "t.json"
    good = {
        "task_id": 3,
        "traj": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        "reward": 1,
    }
    p.write_text(
        json.dumps([good, {"task_id": 4}, {"task_id": 5, "traj": [{"role": "x"}]}], indent=2)
    )
    calls, rej = _split(TAU, p)
    assert len(calls) == 1
    assert [r.line for r in rej] == [16, 19]  # where each element starts
    assert "expected an object with 'task_id' and a 'traj' list" in rej[0].reason
    assert "[2].traj[0]" in rej[1].reason


def test_regression_tau2_user_tool_calls_left_an_empty_user_turn(tmp_path):
    """telecom: the user simulator runs tools on their phone; the agent never sees those turns."""
    tc = {"id": "u1", "name": "toggle_airplane_mode", "arguments": {}, "requestor": "user"}
    msgs = [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "My phone has no signal.", "tool_calls": None},
        {"role": "assistant", "content": "Please turn airplane mode off.", "usage": {"t": 1}},
        {"role": "user", "content": None, "tool_calls": [tc]},
        {"role": "tool", "id": "u1", "content": "Airplane mode: OFF", "requestor": "user"},
        {"role": "user", "content": "Done, it works now.", "tool_calls": None},
        {"role": "assistant", "content": "Great, glad it works!", "usage": {"t": 2}},
    ]
    doc = {
        "info": {"environment_info": {"policy": "Be kind."}},
        "simulations": [{"id": "sim-1", "task_id": "t1", "trial": 0, "messages": msgs}],
    }
    p = tmp_path / "telecom.json"
    p.write_text(json.dumps(doc))
    tau2 = next(s for s in FORMATS if s.name == "tau2-bench")
    calls, rej = _split(tau2, p)
    assert rej == []
    last = calls[-1]
    assert [(m.role, m.content) for m in last.messages] == [
        ("system", tau2_system_prompt("Be kind.")),
        ("assistant", "Hi! How can I help you today?"),
        ("user", "My phone has no signal."),
        ("assistant", "Please turn airplane mode off."),
        ("user", "Done, it works now."),
    ]
    assert all(m.content for m in last.messages)  # no empty user turn


def test_each_trial_is_its_own_trajectory():
    calls, rej = _split(TAU, ROOT / "sample_data" / "tau_bench_shop.json")
    assert rej == []
    by_group: dict[str, set[str]] = collections.defaultdict(set)
    for c in calls:
        assert c.trajectory_id is not None and c.call_id.startswith(c.trajectory_id + "/")
        by_group[c.group_id].add(c.trajectory_id)
    assert len(by_group) == 2 and all(len(t) == 2 for t in by_group.values())  # 2 tasks x 2
    calls2, _ = _split(TAU2, ROOT / "sample_data" / "tau2_bench_shop.json")
    assert len({c.trajectory_id for c in calls2}) == 2 and len({c.group_id for c in calls2}) == 1


def test_trial_rewards_are_one_per_trajectory():
    """A trial's calls share its reward; two trials of a task with rewards 1 and 0 were one
    trajectory before (GRPO refused the tree: "has calls with rewards 1 and 0")."""
    calls, _ = _split(TAU, ROOT / "sample_data" / "tau_bench_shop.json")
    rewards: dict[str, set[float | None]] = collections.defaultdict(set)
    for c in calls:
        rewards[c.trajectory_id].add(c.reward)  # type: ignore[index]
    assert all(len(r) == 1 for r in rewards.values())
    per_task = collections.defaultdict(set)
    for c in calls:
        per_task[c.group_id].add(c.reward)
    assert any(len(r) > 1 for r in per_task.values())  # trials of one task differ
