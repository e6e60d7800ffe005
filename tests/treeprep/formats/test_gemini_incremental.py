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


@pytest.mark.parametrize("started", [None, "2026-09-01T00:00:00Z"], ids=["before-0.53", "0.53+"])
@pytest.mark.parametrize("seed", range(30))
def test_random_sessions_convert_as_whole_conversions_do(seed, started, tmp_path, read_converted):
    """0.53+: consecutive user turns are one message, which stays open to the next entries."""
    lines = _session(seed, 40)
    if started:
        lines[0]["startTime"] = started
    path = tmp_path / "session-h.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = read_converted(gemini_cli.read, path, whole=False)
    assert got == read_converted(gemini_cli.read, path, whole=True)


def _user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "timestamp": "2026-09-01T00:00:00Z", "type": "user",
            "content": [{"text": text}]}  # fmt: skip


@pytest.mark.parametrize(
    ("started", "merged"),
    [("2026-07-28T21:45:04Z", True), ("2026-07-28T21:45:03Z", False), (None, False)],
)
def test_a_session_since_0_53_sends_consecutive_user_turns_as_one(
    started: str | None, merged: bool, tmp_path: Path
) -> None:
    """From 0.53.0 (released 2026-07-28T21:45:04Z) Gemini CLI sends the session context and the
    first prompt as one user turn, their parts in order (``coalesceConsecutiveRoles``), and so
    any user turns in a row; the file records them apart, as before."""
    from treeprep.formats import ReadOptions
    from treeprep.schemas import ChatCall

    meta: dict[str, Any] = {"sessionId": "s", "projectHash": "p", "kind": "main"}
    if started:
        meta["startTime"] = started
    context = _user("d04923d38bb0f6017037e74183378ef4", "<session_context>os</session_context>")
    reply = {"id": "g1", "timestamp": "2026-09-01T00:00:01Z", "type": "gemini", "content": "Ok."}
    lines = [meta, {"$set": {"messages": [context]}}, _user("u1", "Fix it."), reply,
             _user("u2", "Also this."), _user("u3", "And that."),
             {**reply, "id": "g2", "content": "Done."}]  # fmt: skip
    path = tmp_path / "session-x.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    first, second = [
        c for c in gemini_cli.read(str(path), ReadOptions()) if isinstance(c, ChatCall)
    ]
    shapes = [[(m.role, m.content if isinstance(m.content, str) else [p.text for p in m.content])
               for m in c.messages] for c in (first, second)]  # fmt: skip
    if merged:
        assert shapes == [
            [("user", ["<session_context>os</session_context>", "Fix it."])],
            [("user", ["<session_context>os</session_context>", "Fix it."]),
             ("assistant", "Ok."), ("user", ["Also this.", "And that."])],
        ]  # fmt: skip
    else:
        assert shapes == [
            [("user", "<session_context>os</session_context>"), ("user", "Fix it.")],
            [("user", "<session_context>os</session_context>"), ("user", "Fix it."),
             ("assistant", "Ok."), ("user", "Also this."), ("user", "And that.")],
        ]  # fmt: skip
