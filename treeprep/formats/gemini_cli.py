"""Gemini CLI chat sessions (``~/.gemini/tmp/<project hash>/chats/session-*.jsonl`` or ``.json``).

Learned from google-gemini/gemini-cli's ``chatRecordingService`` and ``chatRecordingTypes``:

* current versions append JSONL: a metadata line (``sessionId``, ``projectHash``, ``startTime``,
  ``kind``), then one line per message *version*: a message is re-appended whole, under the same
  ``id``, when its tool calls, results or token counts are filled in (the last version wins);
  ``{"$rewindTo": id}`` drops that message and everything after it (the user rewound);
  ``{"$set": {...}}`` updates metadata, and a ``$set`` holding ``messages`` replaces the whole
  history (the client rewrote it: compression, masked tool output);
* older versions wrote one JSON document: the metadata with a ``messages`` list;
* since 0.44 (``recordSyntheticMessage``, commit 055e0f6) the tool responses sent back to the
  model are also recorded as a ``user`` message of ``functionResponse`` parts: they are the
  results the tool calls' records hold, so such a message is not read again as a user turn.

Sub-agents (``kind: "subagent"`` in the metadata) record their own session in a folder named by
the main session's id, ``chats/<main session id>/<agent id>.jsonl``
(:mod:`treeprep.formats._gemini_layout`). Their calls join the main session's tree (the group is
the folder's name, the agent the sub-agent's session id); the first is hinted ``sub-agent`` and
linked (``parent_call_id``) to the message whose tool call carries the sub-agent's ``agentId``,
when the main session's file or a sibling sub-agent's is there to say which.

A message has ``id``, ``timestamp``, ``type`` (``user``, ``gemini``, or the UI-only ``info``,
``error``, ``warning`` that the model never sees) and ``content`` (a string or a list of parts).
A ``gemini`` message is one model response: its text, ``thoughts`` (thought summaries:
``subject`` and ``description``), and ``toolCalls`` (``id``, ``name``, ``args`` and ``result``,
the ``functionResponse`` parts sent back to the model).

How calls are rebuilt: every ``gemini`` message is one :class:`ChatCall`. Its prompt is the
conversation before it as the client held it at that moment: user turns (those in a row merged
into one for a session started since 0.53.0's release, as that client sends them:
:func:`coalesces`), earlier responses as
assistant messages (text and tool calls with their ``args`` object as the arguments; no reasoning:
Gemini CLI sends no thought part back, so the call after a reply with thoughts is hinted
``reasoning-dropped``), and after each response with tool calls
one ``tool`` message per call holding the ``functionResponse``'s ``output`` (or the whole response
as JSON). Calls rewound away are still calls the model answered, so they are emitted too (the trie
shows the fork); the first call after a rewind is hinted ``retry`` (the user went back and went
on differently). A completion's reasoning is its thought summaries as ``**subject**
description`` (the file keeps no raw thought). The file holds no system prompt and no tool
schemas: ``--system-prompt`` / ``--tools``.

Cost: the history is converted once (:class:`~treeprep.formats._history.ConvertedHistory`): each
call converts only the messages its history gained, and hands the same dicts to
:func:`~treeprep.formats._fields.make_call` as the call before. 800 generated turns took 7.7
CPU-seconds (8.9x the time of 200) when every call converted its whole history; now 1.9 s (4.6x,
``bench/session_scaling.py --formats gemini-cli``).

Rejects, not guesses: a prompt that holds a tool call with no recorded result (cancelled before
it ran) cannot be rebuilt; a user part that is not text (an image) is left for the renderer, which
rejects it by name. The first call after a history rewrite is hinted ``compaction``, and each call
carries its message's timestamp (a template that prints the date prints that one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import orjson

from treeprep.errors import RecordError
from treeprep.formats._fields import (
    chat_content,
    expect,
    make_call,
    one_of,
    opt_list,
    system_message,
    type_name,
)
from treeprep.formats._gemini_layout import parent_call, parent_session
from treeprep.formats._history import Converted, ConvertedHistory
from treeprep.formats._read import document, head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io.compressed import read_all
from treeprep.render.dates import parse_date
from treeprep.schemas import Reject

NAME = "gemini-cli"
_UI_ONLY = frozenset({"info", "error", "warning"})


def _is_meta(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("sessionId"), str)
        and isinstance(obj.get("projectHash"), str)
    )


def sniff(path: str, head: bytes) -> bool:
    s = head.lstrip()
    if s.startswith(b"{") and b"\n" in s:
        objs = head_json_objects(head)
        if objs and _is_meta(objs[0]):
            return True
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        return False
    return _is_meta(doc) and isinstance(doc.get("messages"), list)


# --------------------------------------------------------------------------------------------
# the message records -> chat messages
# --------------------------------------------------------------------------------------------


_PARTS = "a string, a part object or an array of them"


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """A PartListUnion (a string, a part, or a list of them) as chat content parts."""
    if content is None:
        return []
    if isinstance(expect(content, where, str, dict, list, what=_PARTS), str):
        return [{"type": "text", "text": content}]
    items = content if isinstance(content, list) else [content]
    out: list[dict[str, Any]] = []
    for i, p in enumerate(items):
        at = f"{where}[{i}]" if isinstance(content, list) else where
        if isinstance(expect(p, at, str, dict, what="a string or a part object"), str):
            out.append({"type": "text", "text": p})
        elif "text" in p:
            if not p.get("thought"):
                out.append({"type": "text", "text": expect(p["text"], f"{at}.text", str)})
        else:
            kind = next(iter(p), "part")  # inlineData, fileData, ...: not text
            out.append({"type": str(kind)})
    return out


def _text(content: Any, where: str) -> str:
    return "".join(p.get("text", "") for p in _parts(content, where) if p["type"] == "text")


def _reasoning(msg: dict[str, Any], where: str) -> str | None:
    texts = []
    for t in opt_list(msg.get("thoughts"), f"{where}.thoughts"):
        if not isinstance(t, dict):
            continue
        subject, desc = t.get("subject") or "", t.get("description") or ""
        texts.append(f"**{subject}** {desc}".strip() if subject else str(desc))
    joined = "\n\n".join(x for x in texts if x)
    return joined or None


def function_response_text(resp: Any) -> str:
    """A ``functionResponse``'s ``response`` as the tool message's text: its ``output`` when that
    is all it holds, else its JSON.

    >>> function_response_text({"output": "ok"}), function_response_text({"error": "no"})
    ('ok', '{"error": "no"}')
    """
    if isinstance(resp, dict) and isinstance(resp.get("output"), str) and len(resp) == 1:
        return str(resp["output"])
    return json.dumps(resp, ensure_ascii=False)


def _result_text(call: dict[str, Any]) -> str | None:
    """The text the model received for a tool call, None when no result was recorded."""
    result = call.get("result")
    if result is None:
        return None
    items = result if isinstance(result, list) else [result]
    texts = []
    for p in items:
        if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict):
            texts.append(function_response_text(p["functionResponse"].get("response")))
        elif isinstance(p, dict) and isinstance(p.get("text"), str):
            texts.append(p["text"])
        elif isinstance(p, str):
            texts.append(p)
    return "\n".join(texts)


def _where(msg: dict[str, Any]) -> str:
    """How a message is named in a reject: by its id."""
    return f"message {msg.get('id')!r}"


def call_arguments(args: Any) -> dict[str, Any] | str:
    """A call's ``args`` as logged: the object kept as an object (the chat form's arguments, as
    the model emitted them); anything else as its JSON text."""
    if args is None:
        return {}
    return args if isinstance(args, dict) else json.dumps(args, ensure_ascii=False)


def _assistant(msg: dict[str, Any], sent: bool = False) -> dict[str, Any]:
    """A ``gemini`` message as a chat message: as the model answered (its thought summaries as
    reasoning), or ``sent`` back in a later prompt, without them: Gemini CLI keeps no thought
    part in the history it sends (``GeminiChat.processStreamResponse`` filters ``part.thought``
    out of the model turn it stores)."""
    where = _where(msg)
    calls = [c for c in opt_list(msg.get("toolCalls"), f"{where}.toolCalls") if isinstance(c, dict)]
    out: dict[str, Any] = {
        "role": "assistant",
        "content": _text(msg.get("content"), f"{where}.content"),
    }
    r = None if sent else _reasoning(msg, where)
    if r:
        out["reasoning_content"] = r
    if calls:
        out["tool_calls"] = [
            {
                "id": str(c.get("id")),
                "type": "function",
                "function": {
                    "name": str(c.get("name") or ""),
                    "arguments": call_arguments(c.get("args")),
                },
            }
            for c in calls
        ]
    return out


class _Unrebuilt(Exception):
    """A history that cannot be rebuilt (a tool call with no recorded result), and why: not a
    RecordError, so that the call's own faults still name themselves first (:func:`_call`)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _convert(msgs: list[dict[str, Any]], start: int, *, coalesce: bool = False) -> Converted:
    """Chat messages for ``msgs`` (message records in order), converted for
    :class:`~treeprep.formats._history.ConvertedHistory`; :class:`_Unrebuilt` saying why they
    cannot be rebuilt. With ``coalesce`` (0.53+, :func:`coalesces`), consecutive user turns are
    one message, their parts in order (no call's history gains a user turn right after the last
    one's: a reply comes between, so no message stays open to the next entries)."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []  # the parts of the user message that ends ``out``
    for m in msgs:
        kind = m.get("type")
        if kind == "user":
            parts = _parts(m.get("content"), f"{_where(m)}.content")
            if parts and all(p["type"] == "functionResponse" for p in parts):
                continue  # the tool results again (0.44+): sent as the calls' tool messages
            # several parts stay parts, as its telemetry logs them
            if coalesce and run:
                run = [*run, *parts]
                out[-1] = {"role": "user", "content": chat_content(run)}
                continue
            run = parts
            out.append({"role": "user", "content": chat_content(parts)})
        elif kind == "gemini":
            run = []
            out.append(_assistant(m, sent=True))
            for c in m.get("toolCalls") or []:
                if not isinstance(c, dict):
                    continue
                text = _result_text(c)
                if text is None:
                    raise _Unrebuilt(
                        f"tool call {c.get('id')!r} ({c.get('name')!r}, status "
                        f"{c.get('status')!r}) of message {m.get('id')!r} has no recorded "
                        "result, so the prompt of a later call cannot be rebuilt"
                    )
                out.append({"role": "tool", "tool_call_id": str(c.get("id")), "content": text})
    return Converted(out)


#: Gemini CLI 0.53.0's release (npm, 2026-07-28T21:45:04Z). From it on the client sends
#: consecutive turns of one role as one turn, their parts in order
#: (``geminiChat.coalesceConsecutiveRoles``, PR #28407): the session context and the first
#: prompt, above all. The session file does not say which version wrote it, nor did the
#: recording change; a session started before the release was written by an earlier one.
COALESCE_SINCE = datetime(2026, 7, 28, 21, 45, 4, tzinfo=UTC)


def coalesces(meta: dict[str, Any]) -> bool:
    """Whether the session of metadata ``meta`` was started since 0.53.0's release, so that its
    requests merged consecutive user turns (a session without a start time: no)."""
    started = parse_date(meta.get("startTime"))
    return started is not None and started >= COALESCE_SINCE


# --------------------------------------------------------------------------------------------
# the session: versions, rewinds, rewrites
# --------------------------------------------------------------------------------------------


def _is_document(data: bytes) -> bool:
    """A legacy session: one JSON document (pretty-printed, or one line holding ``messages``)."""
    s = data.lstrip()
    first = s.split(b"\n", 1)[0]
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return True  # a pretty-printed document's first line is not a whole value
    return isinstance(obj, dict) and isinstance(obj.get("messages"), list)


def _events(path: str) -> Iterator[tuple[int, dict[str, Any]] | Reject]:
    """(line, record) for every record of a JSONL session or of a legacy JSON document."""
    data = read_all(path)
    if _is_document(data):
        d = document(path, data=data, keep_non_finite=True)
        doc = d.value
        if not _is_meta(doc) or not isinstance(doc.get("messages"), list):
            yield Reject(file=path, line=1, reason="expected a Gemini CLI session document")
            return
        yield 1, {k: v for k, v in doc.items() if k != "messages"}
        for m in doc["messages"]:
            mid = m.get("id") if isinstance(m, dict) else None
            yield (d.line_of(f'"{mid}"') if isinstance(mid, str) else 1), m
        return
    for line, obj in records(path, NAME, objects=True):
        yield obj if isinstance(obj, Reject) else (line, obj)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    versions: dict[str, dict[str, Any]] = {}  # id -> last version (final state of each message)
    events: list[tuple[int, str, Any]] = []  # (line, kind, payload) in file order
    session, sub_agent, coalesce = path, False, False
    for ev in _events(path):
        if isinstance(ev, Reject):
            yield ev
            continue
        line, obj = ev
        if not isinstance(obj, dict):
            reason = f"expected a message record (an object), got {type_name(obj)}"
            yield Reject(file=path, line=line, reason=reason, format=NAME)
            continue
        if "$rewindTo" in obj:
            events.append((line, "rewind", str(obj["$rewindTo"])))
        elif isinstance(obj.get("$set"), dict):
            new = obj["$set"].get("messages")
            if isinstance(new, list):
                snapshot = {
                    m["id"]: m for m in new if isinstance(m, dict) and isinstance(m.get("id"), str)
                }
                events.append((line, "replace", snapshot))
        elif _is_meta(obj):
            session, sub_agent = obj["sessionId"], obj.get("kind") == "subagent"
            coalesce = coalesces(obj)
        elif isinstance(obj.get("id"), str) and isinstance(obj.get("type"), str):
            first = obj["id"] not in versions
            versions[obj["id"]] = obj
            if first:
                events.append((line, "message", obj["id"]))
        else:
            yield Reject(
                file=path, line=line, reason="expected a message, $rewindTo or $set record"
            )
    current: list[str] = []
    rewritten_as: dict[str, dict[str, Any]] = {}  # messages as a history rewrite left them
    rewritten = rewound = thought = False
    who = _who(path, session, sub_agent)
    calls = 0
    # the messages of ``current`` (as a rewrite left them), kept in step with it, and their chat
    # messages, converted once (:class:`~treeprep.formats._history.ConvertedHistory`)
    before: list[dict[str, Any]] = []
    history: ConvertedHistory[dict[str, Any]] = ConvertedHistory(
        partial(_convert, coalesce=coalesce)
    )
    for line, kind, payload in events:
        if kind == "rewind":
            cut = current.index(payload) if payload in current else 0
            rewound = rewound or cut < len(current)
            del current[cut:]
            del before[cut:]
            continue
        if kind == "replace":
            # a rewrite of messages (compression, masking); the first one only sets the session
            # context (0.44+ writes it as a $set on the file's second line): nothing is replaced
            rewritten = rewritten or bool(current)
            current = list(payload)
            rewritten_as.update(payload)
            before = [rewritten_as.get(i) or versions[i] for i in current]
            continue
        msg = versions[payload]
        if not one_of(msg.get("type"), _UI_ONLY):
            if msg.get("type") == "gemini":
                hint = "compaction" if rewritten else "retry" if rewound else None
                if who[1] != "main" and not calls:
                    hint = "sub-agent"  # the sub-agent's first call
                elif hint is None and thought:
                    hint = "reasoning-dropped"  # the last reply's thoughts are not sent back
                caller = who if not calls else (*who[:2], None)
                yield _call(path, line, caller, msg, (before, history), opts, hint)
                rewritten, rewound, calls = False, False, calls + 1
                thought = bool(msg.get("thoughts"))
            current.append(payload)
            before.append(rewritten_as.get(payload) or versions[payload])


def _who(path: str, session: str, sub_agent: bool) -> tuple[str, str, str | None]:
    """(the tree, the agent, the first call's parent call): a sub-agent's session joins its
    main session's tree, linked to the call whose tool call started it."""
    parent = parent_session(path) if sub_agent else None
    if parent is None:
        return session, "main", None
    return parent, session, parent_call(path, parent, session, NAME)


def _call(
    path: str,
    line: int,
    who: tuple[str, str, str | None],
    msg: dict[str, Any],
    prompt: tuple[list[dict[str, Any]], ConvertedHistory[dict[str, Any]]],
    opts: ReadOptions,
    hint: str | None,
) -> Item:
    """``prompt``: the messages before ``msg``, and their chat messages converted so far."""
    before, converted = prompt
    try:
        try:
            history, why = converted.update(before), None
        except _Unrebuilt as e:
            history, why = [], e.why
        completion = _assistant(msg)
    except RecordError as e:
        why = str(e)
    if why is not None:
        return Reject(file=path, line=line, reason=why, format=NAME, call_id=msg.get("id"))
    group, agent, parent = who
    fields = {
        "group_id": group,
        "agent_id": agent,
        "call_id": msg["id"],
        "parent_call_id": parent,
        "model": msg.get("model"),
        "messages": [*system_message(opts.system_prompt), *history],
        "tools": opts.tools,
        "completion": completion,
        "provenance": {"exact_messages": False, "reconstructed": True},
        "branch_reason": hint,
        "timestamp": msg.get("timestamp") if isinstance(msg.get("timestamp"), str) else None,
        "source_file": path,
        "source_line": line,
        "source_format": NAME,
    }
    return make_call(fields, file=path, line=line, fmt=NAME)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=24)
