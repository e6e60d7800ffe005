"""``atif``: Harbor's Agent Trajectory Interchange Format (ATIF v1.x ``trajectory.json``).

A file is one JSON object, a trajectory, or a JSON array of them (the layout agent-data-protocol
publishes its converted datasets in). A trajectory has ``schema_version`` (``"ATIF-v1.<n>"``),
``session_id``, from v1.7 ``trajectory_id``, ``agent`` (``name``, ``version``, ``model_name``, from
v1.5 ``tool_definitions``), ``steps`` and, optionally, ``continued_trajectory_ref`` and
``subagent_trajectories`` (embedded sub-agent trajectories). A step has ``step_id``, ``source``
(``system``/``user``/``agent``), ``message``, and on agent steps ``reasoning_content``,
``tool_calls`` (``tool_call_id``, ``function_name``, ``arguments``), ``observation.results``
(``source_call_id``, ``content``, ``subagent_trajectory_ref``) and ``metrics``
(``prompt_token_ids``, ``completion_token_ids``, ``logprobs``).

Steps to calls. The steps are replayed in order as chat messages: a system step is a system
message, a user step a user message, an agent step an assistant message (``message`` as content,
its reasoning, its tool calls) followed by its observation: a result naming a ``source_call_id``
is that call's ``tool`` message, a result without one (feedback to an action that is not a tool
call) a user message. A step or result with no content adds no message (it never renders as an
empty turn). Every agent step is one call whose prompt is every message before it; an agent step
marked ``is_copied_context`` (context copied from an earlier trajectory, v1.7) or with
``llm_call_count: 0`` (a deterministic dispatch, no model call) is prompt, never a call. A call
whose reply is empty (no text, no reasoning, no tool call) is rejected: it is never trained.
``agent.tool_definitions`` are the tool schemas (else ``--tools``).

Context boundaries. A step whose ``extra.context_management.boundary`` is ``"replace"`` (a
compaction: Mistral Vibe's, Pi's, other producers') ends the context: the calls after
it see the trajectory's system prompt (its leading system steps, kept as Claude Code keeps its
system prompt through a compaction), then the boundary step's content (a user step's message and
untied results; a system step's untied results only, its message being the marker, as the RFC's
boundary rule says; an agent step's untied results, the summary, as a user message), then what
follows. The first call after it is hinted ``compaction``, so the new context branches off at the
system prompt.

Hand-offs (:mod:`treeprep.formats._atif_handoff`). Harbor's terminus-2 marks a summarization with
a system step referencing its summarization sub-agents, with or without the boundary: the calls
after it see the system prompt, the task prompt (the first user step), the questions
sub-agent's prompt and reply, then what follows (the answers), as Harbor sent them and as its
``linear_history`` export writes them. Where that sub-agent's trajectory is absent, those calls
are rejected, naming the export; a call with logged token ids keeps its ids.

Token ids. When an agent step logs both ``metrics.prompt_token_ids`` and
``metrics.completion_token_ids``, the call is a token rollout with those ids, exactly like the
``tokens`` format (``logprobs`` as its log-probs when they match in length); nothing is rendered,
and the completion ids are checked to decode to the step's message and tool-call names
(:mod:`treeprep.render.idcheck`; ``--no-check-ids`` skips it). Completion ids alone cannot be
placed after a prompt that was not logged as ids, so such a step is rendered as a chat call.

Links (:mod:`treeprep.formats._atif_links`). A trajectory's group (tree) is the ``session_id`` of
the trajectory it descends from, qualified by a digest of that root trajectory
(``<session>#<12 hex>``: session ids repeat across files, trials stay apart, a copied file is the
same group; ``--group-by session_id`` joins the runs of one task); a trajectory is named by its
``trajectory_id`` (v1.7) or else its ``session_id``, so sibling sub-agents sharing a session id
stay apart:

* a sub-agent: an observation result's ``subagent_trajectory_ref`` names it by ``trajectory_id``,
  ``session_id`` and/or ``trajectory_path``. Embedded ones are read with their parent; one in
  another file (or another element of the same array) is linked by looking for the trajectory that
  references it. Its calls have the sub-agent's name as ``agent_id`` and the hint ``sub-agent``;
* a continuation (``continued_trajectory_ref``: the file the run went on in): linked to the file
  that names it, with that file's agent id and ``compaction`` on its first call.

A referenced sub-agent or continuation that is neither embedded nor found (by the rule a child
links itself by: an id, or its path's file name) is one reject naming the
reference (its calls are not in the build; the count says so). Every trajectory is one sample
(``trajectory_id``: the group), so sub-agents and continuations count with the run that spawned
them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from treeprep.errors import InputError, RecordError
from treeprep.formats import _atif_handoff as handoff
from treeprep.formats import _atif_links as links
from treeprep.formats._fields import (
    as_dict,
    chat_tool_call,
    content_digest,
    dicts,
    expect,
    make_call,
    opt_dict,
    opt_str,
    token_rollout,
    type_name,
)
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import normalize_tools
from treeprep.formats.openai_responses import check_ids
from treeprep.schemas import Reject

NAME = "atif"


def sniff(path: str, head: bytes) -> bool:
    h = head.lstrip()
    return h[:1] in (b"{", b"[") and b'"schema_version"' in head and b'"ATIF-v' in head


# --------------------------------------------------------------------------------------------
# steps -> messages
# --------------------------------------------------------------------------------------------


def _assistant(step: dict[str, Any], where: str) -> dict[str, Any]:
    calls = [
        chat_tool_call(
            expect(tc.get("tool_call_id"), f"{where}.tool_calls[{j}].tool_call_id", str),
            expect(tc.get("function_name"), f"{where}.tool_calls[{j}].function_name", str),
            expect(
                tc.get("arguments", {}),
                f"{where}.tool_calls[{j}].arguments",
                dict,
                str,
                what="an object",
            ),
        )
        for j, tc in enumerate(dicts(step.get("tool_calls"), f"{where}.tool_calls"))
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": _text(step, where)}
    reasoning = opt_str(step.get("reasoning_content"), f"{where}.reasoning_content")
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def _text(step: dict[str, Any], where: str) -> str:
    m = step.get("message", "")
    if m is None:
        return ""
    if isinstance(m, list):  # v1.6 content parts: the text parts
        return "".join(str(p.get("text") or "") for p in dicts(m, f"{where}.message"))
    return expect(m, f"{where}.message", str)  # type: ignore[no-any-return]


def _observation(
    step: dict[str, Any], where: str, ids: frozenset[str] | set[str] = frozenset()
) -> list[dict[str, Any]]:
    """The step's results as messages: tool results, and untied results with content as user
    messages (an empty one is no message)."""
    obs = opt_dict(step.get("observation"), f"{where}.observation")
    out = []
    for j, res in enumerate(dicts(obs.get("results"), f"{where}.observation.results")):
        w = f"{where}.observation.results[{j}]"
        content = _result_text(res.get("content"), f"{w}.content")
        src = opt_str(res.get("source_call_id"), f"{w}.source_call_id")
        if src is None:
            if content.strip():
                out.append({"role": "user", "content": content})
        elif src not in ids:
            raise RecordError(f"{w}.source_call_id: {src!r} is no tool call of this step")
        else:
            out.append({"role": "tool", "tool_call_id": src, "content": content})
    return out


def _result_text(v: Any, where: str) -> str:
    if isinstance(v, list):  # v1.6 content parts
        return "".join(str(p.get("text") or "") for p in dicts(v, where))
    return opt_str(v, where) or ""


def _said(step: dict[str, Any], source: str, where: str) -> list[dict[str, Any]]:
    """A system or user step's messages: its text (when any) and its untied results."""
    text = _text(step, where)
    own = [{"role": source, "content": text}] if text.strip() else []
    return own + _observation(step, where)


def _boundary(step: dict[str, Any]) -> bool:
    """Whether the step replaces the context (``extra.context_management.boundary``)."""
    extra = step.get("extra")
    cm = extra.get("context_management") if isinstance(extra, dict) else None
    return isinstance(cm, dict) and cm.get("boundary") == "replace"


def _empty(msg: dict[str, Any]) -> bool:
    return not (msg.get("content") or msg.get("reasoning_content") or msg.get("tool_calls"))


def _token_ids(step: dict[str, Any], where: str) -> tuple[list[int], list[int], Any] | None:
    metrics = opt_dict(step.get("metrics"), f"{where}.metrics")
    p, c = metrics.get("prompt_token_ids"), metrics.get("completion_token_ids")
    if p is None or c is None:
        return None
    for name, ids in (("prompt_token_ids", p), ("completion_token_ids", c)):
        check_ids(ids, f"{where}.metrics.{name}")  # before any array: 2**63 is a reject here
    lp = metrics.get("logprobs")
    lp = lp if isinstance(lp, list) and len(lp) == len(c) else None
    return p, c, lp


# --------------------------------------------------------------------------------------------
# one trajectory -> calls
# --------------------------------------------------------------------------------------------


class _Run:
    """One trajectory being replayed: its place in the group and the calls it yields."""

    def __init__(
        self,
        path: str,
        line: int,
        ids: tuple[str, str, str],
        reason: str | None,
        name: str,
        find: handoff.Find,
    ) -> None:
        self.path, self.line = path, line
        #: (group, trajectory: the root's name, agent)
        self.gid, self.trajectory, self.agent = ids
        #: the hint of the next call (the link's first, then ``compaction`` after a boundary)
        self.reason = reason
        self.name = name  # names the calls: several trajectories may share a group and agent
        self.find = find  # the trajectory a sub-agent reference names (a hand-off's questions)

    def reject(self, reason: str, call_id: str | None = None) -> Reject:
        return Reject(file=self.path, line=self.line, format=NAME, reason=reason, call_id=call_id)

    def call(self, step: dict[str, Any], prompt: _Prompt, ctx: dict[str, Any], where: str) -> Item:
        """The agent step's call; a reject where its reply is empty, or where its prompt is lost
        (after a hand-off whose sub-agents are absent) and no logged token ids stand in for it."""
        completion = _assistant(step, where)
        cid = f"{self.gid}/{self.name}/{step.get('step_id')}"
        base = {
            "group_id": self.gid, "agent_id": self.agent, "call_id": cid,
            "trajectory_id": self.trajectory, "branch_reason": self.reason,
            "source_file": self.path, "source_line": self.line, "source_format": NAME,
        }  # fmt: skip
        self.reason = None
        ids = _token_ids(step, where)
        if ids is not None:
            names = [tc["function"]["name"] for tc in completion.get("tool_calls", [])]
            try:
                return token_rollout(
                    ctx["opts"].check_ids, completion["content"], names, prompt_token_ids=ids[0],
                    generation_token_ids=ids[1], generation_log_probs=ids[2], **base,
                )  # fmt: skip
            except ValidationError as e:
                raise RecordError(f"{where}.metrics: {e.errors()[0]['msg']}") from e
        if _empty(completion):
            why = "the agent's reply is empty (no text, reasoning or tool call): not trained"
            return self.reject(f"{where}: {why}", cid)
        if prompt.lost:
            return self.reject(f"{where}: {prompt.lost}", cid)
        stamp = step.get("timestamp")
        return make_call(
            {**base, "parent_call_id": None, "messages": list(prompt.msgs),
             "completion": completion, "tools": ctx["tools"],
             "model": step.get("model_name") or ctx["model"],
             "timestamp": stamp if isinstance(stamp, str) else None,
             "provenance": {"exact_messages": False, "reconstructed": True}},
            file=self.path, line=self.line, fmt=NAME,
        )  # fmt: skip


def _context(doc: dict[str, Any], opts: ReadOptions, where: str) -> dict[str, Any]:
    """What every call of a trajectory shares: its tools, model and the options."""
    agent = opt_dict(doc.get("agent"), f"{where}agent")
    tools = normalize_tools(agent.get("tool_definitions"), f"{where}agent.tool_definitions")
    model = agent.get("model_name") if isinstance(agent.get("model_name"), str) else None
    return {"tools": tools or opts.tools, "model": model, "opts": opts}


class _Prompt:
    """The messages the next call of a trajectory is prompted with, as its steps are replayed."""

    def __init__(self, system: list[dict[str, Any]]) -> None:
        self.system = system  # the system prompt: kept across a context boundary
        self.msgs = list(system)
        self.task: list[dict[str, Any]] = []  # the first user step's messages: the task prompt
        self.lost: str | None = None  # why the context after a hand-off cannot be rebuilt
        self.opening = True  # still in the leading system steps

    def said(self, step: dict[str, Any], source: str, run: _Run, where: str) -> None:
        """A system or user step: its messages, or the context it starts."""
        if handoff.is_marker(step):  # Harbor's hand-off: never a turn itself
            got = handoff.context(step, [*self.system, *self.task], run.find, where)
            self.msgs, self.lost, run.reason = got.messages or [], got.lost, "compaction"
            self.opening = False
            return
        if _boundary(step):  # only the results: a system step's message marks the boundary
            said = _said(step, source, where) if source == "user" else _observation(step, where)
            self.msgs, self.lost, run.reason = list(self.system), None, "compaction"
        else:
            said = _said(step, source, where)
            if self.opening and source == "system":
                self.system.extend(said)
            if source == "user" and not self.task:
                self.task = said
        self.msgs.extend(said)
        self.opening = self.opening and source == "system"

    def agent(self, step: dict[str, Any], run: _Run, where: str) -> None:
        """An agent step after its call: its reply and results, or the summary it ends on."""
        self.opening = False
        reply = _assistant(step, where)
        results = _observation(step, where, {tc["id"] for tc in reply.get("tool_calls", [])})
        if _boundary(step):  # the context restarts with the step's summary
            said = [m for m in results if m["role"] == "user"]
            self.msgs, self.lost, run.reason = [*self.system, *said], None, "compaction"
        else:
            self.msgs.extend([reply, *results])


def _trajectory(doc: dict[str, Any], run: _Run, opts: ReadOptions, where: str) -> Iterator[Item]:
    try:
        ctx = _context(doc, opts, where)
    except RecordError as e:  # every call of this trajectory would need them
        yield run.reject(str(e))
        return
    steps = doc["steps"]
    leading = [s for s in steps if isinstance(s, dict) and s.get("source") == "system"]
    system: list[dict[str, Any]] = []
    if opts.system_prompt and not leading:
        system.append({"role": "system", "content": opts.system_prompt})
    prompt = _Prompt(system)
    for i, raw in enumerate(steps):
        w = f"{where}steps[{i}]"
        try:
            step = as_dict(raw, w)
            source = step.get("source")
            if source in ("system", "user"):
                prompt.said(step, source, run, w)
                continue
            if source != "agent":
                raise RecordError(f"{w}.source: expected system, user or agent, got {source!r}")
            if not step.get("is_copied_context") and step.get("llm_call_count") != 0:
                yield run.call(step, prompt, ctx, w)
            prompt.agent(step, run, w)
        except RecordError as e:
            yield run.reject(str(e))
            return  # later steps' prompts would miss this one: the rest is lost with a reason
    subs = doc.get("subagent_trajectories")
    if subs is not None and not isinstance(subs, list):
        yield run.reject(f"{where}subagent_trajectories: expected an array, got {type_name(subs)}")
        subs = None
    for j, sub in enumerate(subs or []):
        ws = f"{where}subagent_trajectories[{j}]."
        if not isinstance(sub, dict) or not isinstance(sub.get("steps"), list):
            yield run.reject(f"{ws[:-1]}: expected steps")
            continue
        sid = links.identity(sub) or f"{run.agent}.sub{j}"
        ids = (run.gid, run.trajectory, sid)
        yield from _trajectory(sub, _Run(run.path, run.line, ids, "sub-agent", sid, run.find),
                               opts, ws)  # fmt: skip


def _subs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A trajectory's embedded sub-agents, at any depth."""
    return [
        d for sub in links.objects(doc.get("subagent_trajectories")) for d in [sub, *_subs(sub)]
    ]


def _embedded(doc: dict[str, Any]) -> set[str]:
    """The names of a trajectory's embedded sub-agents, at any depth."""
    return {
        str(sub[k]) for sub in _subs(doc) for k in ("trajectory_id", "session_id") if sub.get(k)
    }


def _one(
    doc: dict[str, Any], run: _Run, opts: ReadOptions, where: str, known: set[str]
) -> Iterator[Item]:
    """A whole trajectory's items: its calls, then a reject per absent referenced file."""
    n = 0
    for item in _trajectory(doc, run, opts, where):
        n += 1
        yield item
    if n == 0:
        yield run.reject(f"{where[:-1]}: no agent step to train on" if where else "no agent step")
    for ref, what in links.absent_refs(run.path, doc, known | _embedded(doc)):
        yield run.reject(
            f"{where}{ref}: the referenced trajectory is absent ({what}): its calls are not in "
            "this build"
        )


def _read_array(path: str, docs: list[Any], lines: list[int], opts: ReadOptions) -> Iterator[Item]:
    """The trajectories of a JSON array: each its own run unless another element references it."""
    known = {n for d in docs if isinstance(d, dict) for n in links.names_of("", d)}
    parent_of = links.array_parent(docs)
    scope = [x for d in links.objects(docs) for x in [d, *_subs(d)]]
    find = links.finder(path, scope)
    seen: set[str] = set()
    for k, doc in enumerate(docs):
        if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
            why = f"[{k}]: expected an ATIF trajectory object with a 'steps' list"
            yield Reject(file=path, line=lines[k], format=NAME, reason=why)
            continue
        gid, root, agent, reason = links.lineage(f"[{k}]", doc, parent_of)
        name = links.identity(doc) or f"{os.path.basename(path)}[{k}]"
        if reason is None:  # a run of its own; an id given twice still names two runs
            name = root = name if name not in seen else f"{name}[{k}]"
            gid = gid if links.identity(doc) else f"{name}#{content_digest(doc)}"
        seen.add(name)
        if opts.group_by and doc.get(opts.group_by) is not None:
            gid = str(doc[opts.group_by])
        run = _Run(path, lines[k], (gid, root, agent), reason, name, find)
        yield from _one(doc, run, opts, f"[{k}].", known)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    parsed = document(path)
    doc = parsed.value
    if isinstance(doc, list):
        yield from _read_array(path, doc, parsed.element_lines(len(doc)), opts)
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise InputError(path, 1, "expected an ATIF trajectory object with a 'steps' list")
    session = doc.get("session_id")
    if not isinstance(session, str) or not session:
        raise InputError(path, 1, "session_id: expected a non-empty string")
    gid, root, agent, reason = links.lineage(path, doc, links.folder_parent(path))
    if opts.group_by and doc.get(opts.group_by) is not None:
        gid = str(doc[opts.group_by])
    find = links.finder(path, _subs(doc))
    run = _Run(path, 1, (gid, root, agent), reason, links.identity(doc) or session, find)
    yield from _one(doc, run, opts, "", set())


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=40)
__all__ = ["FORMAT", "NAME"]
