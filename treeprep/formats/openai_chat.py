"""``openai-chat`` and ``openai-chat-json``: per-call logs in OpenAI chat-completions form.

One record is one LLM call: the prompt ``messages``, the ``tools`` offered and the completion. The
completion is read from, in order, ``completion`` (a message or a plain string),
``response.choices[0].message`` and a top-level ``choices[0].message``; a ``request`` object may
hold ``messages``/``tools``/``model`` instead of the top level. Two layouts:

* ``openai-chat``: JSONL, one call per line (any extension but ``.json``).
* ``openai-chat-json``: one call per ``.json`` file (or a JSON list of calls), such as the LiteLLM
  logs written by OpenHands (``messages``, ``tools``, ``kwargs``, ``response``). Calls without a
  group id are grouped by folder (``group_by_folder``): one folder of logs is one agent run.

Normalization is deliberately small, because the renderer must see what the model saw: content parts
are kept as given (the renderer joins text parts), tool-call arguments are kept as given (a JSON
string or an object), ``reasoning_content`` is kept (read through :mod:`treeprep.formats._fields`,
so OpenRouter's ``reasoning`` is the same field), role ``developer`` becomes ``system``, and
provider extras (``index`` on tool calls, ``refusal``, ``function_call: null``, ``annotations``
...) are dropped. The legacy function-calling API (older logs, Toucan-1.5M) maps onto tools: an
assistant's ``function_call`` ``{name, arguments}`` is its one tool call, a ``function`` role
message (with its ``name``) the call's result, and request ``functions`` the tool schemas; the
legacy API had no call ids, so these have none (nothing is invented). Everything else that does
not fit is a reject naming the field: an unknown role,
a wrong type, a tool result with no matching call, a missing completion.

LiteLLM's mocked function calling (``raw_messages`` and ``raw_response`` present): the model was
sent ``messages`` with the tools described in the system prompt as text and no tool schemas, and
answered ``raw_response``; ``response`` is LiteLLM's re-parse into tool calls, which the model
never produced. So for those records the prompt is ``messages``, ``tools`` is None and the
completion is ``raw_response.choices[0].message``: the tokens the model actually saw and wrote.

The group id is ``--group-by FIELD`` (dotted paths allowed) when given, else the first of
``group_id``, ``task_id``, ``session_id`` and the same keys under ``metadata``. The trajectory (the
sample, one agent run) is the first of ``trajectory_id``, ``sample_id``, ``rollout_id``,
``episode_id``, ``session_id`` (top level or under ``metadata``); without one the builder takes the
group as one run.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    REWARD_KEYS,
    AliasError,
    aliased,
    cut_reason,
    first_field,
    one_of,
    openai_tool_calls,
    opt_str,
    reasoning_of,
    template_kwargs_at,
    type_name,
)
from treeprep.formats._read import document, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io.jsonparse import head_record, json_key_in
from treeprep.schemas import BRANCH_REASONS, ChatCall, Provenance, Reject

NAME = "openai-chat"
NAME_JSON = "openai-chat-json"

GROUP_KEYS = ("group_id", "task_id", "session_id")
TRAJECTORY_KEYS = ("trajectory_id", "sample_id", "rollout_id", "episode_id", "session_id")
_ROLES = ("system", "user", "assistant", "tool")


# --------------------------------------------------------------------------------------------
# small shared helpers (also used by the tokens and openai-responses adapters)
# --------------------------------------------------------------------------------------------


def obj_at(rec: dict[str, Any], key: str) -> dict[str, Any]:
    """``rec[key]`` when it is an object, else an empty dict."""
    v = rec.get(key)
    return v if isinstance(v, dict) else {}


def _request_bodies(rec: dict[str, Any], req: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where a row logs its request's fields, first found first: the row, its ``request``,
    LiteLLM's ``kwargs``, and the OpenAI SDK's ``extra_body`` of each (the path as a prefix)."""
    out = []
    for where, body in (("", rec), ("request.", req), ("kwargs.", obj_at(rec, "kwargs"))):
        out += [(where, body), (f"{where}extra_body.", obj_at(body, "extra_body"))]
    return out


def validation_reason(e: ValidationError) -> str:
    """A pydantic error as one short line: ``field.path: message`` (first three errors)."""
    parts: list[str] = []
    seen: set[str] = set()
    for err in e.errors(include_url=False):
        loc = ""
        for x in err["loc"]:
            if isinstance(x, int):
                loc += f"[{x}]"
            elif re.fullmatch(r"[a-z_][a-z0-9_]*", str(x)) and x not in ("str", "list", "dict"):
                loc += f".{x}" if loc else str(x)
            # union-member tags such as 'list[ContentPart]' or 'function-after[...]' are skipped
        if loc in seen:
            continue
        seen.add(loc)
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
        if len(parts) == 3:
            break
    return "; ".join(parts)


def get_path(rec: Any, dotted: str) -> Any:
    """``rec['a']['b']`` for ``'a.b'`` (a top-level key containing dots is tried first)."""
    if isinstance(rec, dict) and dotted in rec:
        return rec[dotted]
    cur = rec
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _as_group(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise RecordError(f"{where}: expected a string or number as group id, got {type_name(v)}")
    return str(v)


def group_of(rec: dict[str, Any], opts: ReadOptions) -> str | None:
    """The record's group id: ``--group-by`` when given, else the usual keys (see module doc)."""
    if opts.group_by:
        return _as_group(get_path(rec, opts.group_by), opts.group_by)
    for k in GROUP_KEYS:
        if rec.get(k) is not None:
            return _as_group(rec[k], k)
    meta = rec.get("metadata")
    if isinstance(meta, dict):
        for k in GROUP_KEYS:
            if meta.get(k) is not None:
                return _as_group(meta[k], f"metadata.{k}")
    return None


_FLOAT_MAX = 1.7976931348623157e308


def trajectory_of(rec: dict[str, Any]) -> str | None:
    """The record's trajectory (sample) id from :data:`TRAJECTORY_KEYS`, or None."""
    for src, where in ((rec, ""), (rec.get("metadata"), "metadata.")):
        if not isinstance(src, dict):
            continue
        for k in TRAJECTORY_KEYS:
            if src.get(k) is not None:
                return _as_group(src[k], f"{where}{k}")
    return None


def number_of(rec: dict[str, Any], key: str) -> float | None:
    """A numeric field (reward, advantage); booleans count as 1.0/0.0."""
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    if not isinstance(v, int | float):
        raise RecordError(f"{key}: expected a number, got {type_name(v)}")
    f = float(v) if abs(v) <= _FLOAT_MAX else math.inf  # a huge int would overflow float()
    if not math.isfinite(f):
        raise RecordError(f"{key}: expected a finite number, got {v!r}")
    return f


def row_reward(rec: dict[str, Any], field: str | None = None) -> float | None:
    """A dataset row's reward: the field ``field`` names (``--map reward=FIELD``, a dotted path
    allowed; it must hold a number or a boolean), else the first of
    :data:`~treeprep.formats._fields.REWARD_KEYS` that holds one.

    >>> row_reward({"resolved": True, "score": 0.5}), row_reward({"target": "text", "score": 2})
    (1.0, 2.0)
    """
    if field is not None:
        head, _, rest = field.partition(".")
        src: Any = rec
        while rest and isinstance(src.get(head), dict):
            src, (head, _, rest) = src[head], rest.partition(".")
        return number_of(src, head) if isinstance(src, dict) and not rest else None
    for key in REWARD_KEYS:
        v = rec.get(key)
        if v is None:
            continue
        if key == "reward" or isinstance(v, bool):
            return number_of(rec, key)  # ``reward`` of another type is a reject, as it was
        if key != "target" and isinstance(v, int | float) and math.isfinite(v):
            return float(v)
    return None


def row_model(rec: dict[str, Any], field: str | None = None) -> str | None:
    """A dataset row's model: ``field`` (``--map model=FIELD``) or ``model``/``model_name``."""
    try:
        v = rec.get(field) if field else aliased(rec, "model")
    except AliasError as e:
        raise RecordError(str(e)) from e
    return v if isinstance(v, str) and v else None


def branch_reason_of(rec: dict[str, Any]) -> str | None:
    v = rec.get("branch_reason")
    if v is None:
        return None
    if v not in BRANCH_REASONS:
        raise RecordError(f"branch_reason: expected one of {', '.join(BRANCH_REASONS)}, got {v!r}")
    return str(v)


def outcome_fields(rec: dict[str, Any], *, file: str, line: int, fmt: str) -> dict[str, Any]:
    """The fields a per-call record reads the same way in every layout: reward, advantage and
    branch reason (checked in that order), and where the record came from."""
    return {
        "reward": number_of(rec, "reward"),
        "advantage": number_of(rec, "advantage"),
        "branch_reason": branch_reason_of(rec),
        "source_file": file,
        "source_line": line,
        "source_format": fmt,
    }


def _content(v: Any, where: str) -> str | list[dict[str, Any]] | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        for i, p in enumerate(v):
            if not isinstance(p, dict) or not isinstance(p.get("type"), str):
                raise RecordError(
                    f"{where}[{i}]: expected a content part object with a string 'type', "
                    f"got {type_name(p)}"
                )
            if "text" in p and p["text"] is not None and not isinstance(p["text"], str):
                raise RecordError(
                    f"{where}[{i}].text: expected a string, got {type_name(p['text'])}"
                )
        return v
    raise RecordError(
        f"{where}: expected a string, a list of content parts or null, got {type_name(v)}"
    )


def normalize_message(m: Any, where: str) -> dict[str, Any]:
    """One chat message as a plain dict for :class:`~treeprep.schemas.Message` (see module doc)."""
    if not isinstance(m, dict):
        raise RecordError(f"{where}: expected a message object, got {type_name(m)}")
    role = m.get("role")
    role = (
        {"developer": "system", "function": "tool"}.get(role, role)
        if isinstance(role, str)
        else role
    )
    if not one_of(role, _ROLES):
        shown = repr(role) if isinstance(role, str | None) else type_name(role)
        raise RecordError(
            f"{where}.role: unknown role {shown} "
            "(expected system, developer, user, assistant or tool)"
        )
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), f"{where}.content")}
    tcs = m.get("tool_calls")
    if tcs:
        if role != "assistant":
            raise RecordError(f"{where}.tool_calls: only assistant messages make tool calls")
        out["tool_calls"] = openai_tool_calls(tcs, f"{where}.tool_calls")
    if m.get("function_call") is not None:  # the legacy API: one call, no id
        if role != "assistant" or tcs:
            raise RecordError(
                f"{where}.function_call: expected on an assistant message without tool_calls"
            )
        out["tool_calls"] = openai_tool_calls([m["function_call"]], f"{where}.function_call")
    if role == "tool":
        tid = m.get("tool_call_id")
        if isinstance(tid, int) and not isinstance(tid, bool):
            tid = str(tid)
        if tid is not None and not isinstance(tid, str):
            raise RecordError(f"{where}.tool_call_id: expected a string, got {type_name(tid)}")
        out["tool_call_id"] = tid
    name = opt_str(m.get("name"), f"{where}.name")
    if name is not None:
        out["name"] = name
    try:
        reasoning = reasoning_of(m)
    except AliasError as e:
        raise RecordError(f"{where}: {e}") from e
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    return out


def legacy_functions(functions: Any, where: str) -> list[dict[str, Any]]:
    """The legacy API's ``functions`` (``{name, description, parameters}`` each) as tools."""
    if not isinstance(functions, list):
        raise RecordError(
            f"{where}: expected an array of function schemas, got {type_name(functions)}"
        )
    return [{"type": "function", "function": f} if isinstance(f, dict) else f for f in functions]


def normalize_tools(tools: Any, where: str) -> list[dict[str, Any]] | None:
    """Tool schemas in chat form ``{"type": "function", "function": {...}}``.

    The flat Responses form (``{"type": "function", "name": ..., "parameters": ...}``) is converted;
    an empty list becomes None (templates treat both alike). A provider's cache mark on a schema
    (``cache_control``: DashScope's and Anthropic's prompt caches) is left out: it tells the
    provider where to cache, the model never sees it (templates would print it with the schema).

    >>> normalize_tools([{"type": "function", "function": {"name": "ls"},
    ...                   "cache_control": {"type": "ephemeral"}}], "tools")
    [{'type': 'function', 'function': {'name': 'ls'}}]
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RecordError(f"{where}: expected an array of tool schemas, got {type_name(tools)}")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        w = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise RecordError(f"{w}: expected a tool schema object, got {type_name(t)}")
        if t.get("type", "function") != "function":
            raise RecordError(
                f"{w}.type: unsupported tool type {t.get('type')!r} (expected function)"
            )
        if isinstance(t.get("function"), dict):
            if not isinstance(t["function"].get("name"), str):
                raise RecordError(f"{w}.function.name: expected a string")
            out.append(t if "cache_control" not in t else _without(t, "cache_control"))
            continue
        if not isinstance(t.get("name"), str):
            raise RecordError(f"{w}: expected 'function' (chat form) or 'name' (Responses form)")
        fn = {
            k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None
        }
        out.append({"type": "function", "function": fn})
    return out or None


def _without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


# --------------------------------------------------------------------------------------------
# one record -> one ChatCall
# --------------------------------------------------------------------------------------------


def _choice_message(resp: Any, where: str) -> dict[str, Any]:
    if not isinstance(resp, dict):
        raise RecordError(f"{where}: expected an object, got {type_name(resp)}")
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        raise RecordError(f"{where}.choices: expected a non-empty array, got {type_name(choices)}")
    ch = choices[0]
    if not isinstance(ch, dict) or not isinstance(ch.get("message"), dict):
        raise RecordError(f"{where}.choices[0].message: expected a message object")
    if why := cut_reason(ch.get("finish_reason"), f"{where}.choices[0].finish_reason".lstrip(".")):
        raise RecordError(why)
    return ch["message"]


def _completion(rec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The raw completion message and where it came from."""
    if "raw_messages" in rec and isinstance(rec.get("raw_response"), dict):
        m = _choice_message(rec["raw_response"], "raw_response")
        if m.get("tool_calls"):
            # a mocked-function-calling model answers in text; tool_calls here (OpenHands logs
            # show `[{}]`) mean the logger overwrote the message, and the model's text is lost
            raise RecordError(
                "raw_response.choices[0].message: mocked function calling, but the logged raw "
                "response carries tool_calls (the logger overwrote the model's text), so the "
                "exact completion is lost"
            )
        return m, "raw_response.choices[0].message"
    c = rec.get("completion")
    if c is not None:
        if isinstance(c, str):
            return {"role": "assistant", "content": c}, "completion"
        if isinstance(c, dict) and "choices" in c:
            return _choice_message(c, "completion"), "completion"
        if not isinstance(c, dict):
            raise RecordError(
                f"completion: expected a message object or a string, got {type_name(c)}"
            )
        return c, "completion"
    if isinstance(rec.get("response"), dict):
        return _choice_message(rec["response"], "response"), "response.choices[0].message"
    if "choices" in rec:
        return _choice_message(rec, ""), "choices[0].message"
    raise RecordError(
        "no completion: expected 'completion', 'response.choices[0].message' or "
        "'choices[0].message'"
    )


def chat_call(
    rec: Any, *, file: str, line: int, fmt: str, opts: ReadOptions, index: int = 0
) -> ChatCall:
    """Convert one raw record (raises :class:`RecordError` with the reason when it does not fit)."""
    if not isinstance(rec, dict):
        raise RecordError(f"expected a JSON object with 'messages', got {type_name(rec)}")
    req = obj_at(rec, "request")
    msgs = rec.get("messages", req.get("messages"))
    if msgs is None:
        raise RecordError("no 'messages' (expected the prompt as a list of chat messages)")
    if not isinstance(msgs, list):
        raise RecordError(f"messages: expected an array of messages, got {type_name(msgs)}")
    messages = [normalize_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
    raw_c, where_c = _completion(rec)
    comp = dict(raw_c)
    comp.setdefault("role", "assistant")
    if comp.get("role") != "assistant":
        raise RecordError(f"{where_c}.role: expected 'assistant', got {comp.get('role')!r}")
    completion = normalize_message(comp, where_c)
    mocked = "raw_messages" in rec and isinstance(rec.get("raw_response"), dict)
    if mocked:
        tools = None  # the tools were described in the prompt text, not sent as schemas
    else:
        kw = obj_at(rec, "kwargs")
        src = next(
            (
                (where, d[key])
                for key in ("tools", "functions")  # ``functions``: the legacy API's
                for where, d in ((key, rec), (f"request.{key}", req), (f"kwargs.{key}", kw))
                if d.get(key) is not None
            ),
            ("tools", None),
        )
        src = (src[0], src[1] if src[0].endswith("tools") else legacy_functions(src[1], src[0]))
        tools = normalize_tools(src[1], src[0])
    resp = obj_at(rec, "response")
    model = rec.get("model") or req.get("model") or resp.get("model")
    bodies = _request_bodies(rec, req)
    effort = first_field(bodies, "reasoning_effort", str)
    template_kwargs = template_kwargs_at(bodies)
    call_id = rec.get("call_id") or rec.get("id") or resp.get("id")
    if not isinstance(call_id, str | int) or isinstance(call_id, bool):
        call_id = None
    if call_id is None:
        call_id = f"{os.path.basename(file)}:{line}" + (f"#{index}" if index else "")
    parent = rec.get("parent_call_id")
    agent = rec.get("agent_id")
    try:
        return ChatCall(
            group_id=group_of(rec, opts),
            agent_id=agent if isinstance(agent, str) else "main",
            call_id=str(call_id),
            trajectory_id=trajectory_of(rec),
            parent_call_id=parent if isinstance(parent, str) else None,
            model=model if isinstance(model, str) else None,
            timestamp=rec["timestamp"] if isinstance(rec.get("timestamp"), str) else None,
            reasoning_effort=effort,
            chat_template_kwargs=template_kwargs,
            messages=messages,  # type: ignore[arg-type]
            tools=tools,
            completion=completion,  # type: ignore[arg-type]
            provenance=Provenance(exact_tokens=False, exact_messages=True, reconstructed=False),
            **outcome_fields(rec, file=file, line=line, fmt=fmt),
        )
    except ValidationError as e:
        raise RecordError(validation_reason(e)) from e


def _convert(
    rec: Any, *, file: str, line: int, fmt: str, opts: ReadOptions, index: int = 0
) -> Item:
    try:
        return chat_call(rec, file=file, line=line, fmt=fmt, opts=opts, index=index)
    except RecordError as e:
        cid = rec.get("id") if isinstance(rec, dict) and isinstance(rec.get("id"), str) else None
        return Reject(file=file, line=line, reason=str(e), format=fmt, call_id=cid)


# --------------------------------------------------------------------------------------------
# reading and sniffing
# --------------------------------------------------------------------------------------------


def read_jsonl(path: str, opts: ReadOptions) -> Iterator[Item]:
    for line, rec in records(path, NAME):
        yield (
            rec
            if isinstance(rec, Reject)
            else _convert(rec, file=path, line=line, fmt=NAME, opts=opts)
        )


def read_json(path: str, opts: ReadOptions) -> Iterator[Item]:
    try:
        doc = document(path).value
    except InputError as e:
        yield Reject(file=e.file, line=e.line, reason=e.reason, format=NAME_JSON)
        return
    if isinstance(doc, list):
        if not doc:
            yield Reject(
                file=path, line=1, reason="empty JSON array (expected calls)", format=NAME_JSON
            )
        for i, rec in enumerate(doc):
            yield _convert(rec, file=path, line=1, fmt=NAME_JSON, opts=opts, index=i + 1)
    else:
        yield _convert(doc, file=path, line=1, fmt=NAME_JSON, opts=opts)


def looks_like_call(rec: Any) -> bool:
    """A parsed record with chat ``messages`` and a completion in one of the known places."""
    if not isinstance(rec, dict):
        return False
    req = obj_at(rec, "request")
    msgs = rec.get("messages", req.get("messages"))
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
        return False
    if rec.get("completion") is not None or isinstance(rec.get("choices"), list):
        return True
    resp = rec.get("response")
    return isinstance(resp, dict) and isinstance(resp.get("choices"), list)


_PARTIAL_START = re.compile(rb'^\s*\{\s*"(messages|request)"\s*:\s*[\[{]')
_OPENAI_ROLE = re.compile(rb'(?<!\\)"role"\s*:\s*"(system|developer|user|tool)"')
_ANTHROPIC_BLOCK = re.compile(rb'(?<!\\)"type"\s*:\s*"(tool_use|tool_result|thinking)"')


def _sniff_head(head: bytes) -> bool:
    rec = head_record(head)
    if rec is not None:
        if isinstance(rec, list):
            return bool(rec) and looks_like_call(rec[0])
        return looks_like_call(rec)
    # the first record is longer than the head: judge by its opening keys
    return (
        _PARTIAL_START.match(head) is not None
        and _OPENAI_ROLE.search(head) is not None
        and _ANTHROPIC_BLOCK.search(head) is None
        and not json_key_in(head, "parentUuid")
    )


def _is_json_path(path: str) -> bool:
    p = path.lower()
    for ext in (".gz", ".zst", ".zstd"):
        p = p.removesuffix(ext)
    return p.endswith(".json") and not p.endswith(".traj.json")


def sniff_jsonl(path: str, head: bytes) -> bool:
    return not _is_json_path(path) and _sniff_head(head)


def sniff_json(path: str, head: bytes) -> bool:
    return _is_json_path(path) and _sniff_head(head)


FORMATS = [
    FormatSpec(name=NAME, sniff=sniff_jsonl, read=read_jsonl, priority=60),
    FormatSpec(name=NAME_JSON, sniff=sniff_json, read=read_json, group_by_folder=True, priority=60),
]
FORMAT = FORMATS[0]
