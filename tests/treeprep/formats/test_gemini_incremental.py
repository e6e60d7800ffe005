"""Gemini CLI: a session's history is converted once, each call converting only what it gained.

The reference is the whole conversion of every call's history, which every call made before:
with the identity check made to fail (``starts_with`` false), each call converts its history
afresh. Every call and reject must come out the same either way, on our samples and on random
sessions with what a history can do between two calls: grow, be rewound (``$rewindTo``), be
rewritten (a ``$set`` of its messages, some of them changed), take a new version of a message,
and hold a tool call with no recorded result (every later call is rejected).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import gemini_cli

ROOT = Path(__file__).resolve().parents[3]


def _tool_calls(rng: random.Random, k: int) -> list[dict[str, Any]]:
    calls = []
    for j in range(rng.choice((1, 1, 2))):
        cid = f"c{k}-{j}"
        done = rng.random() < 0.93  # else cancelled: no result, later prompts cannot be rebuilt
        result = [{"functionResponse": {"id": cid, "name": "ls", "response": {"output": "o"}}}]
        calls.append({"id": cid, "name": "ls", "args": {"k": k},
                      "status": "success" if done else "cancelled",
                      "result": result if done else None})  # fmt: skip
    return calls


def _session(seed: int, steps: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = [{"sessionId": "s", "projectHash": "p"}]
    ids: list[str] = []
    for k in range(steps):
        r = rng.random()
        if r < 0.07 and ids:
            lines.append({"$rewindTo": rng.choice(ids)})
        elif r < 0.1 and ids:
            kept = []
            for i in ids[: rng.randrange(1, len(ids) + 1)]:
                m = dict(next(x for x in reversed(lines) if x.get("id") == i))
                if rng.random() < 0.3:
                    m["content"] = f"{m['content']} (masked)"
                kept.append(m)
            lines.append({"$set": {"messages": kept}})
        elif r < 0.15 and ids:
            lines.append(dict(next(x for x in reversed(lines) if x.get("id") == ids[-1])))
        else:
            kind = rng.choice(("user", "gemini", "gemini", "info"))
            rec: dict[str, Any] = {"id": f"m{k}", "timestamp": "2025-01-01T00:00:00Z",
                                   "type": kind, "content": f"{kind} {k}"}  # fmt: skip
            if kind == "gemini" and rng.random() < 0.6:
                rec["toolCalls"] = _tool_calls(rng, k)
            ids.append(rec["id"])
            lines.append(rec)
    return lines


@pytest.mark.parametrize("path", sorted((ROOT / "sample_data").glob("gemini_cli*/**/*.json*")))
def test_the_samples_convert_as_whole_conversions_do(path, read_converted):
    got = read_converted(gemini_cli.read, path, whole=False)
    assert got == read_converted(gemini_cli.read, path, whole=True)


@pytest.mark.parametrize("seed", range(30))
def test_random_sessions_convert_as_whole_conversions_do(seed, tmp_path, read_converted):
    path = tmp_path / "session-h.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in _session(seed, 40)))
    got = read_converted(gemini_cli.read, path, whole=False)
    assert got == read_converted(gemini_cli.read, path, whole=True)
