"""``pi``: Pi coding-agent sessions (``~/.pi/agent/sessions/--<cwd>--/<time>_<id>.jsonl``).

Learnt from badlogic/pi-mono (``packages/coding-agent/src/core/session-manager.ts`` and
``messages.ts``). The first line is the header ``{type: "session", version, id, timestamp,
cwd}``; every other line is an entry ``{type, id, parentId, timestamp, ...}``, and the entries
form a tree: going back to an earlier message and going on from there adds a child to it, so a
file holds every fork of the conversation. Entry types that reach the model
(``buildSessionContext``): ``message`` (an ``AgentMessage``), ``custom_message`` (a user
message), ``branch_summary`` and ``compaction`` (``summary``, ``firstKeptEntryId``); the others
(``model_change``, ``thinking_level_change``, ``label``, ``custom``, ``session_info``) do not.

Calls. Every assistant message is one call; its prompt is the context Pi builds for the path from
the root to the entry before it: with a compaction on the path, the summary, then the entries
from ``firstKeptEntryId`` up to the compaction, then the entries after it; else every entry of
the path. Messages become chat as ``convertToLlm`` makes them: ``user`` and ``toolResult``
(a ``tool`` message named by ``toolCallId``) as they are, ``bashExecution`` as Pi's ``Ran `cmd```
text (left out when ``excludeFromContext``), ``custom`` messages, branch and compaction summaries
as user messages with Pi's prefixes. An assistant's ``text`` blocks are its content,
``thinking`` blocks its reasoning, ``toolCall`` blocks (``id``, ``name``, ``arguments``) its tool
calls; its ``model`` is the call's model.

Pi's ``transformMessages`` (``packages/ai/src/providers/transform-messages.ts``) then changes
what is sent, and so the prompt: an assistant message whose ``stopReason`` is ``error`` or
``aborted`` is left out (its tool calls with it), and a tool call that no result answers before
the next assistant or user message gets Pi's synthetic result, ``No result provided`` (an error
result named by the call's id and tool). Such a reply is never a completion either: its call is
a reject saying it was cut off. (The same file's other changes, thinking blocks of another model
sent as text and tool-call ids shortened for another provider, are left out: they depend on the
provider the call went to, which a prompt in chat form does not hold.)

Versions. A file is read as Pi's loader reads it: the first entry must be the ``session`` header
(else nothing of the file is read: one reject), and an older file is migrated as
``migrateToCurrentVersion`` does. A v1 file (no ``version``) has no ids: each entry is chained to
the one before it, with the id ``L<line>`` (Pi draws random ones), and a compaction's
``firstKeptEntryIndex`` (counting the file's entries, the header being 0) becomes
``firstKeptEntryId``; before v3 the message role ``hookMessage`` is ``custom``.

The tree is the trie's: the forks of a session branch where they leave each other. A call whose
path does not continue the previous call's is hinted ``retry`` (the user went back and went on
differently), the first call after a compaction ``compaction``. Pi does not store its system
prompt or tool schemas: ``--system-prompt`` and ``--tools`` give them. One file is one group (the
session id).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    BlockNames,
    as_dict,
    assistant_blocks,
    assistant_turn,
    chat_tool_call,
    cut_reason,
    dicts,
    expect,
    make_call,
    type_name,
)
from treeprep.formats._read import head_json_objects, records
from treeprep.formats._sniff import first_record
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "pi"
COMPACTION_PREFIX = (
    "The conversation history before this point was compacted into the following summary:"
    "\n\n<summary>\n"
)
COMPACTION_SUFFIX = "\n</summary>"
BRANCH_PREFIX = (
    "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
)
BRANCH_SUFFIX = "</summary>"
#: the text of the result Pi sends for a tool call that no result answers
NO_RESULT = "No result provided"
#: stop reasons of a reply Pi does not send again (and that is no completion)
CUT_OFF = ("error", "aborted")
#: the session version Pi migrates older files to (``CURRENT_SESSION_VERSION``)
CURRENT_VERSION = 3


def sniff(path: str, head: bytes) -> bool:
    recs = head_json_objects(head)
    rec = recs[0] if recs else first_record(path, head)
    return (
        isinstance(rec, dict)
        and rec.get("type") == "session"
        and isinstance(rec.get("id"), str)
        and "cwd" in rec
    )


# --------------------------------------------------------------------------------------------
# entries -> chat messages (convertToLlm)
# --------------------------------------------------------------------------------------------


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Content as chat parts (a string is one text part; images stay image parts)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [
        {"type": "text", "text": expect(p.get("text"), f"{where}[{i}].text", str)}
        if p.get("type") == "text"
        else p
        for i, p in enumerate(dicts(content, where))
    ]


#: an assistant's content blocks (``AssistantMessage.content``), read strictly: a block's text
#: must be a string, and a block of another type is a reject
_BLOCK_NAMES = BlockNames(
    text="text", thinking="thinking", thinking_field="thinking", tool_call="toolCall"
)


def _tool_call(b: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``toolCall`` block (``id``, ``name``, ``arguments``) in chat form."""
    args = expect(b.get("arguments", {}), f"{where}.arguments", dict, str, what="an object")
    name = expect(b.get("name"), f"{where}.name", str)
    return chat_tool_call(expect(b.get("id"), f"{where}.id", str), name, args)


def _assistant(m: dict[str, Any], where: str) -> dict[str, Any]:
    blocks = enumerate(dicts(m.get("content"), f"{where}.content"))
    text, thinking, calls = assistant_blocks(blocks, f"{where}.content", _BLOCK_NAMES, _tool_call)
    return assistant_turn("".join(text), thinking, calls)


def _bash_text(m: dict[str, Any]) -> str:
    """Pi's ``bashExecutionToText``."""
    text = f"Ran `{m.get('command', '')}`\n"
    text += f"```\n{m['output']}\n```" if m.get("output") else "(no output)"
    code = m.get("exitCode")
    if m.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif isinstance(code, int) and code != 0:
        text += f"\n\nCommand exited with code {code}"
    if m.get("truncated") and m.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {m['fullOutputPath']}]"
    return text


def _tool_result(tid: str, name: Any, parts: list[dict[str, Any]]) -> dict[str, Any]:
    out = {"role": "tool", "tool_call_id": tid, "content": parts}
    return {**out, "name": name} if isinstance(name, str) else out


def _message(m: dict[str, Any], where: str) -> dict[str, Any] | None:
    """One AgentMessage as a chat message (None: not sent to the model)."""
    role = m.get("role")
    if role == "assistant":
        return _assistant(m, where)
    if role == "toolResult":
        tid = expect(m.get("toolCallId"), f"{where}.toolCallId", str)
        return _tool_result(tid, m.get("toolName"), _parts(m.get("content"), where))
    if role in ("user", "custom"):
        return {"role": "user", "content": _parts(m.get("content"), f"{where}.content")}
    if role == "bashExecution":
        return None if m.get("excludeFromContext") else {"role": "user", "content": _bash_text(m)}
    if role == "branchSummary":
        return {"role": "user", "content": BRANCH_PREFIX + str(m.get("summary")) + BRANCH_SUFFIX}
    if role == "compactionSummary":
        return {"role": "user", "content": COMPACTION_PREFIX + str(m.get("summary"))
                + COMPACTION_SUFFIX}  # fmt: skip
    raise RecordError(f"{where}.role: unknown message role {role!r}")


def _entry_message(e: dict[str, Any], where: str) -> dict[str, Any] | None:
    kind = e.get("type")
    if kind == "message":
        return _message(as_dict(e.get("message"), f"{where}.message"), f"{where}.message")
    if kind == "custom_message":
        return {"role": "user", "content": _parts(e.get("content"), f"{where}.content")}
    if kind == "branch_summary" and e.get("summary"):
        return {"role": "user", "content": BRANCH_PREFIX + str(e["summary"]) + BRANCH_SUFFIX}
    return None


def _cut_off(e: dict[str, Any]) -> str | None:
    """The stop reason of an assistant message Pi does not send again (else None)."""
    m = e.get("message")
    if e.get("type") != "message" or not isinstance(m, dict) or m.get("role") != "assistant":
        return None
    return m.get("stopReason") if m.get("stopReason") in CUT_OFF else None


class _Sent:
    """Pi's ``transformMessages`` on chat messages, one at a time (each with whether it is a
    cut-off reply): cut-off replies left out; tool calls that no result answered before the next
    assistant or user message answered with :data:`NO_RESULT`. Calls still pending at the end
    stay so: nothing is done at the end, so the state after a path's messages goes on with the
    messages of a longer path."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []  # the last sent reply's tool calls
        self.answered: set[Any] = set()

    def add(self, m: dict[str, Any], cut: bool) -> None:
        out = self.out
        role = m.get("role")
        if role in ("assistant", "user"):
            for tc in self.pending:
                if tc.get("id") not in self.answered:
                    name = tc.get("function", {}).get("name")
                    out.append(_tool_result(tc["id"], name, [{"type": "text", "text": NO_RESULT}]))
            self.pending, self.answered = [], set()
            if cut:
                return
            self.pending = list(m.get("tool_calls") or []) if role == "assistant" else []
        elif role == "tool":
            self.answered.add(m.get("tool_call_id"))
        out.append(m)


# --------------------------------------------------------------------------------------------
# the tree -> calls
# --------------------------------------------------------------------------------------------


#: paths :meth:`_Session.path_to` keeps (each as long as the session: a few, not one per call)
_PATHS_KEPT = 4


class _Session:
    def __init__(self, path: str, opts: ReadOptions) -> None:
        self.path, self.opts = path, opts
        self.sid = path
        self.entries: dict[str, tuple[int, dict[str, Any]]] = {}  # id -> (line, entry)
        self.last_path: list[str] = []  # the previous call's path
        # each entry's chat message, converted once: every call's context is its whole path,
        # and converting it again per call made a session's read quadratic in its text
        self.converted: dict[str, dict[str, Any] | None] = {}
        #: the paths last asked for, by their last entry (:meth:`path_to`)
        self.paths: dict[str, list[str]] = {}
        #: the last path without a compaction and what Pi sends for it (:meth:`context`)
        self.sent: tuple[list[str], _Sent] | None = None

    def add(self, eid: str, line: int, rec: dict[str, Any]) -> None:
        """Read entry ``eid``; a repeated id replaces the earlier entry (and what was derived
        from the entries is derived again)."""
        if eid in self.entries:
            self.converted.pop(eid, None)
            self.paths.clear()
            self.sent = None
        self.entries[eid] = (line, rec)

    def path_to(self, eid: str | None) -> list[str]:
        """Entry ids from the root to ``eid``; RecordError on a dangling or cyclic parent.

        The walk stops at an entry whose path is one of the last few asked for (the previous
        call's parent, in a session that goes on), so a call walks what it adds."""
        out: list[str] = []
        seen: set[str] = set()
        base: list[str] = []
        asked = eid
        while eid is not None:
            known = self.paths.get(eid)
            if known is not None:
                base = known
                break
            if eid in seen or eid not in self.entries:
                raise RecordError(f"parentId {eid!r} names no earlier entry of the session")
            seen.add(eid)
            out.append(eid)
            parent = self.entries[eid][1].get("parentId")
            eid = parent if isinstance(parent, str) else None
        path = base + out[::-1]
        if asked is not None:
            self.paths[asked] = path
            while len(self.paths) > _PATHS_KEPT:
                del self.paths[next(iter(self.paths))]
        return list(path)

    def context(self, ids: list[str]) -> tuple[list[dict[str, Any]], bool]:
        """The chat messages Pi sends for a path (and whether a compaction is on it).

        A path that goes on from the last one without a compaction goes on from its state."""
        if self.sent is not None:
            last, sent = self.sent
            k = len(last)
            if k <= len(ids) and ids[k - 1] == last[-1] and ids[:k] == last:
                if all(self._type(e) != "compaction" for e in ids[k:]):
                    self.sent = None  # until the state is whole again
                    for eid in ids[k:]:
                        self._send(sent, eid)
                    self.sent = (ids, sent)
                    return list(sent.out), False
        comp = max((i for i, e in enumerate(ids) if self._type(e) == "compaction"), default=-1)
        if comp < 0:
            kept = ids
        else:
            entry = self.entries[ids[comp]][1]
            first = entry.get("firstKeptEntryId")
            start = ids.index(first) if first in ids[:comp] else comp
            kept = ids[start:comp] + ids[comp + 1 :]
        sent = _Sent()
        if comp >= 0:
            summary = str(self.entries[ids[comp]][1].get("summary"))
            text = COMPACTION_PREFIX + summary + COMPACTION_SUFFIX
            sent.add({"role": "user", "content": text}, False)
        for eid in kept:
            self._send(sent, eid)
        if comp < 0 and ids:
            self.sent = (ids, sent)
        return list(sent.out), comp >= 0

    def _send(self, sent: _Sent, eid: str) -> None:
        """Entry ``eid``'s chat message into ``sent`` (none for an entry that is no message)."""
        line, e = self.entries[eid]
        if _cut_off(e) is not None:  # left out unread: a partial reply may not parse
            sent.add({"role": "assistant"}, True)
            return
        if eid in self.converted:
            m = self.converted[eid]
        else:
            m = self.converted[eid] = _entry_message(e, f"line {line}")
        if m is not None:
            sent.add(m, False)

    def _type(self, eid: str) -> Any:
        return self.entries[eid][1].get("type")

    def call(self, line: int, e: dict[str, Any]) -> Item:
        eid = e["id"]
        cut = _cut_off(e)
        if cut is not None:
            why = f"stopReason {cut!r}: the reply was cut off, so it is no completion"
            reason = f"{why} (Pi drops it from the context it sends)"
            return Reject(file=self.path, line=line, format=NAME, reason=reason,
                          call_id=f"{self.sid}/{eid}")  # fmt: skip
        msg = e.get("message")
        if limit := cut_reason(msg.get("stopReason") if isinstance(msg, dict) else None,
                               "message.stopReason"):  # fmt: skip
            # the token limit cut it: Pi sends it again, but it is no completion
            return Reject(file=self.path, line=line, format=NAME, reason=limit,
                          call_id=f"{self.sid}/{eid}")  # fmt: skip
        ids = self.path_to(e.get("parentId") if isinstance(e.get("parentId"), str) else None)
        prompt, compacted = self.context(ids)
        if self.opts.system_prompt:
            prompt.insert(0, {"role": "system", "content": self.opts.system_prompt})
        message = as_dict(e.get("message"), "message")
        hint = None
        new_compaction = compacted and self._last_compaction(ids) not in self.last_path
        if new_compaction:
            hint = "compaction"  # the context was replaced by its summary
        elif self.last_path and ids[: len(self.last_path)] != self.last_path:
            hint = "retry"  # the user went back and went on differently
        self.last_path = [*ids, eid]
        prev = next((i for i in reversed(ids) if self._is_call(i)), None)
        stamp = e.get("timestamp")
        return make_call(
            {"group_id": self.sid, "call_id": f"{self.sid}/{eid}",
             "parent_call_id": f"{self.sid}/{prev}" if prev else None,
             "model": message.get("model") if isinstance(message.get("model"), str) else None,
             "messages": prompt, "completion": _assistant(message, "message"),
             "tools": self.opts.tools, "branch_reason": hint,
             "timestamp": stamp if isinstance(stamp, str) else None,
             "provenance": {"exact_messages": False, "reconstructed": True},
             "arguments_json": "javascript",  # pi-ai's JSON.stringify(tc.arguments)
             "source_file": self.path, "source_line": line, "source_format": NAME},
            file=self.path, line=line, fmt=NAME,
        )  # fmt: skip

    def _last_compaction(self, ids: list[str]) -> str | None:
        return next((i for i in reversed(ids) if self._type(i) == "compaction"), None)

    def _is_call(self, eid: str) -> bool:
        e = self.entries[eid][1]
        m = e.get("message")
        reply = e.get("type") == "message" and isinstance(m, dict) and m.get("role") == "assistant"
        return reply and _cut_off(e) is None


class _Migration:
    """Pi's ``migrateToCurrentVersion`` for one file, entry by entry (the header is entry 0)."""

    def __init__(self, header: dict[str, Any]) -> None:
        v = header.get("version")
        # Pi reads an absent version as 1; a version that is no number migrates nothing here
        number = isinstance(v, int | float) and not isinstance(v, bool)
        self.version: float = 1 if v is None else v if number else CURRENT_VERSION
        self.ids: dict[int, str] = {}  # v1: entry index -> the id it was given
        self.index = 0
        self.prev: str | None = None

    def entry(self, line: int, rec: dict[str, Any]) -> None:
        """Bring one entry (not a header) to the current version, in place, as Pi does."""
        if self.version < 2:  # migrateV1ToV2: ids, the parent chain, the compaction's index
            rec["id"], rec["parentId"] = f"L{line}", self.prev
            self.prev = self.ids[self.index] = rec["id"]
            if rec.get("type") == "compaction" and "firstKeptEntryIndex" in rec:
                k = rec.pop("firstKeptEntryIndex")
                if isinstance(k, int | float) and not isinstance(k, bool) and k in self.ids:
                    rec["firstKeptEntryId"] = self.ids[int(k)]
        m = rec.get("message")
        if self.version < 3 and rec.get("type") == "message" and isinstance(m, dict):
            if m.get("role") == "hookMessage":  # migrateV2ToV3
                rec["message"] = {**m, "role": "custom"}


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    s = _Session(path, opts)
    migration: _Migration | None = None
    for line, rec in records(path, NAME):
        if isinstance(rec, Reject):
            yield rec
            continue
        if migration is None:  # Pi's loader reads nothing of a file that opens otherwise
            if not (isinstance(rec, dict) and rec.get("type") == "session"
                    and isinstance(rec.get("id"), str)):  # fmt: skip
                got = f"type {rec.get('type')!r}" if isinstance(rec, dict) else type_name(rec)
                raise InputError(path, line, "expected Pi's session header (type 'session', a "
                                 f"string id) as the first entry, got {got}")  # fmt: skip
            migration, s.sid = _Migration(rec), rec["id"]
            continue
        migration.index += 1  # Pi counts every parsed line, the ones it cannot use too
        if not isinstance(rec, dict):
            reason = f"expected a JSON object per line, got {type_name(rec)}"
            yield Reject(file=path, line=line, format=NAME, reason=reason)
            continue
        if rec.get("type") == "session":
            continue
        migration.entry(line, rec)
        eid = rec.get("id")
        if not isinstance(eid, str) or not eid:
            yield Reject(file=path, line=line, format=NAME, reason="id: expected a string")
            continue
        s.add(eid, line, rec)
        message = rec.get("message")
        if rec.get("type") != "message" or not isinstance(message, dict):
            continue
        if message.get("role") != "assistant":
            continue
        try:
            yield s.call(line, rec)
        except RecordError as e:
            yield Reject(file=path, line=line, format=NAME, reason=str(e), call_id=f"{s.sid}/{eid}")


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=24)
__all__ = ["FORMAT", "NAME"]
