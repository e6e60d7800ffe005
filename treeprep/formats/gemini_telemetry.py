"""``gemini-cli-telemetry``: Gemini CLI's telemetry file, the exact requests and responses.

Gemini CLI's chat session files keep neither the system instruction nor the tools, and keep
replies as text and thought summaries (:mod:`treeprep.formats.gemini_cli`, ``docs/building.md``).
Its telemetry file keeps what was sent. With ``telemetry.enabled``, ``target: "local"`` and an
``outfile`` in its settings (``GEMINI_TELEMETRY_OUTFILE`` and friends; ``logPrompts`` is on by
default), Gemini CLI appends every OpenTelemetry span and log record to the file as
pretty-printed JSON objects, one after another (not one per line, not in time order). Learnt from
``@google/gemini-cli`` 0.61.0 (``LoggingContentGenerator``, ``ApiRequestEvent``,
``ApiResponseEvent``) and from its records of a run against a mock endpoint that logged every
request body, which they matched:

* a ``gemini_cli.api_request`` log record per call attempt: ``request_text``, the JSON of the
  request's whole ``contents`` as sent (the session context, the history without thought parts,
  the function responses), with ``prompt_id``, ``role`` (``main``, ``subagent``, or the internal
  callers ``utility_next_speaker``, ``utility_compressor``, ``utility_router`` ...), ``model`` and
  ``session.id``; its ``spanContext`` names the ``llm_call`` span;
* that span's ``gen_ai.system_instructions`` and ``gen_ai.tool.definitions``: the system
  instruction and the tools of the call, as JSON;
* a ``gemini_cli.api_response`` when the call ends: ``response_text``, the JSON of every stream
  chunk (an array; one object for a call not streamed), thought parts and function calls
  included, or a ``gemini_cli.api_error``. A streamed response carries no span: it answers the
  earliest unanswered request of the same ``prompt_id``, ``role`` and session before it.

One call per answered request: the prompt is the system instruction, then ``contents`` as chat
messages (a user turn's text parts stay parts, joined by the renderer; a function response is
the tool message of its call, its ``output`` when that is all it holds, else its JSON; a model
turn's text, thoughts and function calls one assistant message); the completion is the chunks'
parts (thought parts its reasoning). Function-call ids lose the ``<name>__`` prefix Gemini CLI
adds to the response's (the request's ids have none). Rejected, with the reason: a request whose
call failed (its error) or whose response is not in the file, a reply the model did not end
(``finishReason`` ``MAX_TOKENS``, ``SAFETY``, ``MALFORMED_FUNCTION_CALL`` ...), a user turn that
mixes text with function responses (no chat form keeps that order), and a request without its
span (its system instruction and tools are unknown).

Group: the session (``session.id``). Agent: ``main``, a sub-agent by its prompt id
(``<agent>#<turn>``, turn 0 a ``sub-agent`` branch), an internal caller by its role (a
``sub-agent`` branch; the compressor's a ``compaction`` one). Some internal calls are sent with no
system instruction (the next-speaker check); the file holds every request whole
(``whole_requests``), so the build does not count them as prompts with gaps.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._fields import as_dict, as_list, cut_reason, expect, make_call
from treeprep.formats._history import Converted, ParsedHistory
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.gemini_cli import call_arguments, function_response_text
from treeprep.io.compressed import read_all
from treeprep.io.jsonparse import (
    lenient_decoder,
    lenient_json_loads,
    non_finite_reason,
    strip_bom,
)
from treeprep.schemas import Reject

NAME = "gemini-cli-telemetry"
_REQUEST, _RESPONSE, _ERROR = (
    "gemini_cli.api_request",
    "gemini_cli.api_response",
    "gemini_cli.api_error",
)


@dataclass
class _Record:
    """A request or response log record: where it starts, when it was made, its attributes."""

    line: int
    time: tuple[int, int]
    attrs: dict[str, Any]
    span: str | None


def _objects(path: str, bad: list[Reject]) -> Iterator[tuple[int, Any]]:
    """(line, object) of each JSON value of the file, one after another. A value that does not
    parse ends the reading (the exporter appends whole objects, so it is a cut tail): one reject
    in ``bad``, the objects before it kept."""
    data = strip_bom(read_all(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        at = data.count(b"\n", 0, e.start) + 1
        why = f"not UTF-8 text (byte {e.start}); Gemini CLI writes UTF-8 (the file is not read)"
        bad.append(Reject(file=path, line=at, reason=why, format=NAME))
        return
    dec = lenient_decoder()  # NaN and Infinity kept as markers: that object is a reject
    i, line, n = 0, 1, len(text)
    while True:
        j = i
        while j < n and text[j] in " \t\r\n":
            j += 1
        line += text.count("\n", i, j)
        if j >= n:
            return
        try:
            obj, end = dec.raw_decode(text, j)
        except json.JSONDecodeError as e:
            at = line + text.count("\n", j, e.pos)
            why = f"malformed JSON: {e.msg} (the records from line {line} on are not read)"
            bad.append(Reject(file=path, line=at, reason=why, format=NAME))
            return
        if (number := non_finite_reason(obj)) is not None:  # JSON.stringify writes none
            bad.append(Reject(file=path, line=line, reason=number, format=NAME))
        else:
            yield line, obj
        line += text.count("\n", j, end)
        i = end


def _parse(
    path: str, bad: list[Reject]
) -> tuple[dict[str, dict[str, Any]], list[_Record], list[_Record]]:
    """(llm_call span attributes by span id, requests, responses and errors), in time order."""
    spans: dict[str, dict[str, Any]] = {}
    requests: list[_Record] = []
    answers: list[_Record] = []
    for line, obj in _objects(path, bad):
        if not isinstance(obj, dict) or not isinstance(obj.get("attributes"), dict):
            continue  # metrics, or something else of the exporters
        attrs = obj["attributes"]
        if obj.get("name") == "llm_call" and isinstance(obj.get("_spanContext"), dict):
            spans[str(obj["_spanContext"].get("spanId"))] = attrs
            continue
        event = attrs.get("event.name")
        if event not in (_REQUEST, _RESPONSE, _ERROR):
            continue
        t = obj.get("hrTime")  # [seconds, nanoseconds]; without it, the file's order
        time = (0, 0)
        if isinstance(t, list) and len(t) == 2 and all(type(x) is int for x in t):
            time = (t[0], t[1])
        ctx = obj.get("spanContext")
        span = str(ctx["spanId"]) if isinstance(ctx, dict) and ctx.get("spanId") else None
        rec = _Record(line, time, attrs, span)
        (requests if event == _REQUEST else answers).append(rec)
    key = lambda r: (r.time, r.line)  # noqa: E731
    return spans, sorted(requests, key=key), sorted(answers, key=key)


def _who(a: dict[str, Any]) -> tuple[str, str, str]:
    return (str(a.get("session.id")), str(a.get("prompt_id")), str(a.get("role")))


def _pairs(requests: list[_Record], answers: list[_Record]) -> dict[int, _Record]:
    """Each answered request's answer, by the request's index: by span where the answer has
    one, else the earliest unanswered request of the same caller before it."""
    by_span = {r.span: i for i, r in enumerate(requests) if r.span}
    waiting: dict[tuple[str, str, str], deque[int]] = defaultdict(deque)
    out: dict[int, _Record] = {}
    events = sorted(
        [(r.time, r.line, 0, i) for i, r in enumerate(requests)]
        + [(r.time, r.line, 1, i) for i, r in enumerate(answers)]
    )
    for _, _, kind, i in events:
        if kind == 0:
            waiting[_who(requests[i].attrs)].append(i)
            continue
        ans = answers[i]
        k = by_span.get(ans.span) if ans.span else None
        queue = waiting[_who(ans.attrs)]
        if k is None and queue:
            k = queue[0]
        if k is not None and k not in out:
            out[k] = ans
            if k in queue:
                queue.remove(k)
    return out


def _json(text: Any, where: str) -> Any:
    try:
        value = lenient_json_loads(expect(text, where, str))
    except json.JSONDecodeError as e:
        raise RecordError(f"{where}: malformed JSON ({e.msg})") from e
    if (why := non_finite_reason(value)) is not None:
        raise RecordError(f"{where}: {why}")
    return value


def _system(value: Any) -> str | None:
    """The system instruction as logged: a string, a part, a content or a list of parts."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict):
        value = value.get("parts", [value])
    if isinstance(value, list):
        text = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in value)
        return text or None
    return None


def _tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    out = []
    for i, tool in enumerate(as_list(value, where)):
        decls = as_dict(tool, f"{where}[{i}]").get("functionDeclarations") or []
        for j, d in enumerate(as_list(decls, f"{where}[{i}].functionDeclarations")):
            d = as_dict(d, f"{where}[{i}].functionDeclarations[{j}]")
            at = f"{where}[{i}].functionDeclarations[{j}]"
            fn: dict[str, Any] = {"name": expect(d.get("name"), f"{at}.name", str)}
            if d.get("description") is not None:
                fn["description"] = d["description"]
            params = d.get("parametersJsonSchema", d.get("parameters"))
            if params is not None:
                fn["parameters"] = params
            out.append({"type": "function", "function": fn})
    return out or None


def _call_id(fc: dict[str, Any]) -> str | None:
    cid, name = fc.get("id"), fc.get("name")
    if not isinstance(cid, str):
        return None
    return cid.removeprefix(f"{name}__") if isinstance(name, str) else cid


def _model_turn(parts: list[Any], where: str) -> dict[str, Any]:
    """A model turn's parts as one assistant message."""
    text: list[str] = []
    thought: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, p in enumerate(parts):
        p = as_dict(p, f"{where}[{i}]")
        if isinstance(p.get("functionCall"), dict):
            fc = p["functionCall"]
            fn = {"name": expect(fc.get("name"), f"{where}[{i}].functionCall.name", str),
                  "arguments": call_arguments(fc.get("args"))}  # fmt: skip
            calls.append({"id": _call_id(fc), "type": "function", "function": fn})
        elif isinstance(p.get("text"), str):
            (thought if p.get("thought") else text).append(p["text"])
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thought:
        msg["reasoning_content"] = "".join(thought)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user_turn(parts: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn as chat messages: its text parts one message, or its function responses one
    tool message each."""
    parts = [as_dict(p, f"{where}[{i}]") for i, p in enumerate(parts)]
    results = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
    if results and len(results) != len(parts):
        raise RecordError(f"{where}: a user turn mixes text and function responses")
    if results:
        return [
            {"role": "tool", "tool_call_id": _call_id(fr),
             "content": function_response_text(fr.get("response"))}
            for fr in results
        ]  # fmt: skip
    texts = [{"type": "text", "text": p["text"]} for p in parts if isinstance(p.get("text"), str)]
    if len(texts) != len(parts):
        kind = next(iter(next(p for p in parts if not isinstance(p.get("text"), str))), "part")
        raise RecordError(f"{where}: a part of kind {kind!r} is no text")
    return [{"role": "user", "content": texts}]


def _convert(contents: list[Any], at: int, where: str) -> Converted:
    """The chat messages of ``contents``, the first at index ``at`` of ``where``."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(contents, at):
        c = as_dict(c, f"{where}[{i}]")
        parts = as_list(c.get("parts"), f"{where}[{i}].parts")
        role = c.get("role")
        if role == "model":
            out.append(_model_turn(parts, f"{where}[{i}].parts"))
        elif role == "user":
            out.extend(_user_turn(parts, f"{where}[{i}].parts"))
        else:
            raise RecordError(f"{where}[{i}].role: expected user or model, got {role!r}")
    return Converted(out)


def _completion(answer: dict[str, Any]) -> dict[str, Any]:
    chunks = _json(answer.get("response_text"), "response_text")
    chunks = chunks if isinstance(chunks, list) else [chunks]
    parts: list[Any] = []
    finish = None
    for k, ch in enumerate(chunks):
        cands = as_list(as_dict(ch, f"response_text[{k}]").get("candidates") or [], "candidates")
        if not cands:
            continue
        cand = as_dict(cands[0], f"response_text[{k}].candidates[0]")
        finish = cand.get("finishReason") or finish
        content = cand.get("content")
        if isinstance(content, dict):
            parts.extend(as_list(content.get("parts") or [], f"response_text[{k}].parts"))
    if why := cut_reason(finish, "finishReason"):
        raise RecordError(why)
    return _model_turn(parts, "response_text parts")


def _agent(role: str, prompt_id: str) -> tuple[str, str | None]:
    """(agent id, branch hint) of a caller: an internal caller's call starts from its own prompt
    (a compressor's from the history it summarises: ``compaction``).

    >>> _agent("main", "s########2"), _agent("subagent", "investigator-7f3a#0")
    (('main', None), ('investigator-7f3a', 'sub-agent'))
    >>> _agent("utility_compressor", "s########2"), _agent("utility_router", "s########2")
    (('utility_compressor', 'compaction'), ('utility_router', 'sub-agent'))
    """
    if role == "main":
        return "main", None
    if role == "subagent":
        agent, _, turn = prompt_id.rpartition("#")
        return (agent or prompt_id), ("sub-agent" if turn == "0" else None)
    return role, ("compaction" if role == "utility_compressor" else "sub-agent")


def _call(
    path: str, req: _Record, answer: _Record, spans: dict[str, dict[str, Any]], prompts: _Prompts
) -> Item:
    a = req.attrs
    if "request_text" not in a:
        raise RecordError("no request_text: Gemini CLI wrote this file with logPrompts off, so the "
                          "prompt is not in it")  # fmt: skip
    span = spans.get(req.span or "")
    if span is None:
        raise RecordError("its llm_call span is not in the file: the system instruction and the "
                          "tools of the call are unknown")  # fmt: skip
    system = _system(_json(span.get("gen_ai.system_instructions", "[]"), "system_instructions"))
    tools = _tools(_json(span.get("gen_ai.tool.definitions", "[]"), "tool.definitions"), "tools")
    contents = as_list(_json(a.get("request_text"), "request_text"), "request_text")
    messages = prompts.of(a).messages(contents, "request_text")
    if answer.attrs.get("event.name") == _ERROR:
        raise RecordError(f"the call failed: {answer.attrs.get('error')!r}")
    agent, hint = _agent(str(a.get("role")), str(a.get("prompt_id")))
    model = answer.attrs.get("model") or a.get("model")
    fields = {
        "group_id": str(a.get("session.id")), "agent_id": agent, "branch_reason": hint,
        "call_id": f"{a.get('prompt_id')}@{req.line}", "model": model,
        "timestamp": a.get("event.timestamp"),
        "messages": [*([{"role": "system", "content": system}] if system else []), *messages],
        "tools": tools, "completion": _completion(answer.attrs),
        "provenance": {"exact_messages": True, "reconstructed": False},
        "source_file": path, "source_line": req.line, "source_format": NAME,
    }  # fmt: skip
    return make_call(fields, file=path, line=req.line, fmt=NAME)


class _Prompts:
    """One :class:`~treeprep.formats._history.ParsedHistory` per caller (session, prompt id's
    caller, role): each request's contents are parsed apart, and a caller's next request sends
    its last one's again, while the callers' requests interleave."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str, str], ParsedHistory] = {}

    def of(self, a: dict[str, Any]) -> ParsedHistory:
        session, prompt_id, role = _who(a)
        key = (session, prompt_id.rpartition("#")[0] if role == "subagent" else "", role)
        if key not in self._by:
            self._by[key] = ParsedHistory(_convert)
        return self._by[key]


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    bad: list[Reject] = []
    spans, requests, answers = _parse(path, bad)
    prompts = _Prompts()
    yield from bad
    paired = _pairs(requests, answers)
    for i, req in enumerate(requests):
        answer = paired.get(i)
        if answer is None:
            why = "no response to this request is in the file (the call was cut, or not flushed)"
            yield Reject(file=path, line=req.line, reason=why, format=NAME)
            continue
        try:
            yield _call(path, req, answer, spans, prompts)
        except RecordError as e:
            yield Reject(file=path, line=req.line, reason=str(e), format=NAME)


#: what only Gemini CLI's telemetry objects hold: a log record's event, an ``llm_call`` span, a
#: metric's name (whichever the exporters flushed first)
_SIGNS = (b'"event.name": "gemini_cli.', b'"name": "llm_call"', b'"name": "gemini_cli.')


def sniff(path: str, head: bytes) -> bool:
    h = strip_bom(head).lstrip()
    return h.startswith(b"{") and any(sign in h for sign in _SIGNS)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=15, whole_requests=True)
