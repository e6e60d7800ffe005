"""``copilot-cli``: GitHub Copilot CLI sessions (``~/.copilot/session-state/<id>/events.jsonl``).

Learnt from the ``@github/copilot`` npm package: the event schema of 1.0.102
(``schemas/session-events.schema.json``) and the replay of 1.0.60, the last release whose replay is
JavaScript (``Session.processEventForState``; from 1.0.89 on it runs in a native module whose
strings hold the same texts). A session is one JSON event per line, ``{type, data, id,
timestamp, parentId, ephemeral?, agentId?}``, appended as it goes; Copilot rebuilds the chat it
sends from them, live and on resume alike, and so does this reader:

* ``system.message``: the system prompt (the last one stands; a ``developer`` one is kept too);
* ``user.message``: a user message of ``transformedContent`` (what the model got: the date, the
  reminders) or else ``content``; ``system.notification``: a user message of its ``content``;
* ``assistant.message``: an assistant message (``reasoningText`` as its reasoning, its
  ``toolRequests`` as tool calls); the messages of one response share an ``apiCallId`` and are
  sent as one (their text joined, their calls in order, the first one's reasoning);
* ``tool.execution_complete``: a tool message of ``result.content`` (``detailedContent`` is for
  the screen), or the error's message; a result is moved next to its call, a second one for the
  same call left out;
* ``abort``, and a resume that was not active: every call without a result gets Copilot's
  "interrupted" result, and every earlier message loses its reasoning (sent back only within one
  run); so does a change of model (in auto mode, a response by another model than the last:
  Copilot resolves one per request and rewrites the history for it).

Every response of the main agent is one call: its prompt the system messages and the chat before
its first message, its completion the messages of its ``apiCallId``, its model the one they
name. Ephemeral events (streamed deltas) are passed over, as are a sub-agent's events (``agentId``)
for the main agent's chat. The file keeps no tool schemas (``--tools``).

Calls whose prompt cannot be rebuilt are rejected with the reason, never guessed:

* a sub-agent's response (``agentId`` or ``parentToolCallId``): its system prompt and first
  prompt are not logged (its other events, interleaved, are not the main agent's chat);
* a response whose prompt Copilot truncated at request time (``session.truncation`` before it:
  only the counts are logged), one whose prompt holds a ``developer`` message (the chat form
  has no such role), one split into messages of which more than one holds reasoning (the order
  of its reasoning and text is not one message);
* every call after a message whose text Copilot builds from what the log lacks: a user message
  with attachments (the ``<tagged_files>`` lines are read from the disk), the output of a
  command the user ran (``isUserRequested``), a compaction's summary message (built with the
  live plan and todos), a result with images, a resume that goes on with pending work, a
  ``custom`` tool call, a change of model over tool calls Copilot may rewrite, and an event
  this reader does not know (one a later version may send the model).

A line that is not JSON, or an event that does not fit, is one reject naming its line, and every
later call is rejected with it. Detected by a first event ``session.start`` of producer
``copilot-agent``, or a file ``events.jsonl`` whose first records are such events.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._fields import as_dict, expect, file_stem, make_call, opt_list, opt_str
from treeprep.formats._read import breaks_later, head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "copilot-cli"
_FILE = "events.jsonl"
#: Copilot's stand-in result for a call that was cut off (``G6n`` in 1.0.60)
INTERRUPTED = "The execution of this tool, or a previous tool was interrupted."
#: the model of auto mode: Copilot resolves a model per request, and rewrites the history for it
AUTO = "auto"
#: events that change nothing Copilot sends (1.0.60's replay ignores them, or, newer, they hold
#: usage, permissions, hooks, the screen's state)
_IGNORED = frozenset(
    # the events 1.0.60's replay passes over (``session.truncation`` is read here: see below)
    """assistant.intent assistant.message_start assistant.message_delta assistant.reasoning_delta
    session.idle session.error session.info session.warning session.title_changed
    session.snapshot_rewind session.shutdown session.remote_steerable_changed session.usage_info
    assistant.turn_start assistant.turn_end assistant.usage model.call_failure assistant.reasoning
    tool.execution_start tool.execution_partial_result subagent.started subagent.completed
    subagent.failed subagent.selected hook.start hook.end hook.progress pending_messages.modified
    tool.execution_progress session.context_changed session.mode_changed
    session.permissions_changed session.schedule_created session.schedule_cancelled
    session.autopilot_objective_changed session.plan_changed session.workspace_file_changed
    session.task_complete assistant.streaming_delta subagent.deselected permission.requested
    permission.completed user_input.requested user_input.completed elicitation.requested
    elicitation.completed sampling.requested sampling.completed external_tool.requested
    external_tool.completed command.queued command.execute command.completed commands.changed
    exit_plan_mode.requested exit_plan_mode.completed session.tools_updated
    session.background_tasks_changed session.skills_loaded session.custom_agents_updated
    session.mcp_servers_loaded session.mcp_server_status_changed session.extensions_loaded
    session.canvas.opened session.canvas.registry_changed session.canvas.closed
    session.extensions.attachments_pushed mcp.oauth_required mcp.oauth_completed
    session.custom_notification capabilities.changed auto_mode_switch.requested
    auto_mode_switch.completed mcp_app.tool_call_complete tool.user_requested skill.invoked
    session.compaction_start"""
    # and later ones that hold usage, permissions or the screen's state
    """ session.usage_record session.usage_checkpoint session.completion_receipt
    session.mode_notice_delivered session.permission_recovery session.schedule_rearmed
    session.auto_mode_resolved session.session_limits_changed
    session.request_body_compression_disabled session.model_deselected session.binary_asset
    session.canvas.recorded session.canvas.removed tool_search.activated skill.invoked_ref
    subagent.configured permission.assentDetected permission.carriedForward
    permission.contextualAuthorization permission.messageAuthorization
    permission.messageAuthorizationDegraded permission.messageAuthorizationRead
    mcp.oauth_recovery_completed""".split()
)


def _envelope(rec: dict[str, Any]) -> bool:
    return (
        isinstance(rec.get("type"), str)
        and isinstance(rec.get("data"), dict)
        and isinstance(rec.get("id"), str)
        and "parentId" in rec
        and "timestamp" in rec
    )


def sniff(path: str, head: bytes) -> bool:
    recs = head_json_objects(head)
    if not recs or not _envelope(recs[0]):
        return False
    if recs[0]["type"] == "session.start":
        return recs[0]["data"].get("producer") == "copilot-agent"
    return file_stem(path, (".gz", ".zst")) == _FILE and all(_envelope(r) for r in recs)


# --------------------------------------------------------------------------------------------
# the chat Copilot keeps
# --------------------------------------------------------------------------------------------


#: a message of the chat and the response it is part of (``apiCallId``; None: not a response's)
Entry = tuple[dict[str, Any], str | None]


def _assistant(data: dict[str, Any]) -> Entry:
    """An ``assistant.message`` as the chat message Copilot keeps, and its response's id."""
    msg: dict[str, Any] = {"role": "assistant", "content": opt_str(data.get("content"), "content")}
    msg["content"] = msg["content"] or None
    reasoning = opt_str(data.get("reasoningText"), "reasoningText")
    if reasoning:
        msg["reasoning_content"] = reasoning
    calls = []
    for i, req in enumerate(opt_list(data.get("toolRequests"), "toolRequests")):
        w = f"toolRequests[{i}]"
        req = as_dict(req, w)
        cid = expect(req.get("toolCallId"), f"{w}.toolCallId", str)
        name = expect(req.get("name"), f"{w}.name", str)
        args = req.get("arguments", {})
        if req.get("type") == "custom" or (req.get("type") is None and cid.startswith("custom_")):
            raise RecordError(f"{w}: a custom (freeform) tool call, which the chat form has not")
        expect(args, f"{w}.arguments", dict, str, what="an object or a JSON string")
        calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
    if calls:
        msg["tool_calls"] = calls
    return msg, opt_str(data.get("apiCallId"), "apiCallId")


def _runs(chat: list[Entry], start: int) -> list[tuple[int, dict[str, Any]]]:
    """The chat from ``start`` as sent, with where each message sent starts: the consecutive
    messages of one response as one (``Wet`` in 1.0.60: their texts joined, their calls in
    order, the first one's other fields)."""
    out: list[tuple[int, dict[str, Any]]] = []
    i = start
    while i < len(chat):
        m, api = chat[i]
        j = i + 1
        while api and j < len(chat) and chat[j][1] == api:
            j += 1
        out.append((i, _joined([e[0] for e in chat[i:j]]) if j - i > 1 else m))
        i = j
    return out


def _joined(run: list[dict[str, Any]]) -> dict[str, Any]:
    out = run[0].copy()
    texts = [m["content"] for m in run if isinstance(m.get("content"), str) and m["content"]]
    out["content"] = "".join(texts) if texts else run[0]["content"]
    calls = [tc for m in run for tc in m.get("tool_calls") or []]
    out.pop("tool_calls", None)
    if calls:
        out["tool_calls"] = calls
    return out


def _completion(run: list[dict[str, Any]]) -> dict[str, Any]:
    """What the model said in one response (its messages), as one assistant message."""
    if sum(1 for m in run if m.get("reasoning_content")) > 1:
        raise RecordError(
            f"a response split into {len(run)} messages with reasoning in more than one: the "
            "order of its reasoning and text is not one message"
        )
    reasoning = next((m["reasoning_content"] for m in run if m.get("reasoning_content")), None)
    out = _joined(run) if len(run) > 1 else run[0]
    if reasoning is not None and "reasoning_content" not in out:
        out = {**out, "reasoning_content": reasoning}
    return out


def _rematched(chat: list[Entry], synthesize: bool) -> list[Entry]:
    """Copilot's ``G6n``: each call's results right after its message, in the order the chat
    holds them; with ``synthesize`` a call without one gets :data:`INTERRUPTED` and a result of
    no call is left out (otherwise kept where it is)."""
    results: dict[str, list[int]] = {}
    for i, (m, _) in enumerate(chat):
        if m["role"] == "tool" and m.get("tool_call_id"):
            results.setdefault(m["tool_call_id"], []).append(i)
    used: set[int] = set()
    out: list[Entry] = []
    for i, (m, api) in enumerate(chat):
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append((m, api))
            found: list[int] = []
            missing: list[str] = []
            for tc in m["tool_calls"]:
                cands = [k for k in results.get(tc["id"], []) if k not in used]
                pick = next((k for k in cands if k > i), cands[0] if cands else None)
                if pick is None:
                    missing.append(tc["id"])
                else:
                    found.append(pick)
                    used.add(pick)
            out.extend(chat[k] for k in sorted(found))
            if synthesize:
                out.extend((_interrupted(c), None) for c in missing)
        elif m["role"] == "tool":
            if not synthesize and i not in used:
                out.append((m, api))
        else:
            out.append((m, api))
    return out


def _interrupted(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": INTERRUPTED}


def _no_reasoning(chat: list[Entry]) -> list[Entry]:
    """Copilot's ``Ryt``: every assistant message without its reasoning."""
    return [
        ({k: v for k, v in m.items() if k != "reasoning_content"}, api)
        if m["role"] == "assistant" and "reasoning_content" in m
        else (m, api)
        for m, api in chat
    ]


# --------------------------------------------------------------------------------------------
# the events, in order
# --------------------------------------------------------------------------------------------


@dataclass
class _Response:
    """The response being read: where it starts, its prompt, its messages."""

    line: int
    when: Any
    prompt: list[dict[str, Any]]
    api: str | None
    model: str | None
    run: list[dict[str, Any]] = field(default_factory=list)


class _Replay:
    """The chat of a session as its events come (:func:`read`)."""

    def __init__(self, path: str, opts: ReadOptions) -> None:
        self.path, self.opts = path, opts
        self.session = os.path.basename(os.path.dirname(os.path.abspath(path)))
        if file_stem(path, (".gz", ".zst")) != _FILE:  # a flat ``<session id>.jsonl``
            self.session = file_stem(path, (".gz", ".zst", ".jsonl"))
        self.system: dict[str, dict[str, Any]] = {}  # "system" / "developer:<name>" -> message
        self.chat: list[Entry] = []
        #: the chat as sent, up to where it was last read (:meth:`prompt`): (where each message
        #: sent starts in :attr:`chat`, it); emptied when the chat is changed in place
        self.view: list[tuple[int, dict[str, Any]]] = []
        self.answered: set[str] = set()  # calls with a result in the chat
        self.model: str | None = None
        self.rewritten_for: str | None = None  # the model the history was last rewritten for
        self.k = 0
        self.open: _Response | None = None
        #: why the next call's prompt is not what was sent (a truncation), or None
        self.truncated: str | None = None

    # -- the calls ------------------------------------------------------------------------------

    def prompt(self) -> list[dict[str, Any]]:
        """The system messages and the chat, as Copilot sends them now (the view is extended
        from its last message, which a response's next message may join)."""
        dev = sorted(k for k in self.system if k != "system")
        head = [self.system[k] for k in ["system", *dev] if k in self.system]
        if "system" not in self.system and self.opts.system_prompt:
            head.insert(0, {"role": "system", "content": self.opts.system_prompt})
        start = self.view.pop()[0] if self.view else 0
        self.view.extend(_runs(self.chat, start))
        return [*head, *(m for _, m in self.view)]

    def replace(self, chat: list[Entry]) -> None:
        """The chat changed in place (results moved, reasoning dropped)."""
        self.chat = chat
        self.view = []

    def close(self) -> Iterator[Item]:
        """The response read so far, as its call (or its reject)."""
        if self.open is None:
            return
        r, self.open = self.open, None
        line = r.line
        cid = f"{self.session}#{self.k}"
        self.k += 1
        try:
            if any(k != "system" for k in self.system):
                raise RecordError("a developer message in the prompt, which the chat form has not")
            if self.truncated is not None:
                raise RecordError(self.truncated)
            completion = _completion(r.run)
        except RecordError as e:
            self.truncated = None
            yield Reject(file=self.path, line=line, reason=str(e), format=NAME, call_id=cid)
            return
        fields = {
            "group_id": self.session, "trajectory_id": self.session, "call_id": cid,
            "parent_call_id": f"{self.session}#{self.k - 2}" if self.k > 1 else None,
            "model": r.model, "messages": r.prompt,
            "completion": completion, "tools": self.opts.tools, "timestamp": r.when,
            "provenance": {"exact_messages": "system" in self.system, "reconstructed": True},
            "source_file": self.path, "source_line": line, "source_format": NAME,
        }  # fmt: skip
        yield make_call(fields, file=self.path, line=line, fmt=NAME)

    def reply(self, line: int, rec: dict[str, Any]) -> Iterator[Item]:
        """An ``assistant.message`` of the main agent."""
        try:
            msg, api = _assistant(rec["data"])
        except RecordError:
            api = rec["data"].get("apiCallId")
            if self.open is not None and api and api == self.open.api:
                self.open = None  # a message of the open response: the response is its reject
            raise
        if self.open is not None and (api is None or api != self.open.api):
            yield from self.close()
        if self.open is None:
            model = rec["data"].get("model")
            model = model if isinstance(model, str) and model else self.model
            if self.model == AUTO and model != AUTO and model is not None:
                self.rewrite_for(model)  # auto mode: the model it resolved to, before the call
            self.open = _Response(line, rec.get("timestamp"), self.prompt(), api, model)
        self.open.run.append(msg)
        self.chat.append((msg, api))

    # -- what the events do to the chat --------------------------------------------------------

    def result(self, data: dict[str, Any]) -> None:
        """A ``tool.execution_complete`` of the main agent."""
        cid = expect(data.get("toolCallId"), "toolCallId", str)
        if data.get("isUserRequested"):
            raise _Breaks("the output of a command the user ran is sent as text Copilot builds "
                          "from it (truncated to a size this reader does not know)")  # fmt: skip
        res = data.get("result")
        if isinstance(res, dict) and res.get("binaryResultsForLlm"):
            raise _Breaks("a tool result with images, which the log holds apart from its text")
        if cid in self.answered:
            return  # Copilot keeps the first result of a call
        if data.get("success"):
            text = opt_str(as_dict(res, "result").get("content") if res is not None else None,
                           "result.content") or ""  # fmt: skip
        else:
            err = data.get("error")
            text = opt_str(as_dict(err, "error").get("message") if err is not None else None,
                           "error.message") or "Tool execution failed"  # fmt: skip
        self.chat.append(({"role": "tool", "tool_call_id": cid, "content": text}, None))
        self.answered.add(cid)
        if not self._in_place(cid):
            self._rematch(synthesize=False)

    def _in_place(self, cid: str) -> bool:
        """Whether the result just added follows its call's message, after its other results
        only (then ``G6n`` leaves the chat as it is)."""
        i = len(self.chat) - 2
        while i >= 0 and self.chat[i][0]["role"] == "tool":
            i -= 1
        calls = self.chat[i][0].get("tool_calls") if i >= 0 else None
        return bool(calls) and any(tc["id"] == cid for tc in calls or [])

    def _rematch(self, *, synthesize: bool) -> None:
        self.replace(_rematched(self.chat, synthesize))
        self.answered = {m["tool_call_id"] for m, _ in self.chat if m["role"] == "tool"}

    def start(self, data: dict[str, Any]) -> None:
        """A ``session.start``: the session's id and model."""
        if isinstance(data.get("sessionId"), str):
            self.session = data["sessionId"]
        if isinstance(data.get("selectedModel"), str):
            self.model = data["selectedModel"]

    def interrupted(self) -> None:
        """An ``abort``, or a resume of a session that was not running."""
        self._rematch(synthesize=True)
        self.replace(_no_reasoning(self.chat))

    def model_change(self, model: str) -> None:
        self.model = model
        self.rewrite_for(model)

    def rewrite_for(self, model: str) -> None:
        """Copilot's ``maybeRewriteChatHistoryForEffectiveModel``: a history sent to another
        model than the last loses its reasoning (and may have its tool calls rewritten)."""
        if self.rewritten_for == model:
            return
        self.rewritten_for = model
        for m, _ in self.chat:
            for tc in m.get("tool_calls") or []:
                args = tc["function"]["arguments"]
                if isinstance(args, dict) and set(args) == {"input"}:
                    raise _Breaks("a change of model over a tool call Copilot may rewrite as a "
                                  "custom one")  # fmt: skip
        self.replace(_no_reasoning(self.chat))

    def system_message(self, data: dict[str, Any]) -> None:
        role = data.get("role")
        content = expect(data.get("content"), "content", str)
        if role == "system":
            self.system["system"] = {"role": "system", "content": content}
        elif role == "developer":
            name = opt_str(data.get("name"), "name") or ""
            self.system[f"developer:{name}"] = {"role": "system", "content": content}
        else:
            raise RecordError(f"role: expected 'system' or 'developer', got {role!r}")

    def user(self, data: dict[str, Any]) -> None:
        if data.get("attachments"):
            raise _Breaks("a user message with attachments, whose lines Copilot reads from the "
                          "disk when it sends them")  # fmt: skip
        text = data.get("transformedContent")
        text = data.get("content") if text is None else text
        self.chat.append(({"role": "user", "content": expect(text, "content", str)}, None))


class _Breaks(RecordError):
    """An event after which the prompts are not what Copilot sent."""


def _event(s: _Replay, kind: str, rec: dict[str, Any]) -> None:
    """What an event other than a response's message does to the chat (:class:`_Breaks`: after
    it the prompts are not what was sent; RecordError: it does not fit)."""
    data = rec["data"]
    if kind == "session.start":
        s.start(data)
    elif kind == "tool.execution_complete":
        if not _sub_agent(rec):
            s.result(data)
    elif kind == "user.message":
        s.user(data)
    elif kind == "system.message":
        s.system_message(data)
    elif kind == "system.notification":
        kind_of = data.get("kind")
        if not (isinstance(kind_of, dict) and kind_of.get("type") == "instruction_discovered"):
            text = expect(data.get("content"), "content", str)
            s.chat.append(({"role": "user", "content": text}, None))
    elif kind == "abort":
        s.interrupted()
    elif kind == "session.resume":
        if data.get("continuePendingWork"):
            raise _Breaks("a resume that goes on with pending work (Copilot settles its tool "
                          "calls from state the log does not keep)")  # fmt: skip
        if not data.get("sessionWasActive"):
            s.interrupted()
        if isinstance(data.get("selectedModel"), str):
            s.model = data["selectedModel"]
    elif kind == "session.model_change":
        s.model_change(expect(data.get("newModel"), "newModel", str))
    elif kind == "session.truncation":
        n = data.get("messagesRemovedDuringTruncation")
        s.truncated = (f"Copilot truncated this prompt when it sent it ({n} messages removed) and "
                       "logs only the counts")  # fmt: skip
    elif kind == "session.compaction_complete":
        if data.get("success") and data.get("summaryContent"):
            raise _Breaks("a compaction: the summary message Copilot sends after it is built with "
                          "the live plan and todos, which the log does not keep")  # fmt: skip
    elif kind not in _IGNORED:
        raise _Breaks(f"an event this reader does not know ({kind!r}): it may change what "
                      "Copilot sends")  # fmt: skip


def _sub_agent(rec: dict[str, Any]) -> bool:
    """Copilot's ``Ip``: an event of a sub-agent."""
    return bool(rec.get("agentId") or rec["data"].get("parentToolCallId"))


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    s = _Replay(path, opts)
    broken: str | None = None  # why the later calls cannot be built
    for line, rec in records(path, NAME, objects=True):
        if isinstance(rec, Reject):
            if broken is None:
                yield from s.close()
                broken = breaks_later(line, rec.reason)
                yield rec
            continue
        if not _envelope(rec):
            if broken is None:
                yield from s.close()
                why = "expected an event: {type, data, id, timestamp, parentId}"
                broken = breaks_later(line, why)
                yield Reject(file=path, line=line, reason=why, format=NAME)
            continue
        kind = rec["type"]
        if rec.get("ephemeral") is True:
            continue
        reply = kind == "assistant.message"
        if rec.get("agentId") and not reply:
            continue  # a sub-agent's event: its own chat, not the main agent's
        if reply and _sub_agent(rec):
            yield from s.close()  # its line comes after the open response's
            yield Reject(file=path, line=line, format=NAME,
                         reason="a sub-agent's response: Copilot does not log its system prompt "
                                "and first prompt")  # fmt: skip
            continue
        if broken is not None:
            if reply:
                yield Reject(file=path, line=line, reason=broken, format=NAME,
                             call_id=f"{s.session}#{s.k}")  # fmt: skip
                s.k += 1
            continue
        try:
            if reply:
                yield from s.reply(line, rec)
            elif kind not in _IGNORED:
                yield from s.close()
                _event(s, kind, rec)
        except RecordError as e:
            yield from s.close()
            broken = breaks_later(line, e)
            if not isinstance(e, _Breaks):
                yield Reject(file=path, line=line, reason=str(e), format=NAME)
    yield from s.close()


#: the files Copilot keeps beside a session's events, and the folders it keeps there
_BESIDE = frozenset({"workspace.yaml", "plan.md", "session.db"})
_FOLDERS = frozenset({"checkpoints", "files", "research", "rewind-file-snapshots"})


def companion(path: str) -> bool:
    """A file Copilot keeps in a session's folder (``workspace.yaml``, ``plan.md``, its lock,
    the checkpoints' summaries...): accounted for with the session, not a log of no known
    format."""
    name, folder = os.path.basename(path), os.path.dirname(path) or "."
    if name in _BESIDE or (name.startswith("inuse.") and name.endswith(".lock")):
        return os.path.isfile(os.path.join(folder, _FILE))
    up = os.path.dirname(folder)
    return os.path.basename(folder) in _FOLDERS and os.path.isfile(os.path.join(up, _FILE))


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=30, companion=companion)
__all__ = ["FORMAT", "INTERRUPTED", "NAME"]
