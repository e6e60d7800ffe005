"""claude-code: the flat sub-agent layout of Claude Code before 2.1.2, and look-alikes.

Files are written with Claude Code's own envelope keys (``sessionId``, ``uuid``, ``parentUuid``,
``version``, ``isSidechain``, ``agentId``); the flat layout puts ``agent-<id>.jsonl`` next to
``<session>.jsonl`` instead of under ``<session>/subagents/``. The look-alike has the shape the
issue describes for iFlow CLI sessions: every assistant line hangs off the first user line and
repeats the previous ``tool_use``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.claude_code import read
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "claude-code"
SID = "7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b"


def _split(path: Path) -> tuple[list[ChatCall], list[Reject]]:
    items = list(read(str(path), ReadOptions()))
    return [i for i in items if isinstance(i, ChatCall)], [
        i for i in items if isinstance(i, Reject)
    ]


def test_flat_layout_agent_file_is_linked_to_its_parent(tmp_path: Path) -> None:
    shutil.copy(SAMPLE / f"{SID}.jsonl", tmp_path / f"{SID}.jsonl")
    shutil.copy(
        SAMPLE / SID / "subagents" / "agent-b5e71c2.jsonl", tmp_path / "agent-b5e71c2.jsonl"
    )
    nested, _ = _split(SAMPLE / SID / "subagents" / "agent-b5e71c2.jsonl")
    flat, rejects = _split(tmp_path / "agent-b5e71c2.jsonl")
    assert rejects == [] and len(flat) == 2
    assert {c.branch_reason for c in flat} == {"sub-agent"}
    assert [c.parent_call_id for c in flat] == [c.parent_call_id for c in nested]
    assert flat[0].parent_call_id is not None  # the Task call of the parent session
    assert [c.messages for c in flat] == [c.messages for c in nested]


def test_flat_layout_without_parent_names_both_layouts(tmp_path: Path) -> None:
    shutil.copy(
        SAMPLE / SID / "subagents" / "agent-b5e71c2.jsonl", tmp_path / "agent-b5e71c2.jsonl"
    )
    calls, rejects = _split(tmp_path / "agent-b5e71c2.jsonl")
    assert calls == [] and len(rejects) == 2
    assert all("flat layout of Claude Code before 2.1.2" in r.reason for r in rejects)


def _env(uuid: str, parent: str | None, type_: str, message: dict, **kw: object) -> dict:
    return {
        "parentUuid": parent,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/w",
        "sessionId": "iflow-1",
        "version": "0.2.0",
        "type": type_,
        "uuid": uuid,
        "timestamp": kw.pop("ts", "2025-09-01T10:00:00.000Z"),
        "message": message,
        **kw,
    }


def _tool_use(i: int) -> dict:
    return {
        "type": "tool_use",
        "id": f"call_{i}",
        "name": "read_file",
        "input": {"path": f"{i}.py"},
    }


def _look_alike() -> list[dict]:
    lines = [_env("u0", None, "user", {"role": "user", "content": "Read the files."})]
    for i in range(1, 4):
        # every assistant line hangs off u0 and repeats the previous tool_use
        blocks = [_tool_use(j) for j in range(max(1, i - 1), i + 1)]
        lines.append(
            _env(
                f"a{i}",
                "u0",
                "assistant",
                {"id": f"msg_{i}", "role": "assistant", "model": "m", "content": blocks},
                ts=f"2025-09-01T10:00:0{i}.000Z",
            )
        )
        result = {"type": "tool_result", "tool_use_id": f"call_{i}", "content": f"file {i}"}
        lines.append(_env(f"r{i}", f"a{i}", "user", {"role": "user", "content": [result]}))
    return lines


def test_look_alike_session_is_rejected_not_read_as_claude_code(tmp_path: Path) -> None:
    p = tmp_path / "session-iflow-1.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in _look_alike()))
    calls, rejects = _split(p)
    assert calls == [] and len(rejects) == 3
    assert [r.line for r in rejects] == [2, 4, 6]
    assert all("hangs off the first user line (line 1)" in r.reason for r in rejects)
    assert all("iFlow CLI" in r.reason for r in rejects)


def test_detection_needs_the_version_key(tmp_path: Path) -> None:
    lines = _look_alike()
    p = tmp_path / "a.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = detect_format(str(p), read_head(str(p)))
    assert spec is not None and spec.name == "claude-code"
    q = tmp_path / "b.jsonl"
    q.write_text(
        "".join(json.dumps({k: v for k, v in x.items() if k != "version"}) + "\n" for x in lines)
    )
    spec = detect_format(str(q), read_head(str(q)))
    assert spec is None or spec.name != "claude-code"
