"""Codex: a session's history is converted once, each call converting only what it gained.

The reference is the whole conversion of every call's history, which every call made before:
with the identity check made to fail (``starts_with`` false), each call converts its history
afresh. Every call and reject must come out the same either way, on our sample and on random
rollouts holding what the history can do between two calls: grow by items and finished turns,
take a user message put back at its line (logged only as ``event_msg``), a server-run hosted
call's stand-in result, an unsupported item, and a compaction that replaces it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import codex
from treeprep.formats.base import ReadOptions
from treeprep.schemas import ChatCall

ROOT = Path(__file__).resolve().parents[3]


def _rollout(seed: int, turns: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    stamp = "2025-11-02T09:15:00.000Z"

    def put(kind: str, payload: dict[str, Any]) -> None:
        lines.append({"timestamp": stamp, "type": kind, "payload": payload})

    def item(payload: dict[str, Any]) -> None:
        put("response_item", payload)

    def user(text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    meta = {"id": f"s{seed}", "cwd": "/app", "base_instructions": {"text": "You are Codex."}}
    put("session_meta", meta)
    put("turn_context", {"model": "gpt-5-codex"})
    item(user("fix the bug"))
    for t in range(turns):
        r = rng.random()
        if r < 0.1:
            put("event_msg", {"type": "user_message", "message": f"only an event {t}"})
        elif r < 0.15:
            item(user(f"a user turn {t}"))
        elif r < 0.17:
            history = [user(f"summary {t}"), {"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "ok"}]}]  # fmt: skip
            put("compacted", {"message": "", "replacement_history": history})
        elif r < 0.18:
            item({"type": "compaction", "encrypted_content": "x"})  # no chat form
        if rng.random() < 0.4:
            item({"type": "reasoning", "summary": [{"type": "summary_text", "text": f"think {t}"}],
                  "content": None})  # fmt: skip
        if rng.random() < 0.5:
            item({"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": f"say {t}"}]})  # fmt: skip
        kind = rng.choice(("function_call", "custom_tool_call", "web_search_call", "none"))
        if kind == "function_call":
            item({"type": kind, "name": "shell", "arguments": "{}", "call_id": f"c{t}"})
            item({"type": "function_call_output", "call_id": f"c{t}", "output": f"out {t}"})
        elif kind == "custom_tool_call":
            item({"type": kind, "name": "apply_patch", "input": "*** Begin", "call_id": f"p{t}"})
            item({"type": "custom_tool_call_output", "call_id": f"p{t}", "output": "done"})
        elif kind == "web_search_call":
            item({"type": kind, "id": f"ws{t}", "status": "completed",
                  "action": {"type": "search", "query": f"q {t}"}})  # fmt: skip
        else:
            item({"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": f"done {t}"}]})  # fmt: skip
            item(user(f"go on {t}"))
    return lines


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rollout-2025-11-02T09-15-00-s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_the_sample_converts_as_whole_conversions_do(read_converted):
    (path,) = (ROOT / "sample_data" / "codex").rglob("*.jsonl")
    got = read_converted(codex.read, path, whole=False)
    assert got == read_converted(codex.read, path, whole=True) and got


@pytest.mark.parametrize("seed", range(30))
def test_random_rollouts_convert_as_whole_conversions_do(seed, tmp_path, read_converted):
    path = _write(tmp_path, _rollout(seed, 40))
    got = read_converted(codex.read, path, whole=False)
    assert got == read_converted(codex.read, path, whole=True)
    assert any('"messages"' in x for x in got)  # some calls, not only rejects


def test_a_long_rollout_converts_each_item_once(tmp_path, monkeypatch):
    """300 turns: every history entry is converted once (plus an open turn's items again), where
    converting every call's whole history converts about 300 x 300 / 2 entries."""
    lines = [x for x in _rollout(1, 300) if x["type"] != "compacted"]
    lines = [x for x in lines if x["payload"].get("type") != "compaction"]
    path = _write(tmp_path, lines)
    seen = {"items": 0}
    real = codex._as_responses_item

    def counted(it: dict[str, Any], line: int = 0) -> dict[str, Any]:
        seen["items"] += 1
        return real(it, line)

    monkeypatch.setattr(codex, "_as_responses_item", counted)
    calls = [c for c in codex.read(str(path), ReadOptions()) if isinstance(c, ChatCall)]
    entries = len(lines) - 2  # all but session_meta and turn_context (event lines add one each)
    assert len(calls) > 250
    assert seen["items"] < 3 * entries, (seen, entries)
