"""``kimi-cli``: Kimi Code CLI sessions (``~/.kimi/sessions/<dir md5>/<session>/context.jsonl``).

Learnt from MoonshotAI/kimi-cli 1.49.0 (``soul/context.py``, ``soul/kimisoul.py``,
``soul/dynamic_injection.py``, ``subagents/store.py``; messages from its ``kosong`` package,
``kosong/message.py`` and ``chat_provider/kimi.py``). A session folder holds ``context.jsonl``,
the model's context as it grows, one line per record:

* ``{"role": "_system_prompt", "content"}`` (the first line since 1.21.0: the system prompt every
  call of the file was sent), ``{"role": "_checkpoint", "id"}`` and ``{"role": "_usage",
  "token_count"}``: markers, never sent;
* every other line a message dump: ``role`` (``user``, ``assistant``, ``tool``, ``system``),
  ``content`` (a string when it is one text part, else a list of ``text``, ``think`` (``think``,
  ``encrypted``), ``image_url``, ``audio_url``, ``video_url`` parts), ``tool_calls`` (``{type:
  "function", id, function: {name, arguments}, extras}``) and ``tool_call_id``.

Every assistant line is one call, and its prompt is the system prompt and every message before it
in the file, as kimi-cli's ``normalize_history`` sends them: consecutive user messages (a dynamic
injection after the user's turn) are one message of both contents, unless either is a
``<notification ...>``. The kimi provider sends an assistant's ``think`` parts back as its
``reasoning_content`` (joined with nothing between them; an empty one is sent too), and drops an
assistant's blank text beside tool calls. Text parts are joined by the renderer, with nothing
between them; an image, audio or video part is left for it to refuse by name.

``/clear``, a compaction and a D-Mail revert rename ``context.jsonl`` to ``context_<n>.jsonl`` and
start a new one: each file is read on its own, all of a folder's files in one tree (the group is the
session id). A compacted file opens with the summary (its first user message holds kimi-cli's
``Previous context has been compacted``) and the last messages it kept, copied: an assistant
message among those is history, no reply to this prompt, and is not a call (the copies end at the
first checkpoint after the file's first, where a step or turn begins). The file's first call is
hinted ``compaction``. A revert copies the lines before its checkpoint, replies to the same
prompts: those calls are in two files, and the build's cross-file dedup keeps one.
Sub-agents keep the same file in ``<session>/subagents/<agent id>/context.jsonl`` (with
``meta.json``: ``launch_spec.effective_model`` is the call's model): their calls join the session's
tree under their agent id, the first hinted ``sub-agent``.

What the session does not keep: the tool schemas (``--tools``), the model of the main agent (in
``config.toml``), and for files from before 1.21.0 the system prompt (``--system-prompt``). Calls
whose reply is lost (a step cancelled while its tools ran: a ``_usage`` line with no assistant
after it; retried attempts; the compaction call itself) are not in the file and not built.

Rejects: a line that is not JSON or a message that does not fit is one reject naming its line,
and every later call of the file is rejected with it (their prompts would miss it); so is a marker
this reader does not know (kimi-cli skips it on resume, but a later version may give it a meaning).
Detected by a first record that is a ``_system_prompt`` or ``_checkpoint`` marker, or, in a file
named ``context.jsonl`` (or a rotated one) that opens with a message, by a marker among its first
records.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    as_dict,
    chat_content,
    content_parts,
    expect,
    file_stem,
    make_call,
    openai_tool_calls,
    system_message,
    type_name,
)
from treeprep.formats._read import breaks_later, document, head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io import reads
from treeprep.schemas import Reject

NAME = "kimi-cli"
#: a session's context file, or one renamed by ``/clear``, a compaction or a revert
_CONTEXT = re.compile(r"context(_\d+)?\.jsonl")
_SUFFIXES = (".gz", ".zst", ".jsonl")
_MARKERS = ("_system_prompt", "_checkpoint", "_usage")
_ROLES = ("user", "assistant", "tool", "system")
_MEDIA = ("image_url", "audio_url", "video_url")
#: how a compaction's summary message opens (``soul/compaction.py``)
_COMPACTED = "<system>Previous context has been compacted."
_SUBAGENTS = "subagents"
_FILE = "context.jsonl"


def _marker(rec: dict[str, Any]) -> bool:
    """A ``_system_prompt``, ``_checkpoint`` or ``_usage`` line."""
    role = rec.get("role")
    if role == "_system_prompt":
        return isinstance(rec.get("content"), str)
    if role == "_checkpoint" or role == "_usage":
        return type(rec.get("id" if role == "_checkpoint" else "token_count")) is int
    return False


def sniff(path: str, head: bytes) -> bool:
    recs = head_json_objects(head)
    if not recs:
        return False
    if recs[0].get("role") in ("_system_prompt", "_checkpoint"):
        return _marker(recs[0])
    # a context file that opens with a message (a session of an older version): its name, every
    # record a role, and a marker among them
    named = _is_context(path)
    return named and all("role" in r for r in recs) and any(_marker(r) for r in recs)


def _is_context(path: str) -> bool:
    """Whether the file is named as a context file (``context.jsonl``, ``context_<n>.jsonl``)."""
    return _CONTEXT.fullmatch(file_stem(path, _SUFFIXES) + ".jsonl") is not None


# --------------------------------------------------------------------------------------------
# a message line -> a chat message
# --------------------------------------------------------------------------------------------


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of parts (kosong reads a string as one text part and null
    as none)."""
    if content is None:
        return []
    if isinstance(expect(content, where, str, list, what="a string or a list of parts"), str):
        return [{"type": "text", "text": content}]
    out: list[dict[str, Any]] = []
    for i, p in enumerate(content):
        at = f"{where}[{i}]"
        part = as_dict(p, at)
        kind = part.get("type")
        if kind == "text":
            out.append({"type": "text", "text": expect(part.get("text"), f"{at}.text", str)})
        elif kind == "think":
            out.append({"type": "think", "think": expect(part.get("think"), f"{at}.think", str)})
        elif kind in _MEDIA:
            out.append(part)  # not text: the renderer refuses it by name
        else:
            raise RecordError(f"{at}.type: expected text, think, {', '.join(_MEDIA)}, got {kind!r}")
    return out


def _assistant(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as the kimi provider sends it."""
    parts = _parts(m.get("content"), "content")
    think = [p["think"] for p in parts if p["type"] == "think"]
    rest = [p for p in parts if p["type"] != "think"]
    calls = openai_tool_calls(m.get("tool_calls"), "tool_calls")
    blank = all(p["type"] == "text" and not p["text"].strip() for p in rest)
    msg: dict[str, Any] = {"role": "assistant"}
    msg["content"] = None if calls and blank else chat_content(rest)
    if len(parts) != len(rest):
        msg["reasoning_content"] = "".join(think)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _message(m: dict[str, Any], role: str) -> dict[str, Any]:
    """A message line (of a role in ``_ROLES``) as the chat message kimi-cli sends."""
    if role == "assistant":
        return _assistant(m)
    parts = _parts(m.get("content"), "content")
    if any(p["type"] == "think" for p in parts):
        raise RecordError(f"content: a think part in a {role} message")
    msg: dict[str, Any] = {"role": role, "content": chat_content(parts)}
    if role == "tool":
        msg["tool_call_id"] = expect(m.get("tool_call_id"), "tool_call_id", str)
    return msg


def _notification(msg: dict[str, Any]) -> bool:
    """kimi-cli's ``is_notification_message``: a user message of one text part that opens with
    ``<notification ``."""
    c = msg["content"]
    return isinstance(c, str) and c.lstrip().startswith("<notification ")


def _append(history: list[dict[str, Any]], msg: dict[str, Any]) -> None:
    """``msg`` added to the history as ``normalize_history`` sends it: a user message after a
    user message is merged into it (a new dict: the last one may be another call's), unless
    either is a notification."""
    last = history[-1] if history else None
    if (
        last is not None
        and last["role"] == msg["role"] == "user"
        and not _notification(last)
        and not _notification(msg)
    ):
        both = [*content_parts(last["content"]), *content_parts(msg["content"])]
        history[-1] = {"role": "user", "content": both}
    else:
        history.append(msg)


# --------------------------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------------------------


def _where(path: str) -> tuple[str, str | None, str]:
    """(the session id, the sub-agent's id or None, the file's stem) of a context file: its
    folder names the session, or the sub-agent inside ``<session>/subagents/``; a file of the
    layout before the session folders (``<session id>.jsonl``) names it itself."""
    folder = os.path.dirname(os.path.abspath(path))
    stem = file_stem(path, _SUFFIXES)
    if not _is_context(path):
        return stem, None, stem
    up = os.path.dirname(folder)
    if os.path.basename(up) == _SUBAGENTS:
        return os.path.basename(os.path.dirname(up)), os.path.basename(folder), stem
    return os.path.basename(folder), None, stem


def _agent_model(path: str) -> str | None:
    """A sub-agent's model (``meta.json``: ``launch_spec.effective_model``), or None."""
    meta = os.path.join(os.path.dirname(path) or ".", "meta.json")
    if not reads.isfile(meta):
        return None
    try:
        value = document(meta).value
    except InputError:
        return None
    spec = value.get("launch_spec") if isinstance(value, dict) else None
    model = spec.get("effective_model") if isinstance(spec, dict) else None
    return model if isinstance(model, str) and model else None


class _Session:
    """One context file's calls, as its lines come."""

    def __init__(self, path: str, opts: ReadOptions) -> None:
        self.path, self.opts = path, opts
        self.session, self.agent, stem = _where(path)
        self.stem = f"{self.session}/{self.agent + '/' if self.agent else ''}{stem}"
        self.model = _agent_model(path) if self.agent else None
        self.system: str | None = None
        self.history: list[dict[str, Any]] = []
        self.k = 0
        #: a step or turn has begun since the file did (a checkpoint after the first)
        self.stepped = False

    def marker(self, rec: dict[str, Any], role: str) -> None:
        """A marker line: the system prompt is kept, the others checked."""
        if role == "_system_prompt":
            self.system = expect(rec.get("content"), "content", str)
        elif role == "_checkpoint" or role == "_usage":
            key = "id" if role == "_checkpoint" else "token_count"
            if type(rec.get(key)) is not int:
                raise RecordError(f"{key}: expected an integer, got {type_name(rec.get(key))}")
            if role == "_checkpoint":
                self.checkpoint(rec)
        else:
            raise RecordError(
                f"role: a marker this reader does not know ({role!r}; expected "
                f"{', '.join(_MARKERS)})"
            )

    def checkpoint(self, rec: dict[str, Any]) -> None:
        """A checkpoint after the file's first: a step or a turn begins (the copies a compaction
        kept end)."""
        self.stepped = self.stepped or (type(rec.get("id")) is int and rec["id"] > 0)

    def call(self, reply: dict[str, Any], line: int) -> Item:
        system = self.system if self.system is not None else self.opts.system_prompt
        first = self.k == 0
        hint = None
        if first and self.agent:
            hint = "sub-agent"
        elif first and self._compacted():
            hint = "compaction"
        fields = {
            "group_id": self.session, "trajectory_id": self.session,
            "agent_id": self.agent or "main",
            "call_id": f"{self.stem}#{self.k}",
            "parent_call_id": None if first else f"{self.stem}#{self.k - 1}",
            "model": self.model, "messages": [*system_message(system), *self.history],
            "completion": reply, "tools": self.opts.tools, "branch_reason": hint,
            "provenance": {"exact_messages": self.system is not None, "reconstructed": False},
            "source_file": self.path, "source_line": line, "source_format": NAME,
        }  # fmt: skip
        self.k += 1
        return make_call(fields, file=self.path, line=line, fmt=NAME)

    def copied(self) -> bool:
        """Whether an assistant line now is one a compaction kept (copied after the summary,
        before the next step began): history, not a reply to this prompt."""
        return not self.stepped and self._compacted()

    def _compacted(self) -> bool:
        """Whether the file's first user message is a compaction's summary."""
        first = next((m for m in self.history if m["role"] == "user"), None)
        return first is not None and any(
            p["type"] == "text" and p["text"].startswith(_COMPACTED)
            for p in content_parts(first["content"])
        )


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    s = _Session(path, opts)
    broken: str | None = None  # why the later calls cannot be built
    for line, rec in records(path, NAME, objects=True):
        if isinstance(rec, Reject):
            if broken is None:
                broken = breaks_later(line, rec.reason)
                yield rec
            continue
        role = rec.get("role")
        if broken is not None:
            if role == "_checkpoint":
                s.checkpoint(rec)  # a compaction's copies are no calls, after a bad line too
            elif role == "assistant" and not s.copied():
                yield Reject(file=path, line=line, reason=broken, format=NAME,
                             call_id=f"{s.stem}#{s.k}")  # fmt: skip
                s.k += 1
            continue
        try:
            if not isinstance(role, str):
                raise RecordError(f"role: expected a string, got {type_name(role)}")
            if role.startswith("_"):
                s.marker(rec, role)
                continue
            if role not in _ROLES:
                raise RecordError(f"role: expected {', '.join(_ROLES)}, got {role!r}")
            msg = _message(rec, role)
        except RecordError as e:
            broken = breaks_later(line, e)
            yield Reject(file=path, line=line, reason=str(e), format=NAME)
            continue
        if role == "assistant":
            if not s.copied():
                yield s.call(msg, line)
            s.history.append(msg)
        else:
            _append(s.history, msg)


#: the files beside a context file: the UI's event log and the session's state (nothing a prompt
#: holds), a sub-agent's record (its model is read) and its prompt and output
_BESIDE = frozenset({"wire.jsonl", "state.json", "meta.json", "prompt.txt", "output"})


def companion(path: str) -> bool:
    """A file kimi-cli keeps beside a context file: accounted for with the session, not a log of
    no known format."""
    folder = os.path.dirname(path) or "."
    return os.path.basename(path) in _BESIDE and os.path.isfile(os.path.join(folder, _FILE))


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=30, companion=companion)
__all__ = ["FORMAT", "NAME"]
