"""OpenHands V1 event streams (the software-agent-sdk's ``events.jsonl``: one event per line).

Every event has ``id``, ``timestamp``, ``source`` (``agent``, ``user``, ``environment``) and
``kind``. The events the LLM sees, and how the SDK turns them into chat messages:

* ``SystemPromptEvent``: ``system_prompt`` (a text part, with an optional ``dynamic_context``
  part after it: one system message of two parts) and ``tools`` (OpenAI function tools; newer
  SDKs write bare ``{name, description, parameters}`` definitions, wrapped here);
* ``MessageEvent``: ``llm_message`` (``role``, ``content`` parts, optional reasoning), a user
  turn or an agent reply, with the agent context's ``extended_content`` parts after its own (a
  triggered skill's knowledge: ``MessageEvent.to_llm_message``).

A message of several text parts stays parts, which the server joins (``--server``); the SDK's
string serializer, for models without function calling, caching or vision, joins them with a
newline itself, as vLLM does. A part that is not text (an image) is refused by the renderer.
* ``ActionEvent``: one tool call of the agent (``tool_call`` with ``id``, ``name``,
  ``arguments``), with the response's ``thought`` parts and ``reasoning_content``; the actions of
  one LLM response share ``llm_response_id`` and form one assistant message (parallel calls);
* ``ObservationEvent``, ``UserRejectObservation``, ``AgentErrorEvent``: the result of a tool call
  (``tool_call_id``), a ``tool`` message;
* ``Condensation``: ``forgotten_event_ids`` leave the history, and ``summary`` enters it as a user
  message at ``summary_offset`` (the history after it is a new branch: ``compaction``).

State updates, pauses and other events never reach the LLM and are not records. Each LLM response
(an ``llm_response_id`` group of actions, or an agent ``MessageEvent``) is one :class:`ChatCall`
whose prompt is the history before it; its timestamp is the first action's.

A stream often starts mid-conversation (the SDK's own test fixture holds two actions and their
observations, but no system prompt and no user message). The prompt is then not what the agent saw,
so such calls are rejected with the reason, never rebuilt by guessing: no ``SystemPromptEvent``
before the call (and no ``--system-prompt``), no user message before it, or a tool result whose
call is not in the stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._fields import (
    chat_content,
    expect,
    make_call,
    one_of,
    opt_dict,
    opt_list,
    opt_str,
    type_name,
)
from treeprep.formats._read import head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "openhands-events"
_SOURCES = frozenset({"agent", "user", "environment"})
_RESULTS = frozenset({"ObservationEvent", "UserRejectObservation", "AgentErrorEvent"})


def _is_event(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("kind"), str)
        and one_of(obj.get("source"), _SOURCES)
        and isinstance(obj.get("id"), str)
        and isinstance(obj.get("timestamp"), str)
    )


def sniff(path: str, head: bytes) -> bool:
    objs = head_json_objects(head)
    return bool(objs) and all(_is_event(o) for o in objs[:5])


def _content(*values: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content from the SDK's content values (each a string, a part or an array of
    parts; null: none), in order: the text of one text part, else the parts as the SDK's
    ``Message`` holds them, which the server joins (``--server``; the SDK's string serializer
    joins them with a newline, as vLLM does). A part that is not text stays a part: the renderer
    refuses it by name rather than drop it."""
    what = "a string, a text part or an array of parts"
    parts: list[dict[str, Any]] = []
    for value in values:
        if value is None:
            continue
        expect(value, where, str, dict, list, what=what)
        items = [value] if isinstance(value, str | dict) else value
        for i, p in enumerate(items):
            at = f"{where}[{i}]" if isinstance(value, list) else where
            if isinstance(p, str):
                parts.append({"type": "text", "text": p})
            elif isinstance(p, dict):
                kind = p.get("type", "text")
                if kind == "text":
                    parts.append(
                        {"type": "text", "text": opt_str(p.get("text"), f"{at}.text") or ""}
                    )
                else:
                    parts.append({"type": str(kind)})
            else:
                raise RecordError(f"{at}: expected a content part, got {type_name(p)}")
    return chat_content(parts) if parts else ""


def _tool(t: Any) -> dict[str, Any] | None:
    if not isinstance(t, dict):
        return None
    if t.get("type") == "function" and isinstance(t.get("function"), dict):
        return t
    if isinstance(t.get("name"), str):
        fn = {"name": t["name"], "description": t.get("description") or ""}
        if isinstance(t.get("parameters"), dict):
            fn["parameters"] = t["parameters"]
        return {"type": "function", "function": fn}
    return None


def _result(ev: dict[str, Any]) -> dict[str, Any]:
    if ev["kind"] == "ObservationEvent":
        obs = opt_dict(ev.get("observation"), "observation")
        content = _content(obs.get("content"), where="observation.content")
    elif ev["kind"] == "UserRejectObservation":
        content = str(ev.get("rejection_reason") or "Action rejected by the user.")
    else:
        content = str(ev.get("error") or "")
    return {"role": "tool", "tool_call_id": str(ev.get("tool_call_id")), "content": content}


def _assistant(actions: list[dict[str, Any]]) -> dict[str, Any]:
    first = actions[0]
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": _content(first.get("thought"), where="thought"),
    }
    if isinstance(first.get("reasoning_content"), str) and first["reasoning_content"]:
        msg["reasoning_content"] = first["reasoning_content"]
    calls = []
    for a in actions:
        tc = opt_dict(a.get("tool_call"), "tool_call")
        calls.append(
            {
                "id": str(tc.get("id") or a.get("tool_call_id")),
                "type": "function",
                "function": {
                    "name": str(tc.get("name") or a.get("tool_name") or ""),
                    "arguments": tc.get("arguments") if tc.get("arguments") is not None else "{}",
                },
            }
        )
    msg["tool_calls"] = calls
    return msg


def _llm_message(ev: dict[str, Any]) -> dict[str, Any]:
    lm = opt_dict(ev.get("llm_message"), "llm_message")
    role = lm.get("role") if lm.get("role") in ("user", "assistant", "system") else "user"
    # MessageEvent.to_llm_message: the message's content, then the agent context's additions
    # (a skill's knowledge triggered by the user's words)
    extended = opt_list(ev.get("extended_content"), "extended_content")
    msg: dict[str, Any] = {
        "role": role,
        "content": _content(lm.get("content"), extended or None, where="llm_message.content"),
    }
    if isinstance(lm.get("reasoning_content"), str) and lm["reasoning_content"]:
        msg["reasoning_content"] = lm["reasoning_content"]
    return msg


class _Stream:
    """The history as the agent's LLM saw it, event by event."""

    def __init__(self) -> None:
        #: the chat messages, and the id of the event each came from (kept in step: a call's
        #: prompt is the messages as they are, not a list rebuilt from pairs per call)
        self.msgs: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.system: dict[str, Any] | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.call_ids: set[str] = set()
        self.problems: list[str] = []
        self.condensed = False

    def messages(self) -> list[dict[str, Any]]:
        """The history's chat messages (the list itself: copy what you keep)."""
        return self.msgs

    def add(self, event_id: str, msg: dict[str, Any]) -> None:
        self.ids.append(event_id)
        self.msgs.append(msg)

    def add_result(self, line: int, ev: dict[str, Any]) -> None:
        msg = _result(ev)
        if msg["tool_call_id"] not in self.call_ids:
            self.problems.append(
                f"line {line} holds the result of tool call {msg['tool_call_id']!r}, whose call "
                "is not in the stream"
            )
            return
        self.add(ev["id"], msg)

    def condense(self, ev: dict[str, Any]) -> None:
        ids = opt_list(ev.get("forgotten_event_ids"), "forgotten_event_ids")
        forgotten = {expect(x, f"forgotten_event_ids[{i}]", str) for i, x in enumerate(ids)}
        kept = [k for k, i in enumerate(self.ids) if i not in forgotten]
        self.ids = [self.ids[k] for k in kept]
        self.msgs = [self.msgs[k] for k in kept]
        if isinstance(ev.get("summary"), str):
            at = ev.get("summary_offset")
            at = at if isinstance(at, int) and 0 <= at <= len(self.msgs) else len(self.msgs)
            self.ids.insert(at, ev["id"])
            self.msgs.insert(at, {"role": "user", "content": ev["summary"]})
        self.condensed = True

    def why_not(self, opts: ReadOptions) -> str | None:
        why = list(self.problems)
        if self.system is None and not opts.system_prompt:
            why.append(
                "no SystemPromptEvent before this call (the agent's system prompt and "
                "tools; pass --system-prompt and --tools to supply them)"
            )
        if not any(m["role"] == "user" for m in self.msgs):
            why.append("no user message before this call (the stream starts mid-conversation)")
        if not why:
            return None
        return "the agent's prompt cannot be rebuilt: " + "; ".join(why)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    events: list[tuple[int, dict[str, Any]]] = []
    for line, obj in records(path, NAME, objects=True):
        if isinstance(obj, Reject):
            yield obj
        elif not _is_event(obj):
            yield Reject(
                file=path,
                line=line,
                reason="expected an OpenHands event object (id, timestamp, source, kind)",
                format=NAME,
            )
        else:
            events.append((line, obj))
    s = _Stream()
    i = 0
    while i < len(events):
        line, ev = events[i]
        end = _group_end(events, i)
        try:
            item = _step(path, [e for _, e in events[i : end + 1]], line, s, opts)
        except RecordError as e:
            # this event cannot join the history: it is rejected, and so is every later call,
            # whose prompt would silently lack it
            yield Reject(file=path, line=line, reason=str(e), format=NAME)
            s.problems.append(f"line {line} is rejected ({e})")
            item = None
        if item is not None:
            yield item
        i = end + 1


def _group_end(events: list[tuple[int, dict[str, Any]]], i: int) -> int:
    """The index of the last event of the call that starts at ``i``: parallel tool calls are
    consecutive agent ActionEvents sharing one ``llm_response_id``."""
    ev = events[i][1]
    rid = ev.get("llm_response_id")
    if ev["kind"] != "ActionEvent" or ev.get("source") != "agent" or rid is None:
        return i
    while (
        i + 1 < len(events)
        and events[i + 1][1].get("kind") == "ActionEvent"
        and events[i + 1][1].get("llm_response_id") == rid
    ):
        i += 1
    return i


def _step(
    path: str, group: list[dict[str, Any]], line: int, s: _Stream, opts: ReadOptions
) -> Item | None:
    """Apply one event (or the actions of one response, ``group``) to the stream.

    Returns the call it completes (None if it is not a call). A misshapen event raises
    RecordError and leaves the stream as it was.
    """
    ev = group[0]
    kind = ev["kind"]
    item: Item | None = None
    if kind == "SystemPromptEvent":
        # SystemPromptEvent.to_llm_message: one system message of two parts
        prompt = _content(ev.get("system_prompt"), ev.get("dynamic_context"), where="system_prompt")
        system = {"role": "system", "content": prompt}
        tools = [_tool(t) for t in opt_list(ev.get("tools"), "tools")]
        s.system = system
        if any(t is None for t in tools):
            s.problems.append(f"line {line}: a tool definition of an unknown shape")
        s.tools = [t for t in tools if t is not None] or None
    elif kind == "ActionEvent" and ev.get("source") == "agent":
        completion = _assistant(group)
        item = _call(path, line, ev, completion, s, opts)
        s.add(ev["id"], completion)
        s.call_ids.update(tc["id"] for tc in completion["tool_calls"])
    elif kind == "MessageEvent":
        msg = _llm_message(ev)
        if ev.get("source") == "agent" and msg["role"] == "assistant":
            item = _call(path, line, ev, msg, s, opts)
        s.add(ev["id"], msg)
    elif kind in _RESULTS and ev.get("tool_call_id"):
        s.add_result(line, ev)
    elif kind == "Condensation":
        s.condense(ev)
    return item


def _call(
    path: str,
    line: int,
    ev: dict[str, Any],
    completion: dict[str, Any],
    s: _Stream,
    opts: ReadOptions,
) -> Item:
    call_id = str(ev.get("llm_response_id") or ev["id"])
    why = s.why_not(opts)
    if why is not None:
        return Reject(file=path, line=line, reason=why, format=NAME, call_id=call_id)
    system = (
        [s.system]
        if s.system is not None
        else ([{"role": "system", "content": opts.system_prompt}] if opts.system_prompt else [])
    )
    fields = {
        "call_id": call_id,
        "messages": [*system, *s.messages()],
        "tools": s.tools if s.tools is not None else opts.tools,
        "completion": completion,
        "provenance": {"exact_messages": False, "reconstructed": True},
        "branch_reason": "compaction" if s.condensed else None,
        "timestamp": ev.get("timestamp"),
        "source_file": path,
        "source_line": line,
        "source_format": NAME,
    }
    s.condensed = False
    return make_call(fields, file=path, line=line, fmt=NAME)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, group_by_folder=False, priority=26)
