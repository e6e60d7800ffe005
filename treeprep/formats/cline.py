"""``cline``: Cline and Roo Code task histories (``tasks/<task id>/api_conversation_history.json``).

Learnt from cline/cline (``src/core/storage/disk.ts``, ``ClineStorageMessage`` in
``src/shared/messages/content.ts``): each task folder keeps the conversation exactly as sent to
the model, a JSON array of Anthropic ``MessageParam``s (``role``, ``content`` as a string or
``text``/``image``/``thinking``/``tool_use``/``tool_result`` blocks) with Cline's own fields
beside them (``id``, ``ts``, ``modelInfo.modelId``, ``metrics``), which Cline strips before
sending. Roo Code, a fork, keeps the same file. The blocks are converted as the ``anthropic``
format converts a request (:func:`~treeprep.formats.anthropic.assistant_message`,
:func:`~treeprep.formats.anthropic.user_messages`): tool results become ``tool`` messages, and
Cline's XML tool calls written in text stay text, as the model wrote them.

Every assistant message is one call whose prompt is every message before it. Cline does not store
its system prompt or tool schemas in this file: ``--system-prompt`` and ``--tools`` give them
(calls without them are trained on a prompt that lacks the system prompt Cline sent). One task
folder is one group (the folder's name, Cline's task id). A message that does not fit is one
reject naming ``[i]``; the calls after it are rejected with it, their prompts would miss it.
Detected by the file name and a JSON array whose first element has a ``role``.

What Cline sends is not always the stored history (read from Cline 3.89.2, ``ContextManager``
``getNewContextMessagesAndMetadata``): near the context window it sends the first two messages
and a later slice (``conversationHistoryDeletedRange``), with a truncation notice in place of the
first reply's text, and it replaces earlier reads of a file with a notice; both edits are kept in
``context_history.json`` beside the history, each stamped with a time. A call made after the first
edit (its reply's ``ts`` later than the edit's; every call when the replies carry no ``ts``) is
rejected with that reason: its prompt is not the stored history, and the edits are not rebuilt.
Roo Code condenses and truncates by marking the stored messages instead (``isSummary``,
``isTruncationMarker``, ``condenseParent``, ``truncationParent``) and sends a filtered view: in
a history it marked, each call is prompted with that view (:mod:`treeprep.formats._roo_view`:
from the last summary on, consecutive user messages as one; the first call from a summary is a
``compaction`` branch), and a call whose view holds a truncation marker is rejected with the
reason; its summaries and markers are not trained. A reply Cline
stored with ``[Response interrupted by user]`` (or ``by API Error``) appended was cut, and
``Failure: I did not provide a response.`` is Cline's text for an empty one: neither call is
trained, and both stay in the later prompts as Cline sends them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import make_call, system_message, type_name
from treeprep.formats._read import document
from treeprep.formats._roo_view import Views, roo_marked
from treeprep.formats.anthropic import assistant_message, user_messages
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io import reads
from treeprep.schemas import Reject

NAME = "cline"
FILE = "api_conversation_history.json"
#: Cline's record of the edits it makes to the history it sends
CONTEXT = "context_history.json"
#: what Cline appends to a reply the user or an API error cut
_INTERRUPTED = ("[Response interrupted by user]", "[Response interrupted by API Error]")
#: what Cline stores in place of an empty reply
_NO_REPLY = "Failure: I did not provide a response."


def sniff(path: str, head: bytes) -> bool:
    h = head.lstrip()
    return os.path.basename(path).startswith(FILE) and h[:1] == b"[" and b'"role"' in h[:4096]


def _model(m: dict[str, Any]) -> str | None:
    info = m.get("modelInfo")
    v = info.get("modelId") if isinstance(info, dict) else None
    return v if isinstance(v, str) and v else None


def _call(
    path: str,
    line: int,
    task: str,
    k: int,
    prompt: list[Any],
    reply: Any,
    model: Any,
    opts: ReadOptions,
    branch: str | None = None,
) -> Item:
    """The task's k-th call (1-based), prompted with the history before it."""
    fields = {
        "group_id": task, "call_id": f"{task}#{k - 1}",
        "parent_call_id": f"{task}#{k - 2}" if k > 1 else None, "branch_reason": branch,
        "model": model, "messages": list(prompt), "completion": reply, "tools": opts.tools,
        "provenance": {"exact_messages": False, "reconstructed": True},
        # its OpenAI-compatible providers: JSON.stringify(toolMessage.input)
        "arguments_json": "javascript",
        "source_file": path, "source_line": line, "source_format": NAME,
    }  # fmt: skip
    return make_call(fields, file=path, line=line, fmt=NAME)


def _edit_times(path: str) -> list[float]:
    """The times (ms) of the edits in ``context_history.json`` beside ``path`` (none when it is
    absent): ``[[message, [kind, [[block, [[ts, "text", [text], meta], ...]], ...]]], ...]``."""
    beside = os.path.join(os.path.dirname(path), CONTEXT)
    if not reads.isfile(beside):  # recorded: a context_history.json that appears is a change
        return []
    value = document(beside).value
    times: list[float] = []
    try:
        for entry in value:
            for _block, updates in entry[1][1]:
                times.extend(float(u[0]) for u in updates)
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise InputError(
            beside, 1, f"expected Cline's context history ([[message, [kind, [[block, "
            f"[[ts, type, [text], meta]]]]]]]), not read: {e}"
        ) from None  # fmt: skip
    return times


def _unsent(m: dict[str, Any], first_edit: float | None) -> str | None:
    """Why the stored history before reply ``m`` is not the prompt Cline sent (None: it is)."""
    ts = m.get("ts")
    if first_edit is not None and (not isinstance(ts, int | float) or first_edit < ts):
        return (
            f"Cline edited the history it sent before this call ({CONTEXT}: a truncation "
            f"notice or file reads replaced, from ts {first_edit:.0f}): the prompt is not the "
            "stored history, and the edits are not rebuilt"
        )
    return None


def _cut(m: dict[str, Any]) -> str | None:
    """Why a stored reply is not what the model said (None: it is)."""
    if m.get("isSummary") or m.get("isTruncationMarker"):
        return (
            "Roo Code wrote this message (a summary from its condense call, whose prompt is not "
            "stored, or a truncation notice), not the model in reply to the history: not trained"
        )
    content = m.get("content")
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        content = texts[-1] if texts else None
    last = content if isinstance(content, str) else ""
    if last.strip() == _NO_REPLY:
        return f"Cline stored {_NO_REPLY!r} in place of an empty reply: no reply to train"
    for note in _INTERRUPTED:
        if last.endswith(note):
            return f"the reply was cut: Cline appended {note!r} to it"
    return None


class _RooPrompts:
    """The prompts of a history Roo Code marked (:mod:`treeprep.formats._roo_view`): each call's
    view converted, the messages it shares with the last call's view not converted again."""

    def __init__(self, history: list[Any], system: list[dict[str, Any]]) -> None:
        self.views = Views(history)
        self.system = system
        self.start: int | None = None  # the view start of the last call made
        self.out = list(system)  # the last prompt
        self.ends: list[int] = []  # where each of the last view's messages ends in it

    def prompt(self, i: int) -> tuple[list[dict[str, Any]] | str, str | None]:
        """(the prompt of the call answered by stored message ``i``, or why it is not known;
        ``compaction`` for the first call from a new summary)."""
        view = self.views.at(i)
        if isinstance(view, str):
            return view, None
        hint = "compaction" if view.start and view.start != self.start else None
        self.start, kept = view.start, view.kept  # a message that does not convert ends the reading
        del self.out[self.ends[kept - 1] if kept else len(self.system) :]
        del self.ends[kept:]
        for held, m in view.messages[kept:]:
            where = f"[{held[0]}].content"
            if m.get("role") == "user":
                self.out.extend(user_messages(m.get("content"), where))
            else:
                self.out.append(assistant_message(m.get("content"), where))
            self.ends.append(len(self.out))
        return list(self.out), hint


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    parsed = document(path)
    history = parsed.value
    if not isinstance(history, list):
        raise InputError(path, 1, f"expected a JSON array of messages, got {type_name(history)}")
    lines = parsed.element_lines(len(history))
    task = os.path.basename(os.path.dirname(os.path.abspath(path)))
    prompt: list[dict[str, Any]] = system_message(opts.system_prompt)
    roo = _RooPrompts(history, list(prompt)) if roo_marked(history) else None
    k = 0
    broken: str | None = None  # why the history stops being usable
    times = _edit_times(path)
    first_edit = min(times) if times else None
    for i, m in enumerate(history):
        where = f"[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        cid = f"{task}#{k}"
        try:
            if broken is not None:
                if role == "assistant":
                    k += 1
                    yield Reject(file=path, line=lines[i], format=NAME, call_id=cid, reason=broken)
                continue
            if role == "user":
                prompt.extend(user_messages(m.get("content"), f"{where}.content"))
                continue
            if role != "assistant":
                raise RecordError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")
            reply = assistant_message(m.get("content"), f"{where}.content")
            sent_prompt, hint = roo.prompt(i) if roo is not None else (prompt, None)
        except RecordError as e:
            broken = f"{e} (the prompts after it would miss it)"
            yield Reject(file=path, line=lines[i], format=NAME, reason=str(e))
            continue
        k += 1
        why = sent_prompt if isinstance(sent_prompt, str) else None
        why = why or _unsent(m, first_edit) or _cut(m)
        if why is None and not isinstance(sent_prompt, str):
            yield _call(path, lines[i], task, k, sent_prompt, reply, _model(m), opts, hint)
        else:
            yield Reject(file=path, line=lines[i], format=NAME, call_id=cid, reason=why)
        prompt.append(reply)


#: the files Cline (and Roo Code) keep beside a task's history: the context edits (read), the UI's
#: messages, the task's metadata and settings (nothing a prompt holds that the history does not)
_BESIDE = frozenset(
    {CONTEXT, "ui_messages.json", "task_metadata.json", "settings.json", "history_item.json"}
)


def companion(path: str) -> bool:
    """A file Cline keeps beside a task's history: accounted for with the task, not a log of no
    known format."""
    folder = os.path.dirname(path) or "."
    return os.path.basename(path) in _BESIDE and os.path.isfile(os.path.join(folder, FILE))


SESSION_NAME = "cline-session"
#: a Cline 4 session's transcript (``<id>.messages.json``), its manifest and compaction state
_SESSION = ".messages.json"
_SESSION_BESIDE = (".compaction.json", ".json")
_SESSION_KEYS = (
    re.compile(rb'"version"\s*:\s*1\b'),
    re.compile(rb'"agent"\s*:\s*"(?:lead|subagent|teammate)"'),
    re.compile(rb'"sessionId"\s*:\s*"'),
)


def sniff_session(path: str, head: bytes) -> bool:
    """A Cline 4 session transcript: ``<id>.messages.json``, an object with ``version`` 1, the
    ``agent`` that wrote it and the ``sessionId`` (before the chat-list formats, which would take
    its ``messages``)."""
    h = head.lstrip()
    return path.endswith(_SESSION) and h[:1] == b"{" and all(k.search(h) for k in _SESSION_KEYS)


def read_session(path: str, opts: ReadOptions) -> Iterator[Item]:
    """Refuses a Cline 4 session transcript as a whole (read from Cline 4.1.13, ``@cline/core``
    ``MessageBuilder.buildForApi`` and the session store): the requests are rebuilt from it at
    send time in ways it does not record."""
    why = (
        "a Cline 4 session transcript is not the requests Cline sent: it stores no tool schemas, "
        "its system prompt lacks the rules Cline appends when sending, and each request is "
        "rebuilt from it at send time (the <user_input> wrappers removed, tool results cut to "
        "8,000 characters, superseded file reads replaced, compaction applied), which it does not "
        "record, so its prompts cannot be rebuilt; log the requests through a proxy (openai-chat "
        "or anthropic logs), or build Cline 3 task folders (api_conversation_history.json)"
    )
    raise InputError(path, 1, why)
    yield  # a generator, like every reader


def session_companion(path: str) -> bool:
    """A Cline 4 session's manifest (``<id>.json``) or compaction state (``<id>.compaction.json``)
    beside its transcript."""
    folder, name = os.path.split(path)
    for suffix in _SESSION_BESIDE:
        if name.endswith(suffix) and not name.endswith(_SESSION):
            stem = name[: -len(suffix)]
            return os.path.isfile(os.path.join(folder or ".", stem + _SESSION))
    return False


FORMATS = [
    FormatSpec(name=NAME, sniff=sniff, read=read, priority=26, companion=companion),
    FormatSpec(
        name=SESSION_NAME,
        sniff=sniff_session,
        read=read_session,
        priority=27,
        companion=session_companion,
    ),
]
FORMAT = FORMATS[0]
__all__ = ["FORMAT", "FORMATS", "NAME", "SESSION_NAME"]
