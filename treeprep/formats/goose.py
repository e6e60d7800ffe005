"""``goose``: Goose's SQLite session store (``~/.local/share/goose/sessions/sessions.db``).

Learnt from block/goose: ``crates/goose/src/session/session_manager.rs`` (the ``sessions`` and
``messages`` tables: ``messages`` holds ``id`` (autoincrement), ``session_id``, ``role``,
``content_json``, ``created_timestamp``, ``metadata_json``), ``session/migrations.rs`` (schema
versions 1-13: ``message_id``, ``provider_name``, ``model_config_json``, ...) and
``conversation/message/`` (``mod.rs``, ``content_types.rs``, ``tool_types.rs``,
``tool_result_serde.rs``): ``content_json`` is a message's content list, each ``{type: ...}``:
``text`` {text}, ``image``, ``toolRequest`` {id, toolCall: {status: success, value: {name,
arguments}} or {status: error, error}}, ``toolResponse`` {id, toolResult: {status: success,
value: {content: [...], isError}} (older: value is the content list) or {status: error, error}},
``thinking`` {thinking}, ``redactedThinking``, and kinds no model sees
(``systemNotification``, ``actionRequired``, ``toolConfirmationRequest``,
``frontendToolRequest``). ``metadata_json`` says whether the agent sees a message
(``agentVisible``) and which model answered (``inference.resolvedModel``/``requestedModel``).

A call is one assistant reply: a run of assistant rows (a reply streamed into several rows is one
reply), its completion their thinking, text and tool requests; its prompt the agent-visible
messages before it, in chat form: tool responses become ``tool`` messages (the text of their
content joined by newlines; an error result as ``Error: <text>``), the rest of a user row a user
message. Compaction hides the old messages from the agent (``agentVisible: false``) and adds a
summary only the agent sees (``userVisible: false``); a hidden message was seen by the calls
before the next agent-only message after it, and is left out of the prompts after that one (the
call after it is hinted ``compaction``). Goose keeps neither its system prompt nor its tool
schemas (``--system-prompt``, ``--tools``). Sub-agent sessions (``session_type`` ``sub_agent``)
name no parent in the store: each is its own tree. Records are named by the message row's
``id``; prompts are rebuilt (``reconstructed``), not kept as sent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson

from treeprep.errors import RecordError
from treeprep.formats._fields import (
    BlockNames,
    as_dict,
    assistant_blocks,
    assistant_turn,
    chat_tool_call,
    dicts,
    expect,
    make_call,
    system_message,
)
from treeprep.formats._sqlite import has_tables, schema, sidecar_of, snapshot
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "goose"
SCHEMA = {
    "sessions": {"id", "working_dir"},
    "messages": {"id", "session_id", "role", "content_json", "created_timestamp"},
}
#: content kinds that are never sent to the model
_UNSENT = {
    "systemNotification", "actionRequired", "toolConfirmationRequest", "frontendToolRequest",
    "redactedThinking",
}  # fmt: skip


def sniff(path: str, head: bytes) -> bool:
    return has_tables(path, head, SCHEMA)


def companion(path: str) -> bool:
    return sidecar_of(path, sniff)


class _Row:
    """One row of ``messages``, its content read."""

    def __init__(self, rowid: int, role: str, content: Any, meta: Any):
        self.rowid, self.role = rowid, role
        where = f"message {rowid}"
        try:
            items = orjson.loads(content)
            meta = orjson.loads(meta) if meta else {}
        except (orjson.JSONDecodeError, TypeError) as e:
            raise RecordError(f"{where}: content_json or metadata_json is not JSON ({e})") from e
        self.items = [(str(c.get("type")), c) for c in dicts(items, f"{where}.content_json")]
        meta = as_dict(meta, f"{where}.metadata_json")
        self.agent_visible = meta.get("agentVisible", True) is not False
        self.agent_only = meta.get("userVisible", True) is False and self.agent_visible
        inference = meta.get("inference") if isinstance(meta.get("inference"), dict) else {}
        model = inference.get("resolvedModel") or inference.get("requestedModel")
        self.model = model if isinstance(model, str) else None
        self.where = where
        if role not in ("user", "assistant"):
            raise RecordError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")


def _tool_output(r: dict[str, Any], where: str) -> str:
    result = as_dict(r.get("toolResult"), f"{where}.toolResult")
    if result.get("status") == "error":
        return f"Error: {expect(result.get('error'), f'{where}.toolResult.error', str)}"
    value = result.get("value")
    content = value.get("content") if isinstance(value, dict) else value
    texts = [
        str(c.get("text"))
        for c in dicts(content, f"{where}.toolResult.value.content")
        if c.get("type") == "text"
    ]
    return "\n".join(texts)


def _tool_call(c: dict[str, Any], where: str) -> dict[str, Any]:
    cid = expect(c.get("id"), f"{where}.id", str)
    call = as_dict(c.get("toolCall"), f"{where}.toolCall")
    if call.get("status") != "success":
        raise RecordError(
            f"{where}.toolCall: a tool request that did not parse ({call.get('error')})"
        )
    value = as_dict(call.get("value"), f"{where}.toolCall.value")
    name = expect(value.get("name"), f"{where}.toolCall.value.name", str)
    return chat_tool_call(cid, name, as_dict(value.get("arguments") or {}, f"{where}.arguments"))


#: goose's assistant content: its other items (tool responses, images...) are not the reply's
_BLOCKS = BlockNames(
    text="text", thinking="thinking", thinking_field="thinking", tool_call="toolRequest",
    others="skip",
)  # fmt: skip


def _reply(rows: list[_Row]) -> dict[str, Any]:
    """A run of assistant rows as one assistant turn."""
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for r in rows:
        blocks = enumerate(c for _, c in r.items)
        t, th, tc = assistant_blocks(blocks, f"{r.where}.content_json", _BLOCKS, _tool_call)
        text += t
        thinking += th
        calls += tc
    return assistant_turn("\n".join(text), thinking, calls)


def _user(r: _Row) -> list[dict[str, Any]]:
    """A user row as chat: its tool responses, then the rest as a user message."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for i, (kind, c) in enumerate(r.items):
        w = f"{r.where}.content_json[{i}]"
        if kind == "toolResponse":
            cid = expect(c.get("id"), f"{w}.id", str)
            out.append({"role": "tool", "tool_call_id": cid, "content": _tool_output(c, w)})
        elif kind == "text":
            text.append(expect(c.get("text"), f"{w}.text", str))
        elif kind == "image":
            raise RecordError(f"{w}: an image in a user message (not rendered)")
    if text:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _turns(rows: list[_Row]) -> list[list[_Row]]:
    """Rows grouped into turns: each run of assistant rows is one, each user row one."""
    turns: list[list[_Row]] = []
    for r in rows:
        if turns and r.role == "assistant" and turns[-1][-1].role == "assistant":
            turns[-1].append(r)
        else:
            turns.append([r])
    return turns


class _Seen:
    """What the agent saw before each turn, kept as the turns go on (a call's prompt was a walk
    over every turn before it: quadratic in the session).

    Before turn ``t`` the agent saw the chat of every earlier turn that is agent-visible or comes
    at or after the last agent-only turn before ``t`` (the compaction's summary): turns that a
    compaction hid stay in the prompts up to that summary."""

    def __init__(self, turns: list[list[_Row]], chats: list[list[dict[str, Any]]]) -> None:
        self.turns, self.chats = turns, chats
        self.hidden_before = 0  # the last agent-only turn before ``self.upto``
        self.upto = 0
        self.visible: list[dict[str, Any]] = []  # the messages seen before ``self.upto``

    def before(self, t: int) -> tuple[int, list[dict[str, Any]]]:
        """(the last agent-only turn before ``t`` or 0, the messages the agent saw before ``t``:
        the list itself, copy what you keep). ``t`` only grows."""
        turns = self.turns
        h = self.hidden_before
        for k in range(self.upto, t):
            if turns[k][0].agent_only:
                h = k
        if h != self.hidden_before:  # a compaction: which turns are seen changed
            self.hidden_before, self.upto, self.visible = h, 0, []
        for k in range(self.upto, t):
            if turns[k][0].agent_visible or k >= h:
                self.visible.extend(self.chats[k])
        self.upto = t
        return h, self.visible


def _session(path: str, sid: str, raw: list[Any], opts: ReadOptions) -> Iterator[Item]:
    rows: list[_Row] = []
    for rowid, role, content, meta in raw:
        try:
            rows.append(_Row(int(rowid), str(role), content, meta))
        except RecordError as e:  # the prompts after it would miss it: the rest is rejected
            yield Reject(file=path, line=int(rowid), format=NAME, reason=str(e))
            for later, r, *_ in raw:
                if r == "assistant" and int(later) > int(rowid):
                    why = f"message {rowid} cannot be read (the prompts after it would miss it)"
                    yield Reject(file=path, line=int(later), format=NAME, reason=why)
            break
    turns = _turns(rows)
    chats: list[list[dict[str, Any]]] = []
    cut = 0  # turns before this index that the agent no longer saw
    broken: str | None = None
    seen = _Seen(turns, chats)
    system = system_message(opts.system_prompt)
    for t, turn in enumerate(turns):
        head = turn[0]
        cid = f"{sid}/{head.rowid}"
        try:
            chat = [_reply(turn)] if head.role == "assistant" else _user(head)
        except RecordError as e:
            chat = []
            if head.role == "assistant":
                yield Reject(file=path, line=head.rowid, format=NAME, call_id=cid, reason=str(e))
            elif broken is None:
                broken = f"{e} (the prompts after it would miss it)"
                yield Reject(file=path, line=head.rowid, format=NAME, reason=str(e))
        if head.role == "assistant" and chat and broken is not None:
            yield Reject(file=path, line=head.rowid, format=NAME, call_id=cid, reason=broken)
        elif head.role == "assistant" and chat:
            hidden_before, visible = seen.before(t)
            prompt = [*system, *visible]
            yield make_call(
                {"group_id": sid, "call_id": cid, "model": head.model, "messages": prompt,
                 "completion": chat[0], "tools": opts.tools,
                 "branch_reason": "compaction" if hidden_before > cut else None,
                 "provenance": {"exact_messages": False, "reconstructed": True},
                 "source_file": path, "source_line": head.rowid, "source_format": NAME},
                file=path, line=head.rowid, fmt=NAME,
            )  # fmt: skip
            cut = hidden_before
        chats.append(
            [m for m in chat if m.get("content") or m.get("tool_calls") or m["role"] == "tool"]
            if any(c[0] not in _UNSENT for c in head.items) else []
        )  # fmt: skip


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    cols = schema(path) or {}
    meta = "metadata_json" if "metadata_json" in cols.get("messages", frozenset()) else "NULL"
    sessions, messages = snapshot(
        path,
        [
            ("SELECT id FROM sessions ORDER BY created_at, rowid", ()),
            (
                f"SELECT session_id, id, role, content_json, {meta} FROM messages "
                "ORDER BY session_id, created_timestamp, id",
                (),
            ),
        ],
    )
    by_session: dict[str, list[Any]] = defaultdict(list)
    for sid, *row in messages:
        by_session[str(sid)].append(row)
    order = [str(s) for (s,) in sessions]
    for sid in [*order, *(s for s in by_session if s not in set(order))]:
        yield from _session(path, sid, by_session.get(sid, []), opts)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=20, companion=companion)
__all__ = ["FORMAT", "NAME", "SCHEMA"]
