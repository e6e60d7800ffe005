"""``crush``: Crush's per-project SQLite store (``.crush/crush.db``).

Learnt from charmbracelet/crush at 37f36e9 (2026-08-21): the goose migrations under
``internal/db/migrations/`` (tables ``sessions``: ``id``, ``parent_session_id``,
``summary_message_id``, ...; ``messages``: ``id``, ``session_id``, ``role``, ``parts``,
``model``, ``provider``, ``created_at``, ``finished_at``, ``is_summary_message``), the typed parts
of ``internal/message/content.go`` and ``message.go`` (``parts`` is a JSON array of ``{type,
data}``: ``text`` {text}, ``reasoning`` {thinking, signature}, ``tool_call`` {id, name, input:
the arguments as a JSON string, finished}, ``tool_result`` {tool_call_id, name, content, data,
mime_type, is_error}, ``finish`` {reason, ...}, ``binary`` {Path, MIMEType, Data},
``image_url``, ``shell_command`` {command, output, exit_code}), and ``internal/agent/agent.go``
(``preparePrompt``, ``getSessionMessages``, ``ToAIMessage``), which says what is sent.

Messages of a session are listed by ``created_at`` (seconds: ties keep insertion order, the
rowid). Crush writes one assistant message per LLM step and one ``tool`` message with the
step's results, so a call is one assistant message: its completion the message's reasoning, text
and tool calls, its prompt what ``preparePrompt`` makes of the messages before it: a main
session's prompts open with Crush's todo reminder (a user message; sub-agents get none); user
messages are their trimmed text with text attachments and shell commands appended, other
attachments as file parts; assistant messages with nothing in them are left out; tool results
without their call are dropped, calls without a result get Crush's "interrupted" result. Once a
summary was written (``is_summary_message``), later prompts start at it, sent as a user
message, and the first call after it is hinted ``compaction``. The summary call itself, whose
prompt is Crush's summary template, is rejected, as is a step that did not finish (no ``finish``
part, or ``canceled``/``error``/``content_filter``). Each message is converted once as the
session goes on (:class:`_Context`), so a build grows with the session's unique text.

Sub-agents: a session with a ``parent_session_id`` (the agent tool's, named
``<message id>$$<tool call id>``) joins its root session's tree, its first call hinted
``sub-agent`` and linked to the parent's call. Crush stores neither its system prompt nor its
tool schemas: ``--system-prompt`` and ``--tools`` give them. The prompts are rebuilt from the
store (``reconstructed``), not kept as sent. Records are named by the message's ``rowid``.
"""

from __future__ import annotations

import base64
import binascii
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson

from treeprep.errors import RecordError
from treeprep.formats._fields import (
    as_dict,
    assistant_turn,
    chat_tool_call,
    dicts,
    expect,
    make_call,
    opt_str,
    system_message,
)
from treeprep.formats._sqlite import has_tables, root_of, sidecar_of, snapshot
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "crush"
SCHEMA = {
    "sessions": {"id", "parent_session_id", "summary_message_id"},
    "messages": {"id", "session_id", "role", "parts", "model", "created_at"},
}
#: the user message ``preparePrompt`` puts first in a main session's prompts
TODO_REMINDER = (
    "<system_reminder>This is a reminder that your todo list is currently empty. DO NOT "
    "mention this to the user explicitly because they are already aware.\nIf you are working "
    'on tasks that would benefit from a todo list please use the "todos" tool to create one.\n'
    "If not, please feel free to ignore. Again do not mention this message to the user."
    "</system_reminder>"
)
INTERRUPTED = (
    "tool call was interrupted and did not produce a result, you may retry this call if the "
    "result is still needed"
)
ATTACHED = (
    "\n<system_info>The files below have been attached by the user, consider them in your "
    "response</system_info>\n"
)
#: finish reasons of a step whose reply is whole (``max_tokens`` is not: the limit cut it, see
#: :data:`~treeprep.formats._fields.CUT_REASONS`)
_FINISHED = ("end_turn", "tool_use")


def sniff(path: str, head: bytes) -> bool:
    return has_tables(path, head, SCHEMA)


def companion(path: str) -> bool:
    return sidecar_of(path, sniff)


class _Msg:
    """One row of ``messages``: its parts grouped by type."""

    def __init__(self, rowid: int, mid: str, role: str, raw: Any, model: Any, summary: bool):
        self.rowid, self.id, self.role, self.summary = rowid, mid, role, summary
        self.model = model if isinstance(model, str) and model else None
        where = f"message {mid}"
        try:
            parts = orjson.loads(raw)
        except (orjson.JSONDecodeError, TypeError) as e:
            raise RecordError(f"{where}.parts: not JSON ({e})") from e
        self.parts: list[tuple[str, dict[str, Any]]] = []
        for i, p in enumerate(dicts(parts, f"{where}.parts")):
            kind = expect(p.get("type"), f"{where}.parts[{i}].type", str)
            self.parts.append((kind, as_dict(p.get("data"), f"{where}.parts[{i}].data")))
        self.where = where

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.parts if k == kind]

    def text(self) -> str:
        texts = self.of("text")
        return str(texts[0].get("text") or "") if texts else ""

    def finish(self) -> str | None:
        done = self.of("finish")
        return str(done[0].get("reason")) if done else None

    def calls(self) -> list[dict[str, Any]]:
        out = []
        for c in self.of("tool_call"):
            cid = expect(c.get("id"), f"{self.where} tool_call.id", str)
            name = expect(c.get("name"), f"{self.where} tool_call.name", str)
            out.append(chat_tool_call(cid, name, expect(c.get("input"), f"{cid}.input", str)))
        return out

    def thinking(self) -> list[str]:
        found = self.of("reasoning")
        text = str(found[0].get("thinking") or "") if found else ""
        return [text] if text else []


def _user(m: _Msg) -> dict[str, Any] | None:
    """A user message as ``ToAIMessage`` sends it (None when it has nothing)."""
    text = m.text().strip()
    files: list[dict[str, Any]] = []
    attached: list[tuple[str, str]] = []
    for b in m.of("binary"):
        mime = expect(b.get("MIMEType"), f"{m.where} binary.MIMEType", str)
        path = opt_str(b.get("Path"), f"{m.where} binary.Path") or ""
        if mime.startswith("text/"):
            attached.append((path, _decoded(b.get("Data"), m.where)))
        else:
            files.append({"type": "file", "mime": mime, "filename": path or None})
    if attached:
        text += ATTACHED
        for path, body in attached:
            text += (f"<file path='{path}'>\n" if path else "<file>\n") + f"\n{body}\n</file>\n"
    for sc in m.of("shell_command"):
        shell = f"$ {sc.get('command')}\n{sc.get('output')}\n(exit code {sc.get('exit_code')})"
        text = f"{text}\n\n{shell}" if text else shell
    if not text and not files:
        return None
    if not files:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [*([{"type": "text", "text": text}] if text else []), *files],
    }


def _decoded(data: Any, where: str) -> str:
    raw = expect(data, f"{where} binary.Data", str)
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as e:
        raise RecordError(f"{where} binary.Data: not base64 of UTF-8 text ({e})") from e


def _results(m: _Msg, known: set[str]) -> list[dict[str, Any]]:
    out = []
    for r in m.of("tool_result"):
        cid = expect(r.get("tool_call_id"), f"{m.where} tool_result.tool_call_id", str)
        if cid not in known:
            continue  # an orphaned result: preparePrompt drops it
        if r.get("data"):
            raise RecordError(f"{m.where}: a media tool result (Crush sends it as a file part)")
        content = expect(r.get("content"), f"{m.where} tool_result.content", str)
        out.append({"role": "tool", "tool_call_id": cid, "name": r.get("name"), "content": content})
    return out


class _Context:
    """``preparePrompt`` over a session's messages as they come, each message converted once.

    Two sets over the whole history decide a message's conversion: a tool result is sent only when
    some assistant message made its call, and a call that no result answers gets Crush's
    ``INTERRUPTED`` result. Within one history both sets only grow, so a converted message can
    change only when an id it waits for arrives; the history is then converted again from the
    earliest such message (seldom: a step and its results come in between the same two calls,
    and are converted together). A finished summary starts the history anew, at the summary
    (``compacted`` until a call takes it).
    """

    def __init__(self, sub_agent: bool) -> None:
        self.head = [] if sub_agent else [{"role": "user", "content": TODO_REMINDER}]
        self.compacted = False
        self._reset([])

    def _reset(self, msgs: list[_Msg]) -> None:
        self.msgs = msgs
        self.out: list[dict[str, Any]] = list(self.head)
        self.starts: list[int] = []  # where msgs[i]'s messages start in out, for the converted
        self.calls: set[str] = set()  # the call ids made in the history
        self.answered: set[str] = set()  # the call ids that a result answers
        self.seen = 0  # msgs[:seen] are counted in calls and answered
        self.wait_call: dict[str, int] = {}  # an orphaned result's id -> its least message
        self.wait_answer: dict[str, int] = {}  # an unanswered call's id -> its least message

    def add(self, m: _Msg) -> None:
        if m.summary and m.finish():
            self._reset([m])
            self.compacted = True
        else:
            self.msgs.append(m)

    def prompt(self) -> list[dict[str, Any]]:
        """The messages ``preparePrompt`` makes of the history (a new list each call)."""
        new = self.msgs[self.seen :]
        made = [c["id"] for m in new if m.role == "assistant" for c in m.calls()]
        got = [
            str(r.get("tool_call_id")) for m in new if m.role == "tool" for r in m.of("tool_result")
        ]
        redo = min(
            [len(self.starts)]
            + [self.wait_call[c] for c in made if c in self.wait_call]
            + [self.wait_answer[c] for c in got if c in self.wait_answer]
        )
        self.calls.update(made)
        self.answered.update(got)
        self.seen = len(self.msgs)
        if redo < len(self.starts):
            del self.out[self.starts[redo] :], self.starts[redo:]
            self.wait_call = {c: i for c, i in self.wait_call.items() if i < redo}
            self.wait_answer = {c: i for c, i in self.wait_answer.items() if i < redo}
        for i in range(len(self.starts), len(self.msgs)):
            self.starts.append(len(self.out))
            self.out.extend(self._convert(i))
        return list(self.out)

    def _convert(self, i: int) -> list[dict[str, Any]]:
        m = self.msgs[i]
        if not m.parts:
            return []
        if i == 0 and m.summary:
            return [{"role": "user", "content": m.text().strip()}]
        if m.role == "user":
            user = _user(m)
            return [user] if user else []
        if m.role == "tool":
            out = _results(m, self.calls)
            for r in m.of("tool_result"):
                cid = r.get("tool_call_id")
                if isinstance(cid, str) and cid not in self.calls:
                    self.wait_call.setdefault(cid, i)
            return out
        if m.role != "assistant":
            return []
        made = m.calls()
        if not made and not m.text() and not m.thinking():
            return []
        out = [assistant_turn(m.text().strip(), m.thinking(), made)]
        for c in made:
            if c["id"] not in self.answered:
                self.wait_answer.setdefault(c["id"], i)
                out.append({"role": "tool", "tool_call_id": c["id"],
                            "name": c["function"]["name"], "content": INTERRUPTED})  # fmt: skip
        return out


def _why_not(m: _Msg) -> str | None:
    """Why an assistant message is no call to train on, or None."""
    if m.summary:
        return "a summary call: its prompt is Crush's summary template, which the store lacks"
    reason = m.finish()
    if reason is None:
        return "the step has no finish part: the call was cut"
    if reason not in _FINISHED:
        return f"the step finished with {reason!r}: its reply is not whole"
    if not m.calls() and not m.text() and not m.thinking():
        return "the step wrote nothing"
    return None


def _session(
    path: str, sid: str, rows: list[Any], group: str, parent: str | None, opts: ReadOptions
) -> Iterator[Item]:
    ctx = _Context(sub_agent=parent is not None)
    system = system_message(opts.system_prompt)
    broken: str | None = None
    first = True
    for rowid, mid, role, raw, model, summary in rows:
        cid = f"{sid}/{mid}"
        try:
            m = _Msg(int(rowid), str(mid), str(role), raw, model, bool(summary))
            why = _why_not(m) if role == "assistant" else None
            if role == "assistant" and why is None and broken is None:
                prompt = [*system, *ctx.prompt()]
                turn = assistant_turn(m.text(), m.thinking(), m.calls())
        except RecordError as e:
            if broken is None:
                broken = f"{e} (the prompts after it would miss it)"
                yield Reject(file=path, line=int(rowid), format=NAME, reason=str(e))
            continue
        ctx.add(m)
        if role != "assistant":
            continue
        if why is not None or broken is not None:
            reason = why or broken or ""
            yield Reject(file=path, line=m.rowid, format=NAME, call_id=cid, reason=reason)
            continue
        link = parent and sid.split("$$")[0]
        hint = "compaction" if ctx.compacted else None  # the first call that starts at a summary
        yield make_call(
            {"group_id": group, "call_id": cid, "agent_id": sid if parent else "main",
             "parent_call_id": f"{parent}/{link}" if first and link and "$$" in sid else None,
             "model": m.model, "messages": prompt, "completion": turn, "tools": opts.tools,
             "branch_reason": "sub-agent" if first and parent else hint,
             "provenance": {"exact_messages": False, "reconstructed": True},
             "source_file": path, "source_line": m.rowid, "source_format": NAME},
            file=path, line=m.rowid, fmt=NAME,
        )  # fmt: skip
        first = ctx.compacted = False


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    sessions, messages = snapshot(
        path,
        [
            ("SELECT id, parent_session_id FROM sessions ORDER BY created_at, rowid", ()),
            (
                "SELECT session_id, rowid, id, role, parts, model, "
                f"{'is_summary_message' if _has_summary_flag(path) else '0'} "
                "FROM messages ORDER BY session_id, created_at, rowid",
                (),
            ),
        ],
    )
    parents: dict[str, str | None] = {str(s): p or None for s, p in sessions}
    by_session: dict[str, list[Any]] = defaultdict(list)
    for sid, *row in messages:
        by_session[str(sid)].append(row)
    for sid in [*parents, *(s for s in by_session if s not in parents)]:
        group = root_of(parents, sid)
        yield from _session(path, sid, by_session.get(sid, []), group, parents.get(sid), opts)


def _has_summary_flag(path: str) -> bool:
    from treeprep.formats._sqlite import schema

    found = schema(path) or {}
    return "is_summary_message" in found.get("messages", frozenset())


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=20, companion=companion)
__all__ = ["FORMAT", "NAME", "SCHEMA"]
