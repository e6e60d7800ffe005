"""SWE-agent: each call converts only the prompt messages it does not share with the last one.

A ``.traj`` holds every step's messages whole (``query`` or ``messages``, parsed apart, so the
same message is another object in each step), or the prompts are prefixes of one ``history``.
The reference is every prompt's messages converted afresh, one by one (and, apart, the same
with ``ConvertedHistory``'s identity checks failing).
Every call and reject must come out the same either way, on our sample, the real trajectories in
``../shared/data`` when present, and random runs in the three forms holding what a run can do:
grow, elide an old output (``last_n_observations``), go back, hold a misshapen message that the
steps after it hold too, and hold values that are equal in Python but not in JSON (``1``,
``1.0``, ``true``).
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import swe_agent
from treeprep.formats._history import ParsedHistory

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "data" / "logs" / "swe-agent"


def _step(rng: random.Random, k: int, bad: float) -> list[Any]:
    """A step's assistant action and its output, each (with chance ``bad``) misshapen."""
    n = rng.choice([1, 1.0, True])  # equal in Python, another input in JSON
    call = {"id": f"call_{k}", "type": "function",
            "function": {"name": "bash", "arguments": {"n": n}}}  # fmt: skip
    action = {"role": "assistant", "content": f"step {k}", "thought": f"think {k}",
              "action": "ls", "tool_calls": [call]}  # fmt: skip
    output = {"role": "tool", "content": f"out {k}\nline", "tool_call_ids": [f"call_{k}"]}
    if rng.random() < bad:
        action = {**action, "tool_calls": "ls"}
    if rng.random() < bad:
        output = rng.choice(["not a message", {**output, "tool_call_ids": "call"}])
    return [action, output]


def _run(seed: int, steps: int, rewind: float = 0.1, swap: float = 0.2) -> list[list[Any]]:
    """Each step's messages: the history after it, with old outputs elided, rewinds (chance
    ``rewind`` per step), an action sent again with an argument of another JSON type (chance
    ``swap``) and, in the last third, misshapen messages."""
    rng = random.Random(seed)
    history: list[Any] = [
        {"role": "system", "content": "You are an autonomous programmer."},
        {"role": "user", "content": "Fix the bug."},
    ]
    out = []
    for k in range(steps):
        if rng.random() < rewind and len(history) > 4:
            history = history[: rng.randrange(2, len(history))]  # back to an earlier step
        bad = 0.05 if 3 * k > 2 * steps else 0.0
        history += _step(rng, k, bad)
        tools = [i for i, m in enumerate(history) if isinstance(m, dict) and m["role"] == "tool"]
        if len(tools) > 5 and rng.random() < 0.8:
            i = tools[-6]
            history[i] = {**history[i], "content": "Old environment output: (2 lines omitted)"}
        if rng.random() < swap:  # an action sent again with an argument equal in Python only
            i = rng.choice([i for i, m in enumerate(history) if _is_action(m)] or [0])
            if _is_action(history[i]):
                history[i] = copy.deepcopy(history[i])
                args = history[i]["tool_calls"][0]["function"]["arguments"]
                args["n"] = rng.choice([v for v in (1, 1.0, True) if repr(v) != repr(args["n"])])
        out.append(copy.deepcopy(history))  # parsed apart: other objects in each step
    return out


def _is_action(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("tool_calls"), list)


def _write(tmp_path: Path, seed: int, form: str) -> Path:
    runs = _run(seed, 30)
    if form == "messages":
        steps = [{"action": "ls", "observation": "", "response": "", "messages": m} for m in runs]
        doc: dict[str, Any] = {"trajectory": steps, "history": runs[-1]}
    elif form == "query":
        steps = [{"action": "ls", "observation": "", "response": "r", "query": m} for m in runs]
        doc = {"trajectory": steps, "history": runs[-1]}
    else:
        doc = {"history": runs[-1]}
    path = tmp_path / f"run-{form}.traj"
    path.write_text(json.dumps(doc))
    return path


def _afresh(self: Any, raw: list[Any], where: str) -> list[dict[str, Any]]:
    """The reference: every message of every prompt converted, nothing kept."""
    return [swe_agent._message(m, f"{where}[{j}]") for j, m in enumerate(raw)]


def _both(read_converted, path: Path) -> list[str]:
    got = read_converted(swe_agent.read, path, whole=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ParsedHistory, "messages", _afresh)
        assert got == read_converted(swe_agent.read, path, whole=False)
    assert got == read_converted(swe_agent.read, path, whole=True)
    return got


def test_the_samples_convert_as_whole_conversions_do(read_converted):
    paths = [ROOT / "sample_data" / "swe_agent_slugify.traj", *sorted(SHARED.glob("*.traj"))]
    for path in paths:
        assert _both(read_converted, path), path


@pytest.mark.parametrize("form", ["messages", "query", "history"])
@pytest.mark.parametrize("seed", range(8))
def test_random_runs_convert_as_whole_conversions_do(form, seed, tmp_path, read_converted):
    got = _both(read_converted, _write(tmp_path, seed, form))
    assert any('"messages"' in x for x in got)  # some calls, not only rejects


def test_a_long_run_converts_each_message_once(tmp_path, monkeypatch):
    """300 steps whose outputs are elided five back: a step converts the messages after the
    output elided last (about a dozen), not every message it holds."""
    runs = _run(1, 300, rewind=0.0, swap=0.0)
    steps = [{"action": "ls", "observation": "", "response": "", "messages": m} for m in runs]
    path = tmp_path / "long.traj"
    path.write_text(json.dumps({"trajectory": steps, "history": runs[-1]}))
    converted = []
    real = swe_agent._message
    monkeypatch.setattr(swe_agent, "_message", lambda m, at: converted.append(1) or real(m, at))
    items = list(swe_agent.read(str(path), swe_agent.ReadOptions()))
    assert len(items) == 300
    assert len(converted) < 300 * 16 < sum(map(len, runs)) / 10, len(converted)
