"""Claude Code's incremental replay (treeprep.formats._claude_replay) against a whole replay.

The reference is the whole replay of each call's thread, which every call made before: with
``MAX_TIPS = 0`` no replay stays live, so each call is replayed whole. Every call and reject must
come out the same either way, on the real sessions, our samples, and random sessions that hold
every line a replay must not miss: late streamed blocks, late tool results, context lines hung
off earlier lines (some later carried on the thread), progress lines, retries, rewinds and a
compaction.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.errors import ReplayMismatch
from treeprep.formats import _claude_replay
from treeprep.formats import claude_code as cc
from treeprep.formats.base import ReadOptions
from treeprep.modes import Server
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT / ".." / "shared" / "data" / "logs" / "claude-code"


class _Counted(_claude_replay.Threads):
    """Threads that remember themselves, to count how each call's thread was replayed."""

    made: list[_Counted] = []

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        _Counted.made.append(self)


def _read(
    path: Path, monkeypatch: pytest.MonkeyPatch, *, whole: bool, server: Server = Server.vllm
) -> list[str]:
    _Counted.made = []
    with monkeypatch.context() as m:
        m.setattr(cc, "Threads", _Counted)
        if whole:
            m.setattr(_claude_replay, "MAX_TIPS", 0)
        items = cc.read(str(path), ReadOptions(server=server))
        return [i.model_dump_json() for i in items]


def _counts() -> tuple[int, int]:
    return sum(t.incremental for t in _Counted.made), sum(t.whole for t in _Counted.made)


def _files() -> list[Path]:
    found = sorted((ROOT / "sample_data" / "claude-code").rglob("*.jsonl"))
    return found + (sorted(SHARED.rglob("*.jsonl")) if SHARED.is_dir() else [])


#: the Messages endpoints a replay's turns are converted by (vLLM's and llama.cpp's differ in
#: the order of a turn's messages, which the replay makes again as the turn grows)
SERVERS = (Server.vllm, Server.llama_cpp)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name[:24])
def test_real_and_sample_sessions_replay_as_whole_replays_do(path, server, monkeypatch):
    got = _read(path, monkeypatch, whole=False, server=server)
    assert got == _read(path, monkeypatch, whole=True, server=server)


class _Writer:
    """A random Claude Code session, written with lines deferred to later in the file."""

    def __init__(self, seed: int, *, late: bool = True) -> None:
        self.rng = random.Random(seed)
        self.late = late
        self.lines: list[dict[str, Any]] = []
        self.deferred: list[tuple[int, dict[str, Any]]] = []  # (lines still to wait, record)
        self.n = 0
        self.tool = 0

    def rec(self, kind: str, parent: str | None, message: Any = None, **extra: Any) -> dict:
        self.n += 1
        r: dict[str, Any] = {
            "type": kind,
            "uuid": f"u{self.n}",
            "parentUuid": parent,
            "sessionId": "s",
            "version": "2.0.0",
            "isSidechain": False,
            **extra,
        }
        if message is not None:
            r["message"] = message
        return r

    def put(self, r: dict[str, Any], *, late: float = 0.0) -> str:
        """Write ``r`` now, or (with chance ``late``) a few lines later."""
        if self.late and self.rng.random() < late:
            self.deferred.append((self.rng.randint(1, 12), r))
        else:
            self.lines.append(r)
            still = []
            for wait, d in self.deferred:
                if wait <= 1:
                    self.lines.append(d)
                else:
                    still.append((wait - 1, d))
            self.deferred = still
        return str(r["uuid"])

    def user(self, parent: str | None, **extra: Any) -> str:
        text = f"user says {self.rng.randint(0, 999)}"
        return self.put(self.rec("user", parent, {"role": "user", "content": text}, **extra))

    def meta(self, parent: str) -> str:
        msg = {"role": "user", "content": [{"type": "text", "text": f"hook {self.n}"}]}
        return self.put(self.rec("user", parent, msg, isMeta=True), late=0.5)

    def response(self, parent: str, mid: str) -> str:
        """An API response of 1-3 blocks (one line each) and its tool results."""
        blocks: list[dict[str, Any]] = [{"type": "text", "text": f"reply {mid}"}]
        if self.rng.random() < 0.3:
            blocks.insert(0, {"type": "thinking", "thinking": f"think {mid}", "signature": "x"})
        tools = []
        for _ in range(self.rng.choice((0, 1, 1, 2))):
            self.tool += 1
            tools.append(f"toolu_{self.tool}")
            blocks.append({"type": "tool_use", "id": tools[-1], "name": "Bash", "input": {}})
        uses: dict[str, str] = {}
        for i, b in enumerate(blocks):
            msg = {"id": mid, "model": "claude-x", "role": "assistant", "content": [b]}
            parent = self.put(self.rec("assistant", parent, msg), late=0.1 if i else 0.0)
            if b["type"] == "tool_use":
                uses[b["id"]] = parent
        for tid in tools:  # the last result goes on the thread; the others hang off their use
            on = tid == tools[-1]
            res = {"type": "tool_result", "tool_use_id": tid, "content": f"out {tid}"}
            msg = {"role": "user", "content": [res]}
            u = self.put(self.rec("user", parent if on else uses[tid], msg), late=0 if on else 0.3)
            parent = u if on else parent
        return parent

    def session(self, turns: int) -> list[dict[str, Any]]:
        tip = self.user(None)
        seen = [tip]
        for t in range(turns):
            r = self.rng.random()
            if r < 0.1:
                tip = self.user(self.rng.choice(seen))  # a rewind
            elif r < 0.2:
                tip = self.meta(tip)  # context on the thread
            elif r < 0.3:
                self.meta(self.rng.choice(seen))  # context hung off an earlier line
            elif r < 0.35:
                tip = self.put(self.rec("progress", tip, data={"type": "hook_progress"}))
            elif r < 0.4:
                self.response(tip, f"msg_retry{t}")  # a retry: the next response has its parent
            elif r < 0.42:
                b = self.put(self.rec("system", None, subtype="compact_boundary"))
                tip = self.user(b, isCompactSummary=True)
            else:
                tip = self.response(tip, f"msg_{t}")
                if self.rng.random() < 0.3:
                    tip = self.user(tip)
            seen.append(tip)
        for _wait, d in self.deferred:
            self.lines.append(d)
        return self.lines


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("seed", range(40))
def test_random_sessions_replay_as_whole_replays_do(seed, server, tmp_path, monkeypatch):
    path = _write(tmp_path, _Writer(seed).session(60))
    got = _read(path, monkeypatch, whole=False, server=server)
    incremental, whole = _counts()
    assert _read(path, monkeypatch, whole=True, server=server) == got
    assert _counts() == (0, incremental + whole)
    assert not any("internal error" in x for x in got)


def test_the_random_sessions_take_both_paths(tmp_path, monkeypatch):
    """The random sessions above go on from live tips and also fall back to whole replays (a
    generator that stopped making either would leave one path untested)."""
    mixes = []
    for seed in range(40):
        _read(_write(tmp_path, _Writer(seed).session(60)), monkeypatch, whole=False)
        mixes.append(_counts())
    assert sum(i for i, _ in mixes) > 1000
    assert sum(w for _, w in mixes) > 100


def _linear(turns: int) -> list[dict[str, Any]]:
    w = _Writer(0, late=False)
    tip = w.user(None)
    for t in range(turns):
        tip = w.response(tip, f"msg_{t}")
    return w.lines


def test_a_linear_session_is_replayed_whole_once(tmp_path, monkeypatch):
    path = _write(tmp_path, _linear(300))
    calls = _read(path, monkeypatch, whole=False)
    assert len(calls) == 300
    assert _counts() == (299, 1)
    (threads,) = _Counted.made
    assert threads.schedule.checks < 40  # the whole-replay checks are spaced out
    assert calls == _read(path, monkeypatch, whole=True)


def _late_lines() -> list[dict[str, Any]]:
    """Two responses; a context line hung off the first prompt is written after the second."""
    w = _Writer(0)
    first = w.user(None)
    tip = w.response(first, "msg_a")
    late = w.rec("user", first, {"role": "user", "content": "a late hook"}, isMeta=True)
    tip = w.response(w.user(tip), "msg_b")
    w.put(late)
    w.response(w.user(tip), "msg_c")
    return w.lines


def test_a_line_written_between_two_calls_into_the_history_makes_a_whole_replay(
    tmp_path, monkeypatch
):
    path = _write(tmp_path, _late_lines())
    items = [c for c in cc.read(str(path), ReadOptions()) if isinstance(c, ChatCall)]
    # after the first prompt, in its message: Claude Code sends user messages in a row as one
    assert items[2].messages[0].text().endswith("\na late hook")
    assert "a late hook" not in items[1].messages[0].text()
    _read(path, monkeypatch, whole=False)
    assert _counts() == (1, 2)


def test_a_wrong_incremental_replay_is_caught_and_ends_the_file(tmp_path, monkeypatch):
    """A replay that went on where it must not (here: ``fits`` always true) is caught by the
    cross-check, and the file ends as the adapter's internal error, never as wrong prompts."""
    path = _write(tmp_path, _late_lines())
    monkeypatch.setattr(_claude_replay.Replay, "fits", lambda self, cut, segment: True)
    with pytest.raises(ReplayMismatch, match=r"s\.jsonl:\d+: the incremental replay"):
        list(cc.read(str(path), ReadOptions()))


def test_a_retry_shares_its_sibling_replay(tmp_path, monkeypatch):
    w = _Writer(0)
    u = w.user(None)
    w.response(u, "msg_a")
    w.response(u, "msg_b")  # the same prompt, answered again
    path = _write(tmp_path, w.lines)
    items = list(cc.read(str(path), ReadOptions()))
    assert all(isinstance(c, ChatCall) for c in items) and len(items) == 2
    assert items[0].messages == items[1].messages
    _read(path, monkeypatch, whole=False)
    assert _counts() == (1, 1)
    assert not any(isinstance(c, Reject) for c in items)


def test_user_messages_in_a_row_are_sent_as_one(tmp_path):
    """Claude Code's ``normalizeMessagesForAPI`` (read in 2.1.112, ``Zn8``/``MNY``/``nCK``, and
    2.1.337) merges user messages in a row into one: contents in order, a string taken as one
    text block, a newline added to the first's last text where the next begins with text, the
    tool results first (here the ``tool`` messages before it). Written out from that code: the
    tool result, a hook's text and the user's next prompt are one message after the result."""
    w = _Writer(0, late=False)
    first = w.user(None)
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
    msg = {"id": "msg_a", "model": "claude-x", "role": "assistant", "content": [use]}
    tip = w.put(w.rec("assistant", first, msg))
    res = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}
    tip = w.put(w.rec("user", tip, {"role": "user", "content": [res]}))
    hook = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x"}]}
    tip = w.put(w.rec("user", tip, hook, isMeta=True))
    tip = w.put(w.rec("user", tip, {"role": "user", "content": "Go on."}))
    w.response(tip, "msg_b")
    path = _write(tmp_path, w.lines)
    last = [c for c in cc.read(str(path), ReadOptions()) if isinstance(c, ChatCall)][-1]
    assert [m.role for m in last.messages] == ["user", "assistant", "tool", "user"]
    assert [p.text for p in last.messages[-1].content] == ["<system-reminder>x\n", "Go on."]
    # llama.cpp's endpoint (server_chat_convert_anthropic_to_oai) puts a turn's own message
    # first, then a tool message per result, whatever the blocks' order
    opts = ReadOptions(server=Server.llama_cpp)
    last = [c for c in cc.read(str(path), opts) if isinstance(c, ChatCall)][-1]
    assert [m.role for m in last.messages] == ["user", "assistant", "user", "tool"]
    assert [p.text for p in last.messages[2].content] == ["<system-reminder>x\n", "Go on."]
    assert last.messages[3].content == "out"


def test_a_blank_text_block_of_a_response_is_not_sent_again(tmp_path):
    """Claude Code merges a response's lines with ``HNY`` (2.1.112): a text block of whitespace
    alone (``"\\n\\n"``, not ``""``) is left out of the merged message, unless only thinking
    would remain. The call's own completion keeps it: the model wrote it."""
    w = _Writer(0, late=False)
    tip = w.user(None)
    for block in ({"type": "text", "text": "\n\n"}, {"type": "text", "text": "Done."}):
        msg = {"id": "msg_a", "model": "claude-x", "role": "assistant", "content": [block]}
        tip = w.put(w.rec("assistant", tip, msg))
    w.response(w.user(tip), "msg_b")
    path = _write(tmp_path, w.lines)
    first, second = [c for c in cc.read(str(path), ReadOptions()) if isinstance(c, ChatCall)]
    assert [p.text for p in first.completion.content] == ["\n\n", "Done."]
    assert second.messages[1].content == "Done."


def test_a_prompt_with_an_attachment_claude_code_sends_is_rejected_naming_it(tmp_path, monkeypatch):
    """Claude Code 2.1.97 on writes ``attachment`` lines on the thread; most it sends to the
    model as context (``normalizeAttachmentForAPI``, read in 2.1.112), which the replay does
    not rebuild yet: each call whose prompt holds one is rejected naming its line, in the
    incremental replay as in a whole one. Those Claude Code sends nothing for are passed over."""
    w = _Writer(0, late=False)

    def attach(parent: str, **att: Any) -> str:
        return w.put(w.rec("attachment", parent, attachment=att))

    tip = w.user(None)
    tip = attach(tip, type="todo", content=[])  # sends nothing
    tip = attach(tip, type="hook_success", hookEvent="PreToolUse", content="ok")  # nothing
    tip = w.response(tip, "msg_a")
    tip = w.user(tip)
    sent = attach(tip, type="date_change", newDate="2026-12-07")
    no = 1 + next(i for i, r in enumerate(w.lines) if r["uuid"] == sent)
    tip = w.response(sent, "msg_b")
    w.response(w.user(tip), "msg_c")
    path = _write(tmp_path, w.lines)
    items = list(cc.read(str(path), ReadOptions()))
    assert isinstance(items[0], ChatCall)
    why = [i.reason for i in items[1:] if isinstance(i, Reject)]
    assert len(why) == 2 and all(f"line {no} is an attachment ('date_change')" in r for r in why)
    assert _read(path, monkeypatch, whole=False) == _read(path, monkeypatch, whole=True)
    # a line that carries its rendered text sends it, whatever its type
    w.lines[1]["rendered"] = [{"content": "<system-reminder>\nx\n</system-reminder>"}]
    items = list(cc.read(str(_write(tmp_path, w.lines)), ReadOptions()))
    assert "line 2 is an attachment ('todo')" in items[0].reason
