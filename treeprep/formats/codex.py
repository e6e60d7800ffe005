"""``codex``: Codex CLI session rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Each line is ``{"timestamp", "type", "payload"}`` (codex-rs ``RolloutLine``/``RolloutItem``):

* ``session_meta``: the session ``id`` (the group), ``cwd``, ``cli_version`` and, in newer
  versions, ``base_instructions.text`` (the system prompt sent as ``instructions``);
* ``response_item``: one Responses API item exactly as sent or received: ``message`` (user,
  developer, assistant), ``reasoning``, ``function_call``/``function_call_output`` and the
  freeform ``custom_tool_call``/``custom_tool_call_output`` (``apply_patch``: its ``input`` is the
  raw text the model wrote, kept as the call's arguments string);
* ``turn_context`` (the ``model``), ``event_msg`` (UI events, duplicates of items): not prompt;
* ``compacted``: the history was replaced. With ``replacement_history`` the next prompts continue
  from it (the next call is hinted ``compaction``); without it (older versions summarised locally
  and the rebuilt history is not stored) later calls are rejected, since their prompt is unknown.

Codex sends the whole history on every request and appends to it, so each assistant turn (a
maximal run of ``reasoning``/``function_call``/``custom_tool_call``/hosted-tool/assistant
``message`` items) is one call whose prompt is every item before it. Items are converted by the
``openai-responses`` adapter (:func:`treeprep.formats.openai_responses.segments`).

Hosted tools render as tool calls (:func:`_as_responses_item`): ``web_search_call`` as
``web_search`` with its ``action`` as the arguments, ``local_shell_call`` as ``local_shell`` with
its ``action`` (its ``local_shell_call_output`` is the tool result), ``image_generation_call`` as
``image_generation`` with its ``revised_prompt`` (the image itself has no text form). A call the
server runs (web search, image generation) ends the call it is in: the model's text after it was
written after the call's results, so it belongs to the next call, whose prompt holds the hosted
call and a tool turn ``(results not logged)`` in place of the results (:data:`NOT_LOGGED`), the
nearest the log allows to what the model saw. ``[reasoning, web_search_call, reasoning, message,
function_call x3]`` is two calls: think and search; then think, say and call. Encrypted
``compaction`` items reject every call whose prompt or completion
holds them, naming the item and line; ``ghost_snapshot`` items are harness bookkeeping that Codex
never sends and are skipped.

The user turn: some rollouts (Codex Desktop) keep a user's message only as an ``event_msg``
``user_message``. When no ``message`` item of the user holds that text before the next assistant
turn, it is rebuilt as a user message at the event's place; a call whose prompt still has no user
turn is rejected. Tool schemas: ``--tools``, else ``session_meta.dynamic_tools`` (``name``,
``description``, ``input_schema``); Codex's built-in tools are not stored.

Cost: a session's history is converted to chat messages once
(:class:`~treeprep.formats._history.ConvertedHistory`), each call converting only the items its
history gained since the last call, and the messages are the same dicts call after call, so
:func:`~treeprep.formats._fields.make_call` validates each once and the renderer knows the
history by identity. Converting and validating every call's whole history
made a build quadratic in the session: 800 generated turns took 34.8 CPU-seconds, 15.4x the
time of 200 turns; now 1.9 s, 5.2x (``bench/session_scaling.py --formats codex``).

Sub-agents (:func:`_spawn_link`). A rollout whose ``session_meta.source.subagent.thread_spawn``
names a ``parent_thread_id`` was spawned by another thread's ``spawn_agent`` call (codex-rs
``multi_agents/spawn.rs``: the call's output is ``{"agent_id": <the new thread id>, ...}``). The
parent's rollout is looked for by its file name (``rollout-...-<id>.jsonl``) in the same folder,
then anywhere under the sessions root (``YYYY/MM/DD`` folders). The sub-agent's calls join the
tree of the parent's root thread, with the sub-agent's thread id as ``agent_id``, ``sub-agent`` on
the first call and, as its ``parent_call_id``, the parent's call that made the ``spawn_agent``
call. A parent rollout that is absent, or holds no such call, still puts the calls in the
parent's tree (named by its thread id), with no parent call.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
from pydantic import ValidationError

from treeprep.formats._fields import make_call, one_of, system_message
from treeprep.formats._history import Converted, ConvertedHistory
from treeprep.formats._read import records
from treeprep.formats._sniff import first_record
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import RecordError, validation_reason
from treeprep.formats.openai_responses import segments, turn_item
from treeprep.io import reads
from treeprep.schemas import ChatCall, Reject

NAME = "codex"
_LINE_TYPES = {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
_HOSTED = {"web_search_call", "local_shell_call", "image_generation_call"}
#: hosted calls the server runs mid-response, whose results the rollout does not hold
_SERVER_RUN = {"web_search_call", "image_generation_call"}
#: the tool turn that stands for a server-run call's results in later prompts
NOT_LOGGED = "(results not logged)"
_ASSISTANT = {"reasoning", "function_call", "custom_tool_call", *_HOSTED}
_UNSUPPORTED = {"compaction", "compaction_summary"}
_SKIP = {"ghost_snapshot"}


def sniff(path: str, head: bytes) -> bool:
    rec = first_record(path, head)
    return (
        isinstance(rec, dict)
        and one_of(rec.get("type"), _LINE_TYPES)
        and isinstance(rec.get("payload"), dict)
        and "timestamp" in rec
    )


def _is_assistant(it: dict[str, Any]) -> bool:
    t = it.get("type")
    return one_of(t, _ASSISTANT) or (t == "message" and it.get("role") == "assistant")


def _hosted_id(it: dict[str, Any], line: int) -> str:
    return str(it.get("call_id") or it.get("id") or f"{it.get('type')}@{line}")


def _hosted_call(it: dict[str, Any], line: int) -> dict[str, Any]:
    """A hosted tool item as a function call: its name, and what the model asked for."""
    t = str(it.get("type"))
    cid = _hosted_id(it, line)
    if t == "image_generation_call":
        args: Any = {"prompt": it.get("revised_prompt") or ""}
    else:
        args = it.get("action") if isinstance(it.get("action"), dict) else {}
    return {
        "type": "function_call",
        "call_id": cid,
        "name": t.removesuffix("_call"),
        "arguments": args,
    }


def _as_responses_item(it: dict[str, Any], line: int = 0) -> dict[str, Any]:
    """Freeform custom tool calls as function calls (their raw input is the arguments string),
    hosted tool items as function calls (:func:`_hosted_call`), their outputs as tool results."""
    t = it.get("type")
    if one_of(t, _HOSTED):
        return _hosted_call(it, line)
    if t == "local_shell_call_output":
        return {
            "type": "function_call_output",
            "call_id": it.get("call_id") or it.get("id"),
            "output": it.get("output"),
        }
    if t == "custom_tool_call":
        return {
            "type": "function_call",
            "call_id": it.get("call_id"),
            "name": it.get("name"),
            "arguments": it.get("input", ""),
        }
    if t == "custom_tool_call_output":
        return {
            "type": "function_call_output",
            "call_id": it.get("call_id"),
            "output": it.get("output"),
        }
    return it


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _input_text(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def _dynamic_tools(meta: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``session_meta.dynamic_tools`` ({name, description, input_schema}) as chat tool schemas."""
    specs = meta.get("dynamic_tools")
    if not isinstance(specs, list):
        return None
    out = []
    for t in specs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            continue
        fn: dict[str, Any] = {"name": t["name"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        schema = t.get("input_schema", t.get("inputSchema", t.get("parameters")))
        if isinstance(schema, dict):
            fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out or None


class _Unsupported(RecordError):
    """An item that has no chat form, in a call's prompt or completion."""

    def __init__(self, line: int, typ: Any) -> None:
        super().__init__(
            f"line {line}: {typ} item (a hosted tool or encrypted state that has no chat form), "
            "so the prompt or completion cannot be rendered"
        )


def _first_unsupported(entries: list[tuple[int, dict[str, Any]]]) -> _Unsupported | None:
    """The first item of ``entries`` that has no chat form, as the error naming it."""
    for no, it in entries:
        if one_of(it.get("type"), _UNSUPPORTED):
            return _Unsupported(no, it.get("type"))
    return None


def _convert(entries: list[tuple[int, dict[str, Any]]], start: int) -> Converted:
    """History entries as chat messages; the assistant turn they end with may go on. An entry
    with no chat form is found before any is converted (its error comes first, as it names the
    first such item of the prompt or completion: entries converted before hold none)."""
    bad = _first_unsupported(entries)
    if bad is not None:
        raise bad
    items = [_as_responses_item(it, no) for no, it in entries]
    segs = segments(items, "history", start=start)
    tail = len(items)
    while tail and turn_item(items[tail - 1]):
        tail -= 1
    open_entries = len(items) - tail
    return Converted([s.message for s in segs], open_entries, 1 if open_entries else 0)


class _Session:
    def __init__(self, path: str, opts: ReadOptions) -> None:
        self.path = path
        self.opts = opts
        self.gid = os.path.basename(path)
        self.sid = self.gid  # this thread's id: names its calls (gid: the root thread's)
        self.agent = "main"
        self.spawned_by: str | None = None  # the parent's call that spawned this thread
        self.system: str | None = opts.system_prompt
        self.model: str | None = None
        self.effort: str | None = None  # the turn context's reasoning effort
        #: the model and effort of the turn in progress (the context when its first item came:
        #: the next turn's turn_context line comes before the item that ends this one)
        self.turn_context: tuple[str | None, str | None] = (None, None)
        self.project: str | None = None  # session_meta.cwd, for --project
        self.timestamp: str | None = None  # the latest line's, for --since/--until and the date
        self.history: list[tuple[int, dict[str, Any]]] = []
        self.turn: list[tuple[int, dict[str, Any]]] = []
        self.lost: int | None = None  # line of a compaction whose new history is not stored
        self.hint: str | None = None
        self.k = 0
        self.tools: list[dict[str, Any]] | None = None
        #: event_msg user_message texts since the last assistant turn: (line, text)
        self.user_events: list[tuple[int, str]] = []
        #: texts of the user message items since the last assistant turn
        self.user_texts: list[str] = []
        #: the history's chat messages, converted once (module docstring, Cost)
        self.converted: ConvertedHistory[tuple[int, dict[str, Any]]] = ConvertedHistory(_convert)

    def add(self, no: int, it: dict[str, Any]) -> Iterator[Item]:
        """One response item: an assistant item joins the turn, any other closes it."""
        if not _is_assistant(it):
            yield from self.flush()
            self.history.append((no, it))
            if it.get("type") == "message" and it.get("role") == "user":
                self.user_texts.append(_text_of(it.get("content")))
            return
        if not self.turn:
            self._rebuild_user_turns()
            self.turn_context = (self.model, self.effort)
        self.turn.append((no, it))
        if one_of(it.get("type"), _SERVER_RUN):  # the text after it saw its results
            yield from self.flush()
            out = {"type": "function_call_output", "call_id": _hosted_id(it, no)}
            self.history.append((no, {**out, "output": NOT_LOGGED}))

    def _rebuild_user_turns(self) -> None:
        """User messages logged only as event_msg user_message, put back at their place."""
        for no, text in self.user_events:
            if any(text.strip() in t for t in self.user_texts):
                continue
            item = {"type": "message", "role": "user", "content": [_input_text(text)]}
            at = next((i for i, (n, _) in enumerate(self.history) if n > no), len(self.history))
            self.history.insert(at, (no, item))
        self.user_events, self.user_texts = [], []

    def flush(self) -> Iterator[Item]:
        if not self.turn:
            return
        turn, self.turn = self.turn, []
        line = turn[0][0]
        call_id = f"{self.sid}#{self.k}"
        self.k += 1
        hint, self.hint = self.hint, None
        if self.k == 1 and self.agent != "main":
            hint = hint or "sub-agent"
        try:
            yield self._call(turn, line, call_id, hint)
        except RecordError as e:
            yield Reject(file=self.path, line=line, reason=str(e), format=NAME, call_id=call_id)
        self.history.extend(turn)

    def _call(
        self, turn: list[tuple[int, dict[str, Any]]], line: int, call_id: str, hint: str | None
    ) -> ChatCall:
        if self.lost is not None:
            raise RecordError(
                f"the history was compacted at line {self.lost} without a stored "
                "replacement_history, so this call's prompt is unknown"
            )
        bad = _first_unsupported(turn)
        try:
            history = self.converted.update(self.history)
        except _Unsupported:
            raise
        except RecordError:
            if bad is not None:  # an item with no chat form is named before any other fault
                raise bad from None
            raise
        if bad is not None:
            raise bad
        if not self.converted.roles["user"]:
            raise RecordError(
                "the call's prompt has no user turn (no user message item and no event_msg "
                "user_message before it)"
            )
        done = segments([_as_responses_item(it, no) for no, it in turn], f"line {line}")
        fields = {
            "group_id": self.gid,
            "agent_id": self.agent,
            "call_id": call_id,
            "parent_call_id": f"{self.sid}#{self.k - 2}" if self.k > 1 else self.spawned_by,
            "model": self.turn_context[0],
            "reasoning_effort": self.turn_context[1],
            "timestamp": self.timestamp,
            "project": self.project,
            "messages": [*system_message(self.system), *history],
            "tools": self.opts.tools if self.opts.tools is not None else self.tools,
            "completion": done[0].message,
            "provenance": {"exact_messages": True, "reconstructed": True},
            "branch_reason": hint,
            "source_file": self.path,
            "source_line": line,
            "source_format": NAME,
        }
        call = make_call(fields, file=self.path, line=line, fmt=NAME)
        if isinstance(call, Reject):  # the reason as this reader has always worded it
            try:
                ChatCall.model_validate(fields)
            except ValidationError as e:
                raise RecordError(validation_reason(e)) from e
            raise RecordError(call.reason)
        return call


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    s = _Session(path, opts)
    for no, rec in records(path, NAME):
        if isinstance(rec, Reject):
            yield rec
            continue
        p = rec.get("payload") if isinstance(rec, dict) else None
        t = rec.get("type") if isinstance(rec, dict) else None
        if not one_of(t, _LINE_TYPES) or not isinstance(p, dict):
            yield Reject(
                file=path,
                line=no,
                format=NAME,
                reason="expected a rollout line {timestamp, type, payload} with type "
                f"{', '.join(sorted(_LINE_TYPES))}",
            )
            continue
        if t == "session_meta":
            meta: dict[str, Any] = p["meta"] if isinstance(p.get("meta"), dict) else p
            if isinstance(meta.get("id"), str) and s.k == 0 and s.sid == os.path.basename(path):
                s.gid = s.sid = meta["id"]  # the first session_meta: a fork copies its parent's
                parent = _parent_thread(meta)
                if parent is not None:
                    s.agent = s.sid
                    s.gid, s.spawned_by = _spawn_link(path, parent, s.sid, opts)
            if isinstance(meta.get("cwd"), str):
                s.project = meta["cwd"]
            s.tools = _dynamic_tools(meta) or s.tools
            base = meta.get("base_instructions")
            if opts.system_prompt is None and isinstance(base, dict) and base.get("text"):
                s.system = str(base["text"])
        elif t == "event_msg" and p.get("type") == "user_message":
            if isinstance(p.get("message"), str) and p["message"].strip():
                s.user_events.append((no, p["message"]))
        elif t == "turn_context":
            if isinstance(p.get("model"), str):
                s.model = p["model"]
            s.effort = p["effort"] if isinstance(p.get("effort"), str) else None
        elif t == "compacted":
            yield from s.flush()
            new = p.get("replacement_history")
            if isinstance(new, list):
                s.history = [(no, it) for it in new if isinstance(it, dict)]
                s.lost = None
                s.hint = "compaction"
            else:
                s.lost = no
        elif t == "response_item":
            if not one_of(p.get("type"), _SKIP):
                yield from s.add(no, p)  # may end the turn before: its calls take the older time
            if isinstance(rec.get("timestamp"), str):
                s.timestamp = rec["timestamp"]
    yield from s.flush()


def _parent_thread(meta: dict[str, Any]) -> str | None:
    """``source.subagent.thread_spawn.parent_thread_id`` (either spelling), or None."""
    src = meta.get("source")
    sub = (src.get("subagent") or src.get("subAgent")) if isinstance(src, dict) else None
    spawn = (sub.get("thread_spawn") or sub.get("threadSpawn")) if isinstance(sub, dict) else None
    parent = spawn.get("parent_thread_id") if isinstance(spawn, dict) else None
    return parent if isinstance(parent, str) and parent else None


#: how many spawn levels are followed up to a root thread
_MAX_DEPTH = 8


def _rollout_of(path: str, thread: str) -> str | None:
    """The rollout file of ``thread``: in ``path``'s folder, else under its sessions root."""
    folder = os.path.dirname(path) or "."
    pattern = f"rollout-*{glob.escape(thread)}.jsonl*"
    found = reads.glob(os.path.join(glob.escape(folder), pattern))  # recorded: see reads
    parts = os.path.normpath(os.path.abspath(folder)).split(os.sep)
    if not found and len(parts) > 3 and all(p.isdigit() for p in parts[-3:]):
        root = os.sep.join(parts[:-3]) or os.sep
        found = reads.glob(os.path.join(glob.escape(root), "*", "*", "*", pattern))
    return found[0] if found else None


def _spawn_link(path: str, parent: str, me: str, opts: ReadOptions) -> tuple[str, str | None]:
    """(the root thread's id: the group, the parent's call that spawned ``me`` or None)."""
    depth = opts.codex_spawn_depth
    found = _rollout_of(path, parent) if depth < _MAX_DEPTH else None
    if found is None or os.path.abspath(found) == os.path.abspath(path):
        return parent, None
    spawn_call = None  # the call id of the parent's spawn_agent call whose output names ``me``
    for _, rec in records(found, NAME):
        p = rec.get("payload") if isinstance(rec, dict) else None
        if isinstance(p, dict) and p.get("type") == "function_call_output":
            out = p.get("output")
            try:
                value = orjson.loads(out) if isinstance(out, str) else out
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict) and value.get("agent_id") == me:
                spawn_call = p.get("call_id")
                break
    deeper = replace(opts, codex_spawn_depth=depth + 1)
    root, by = parent, None
    for item in read(found, deeper):
        if isinstance(item, ChatCall):
            root = item.group_id or root
            if spawn_call and any(tc.id == spawn_call for tc in item.completion.tool_calls or []):
                by = item.call_id
                break
    return root, by


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=22)
