"""codex: sub-agent rollouts linked to the thread that spawned them (issue 40 item 3).

The rollouts are written from codex-rs: ``SessionSource::SubAgent(ThreadSpawn {parent_thread_id,
depth})`` serialized under ``session_meta.source.subagent.thread_spawn``, and ``spawn_agent``'s
output ``{"agent_id": <thread id>, "nickname"}`` (``tools/handlers/multi_agents/spawn.rs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, get_format
from treeprep.schemas import ChatCall


def _line(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": "2025-11-03T10:00:00.000Z", "type": kind, "payload": payload}


def _msg(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    content = [{"type": part, "text": text}]
    return _line("response_item", {"type": "message", "role": role, "content": content})


def _meta(thread: str, parent: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": thread, "cwd": "/w"}
    if parent is not None:
        meta["source"] = {"subagent": {"thread_spawn": {"parent_thread_id": parent, "depth": 1}}}
    return _line("session_meta", meta)


def _spawning(thread: str, child: str, parent: str | None = None) -> list[dict[str, Any]]:
    args = json.dumps({"message": "Count the tests."})
    out = json.dumps({"agent_id": child, "nickname": "Euler"})
    return [
        _meta(thread, parent),
        _msg("user", "Look into the tests."),
        _msg("assistant", "I will ask a helper."),  # call #0
        _msg("user", "Go on."),
        _line("response_item", {"type": "function_call", "call_id": "sp1",
                                "name": "spawn_agent", "arguments": args}),  # call #1
        _line("response_item", {"type": "function_call_output", "call_id": "sp1", "output": out}),
        _msg("assistant", "The helper is counting."),  # call #2
    ]  # fmt: skip


def _child(thread: str, parent: str) -> list[dict[str, Any]]:
    return [_meta(thread, parent), _msg("user", "Count the tests."), _msg("assistant", "12 tests.")]


def _write(folder: Path, thread: str, lines: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"rollout-2025-11-03T10-00-00-{thread}.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def _read(p: Path) -> list[Any]:
    return list(get_format("codex").read(str(p), ReadOptions()))


def test_a_subagent_joins_its_parents_tree_under_the_spawning_call(tmp_path: Path) -> None:
    day = tmp_path / "sessions" / "2025" / "11" / "03"
    _write(day, "P", _spawning("P", "C"))
    child = _write(day, "C", _child("C", "P"))
    (call,) = _read(child)
    assert (call.group_id, call.agent_id, call.call_id) == ("P", "C", "C#0")
    assert (call.branch_reason, call.parent_call_id) == ("sub-agent", "P#1")


def test_a_grandchild_in_another_day_folder_joins_the_root(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    _write(root / "2025" / "11" / "03", "P", _spawning("P", "C"))
    _write(root / "2025" / "11" / "03", "C", _spawning("C", "G", parent="P"))
    grandchild = _write(root / "2025" / "11" / "04", "G", _child("G", "C"))
    (call,) = _read(grandchild)
    assert (call.group_id, call.agent_id, call.parent_call_id) == ("P", "G", "C#1")


def test_an_absent_parent_still_names_the_tree(tmp_path: Path) -> None:
    (call,) = _read(_write(tmp_path, "C", _child("C", "P")))
    assert (call.group_id, call.agent_id, call.branch_reason, call.parent_call_id) == (
        "P", "C", "sub-agent", None,
    )  # fmt: skip


def test_parent_and_subagent_build_into_one_tree(tmp_path: Path) -> None:
    day = tmp_path / "logs" / "2025" / "11" / "03"
    _write(day, "P", _spawning("P", "C"))
    _write(day, "C", _child("C", "P"))
    m = build(BuildConfig(inputs=[str(tmp_path / "logs")], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees) == (4, 1)
    calls = [c for c in _read(day / "rollout-2025-11-03T10-00-00-P.jsonl")]
    assert all(isinstance(c, ChatCall) and c.agent_id == "main" for c in calls)
