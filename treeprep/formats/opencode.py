"""``opencode``: OpenCode sessions, as ``opencode export`` writes them or as its storage keeps them.

Learnt from sst/opencode (now anomalyco/opencode): ``packages/opencode/src/session/
message-v2.ts`` (the message and part schemas, ``toModelMessages``, ``filterCompacted``),
``src/cli/cmd/export.ts`` and ``src/storage/json-migration.ts`` (the file layout). A session is
a list of messages, each ``{info, parts}``: ``info`` is a user message (``id``, ``sessionID``,
``role``, ``agent``, ``model``) or an assistant message (``parentID``, the user message it
answers; ``modelID``, ``providerID``, ``summary`` for a compaction's summary, ``finish``,
``error``); ``parts`` are ``text`` (``synthetic``, ``ignored``), ``reasoning``, ``file``,
``tool`` (``callID``, ``tool``, ``state`` with ``status``, ``input``, ``output`` or ``error``),
``step-start``/``step-finish``, ``compaction``, ``subtask`` and parts no model sees (``patch``,
``snapshot``, ``agent``, ``retry``). Two layouts are read:

* ``opencode export <id>`` output: one JSON document ``{info, messages: [{info, parts}]}``;
* the JSON storage of OpenCode before its SQLite database (``~/.local/share/opencode/storage``):
  the session file ``session/<project>/<session>.json`` is read, with its messages from
  ``message/<session>/*.json`` and their parts from ``part/<message>/*.json``, in id order (ids
  ascend with time). Message and part files are not logs on their own: a folder build skips
  them (:func:`companion`) and says they belong to sessions.

Calls. An assistant message runs one LLM call per step: its parts are split at ``step-start``,
and each step is one call whose completion is the step's reasoning, text and tool calls, and
whose prompt is what ``toModelMessages`` sends: the session's earlier messages (user text parts
that are not ``ignored``, synthetic ones included, non-text files as file parts the renderer
names; an assistant's steps, each an assistant message followed by a ``tool`` message per tool
result: the output, ``[Old tool result content cleared]`` once compacted, the error text, or
``[Tool execution was interrupted]``), then the message's earlier steps. Assistant messages that
ended in an error are left out of later prompts (an aborted one that wrote something stays), and
a step with no ``step-finish`` (the call was cut by an error or an abort) is rejected.

Compaction: a user message with a ``compaction`` part is sent as "What did we do so far?"; the
summary the model wrote (``summary: true``) is a call on the whole history, and once it is done
the prompts start at that user message (``filterCompacted``; the call after it is hinted
``compaction``); with the request's ``tail_start_id`` (newer versions keep a tail of the
history) the prompt is the request, the summary, the kept tail, then what followed. Sub-agents: a
session with a ``parentID`` (the ``task`` tool's child session) joins the tree of its root
session, its first call hinted ``sub-agent``. OpenCode stores neither its system prompt nor its
tool schemas: ``--system-prompt`` and ``--tools`` give them. A message or part that does not fit
rejects the calls from it on (their prompts would miss it), naming the message.
"""

from __future__ import annotations

import os
import re
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
    opt_dict,
    opt_str,
    type_name,
)
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io import reads
from treeprep.io.compressed import read_head
from treeprep.schemas import Reject

NAME = "opencode"
COMPACTION_PROMPT = "What did we do so far?"
SUBTASK_PROMPT = "The following tool was executed by the user"
CLEARED = "[Old tool result content cleared]"
INTERRUPTED = "[Tool execution was interrupted]"
#: parent sessions followed up to the root
_MAX_CHAIN = 64
_SESSION_ID = re.compile(rb'"id"\s*:\s*"ses_')


def _layout(path: str, head: bytes) -> str | None:
    """``export`` or ``storage`` for a session file of either layout, else None."""
    h = head.lstrip()
    if not h.startswith(b"{"):
        return None
    if b'"info"' in h[:4096] and b'"ses_' in h[:4096] and b'"messages"' in h:
        return "export"
    folder = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if (
        os.path.basename(folder) == "session"
        and os.path.basename(path).startswith("ses_")
        and _SESSION_ID.search(h[:4096])
        and b'"projectID"' in h
    ):
        return "storage"
    return None


def sniff(path: str, head: bytes) -> bool:
    return _layout(path, head) is not None


#: storage folders of the files a session file reads: (folder, its subfolders' prefix, files')
_COMPANIONS = {"message": ("ses_", "msg_"), "part": ("msg_", "prt_")}


def companion(path: str) -> bool:
    """A message or part file of the storage layout (``message/ses_*/msg_*.json``,
    ``part/msg_*/prt_*.json`` beside ``session/``), read with its session, or a project file
    (``project/*.json``), which holds no calls: none is a log on its own."""
    p = os.path.abspath(path)
    owner = os.path.dirname(p)
    if os.path.basename(owner) == "project" and p.endswith(".json"):
        return os.path.isdir(os.path.join(os.path.dirname(owner), "session"))
    kind = os.path.dirname(owner)
    if os.path.basename(kind) not in _COMPANIONS or not p.endswith(".json"):
        return False
    dir_prefix, file_prefix = _COMPANIONS[os.path.basename(kind)]
    return (
        os.path.basename(owner).startswith(dir_prefix)
        and os.path.basename(p).startswith(file_prefix)
        and os.path.isdir(os.path.join(os.path.dirname(kind), "session"))
    )


# --------------------------------------------------------------------------------------------
# loading a session: (session info, [{info, parts}]) from either layout
# --------------------------------------------------------------------------------------------


def _json_files(folder: str) -> list[str]:
    names = [n for n in reads.listdir(folder) if n.endswith(".json")]  # a new file: a change
    return [os.path.join(folder, n) for n in names]


def _object(path: str, what: str) -> dict[str, Any]:
    value = document(path).value
    if not isinstance(value, dict):
        raise InputError(path, 1, f"expected an OpenCode {what} object, got {type_name(value)}")
    return value


#: every part type of ``message-v2.ts``: a part of another type is one we cannot read
PART_TYPES = ("text", "reasoning", "file", "tool", "step-start", "step-finish", "compaction",
              "subtask", "patch", "snapshot", "agent", "retry")  # fmt: skip
#: optional fields that change what is read, and the JSON types ``message-v2.ts`` gives them
_PART_FIELDS: dict[str, tuple[type, ...]] = {"synthetic": (bool,), "ignored": (bool,),
                                             "time": (dict,), "tail_start_id": (str,)}  # fmt: skip
_INFO_FIELDS: dict[str, tuple[type, ...]] = {"summary": (bool,), "finish": (str,),
                                             "error": (dict,), "modelID": (str,)}  # fmt: skip


def _typed(obj: dict[str, Any], fields: dict[str, tuple[type, ...]], where: str) -> None:
    """RecordError naming the first of ``fields`` that ``obj`` holds with another type (null is
    absent)."""
    for key, types in fields.items():
        if obj.get(key) is not None:
            what = "a boolean" if types == (bool,) else None
            expect(obj[key], f"{where}.{key}", *types, what=what)


def check_part(part: dict[str, Any], where: str) -> None:
    """RecordError unless ``part`` is one we can read: a known ``type``, its optional fields of
    their types. A part we cannot read rejects its call: dropping it would drop what the model
    was sent (a user's request), silently."""
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in PART_TYPES:
        got = repr(kind) if isinstance(kind, str) else type_name(kind)
        raise RecordError(f"{where}.type: expected one of {', '.join(PART_TYPES)}; got {got}")
    _typed(part, _PART_FIELDS, where)


def _check_session(info: dict[str, Any], path: str) -> dict[str, Any]:
    """The session object, its ``id`` and ``parentID`` strings (or absent); InputError naming the
    field otherwise (a parent of another type would silently make a sub-agent a root)."""
    try:
        opt_str(info.get("id"), "id")
        opt_str(info.get("parentID"), "parentID")
    except RecordError as e:
        raise InputError(path, 1, f"session {e}") from e
    return info


class _Broken(str):
    """A message of the storage layout whose file or parts could not be read (the reason)."""


_Loaded = tuple[dict[str, Any], list[Any], list[str], list[int]]


def _storage(path: str) -> _Loaded:
    """(session, messages, where each message is, its line in ``path``)."""
    info = _check_session(_object(path, "session"), path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    sid = os.path.basename(path).removesuffix(".json")
    messages: list[Any] = []
    wheres: list[str] = []
    for mfile in _json_files(os.path.join(root, "message", sid)):
        mid = os.path.basename(mfile).removesuffix(".json")
        wheres.append(f"message/{sid}/{mid}.json")
        try:
            m = _object(mfile, "message")
            parts = [_part(p) for p in _json_files(os.path.join(root, "part", mid))]
        except InputError as e:  # the message's file or one of its parts' files
            messages.append(_Broken(f"{e.file}:{e.line}: {e.reason}"))
            continue
        messages.append({"info": {**m, "id": mid}, "parts": parts})
    return info, messages, wheres, [1] * len(messages)


def _part(path: str) -> dict[str, Any]:
    """A part file, checked (:func:`check_part`): InputError naming the file and the field."""
    part = _object(path, "part")
    try:
        check_part(part, "part")
    except RecordError as e:
        raise InputError(path, 1, str(e)) from e
    return part


def _export(path: str) -> _Loaded:
    parsed = document(path)
    doc = parsed.value
    if not isinstance(doc, dict):
        raise InputError(path, 1, f"expected an OpenCode export object, got {type_name(doc)}")
    info = doc.get("info")
    if not isinstance(info, dict):
        raise InputError(path, 1, f"info: expected the session object, got {type_name(info)}")
    _check_session(info, path)
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise InputError(path, 1, f"messages: expected an array, got {type_name(messages)}")
    lines = []
    for m in messages:
        i = m.get("info") if isinstance(m, dict) else None
        mid = i.get("id") if isinstance(i, dict) else None
        lines.append(parsed.line_of(f'"id": "{mid}"') if isinstance(mid, str) else 1)
    return info, messages, [f"messages[{j}]" for j in range(len(messages))], lines


def _root_session(path: str, info: dict[str, Any], layout: str) -> str:
    """The session a chain of ``parentID`` starts from (sibling session files are looked up in
    the storage layout; an export names only its parent)."""
    parent = info.get("parentID")
    sid = info.get("id") if isinstance(info.get("id"), str) else path
    if not isinstance(parent, str) or not parent:
        return str(sid)
    if layout != "storage":
        return parent
    folder = os.path.dirname(path)
    for _ in range(_MAX_CHAIN):
        p = os.path.join(folder, f"{parent}.json")
        try:
            up = _object(p, "session").get("parentID") if reads.isfile(p) else None
        except InputError:
            up = None
        if not isinstance(up, str) or not up:
            break
        parent = up
    return parent


# --------------------------------------------------------------------------------------------
# parts -> chat (toModelMessages)
# --------------------------------------------------------------------------------------------


def _tool_output(state: dict[str, Any], where: str) -> str:
    """What the model was sent as a tool part's result."""
    status = state.get("status")
    if status == "completed":
        time = opt_dict(state.get("time"), f"{where}.time")
        if time.get("compacted") is not None:
            expect(time["compacted"], f"{where}.time.compacted", int, float)
        if time.get("compacted"):
            return CLEARED
        return expect(state.get("output"), f"{where}.output", str)  # type: ignore[no-any-return]
    if status == "error":
        meta = state.get("metadata")
        if isinstance(meta, dict) and meta.get("interrupted") is True:
            if isinstance(meta.get("output"), str):
                return str(meta["output"])
        return expect(state.get("error"), f"{where}.error", str)  # type: ignore[no-any-return]
    if status in ("pending", "running"):
        return INTERRUPTED
    raise RecordError(
        f"{where}.status: expected completed, error, pending or running, got {status!r}"
    )


def _steps(parts: list[dict[str, Any]]) -> list[list[tuple[int, dict[str, Any]]]]:
    """The parts of an assistant message split at ``step-start`` (index, part)."""
    steps: list[list[tuple[int, dict[str, Any]]]] = [[]]
    for i, p in enumerate(parts):
        if p.get("type") == "step-start" and steps[-1]:
            steps.append([])
        steps[-1].append((i, p))
    return [s for s in steps if any(p.get("type") != "step-start" for _, p in s)]


#: a step's parts that are its reply (a part's text must be a string); the others (the step's
#: bounds, files, patches: :data:`PART_TYPES`, checked by :func:`check_part`) are skipped
_BLOCK_NAMES = BlockNames(
    text="text", thinking="reasoning", thinking_field="text", tool_call="tool", others="skip"
)


def _step_messages(step: list[tuple[int, dict[str, Any]]], where: str) -> list[dict[str, Any]]:
    """One step as chat: the assistant message, then one tool message per tool result."""
    results: list[dict[str, Any]] = []

    def tool_call(p: dict[str, Any], w: str) -> dict[str, Any]:
        """A ``tool`` part as a chat tool call; its result goes to ``results``."""
        cid = expect(p.get("callID"), f"{w}.callID", str)
        name = expect(p.get("tool"), f"{w}.tool", str)
        state = as_dict(p.get("state"), f"{w}.state")
        args = as_dict(state.get("input", {}), f"{w}.state.input")
        out = _tool_output(state, f"{w}.state")
        results.append({"role": "tool", "tool_call_id": cid, "name": name, "content": out})
        return chat_tool_call(cid, name, args)

    text, thinking, calls = assistant_blocks(step, f"{where}.parts", _BLOCK_NAMES, tool_call)
    return [assistant_turn("".join(text), thinking, calls), *results]


def _user(parts: list[dict[str, Any]], where: str) -> dict[str, Any] | None:
    content: list[dict[str, Any]] = []
    for i, p in enumerate(parts):
        w = f"{where}.parts[{i}]"
        kind = p.get("type")
        if kind == "text" and not p.get("ignored"):
            content.append({"type": "text", "text": expect(p.get("text"), f"{w}.text", str)})
        elif kind == "file":
            mime = expect(p.get("mime"), f"{w}.mime", str)
            if mime not in ("text/plain", "application/x-directory"):  # those are sent as text
                name = opt_str(p.get("filename"), f"{w}.filename")
                content.append({"type": "file", "mime": mime, "filename": name})
        elif kind == "compaction":
            content.append({"type": "text", "text": COMPACTION_PROMPT})
        elif kind == "subtask":
            content.append({"type": "text", "text": SUBTASK_PROMPT})
    if not content:
        return None
    if all(c["type"] == "text" for c in content) and len(content) == 1:
        return {"role": "user", "content": content[0]["text"]}
    return {"role": "user", "content": content}


def _sent(info: dict[str, Any], parts: list[dict[str, Any]]) -> bool:
    """Whether ``toModelMessages`` keeps an assistant message (errors are left out, unless an
    abort after the model wrote something)."""
    error = info.get("error")
    if not error:
        return True
    aborted = isinstance(error, dict) and error.get("name") == "MessageAbortedError"
    return aborted and any(p.get("type") not in ("step-start", "reasoning") for p in parts)


def _history(messages: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[int]:
    """The messages ``filterCompacted`` sends, by index: all of them, or from the newest
    compaction request whose summary is done; with the request's ``tail_start_id`` (newer
    versions keep a tail of the history), the request and its summary, then the kept tail, then
    what followed the summary."""
    done: set[Any] = set()
    for c in range(len(messages) - 1, -1, -1):
        info, parts = messages[c]
        if info.get("role") == "assistant":
            if info.get("summary") and info.get("finish") and not info.get("error"):
                done.add(info.get("parentID"))
            continue
        part = next((p for p in parts if p.get("type") == "compaction"), None)
        if info.get("id") not in done or part is None:
            continue
        tail = part.get("tail_start_id")
        ids = [m.get("id") for m, _ in messages]
        t = ids.index(tail) if isinstance(tail, str) and tail in ids[:c] else -1
        s = next(
            (k for k in range(c + 1, len(messages)) if messages[k][0].get("summary")
             and messages[k][0].get("parentID") == info.get("id")),
            -1,
        )  # fmt: skip
        if t >= 0 and s > c:
            return [*range(c, s + 1), *range(t, c), *range(s + 1, len(messages))]
        return list(range(c, len(messages)))
    return list(range(len(messages)))


# --------------------------------------------------------------------------------------------
# the session -> calls
# --------------------------------------------------------------------------------------------


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    layout = _layout(path, read_head(path)) or "export"
    info, raw, wheres, lines = _storage(path) if layout == "storage" else _export(path)
    group = _root_session(path, info, layout)
    yield from session_calls(path, (info, raw, wheres, lines), group, opts)


def session_calls(path: str, loaded: _Loaded, group: str, opts: ReadOptions) -> Iterator[Item]:
    """The calls of one loaded session (its info, its ``{info, parts}`` messages, where each
    message is and its line), in the tree of ``group`` (also read by
    :mod:`treeprep.formats.opencode_db`)."""
    info, raw, wheres, lines = loaded
    sid = str(info.get("id")) if isinstance(info.get("id"), str) else os.path.basename(path)
    sub_agent = group != sid
    done: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []  # messages read so far
    chats: list[list[dict[str, Any]]] = []  # each message of ``done`` as chat
    broken: str | None = None
    k = 0
    last_start = 0
    for j, m in enumerate(raw):
        where, line = wheres[j], lines[j]
        minfo: dict[str, Any] = {}
        parts: list[dict[str, Any]] = []
        steps: list[list[tuple[int, dict[str, Any]]]] = []
        try:
            if isinstance(m, _Broken):
                raise RecordError(str(m))
            m = as_dict(m, where)
            minfo = as_dict(m.get("info"), f"{where}.info")
            parts = dicts(m.get("parts"), f"{where}.parts")
            role = minfo.get("role")
            steps = _steps(parts) if role == "assistant" else []
            if role not in ("user", "assistant"):
                raise RecordError(
                    f"{where}.info.role: expected 'user' or 'assistant', got {role!r}"
                )
            expect(minfo.get("id"), f"{where}.info.id", str)
            opt_str(minfo.get("parentID"), f"{where}.info.parentID")
            as_chat = _message_chat(minfo, parts, steps, where)
        except RecordError as e:
            as_chat = []
            name = minfo.get("id")  # the message's id still names its steps' rejects
            minfo, parts = ({"id": name} if isinstance(name, str) else {}), []
            if broken is None:
                broken = f"{e} (the prompts after it would miss it)"
                yield Reject(file=path, line=line, format=NAME, reason=str(e))
        mid = minfo.get("id")
        model = minfo.get("modelID") if isinstance(minfo.get("modelID"), str) else None
        order = _history(done)
        start = order[0] if order else 0
        history = [msg for c in order for msg in chats[c]]
        earlier: list[dict[str, Any]] = []
        for s, step in enumerate(steps):
            cid = f"{sid}/{mid}#{s}"
            k += 1
            if broken is not None:
                yield Reject(file=path, line=line, format=NAME, call_id=cid, reason=broken)
                continue
            finished = any(p.get("type") == "step-finish" for _, p in step)
            if not finished:
                why = "the step has no step-finish: the call was cut (an error or an abort)"
                yield Reject(file=path, line=line, format=NAME, call_id=cid, reason=why)
                continue
            turn = _step_messages(step, where)
            ends = [p.get("reason") for _, p in step if p.get("type") == "step-finish"]
            if cut := cut_reason(ends[-1], f"{where}: the step-finish reason"):
                yield Reject(file=path, line=line, format=NAME, call_id=cid, reason=cut)
                earlier.extend(turn)  # it is sent back all the same
                continue
            hint = None
            if sub_agent and k == 1:
                hint = "sub-agent"
            elif start > last_start:
                hint = "compaction"
            last_start = start
            prompt = [*history, *earlier]
            if opts.system_prompt:
                prompt.insert(0, {"role": "system", "content": opts.system_prompt})
            yield make_call(
                {"group_id": group, "call_id": cid, "agent_id": "main" if not sub_agent else sid,
                 "model": model, "messages": prompt, "completion": turn[0],
                 "tools": opts.tools, "branch_reason": hint,
                 "provenance": {"exact_messages": False, "reconstructed": True},
                 "arguments_json": "javascript",  # the AI SDK's JSON.stringify(part.input)
                 "source_file": path, "source_line": line, "source_format": NAME},
                file=path, line=line, fmt=NAME,
            )  # fmt: skip
            earlier.extend(turn)
        done.append((minfo, parts))
        chats.append(as_chat)


def _message_chat(
    info: dict[str, Any],
    parts: list[dict[str, Any]],
    steps: list[list[tuple[int, dict[str, Any]]]],
    where: str,
) -> list[dict[str, Any]]:
    """One message as the chat messages later prompts hold (checked even when not sent)."""
    _typed(info, _INFO_FIELDS, f"{where}.info")
    for i, p in enumerate(parts):
        check_part(p, f"{where}.parts[{i}]")
    if info.get("role") == "user":
        user = _user(parts, where)
        return [user] if user else []
    out = [msg for step in steps for msg in _step_messages(step, where)]
    return out if _sent(info, parts) else []


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=27, companion=companion)
__all__ = ["COMPACTION_PROMPT", "FORMAT", "NAME"]
