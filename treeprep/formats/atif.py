"""``atif``: Harbor's Agent Trajectory Interchange Format (ATIF v1.x ``trajectory.json``).

One file is one JSON object: ``schema_version`` (``"ATIF-v1.<n>"``), ``session_id``, ``agent``
(``name``, ``version``, ``model_name``, from v1.5 ``tool_definitions``), ``steps`` and, optionally,
``continued_trajectory_ref`` and ``subagent_trajectories`` (embedded sub-agent trajectories). A
step has ``step_id``, ``source`` (``system``/``user``/``agent``), ``message``, and on agent steps
``reasoning_content``, ``tool_calls`` (``tool_call_id``, ``function_name``, ``arguments``),
``observation.results`` (``source_call_id``, ``content``, ``subagent_trajectory_ref``) and
``metrics`` (``prompt_token_ids``, ``completion_token_ids``, ``logprobs``).

Steps to calls. The steps are replayed in order as chat messages: a system step is a system
message, a user step a user message, an agent step an assistant message (``message`` as content,
its reasoning, its tool calls) followed by its observation: a result naming a ``source_call_id``
is that call's ``tool`` message, a result without one (feedback to an action that is not a tool
call) a user message. Every agent step is one call whose prompt is every message before it; an
agent step marked ``is_copied_context`` (context copied from an earlier trajectory, v1.7) is
prompt, never a call. A call whose reply is empty (no text, no reasoning, no tool call) is
rejected: it is never trained. ``agent.tool_definitions`` are the tool schemas (else ``--tools``).

Token ids. When an agent step logs both ``metrics.prompt_token_ids`` and
``metrics.completion_token_ids``, the call is a :class:`~treeprep.schemas.TokenRollout` with
those ids, exactly like the ``tokens`` format (``logprobs`` as its log-probs when they match in
length); nothing is rendered. Completion ids alone cannot be placed after a prompt that was not
logged as ids, so such a step is rendered as a chat call.

Links. A trajectory's group (tree) is the ``session_id`` of the trajectory it descends from:

* a sub-agent: an observation result's ``subagent_trajectory_ref`` names the sub-agent by
  ``session_id`` and, optionally, ``trajectory_path``. Embedded ones (``subagent_trajectories``)
  are read with their parent; a separate file is linked by looking for the file that references
  it in its own folder. Its calls have the sub-agent's session id as ``agent_id`` and the hint
  ``sub-agent``;
* a continuation (``continued_trajectory_ref``: the file the run went on in, after a context
  reset or a summary): the continued file is linked to the file that names it, with the agent id
  of that file and ``compaction`` on its first call.

A file no other file of its folder references is its own group (named by its session id). Every
trajectory is one sample (``trajectory_id``: the root's session id), so sub-agents and
continuations count as part of the run that spawned them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson
from pydantic import ValidationError

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    as_dict,
    as_list,
    chat_tool_call,
    dicts,
    expect,
    make_call,
    opt_dict,
    opt_str,
)
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import normalize_tools
from treeprep.schemas import Reject, TokenRollout

NAME = "atif"
#: folders with more JSON files than this are not scanned for a file's parent
_MAX_SIBLINGS = 2000


def sniff(path: str, head: bytes) -> bool:
    h = head.lstrip()
    return h.startswith(b"{") and b'"schema_version"' in head and b'"ATIF-v' in head


# --------------------------------------------------------------------------------------------
# links between files
# --------------------------------------------------------------------------------------------


def _refs(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(sub-agent session ids and paths, continuation paths) one trajectory references."""
    subs: set[str] = set()
    for step in _objects(doc.get("steps")):
        obs = step.get("observation")
        for res in _objects(obs.get("results") if isinstance(obs, dict) else None):
            for ref in _objects(res.get("subagent_trajectory_ref")):
                subs.update(str(ref[k]) for k in ("session_id", "trajectory_path") if ref.get(k))
    cont = doc.get("continued_trajectory_ref")
    conts = {cont} if isinstance(cont, str) and cont else set()
    return subs, conts


def _objects(v: Any) -> list[dict[str, Any]]:
    """The objects of ``v`` when it is a list (nothing otherwise): links are looked up leniently,
    the file itself is checked when it is read."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _names(path: str, session: str) -> set[str]:
    base = os.path.basename(path)
    return {session, base, path}


def _named(refs: set[str], names: set[str]) -> bool:
    return any(r in names or os.path.basename(r) in names for r in refs)


def _parent(path: str, session: str) -> tuple[str, str, str] | None:
    """(parent file, its session id, link kind) of the folder file that references this one."""
    folder = os.path.dirname(path) or "."
    try:
        siblings = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
    except OSError:
        return None
    if len(siblings) > _MAX_SIBLINGS:
        return None
    names = _names(path, session)
    for f in siblings:
        other = os.path.join(folder, f)
        if os.path.abspath(other) == os.path.abspath(path):
            continue
        try:
            with open(other, "rb") as fh:
                data = fh.read()
            if b'"ATIF-v' not in data or not any(n.encode() in data for n in names):
                continue
            doc = orjson.loads(data)
        except (OSError, orjson.JSONDecodeError):
            continue
        if not isinstance(doc, dict):
            continue
        subs, conts = _refs(doc)
        kind = "sub-agent" if _named(subs, names) else "compaction" if _named(conts, names) else ""
        if kind:
            return other, str(doc.get("session_id") or f), kind
    return None


def _lineage(path: str, session: str) -> tuple[str, str, str | None]:
    """(group id, agent id, branch reason) of the file: follows parents up to the root."""
    seen = {os.path.abspath(path)}
    agent = session
    reason: str | None = None
    cur, cur_session = path, session
    first = True
    while (link := _parent(cur, cur_session)) is not None:
        nxt, nxt_session, kind = link
        if os.path.abspath(nxt) in seen:
            break
        seen.add(os.path.abspath(nxt))
        if first:
            reason = kind
            agent = session if kind == "sub-agent" else nxt_session
            first = False
        elif kind == "compaction" and agent == cur_session:
            agent = nxt_session  # a continuation of a continuation keeps the first's agent
        cur, cur_session = nxt, nxt_session
    return cur_session, ("main" if agent == cur_session else agent), reason


# --------------------------------------------------------------------------------------------
# steps -> messages and calls
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
    if isinstance(m, list):  # v1.6 content parts: the text parts
        return "".join(str(p.get("text") or "") for p in dicts(m, f"{where}.message"))
    return expect(m, f"{where}.message", str)  # type: ignore[no-any-return]


def _observation(step: dict[str, Any], where: str, ids: set[str]) -> list[dict[str, Any]]:
    obs = opt_dict(step.get("observation"), f"{where}.observation")
    out = []
    for j, res in enumerate(dicts(obs.get("results"), f"{where}.observation.results")):
        w = f"{where}.observation.results[{j}]"
        content = opt_str(res.get("content"), f"{w}.content") or ""
        src = opt_str(res.get("source_call_id"), f"{w}.source_call_id")
        if src is None:
            out.append({"role": "user", "content": content})
        elif src not in ids:
            raise RecordError(f"{w}.source_call_id: {src!r} is no tool call of this step")
        else:
            out.append({"role": "tool", "tool_call_id": src, "content": content})
    return out


def _empty(msg: dict[str, Any]) -> bool:
    return not (msg.get("content") or msg.get("reasoning_content") or msg.get("tool_calls"))


def _token_ids(step: dict[str, Any], where: str) -> tuple[list[int], list[int], Any] | None:
    metrics = opt_dict(step.get("metrics"), f"{where}.metrics")
    p, c = metrics.get("prompt_token_ids"), metrics.get("completion_token_ids")
    if p is None or c is None:
        return None
    for name, ids in (("prompt_token_ids", p), ("completion_token_ids", c)):
        for k, t in enumerate(as_list(ids, f"{where}.metrics.{name}")):
            expect(t, f"{where}.metrics.{name}[{k}]", int)
    lp = metrics.get("logprobs")
    lp = lp if isinstance(lp, list) and len(lp) == len(c) else None
    return p, c, lp


class _Run:
    """One trajectory being replayed: its place in the group and the calls it yields."""

    def __init__(self, path: str, gid: str, agent: str, reason: str | None, session: str) -> None:
        self.path, self.gid, self.agent, self.reason = path, gid, agent, reason
        self.session = session  # names the calls: several files may share a group and agent
        self.k = 0

    def call(
        self, step: dict[str, Any], msgs: list[Any], tools: Any, model: Any, where: str
    ) -> Item:
        completion = _assistant(step, where)
        cid = f"{self.gid}/{self.session}/{step.get('step_id', self.k)}"
        base = {
            "group_id": self.gid,
            "agent_id": self.agent,
            "call_id": cid,
            "trajectory_id": self.gid,
            "branch_reason": self.reason if self.k == 0 else None,
            "source_file": self.path,
            "source_line": 1,
            "source_format": NAME,
        }
        self.k += 1
        ids = _token_ids(step, where)
        if ids is not None:
            try:
                return TokenRollout(
                    prompt_token_ids=ids[0], generation_token_ids=ids[1],
                    generation_log_probs=ids[2], **base,
                )  # fmt: skip
            except ValidationError as e:
                raise RecordError(f"{where}.metrics: {e.errors()[0]['msg']}") from e
        if _empty(completion):
            why = "the agent's reply is empty (no text, reasoning or tool call): not trained"
            return Reject(file=self.path, line=1, format=NAME, call_id=cid, reason=why)
        base["parent_call_id"] = None
        return make_call(
            {**base, "messages": list(msgs), "completion": completion, "tools": tools,
             "model": step.get("model_name") or model,
             "timestamp": step.get("timestamp") if isinstance(step.get("timestamp"), str) else None,
             "provenance": {"exact_messages": False, "reconstructed": True}},
            file=self.path, line=1, fmt=NAME,
        )  # fmt: skip


def _trajectory(doc: dict[str, Any], run: _Run, opts: ReadOptions, where: str) -> Iterator[Item]:
    try:
        agent = opt_dict(doc.get("agent"), f"{where}agent")
        tools = normalize_tools(agent.get("tool_definitions"), f"{where}agent.tool_definitions")
    except RecordError as e:  # every call of this trajectory would need them
        yield Reject(file=run.path, line=1, format=NAME, reason=str(e))
        return
    model = agent.get("model_name") if isinstance(agent.get("model_name"), str) else None
    tools = tools or opts.tools
    msgs: list[dict[str, Any]] = []
    if opts.system_prompt and not any(
        isinstance(s, dict) and s.get("source") == "system" for s in doc["steps"]
    ):
        msgs.append({"role": "system", "content": opts.system_prompt})
    for i, raw in enumerate(doc["steps"]):
        w = f"{where}steps[{i}]"
        try:
            step = as_dict(raw, w)
            source = step.get("source")
            if source in ("system", "user"):
                msgs.append({"role": source, "content": _text(step, w)})
                msgs.extend(_observation(step, w, set()))
                continue
            if source != "agent":
                raise RecordError(f"{w}.source: expected system, user or agent, got {source!r}")
            if not step.get("is_copied_context"):
                item = run.call(step, msgs, tools, model, w)
                if isinstance(item, Reject):
                    item.reason = f"{w}: {item.reason}"
                    item.call_id = item.call_id or f"{run.gid}/{run.session}/{step.get('step_id')}"
                yield item
            reply = _assistant(step, w)
            msgs.append(reply)
            ids = {tc["id"] for tc in reply.get("tool_calls", [])}
            msgs.extend(_observation(step, w, ids))
        except RecordError as e:
            yield Reject(file=run.path, line=1, format=NAME, reason=str(e), call_id=None)
            return  # later steps' prompts would miss this one: the rest is lost with a reason
    for j, sub in enumerate(doc.get("subagent_trajectories") or []):
        ws = f"{where}subagent_trajectories[{j}]."
        if not isinstance(sub, dict) or not isinstance(sub.get("steps"), list):
            yield Reject(file=run.path, line=1, format=NAME, reason=f"{ws[:-1]}: expected steps")
            continue
        sid = str(sub.get("session_id") or f"{run.agent}.sub{j}")
        yield from _trajectory(sub, _Run(run.path, run.gid, sid, "sub-agent", sid), opts, ws)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    doc = document(path).value
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise InputError(path, 1, "expected an ATIF trajectory object with a 'steps' list")
    session = doc.get("session_id")
    if not isinstance(session, str) or not session:
        raise InputError(path, 1, "session_id: expected a non-empty string")
    gid, agent, reason = _lineage(path, session)
    if opts.group_by and doc.get(opts.group_by) is not None:
        gid = str(doc[opts.group_by])
    run = _Run(path, gid, agent, reason, session)
    n = 0
    for item in _trajectory(doc, run, opts, ""):
        n += 1
        yield item
    if n == 0:
        yield Reject(file=path, line=1, format=NAME, reason="no agent step to train on")


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=40)
__all__ = ["FORMAT", "NAME"]
