"""Crush: a session's messages are converted once, each call converting only what came since.

The reference is the whole conversion of every call's history: with ``_Context.prompt`` made to
start the history afresh each call, every message is converted again against the whole history's
call and result sets. Every call and reject must come out the same either way, on our sample and
on random stores holding what changes an earlier message's conversion: a result that answers a
call made steps before (or never: the ``INTERRUPTED`` stand-in), a result logged before its call,
duplicate call ids, finished and unfinished summaries, cut and canceled steps, attachments, shell
commands, empty messages, and rows that do not parse.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.treeprep.formats.sqlite_samples import CRUSH_DDL
from treeprep.formats import crush
from treeprep.formats._fields import forget_shared_messages
from treeprep.formats.base import ReadOptions

ROOT = Path(__file__).resolve().parents[3]
FINISH = ["end_turn", "tool_use", "tool_use", "tool_use", "max_tokens", "canceled", None]


def _parts(*parts: tuple[str, dict[str, Any]]) -> str:
    return json.dumps([{"type": k, "data": d} for k, d in parts])


def _user(rng: random.Random, k: int) -> str:
    parts: list[tuple[str, dict[str, Any]]] = []
    if rng.random() < 0.9:
        parts.append(("text", {"text": f" ask {k} "}))
    if rng.random() < 0.1:
        parts.append(("binary", {"Path": f"f{k}.txt", "MIMEType": "text/plain", "Data": "aGk="}))
    if rng.random() < 0.05:
        parts.append(("binary", {"Path": "a.png", "MIMEType": "image/png", "Data": "AA=="}))
    if rng.random() < 0.05:
        parts.append(("shell_command", {"command": "ls", "output": "a", "exit_code": 0}))
    if rng.random() < 0.003:
        parts.append(("binary", {"Path": "bad", "MIMEType": "text/plain", "Data": "%%"}))
    return _parts(*parts)


def _assistant(rng: random.Random, k: int, ids: list[str]) -> str:
    parts: list[tuple[str, dict[str, Any]]] = []
    if rng.random() < 0.3:
        parts.append(("reasoning", {"thinking": f"think {k}", "signature": ""}))
    if rng.random() < 0.6:
        parts.append(("text", {"text": f"say {k}\n"}))
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        cid = rng.choice(ids) if ids and rng.random() < 0.05 else f"call_{k}_{len(parts)}"
        ids.append(cid)
        parts.append(("tool_call", {"id": cid, "name": "bash", "input": '{"c":1}'}))
    if rng.random() < 0.001:
        parts.append(("tool_call", {"id": 7, "name": "bash", "input": "{}"}))
    reason = rng.choice(FINISH)
    if reason:
        parts.append(("finish", {"reason": reason}))
    return _parts(*parts)


def _results(rng: random.Random, ids: list[str], k: int) -> str:
    pending = [c for c in ids[-6:] if rng.random() < 0.8]
    if rng.random() < 0.1:
        pending.append(f"call_{k + rng.randint(1, 6)}_0")  # logged before its call, or never made
    results = [
        ("tool_result", {"tool_call_id": c, "name": "bash", "content": f"out {c}"})
        for c in rng.sample(pending, len(pending))
    ]
    if rng.random() < 0.002:
        results.append(("tool_result", {"tool_call_id": ids[-1] if ids else "x", "data": "AA"}))
    return _parts(*results)


def _store(path: Path, seed: int, steps: int) -> None:
    """A random Crush store: a main session and a sub-agent, ``steps`` messages each."""
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.executescript(CRUSH_DDL)
    sessions = (("s1", None), ("m1$$call_1_0", "s1"))
    for sid, parent in sessions:
        con.execute(
            "INSERT INTO sessions (id, parent_session_id, title, updated_at, created_at)"
            " VALUES (?, ?, 't', 1, 1)",
            (sid, parent),
        )
    row = 0
    for sid, _ in sessions:
        ids: list[str] = []
        for k in range(steps):
            roll, summary = rng.random(), 0
            if roll < 0.2:
                role, parts = "user", _user(rng, k)
            elif roll < 0.6:
                role, parts = "assistant", _assistant(rng, k, ids)
                summary = int(rng.random() < 0.04)
            else:
                role, parts = "tool", _results(rng, ids, k)
            if rng.random() < 0.0005:
                parts = "{not json"
            if rng.random() < 0.03:
                parts = "[]"
            row += 1
            con.execute(
                "INSERT INTO messages (id, session_id, role, parts, model, created_at,"
                " updated_at, is_summary_message) VALUES (?, ?, ?, ?, 'm', ?, ?, ?)",
                (f"m{row}", sid, role, parts, row // 3, row, summary),
            )
    con.commit()
    con.close()


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, *, whole: bool) -> list[str]:
    forget_shared_messages()
    with monkeypatch.context() as m:
        if whole:
            incremental = crush._Context.prompt

            def afresh(self: crush._Context) -> list[dict[str, Any]]:
                self._reset(self.msgs)
                return incremental(self)

            m.setattr(crush._Context, "prompt", afresh)
        opts = ReadOptions(system_prompt="You are Crush.")
        return [i.model_dump_json() for i in crush.read(str(path), opts)]


def test_the_sample_reads_the_same_incrementally(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = ROOT / "sample_data" / "crush" / "crush.db"
    assert _read(sample, monkeypatch, whole=False) == _read(sample, monkeypatch, whole=True)


def test_random_stores_read_the_same_incrementally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redone = calls = 0
    convert = crush._Context._convert
    counted: list[int] = []

    def counting(self: crush._Context, i: int) -> list[dict[str, Any]]:
        counted.append(i)
        return convert(self, i)

    for seed in range(40):
        p = tmp_path / f"crush-{seed}.db"
        _store(p, seed, steps=120)
        want = _read(p, monkeypatch, whole=True)
        counted.clear()
        with monkeypatch.context() as m:
            m.setattr(crush._Context, "_convert", counting)
            got = _read(p, monkeypatch, whole=False)
        assert got == want, f"seed {seed}"
        calls += sum('"call_id"' in g and '"completion"' in g for g in got)
        redone += len(counted) - len(set(counted))
    assert calls > 1000  # the stores reach many calls, and some histories were converted again
    assert redone > 100


def test_a_linear_session_converts_each_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "crush.db"
    con = sqlite3.connect(p)
    con.executescript(CRUSH_DDL)
    con.execute("INSERT INTO sessions (id, title, updated_at, created_at) VALUES ('s', 't', 1, 1)")
    rows = [("user", _parts(("text", {"text": "go"})))]
    for k in range(200):
        call = ("tool_call", {"id": f"c{k}", "name": "bash", "input": "{}"})
        rows.append(("assistant", _parts(call, ("finish", {"reason": "tool_use"}))))
        rows.append(("tool", _parts(("tool_result", {"tool_call_id": f"c{k}", "content": "ok"}))))
    for n, (role, parts) in enumerate(rows):
        con.execute(
            "INSERT INTO messages (id, session_id, role, parts, created_at, updated_at)"
            " VALUES (?, 's', ?, ?, ?, ?)",
            (f"m{n}", role, parts, n, n),
        )
    con.commit()
    con.close()
    convert = crush._Context._convert
    counted: list[int] = []

    def counting(self: crush._Context, i: int) -> list[dict[str, Any]]:
        counted.append(i)
        return convert(self, i)

    monkeypatch.setattr(crush._Context, "_convert", counting)
    items = list(crush.read(str(p), ReadOptions()))
    assert len(items) == 200
    # a step and its result come in between two calls: each message is converted once (all but
    # the last step's result, which no call follows)
    assert sorted(counted) == list(range(len(rows) - 2))
