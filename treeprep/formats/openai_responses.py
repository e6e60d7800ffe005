"""``openai-responses``: OpenAI Responses API logs (NeMo-Gym rollouts) turned into chat calls.

A record holds the request (``responses_create_params``, or ``request``, or ``input``/``tools``/
``instructions`` at the top level) and the response (``response.output``, or a top-level
``output``). ``input`` is a string (one user message) or a list of items; ``output`` is a list
of items. Items become chat messages:

* ``message`` -> a message of its role (``developer`` becomes ``system``), content kept as given;
* ``reasoning`` -> ``reasoning_content`` of the assistant turn it belongs to (its ``content``
  ``reasoning_text`` parts when present, else its ``summary`` texts, joined by newlines);
* ``function_call`` -> a tool call (``id`` = ``call_id``, arguments kept as given);
* ``function_call_output`` -> a ``tool`` message answering ``call_id``.

One assistant turn is a maximal run of consecutive ``reasoning``/``function_call``/assistant
``message`` items: models emit reasoning before *or after* the call it explains (NeMo-Gym logs
``function_call, reasoning, function_call_output``), and several parallel calls, so the run, not the
single item, is one response. Each turn in ``output`` is one call: its prompt is ``instructions`` +
``input`` + every output item before the turn, its completion is the turn. ``tools`` are converted
from the flat Responses form to chat function schemas. Provenance: ``exact_messages`` (the items
are the logged request and response).

NeMo-Gym's aviary agent logs ``output`` as a list of per-step agent states (each the whole input
list after that step) instead of one flat item list; then step k's prompt is state k-1 exactly as
stored and its completion the model's items that follow it (see :func:`_state_steps`).

Token ids are used exactly when the items carry them: a turn whose items hold
``prompt_token_ids``/``generation_token_ids`` (``generation_log_probs`` optional) becomes a
:class:`~treeprep.schemas.TokenRollout` per distinct id pair instead of a chat call (NeMo-Gym
attaches the ids of the whole generation, reasoning included, to the turn's message item). Such
files are sniffed as ``tokens`` (lower priority number); if the ids lie past the sniffed head the
file lands here and the ids are still used.

Group: ``--group-by``, else ``group_id``/``task_id``/``session_id`` (also under ``metadata``),
else NeMo-Gym's ``_ng_task_index`` scoped by the file's name (``NAME:task-N``): the rollouts of one
task (GRPO samples) share one tree. A NeMo-Gym record without the index (files written before
NeMo-Gym numbered its tasks, such as its ``example_rollouts.jsonl``) is grouped by the prompt its
rollout was sampled from: ``NAME:prompt-<digest>`` of ``responses_create_params``' ``instructions``,
``input`` and ``tools``. A file's rollouts of different tasks are different GRPO groups, never one
(the trainer computes advantages per tree), and two rollouts of one prompt are one group wherever
they lie in the file. Other records with no group share their file's. Reward and advantage come
from the record. One record is one rollout: its turns share a trajectory id (``trajectory_id``
and the other keys of :func:`~treeprep.formats.openai_chat.trajectory_of`, else ``FILE:LINE``).
The first call of a rollout that names its sample (one of those keys, or NeMo-Gym's: every
``responses_create_params`` record is one rollout) is hinted ``sampling``
(:mod:`treeprep.formats._samples`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from treeprep.formats._fields import (
    assistant_turn,
    chat_tool_call,
    content_digest,
    cut_reason,
    expect,
    file_stem,
    first_field,
    token_rollout,
    type_name,
)
from treeprep.formats._read import records
from treeprep.formats._samples import Samples
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import (
    RecordError,
    branch_reason_of,
    group_of,
    normalize_message,
    normalize_tools,
    number_of,
    obj_at,
    trajectory_of,
    validation_reason,
)
from treeprep.io.jsonparse import head_record, json_key_in
from treeprep.schemas import ChatCall, Provenance, Reject, TokenRollout

NAME = "openai-responses"

_ID_KEYS = ("prompt_token_ids", "generation_token_ids")
#: removed from the file's name for the ``_ng_task_index`` group id
_SUFFIXES = (".gz", ".zst", ".zstd", ".jsonl", ".ndjson", ".json")
#: what a NeMo-Gym task is without ``_ng_task_index``: the prompt its rollouts were sampled from
_TASK_KEYS = ("instructions", "input", "tools")


@dataclass
class _Segment:
    """A chat message made of one or more items; ``turn`` marks an assistant turn."""

    message: dict[str, Any]
    turn: bool = False
    #: (item index, item) for items of the turn that carry token ids
    id_items: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def _reasoning_text(it: dict[str, Any], where: str) -> str | None:
    texts: list[str] = []
    for key, kinds in (("content", ("reasoning_text", "text")), ("summary", ("summary_text",))):
        parts = it.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise RecordError(f"{where}.{key}: expected an array, got {type_name(parts)}")
        for i, p in enumerate(parts):
            if not isinstance(p, dict) or not isinstance(p.get("text"), str):
                raise RecordError(f"{where}.{key}[{i}]: expected a part with a string 'text'")
            if p.get("type", kinds[0]) in kinds:
                texts.append(p["text"])
        if texts:
            break  # full reasoning text wins over the summary
    return "\n".join(texts) if texts else None


class _Turn:
    def __init__(self) -> None:
        self.contents: list[Any] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.id_items: list[tuple[int, dict[str, Any]]] = []

    def message(self) -> dict[str, Any]:
        content: Any = None
        if len(self.contents) == 1:
            content = self.contents[0]
        elif self.contents:
            if all(isinstance(c, list) for c in self.contents):
                content = [p for c in self.contents for p in c]
            else:
                content = "".join(
                    c if isinstance(c, str) else "".join(str(p.get("text") or "") for p in c)
                    for c in self.contents
                    if c is not None
                )
        return assistant_turn(content, self.reasoning, self.tool_calls)


def turn_item(it: dict[str, Any]) -> bool:
    """Whether a Responses item belongs to an assistant turn (reasoning, a function call or an
    assistant message): :func:`segments` merges a run of them into one message, and any other
    item closes the run."""
    typ = it.get("type")
    if typ is None and "role" in it:
        typ = "message"
    return typ in ("reasoning", "function_call") or (
        typ == "message" and it.get("role") == "assistant"
    )


def segments(items: Any, where: str, *, start: int = 0) -> list[_Segment]:
    """Convert Responses items to chat messages, merging each assistant turn into one message.
    ``start``: the index of ``items[0]`` in the list it was cut from (errors name ``where[i]``
    by that list's indexes: a reader converting a history piece by piece names the same item)."""
    if isinstance(items, str):
        return [_Segment({"role": "user", "content": items})]
    if not isinstance(items, list):
        raise RecordError(
            f"{where}: expected a string or an array of items, got {type_name(items)}"
        )
    out: list[_Segment] = []
    turn: _Turn | None = None

    def close() -> None:
        nonlocal turn
        if turn is not None:
            out.append(_Segment(turn.message(), turn=True, id_items=turn.id_items))
            turn = None

    for i, it in enumerate(items, start):
        w = f"{where}[{i}]"
        if not isinstance(it, dict):
            raise RecordError(f"{w}: expected an item object, got {type_name(it)}")
        typ = it.get("type")
        if typ is None and "role" in it:
            typ = "message"
        assistant_item = turn_item(it)
        if not assistant_item:
            close()
        if typ == "message":
            if it.get("role") == "assistant":
                turn = turn or _Turn()
                msg = normalize_message({"role": "assistant", "content": it.get("content")}, w)
                turn.contents.append(msg["content"])
            else:
                msg = normalize_message({"role": it.get("role"), "content": it.get("content")}, w)
                out.append(_Segment(msg))
        elif typ == "reasoning":
            turn = turn or _Turn()
            text = _reasoning_text(it, w)
            if text is not None:
                turn.reasoning.append(text)
        elif typ == "function_call":
            turn = turn or _Turn()
            cid = expect(it.get("call_id"), f"{w}.call_id", str)
            name = expect(it.get("name"), f"{w}.name", str)
            args = expect(
                it.get("arguments", ""),
                f"{w}.arguments",
                str,
                dict,
                what="a JSON string or an object",
            )
            turn.tool_calls.append(chat_tool_call(cid, name, args))
        elif typ == "function_call_output":
            cid = expect(it.get("call_id"), f"{w}.call_id", str)
            output = it.get("output")
            msg = normalize_message({"role": "tool", "tool_call_id": cid, "content": output}, w)
            out.append(_Segment(msg))
        else:
            raise RecordError(
                f"{w}.type: unsupported item type {typ!r} "
                "(expected message, reasoning, function_call or function_call_output)"
            )
        if assistant_item and turn is not None and any(k in it for k in _ID_KEYS):
            turn.id_items.append((i, it))
    close()
    return out


def _group(rec: dict[str, Any], opts: ReadOptions, file: str) -> str | None:
    g = group_of(rec, opts)
    if g is None and not opts.group_by:
        idx = rec.get("_ng_task_index")
        if isinstance(idx, int) and not isinstance(idx, bool):
            g = f"{file_stem(file, _SUFFIXES)}:task-{idx}"
        elif isinstance(params := rec.get("responses_create_params"), dict):
            task = {k: params.get(k) for k in _TASK_KEYS}
            g = f"{file_stem(file, _SUFFIXES)}:prompt-{content_digest(task)}"
    return g


@dataclass(frozen=True)
class _Shared:
    """What every call of one record shares."""

    base_id: str
    group: str | None
    reward: float | None
    advantage: float | None
    branch: str | None
    model: str | None
    tools: list[dict[str, Any]] | None
    file: str
    line: int
    fmt: str
    #: where the output items are (``response.output`` or ``output``)
    where: str
    #: check logged ids against the items' text (``--check-ids``)
    check_ids: bool = True
    #: the request's ``reasoning.effort`` (else the response's)
    effort: str | None = None


def _effort(
    params: dict[str, Any], at: Callable[[str], str], resp: dict[str, Any], rwhere: str
) -> str | None:
    """The request's ``reasoning.effort``, else the one the response echoes; one that is not a
    string is a RecordError naming it, as the API refuses such a request."""
    bodies = [(f"{at('reasoning')}.", obj_at(params, "reasoning"))]
    if resp is not params:
        response = rwhere.removesuffix("output")  # "response." or "" (the flat form)
        bodies.append((f"{response}reasoning.", obj_at(resp, "reasoning")))
    return first_field(bodies, "effort", str)  # type: ignore[no-any-return]


def response_of(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's response object: ``response``, else the record itself (the flat form)."""
    return obj_at(rec, "response") if isinstance(rec.get("response"), dict) else rec


def _request(rec: Any) -> tuple[dict[str, Any], str, dict[str, Any], str, list[Any]]:
    """(request params, where they are, response, where its output is, the output items)."""
    if not isinstance(rec, dict):
        raise RecordError(f"expected a JSON object, got {type_name(rec)}")
    if isinstance(rec.get("responses_create_params"), dict):
        params, pwhere = rec["responses_create_params"], "responses_create_params"
    elif isinstance(rec.get("request"), dict):
        params, pwhere = rec["request"], "request"
    else:
        params, pwhere = rec, ""
    resp = response_of(rec)
    rwhere = "response.output" if resp is not rec else "output"
    output = resp.get("output")
    if not isinstance(output, list):
        raise RecordError(f"{rwhere}: expected an array of output items, got {type_name(output)}")
    return params, pwhere, resp, rwhere, output


def _prompt(
    params: dict[str, Any], at: Callable[[str], str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the system message from ``instructions``, if any; the whole prompt: it and ``input``)."""
    prompt: list[dict[str, Any]] = []
    instructions = params.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RecordError(
                f"{at('instructions')}: expected a string, got {type_name(instructions)}"
            )
        prompt.append({"role": "system", "content": instructions})
    system = list(prompt)
    inp = params.get("input")
    if inp is not None:
        prompt.extend(s.message for s in segments(inp, at("input")))
    return system, prompt


def responses_items(
    rec: Any, *, file: str, line: int, fmt: str, opts: ReadOptions
) -> list[ChatCall | TokenRollout]:
    """Every call of one Responses record (raises :class:`RecordError` when it does not fit)."""
    params, pwhere, resp, rwhere, output = _request(rec)

    def at(k: str) -> str:
        return f"{pwhere}.{k}" if pwhere else k

    system, prompt = _prompt(params, at)
    tools_src = params.get("tools") if params.get("tools") is not None else resp.get("tools")
    tools = normalize_tools(tools_src, at("tools"))
    if output and all(isinstance(x, list) for x in output):
        steps = _state_steps(output, system, rwhere)
    else:
        steps = _flat_steps(output, prompt, rwhere)
    rid = resp.get("id")
    shared = _Shared(
        base_id=rid if isinstance(rid, str) else f"{os.path.basename(file)}:{line}",
        group=_group(rec, opts, file),
        reward=number_of(rec, "reward"),
        advantage=number_of(rec, "advantage"),
        branch=branch_reason_of(rec),
        model=resp.get("model") if isinstance(resp.get("model"), str) else None,
        tools=tools,
        file=file,
        line=line,
        fmt=fmt,
        where=rwhere,
        check_ids=opts.check_ids,
        effort=_effort(params, at, resp, rwhere),
    )
    out: list[ChatCall | TokenRollout] = []
    for turn_no, (history, seg, hint) in enumerate(steps):
        try:
            if seg.id_items:
                out.extend(_rollouts(seg, turn_no, shared.branch or hint, shared))
            else:
                out.append(_chat_call(history, seg, turn_no, shared.branch or hint, shared))
        except ValidationError as e:
            raise RecordError(f"assistant turn {turn_no}: {validation_reason(e)}") from e
    traj = trajectory_of(rec) or f"{os.path.basename(file)}:{line}"
    for call in out:
        call.trajectory_id = traj
    return out


def _chat_call(
    history: list[dict[str, Any]], seg: _Segment, turn_no: int, branch: str | None, sh: _Shared
) -> ChatCall:
    return ChatCall(
        group_id=sh.group,
        call_id=f"{sh.base_id}#{turn_no}",
        model=sh.model,
        reasoning_effort=sh.effort,
        messages=list(history),  # type: ignore[arg-type]
        tools=sh.tools,
        completion=seg.message,  # type: ignore[arg-type]
        reward=sh.reward,
        advantage=sh.advantage,
        provenance=Provenance(exact_messages=True),
        branch_reason=branch,  # type: ignore[arg-type]
        source_file=sh.file,
        source_line=sh.line,
        source_format=sh.fmt,
    )


_Step = tuple[list[dict[str, Any]], _Segment, str | None]


def _flat_steps(output: list[Any], prompt: list[dict[str, Any]], where: str) -> list[_Step]:
    """One flat list of output items: each assistant turn follows everything before it."""
    segs = segments(output, where)
    if not any(s.turn for s in segs):
        raise RecordError(
            f"{where}: no assistant output (expected a message, reasoning or function_call item)"
        )
    steps: list[_Step] = []
    history = list(prompt)
    for seg in segs:
        if seg.turn:
            steps.append((list(history), seg, None))
        history.append(seg.message)
    return steps


def _is_assistant_item(it: Any) -> bool:
    if not isinstance(it, dict):
        return False
    typ = it.get("type", "message" if "role" in it else None)
    return typ in ("reasoning", "function_call") or (
        typ == "message" and it.get("role") == "assistant"
    )


def _state_steps(output: list[Any], system: list[dict[str, Any]], where: str) -> list[_Step]:
    """``output`` as a list of per-step agent states (NeMo-Gym's aviary agent).

    ``output[k]`` is the whole input list after step k: the state sent at step k (``output[k-1]``,
    or for k = 0 the initial input, which is not stored apart) followed by the model's output items
    and the environment's observations. So step k's prompt is ``output[k-1]`` exactly as stored
    (the agent may have collapsed old environment states in it: then the step is hinted
    ``elided-history``) and its completion is the run of assistant items at position
    ``len(output[k-1])`` of ``output[k]``; for k = 0 it is the last assistant run of ``output[0]``.
    """
    steps: list[_Step] = []
    prev: list[Any] | None = None
    for k, state in enumerate(output):
        w = f"{where}[{k}]"
        if prev is None:
            runs = [i for i, it in enumerate(state) if _is_assistant_item(it)]
            if not runs:
                raise RecordError(f"{w}: no assistant output in the first step's state")
            a = runs[-1]
            while a > 0 and _is_assistant_item(state[a - 1]):
                a -= 1
            prompt_items = state[:a]
        else:
            a = len(prev)
            if a >= len(state) or not _is_assistant_item(state[a]):
                raise RecordError(
                    f"{w}[{a}]: expected the model's output right after the previous step's "
                    f"{a} items"
                )
            prompt_items = prev
        b = a
        while b < len(state) and _is_assistant_item(state[b]):
            b += 1
        turn = segments(state[a:b], w)
        hint = None
        if prev is not None and k >= 2 and prev[: len(output[k - 2])] != output[k - 2]:
            hint = "elided-history"
        prompt = system + [sg.message for sg in segments(prompt_items, w)]
        steps.append((prompt, turn[0], hint))
        prev = state
    return steps


def _rollouts(seg: _Segment, turn_no: int, branch: str | None, sh: _Shared) -> list[TokenRollout]:
    """One TokenRollout per distinct id pair on the turn's items, its ids checked against the
    text and tool-call names of the items that carry them."""
    out: list[TokenRollout] = []
    said: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[list[str], list[str]]] = {}
    for _, it in seg.id_items:
        key = (tuple(it.get("prompt_token_ids") or ()), tuple(it.get("generation_token_ids") or ()))
        texts, names = said.setdefault(key, ([], []))
        if it.get("type") == "function_call" and isinstance(it.get("name"), str):
            names.append(it["name"])
        elif it.get("type") == "message":
            texts.append(_item_text(it.get("content")))
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for idx, it in seg.id_items:
        w = f"{sh.where}[{idx}]"
        p = check_ids(it.get("prompt_token_ids"), f"{w}.prompt_token_ids")
        g = check_ids(it.get("generation_token_ids"), f"{w}.generation_token_ids")
        key = (tuple(p), tuple(g))
        if key in seen:  # the same generation attached to several items of one turn
            continue
        seen.add(key)
        lp = check_logprobs(it.get("generation_log_probs"), f"{w}.generation_log_probs")
        iid = it.get("id") if isinstance(it.get("id"), str) else str(idx)
        texts, names = said[key]
        out.append(
            token_rollout(
                sh.check_ids,
                "".join(texts),
                names,
                group_id=sh.group,
                call_id=f"{sh.base_id}#{turn_no}/{iid}",
                prompt_token_ids=p,
                generation_token_ids=g,
                generation_log_probs=lp,
                reward=sh.reward,
                advantage=sh.advantage,
                branch_reason=branch,
                source_file=sh.file,
                source_line=sh.line,
                source_format=sh.fmt,
            )  # fmt: skip
        )
    return out


def _item_text(content: Any) -> str:
    """The text of a message item's content (a string, or its text parts joined)."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


#: the largest token id a shard holds (int32)
MAX_TOKEN_ID = 2**31 - 1
#: the largest finite float32: log-probs are stored as float32
FLOAT32_MAX = 3.4028234663852886e38


def check_ids(v: Any, where: str) -> list[int]:
    """A list of non-negative ints (booleans are not ids)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise RecordError(f"{where}: expected an array of token ids, got {type_name(v)}")
    for i, t in enumerate(v):
        if type(t) is not int or t < 0:
            raise RecordError(f"{where}[{i}]: expected a non-negative integer, got {t!r}")
        if t > MAX_TOKEN_ID:  # shards hold int32 ids
            raise RecordError(f"{where}[{i}]: token id {t} is out of range (max {MAX_TOKEN_ID})")
    return v


def check_logprobs(v: Any, where: str) -> list[float] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise RecordError(f"{where}: expected an array of numbers, got {type_name(v)}")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise RecordError(f"{where}[{i}]: expected a number, got {x!r}")
        if not abs(x) <= FLOAT32_MAX:  # NaN, infinities and what float32 would turn into them
            raise RecordError(f"{where}[{i}]: {x!r} is not a finite float32 number")
    return [float(x) for x in v]


def convert(rec: Any, *, file: str, line: int, fmt: str, opts: ReadOptions) -> list[Item]:
    try:
        items: list[Item] = list(responses_items(rec, file=file, line=line, fmt=fmt, opts=opts))
    except RecordError as e:
        return [Reject(file=file, line=line, reason=str(e), format=fmt)]
    resp = response_of(rec)
    why = cut_reason(resp.get("status"), "response.status")
    if why and items and isinstance(items[-1], ChatCall):
        # the limit cut the last reply (the turns before it are whole); token ids are exact
        # without an end of turn, so a TokenRollout stays
        cid = items[-1].call_id
        items[-1] = Reject(file=file, line=line, reason=why, format=fmt, call_id=cid)
    return items


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    samples = Samples()  # each rollout's first call: sampling (see the module)
    for line, rec in records(path, NAME):
        if isinstance(rec, Reject):
            yield rec
        else:
            yield from samples.mark(rec, convert(rec, file=path, line=line, fmt=NAME, opts=opts))


def looks_like_responses(rec: Any) -> bool:
    """A parsed record in the Responses layout (request params and/or output items)."""
    if not isinstance(rec, dict):
        return False
    if isinstance(rec.get("responses_create_params"), dict):
        return True
    resp = rec.get("response")
    if isinstance(resp, dict) and isinstance(resp.get("output"), list) and "choices" not in resp:
        return True
    return isinstance(rec.get("output"), list) and "input" in rec


_ITEM_TYPE = re.compile(rb'(?<!\\)"type"\s*:\s*"(function_call|function_call_output|reasoning)"')


def sniff(path: str, head: bytes) -> bool:
    rec = head_record(head)
    if rec is not None:
        return looks_like_responses(rec)
    if not head.lstrip().startswith(b"{"):
        return False
    if json_key_in(head, "responses_create_params"):
        return True
    return (
        json_key_in(head, "input")
        and json_key_in(head, "output")
        and _ITEM_TYPE.search(head) is not None
    )


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=45)
