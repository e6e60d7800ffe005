"""SWE-agent trajectories (``*.traj``: one JSON document per run).

A ``.traj`` holds ``trajectory`` (one step per model call: ``response``, ``thought``, ``action``,
``observation``, and depending on the version ``query`` or ``messages``) and ``history`` (every
message of the run, the system prompt and demonstrations included; function-calling runs carry
OpenAI ``tool_calls`` on assistant messages and ``tool_call_ids`` on ``tool`` messages).

Which prompt each call gets, most exact first:

1. ``step["query"]`` (newer SWE-agent): the exact messages sent for that step.
2. ``step["messages"]`` (SWE-agent 1.x): the processed history *after* the step, i.e. what the next
   query sends; so call ``k`` has prompt ``steps[k-1]["messages"]`` (call 0: the messages before the
   first action) and completion ``steps[k]["messages"][-2]``. History processors such as
   ``last_n_observations`` have already replaced old outputs ("Old environment output: (7 lines
   omitted)"), so these prompts are exact, and a call whose prompt is not the previous prompt plus
   the previous completion is hinted ``elided-history``.
3. ``history`` only (older runs): call ``k`` is the ``k``-th assistant message and its prompt all
   messages before it. This is a reconstruction: any history processor the run used is not
   replayed.

Tool schemas are not stored (SWE-agent generates them from its tool bundles): ``--tools`` supplies
them. One group (tree) per file: every call of a run shares its system prompt and task.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    AliasError,
    as_dict,
    file_stem,
    group_or,
    make_call,
    openai_tool_calls,
    opt_list,
    reasoning_of,
    type_name,
)
from treeprep.formats._history import Converted, ParsedHistory
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "swe-agent"
_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def _strip_ext(path: str) -> str:
    return file_stem(path, (".gz", ".zst"))


def sniff(path: str, head: bytes) -> bool:
    """A ``.traj`` JSON document with SWE-agent's ``trajectory`` / ``history`` keys."""
    if not _strip_ext(path).endswith(".traj"):
        return False
    h = head.lstrip()
    return h.startswith(b"{") and (b'"trajectory"' in head or b'"history"' in head)


def _message(m: Any, where: str) -> dict[str, Any]:
    """A SWE-agent message in OpenAI form (its bookkeeping keys dropped); RecordError naming
    ``where`` when it is misshapen."""
    m = as_dict(m, where)
    if not isinstance(m.get("role"), str):
        raise RecordError(f"{where}.role: expected a string, got {type_name(m.get('role'))}")
    out = {k: m[k] for k in _KEEP if k in m and m[k] is not None}
    try:
        reasoning = reasoning_of(m)
    except AliasError as e:
        raise RecordError(f"{where}: {e}") from e
    if reasoning is not None and m.get("role") == "assistant":
        out["reasoning_content"] = reasoning
    if m.get("role") == "tool" and "tool_call_id" not in out:
        ids = opt_list(m.get("tool_call_ids"), f"{where}.tool_call_ids")
        if ids:
            out["tool_call_id"] = ids[0]
    if out.get("tool_calls"):
        out["tool_calls"] = openai_tool_calls(out["tool_calls"], f"{where}.tool_calls")
    if isinstance(out.get("content"), list):
        out["content"] = [
            {"type": p.get("type", "text"), "text": p.get("text")} if isinstance(p, dict) else p
            for p in out["content"]
        ]
    return out


def _convert(entries: list[Any], at: int, where: str) -> Converted:
    """SWE-agent messages (``where``'s, from index ``at``), one chat message each."""
    return Converted([_message(m, f"{where}[{at + j}]") for j, m in enumerate(entries)])


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    doc = document(path, keep_non_finite=True).value
    if not isinstance(doc, dict) or not (
        isinstance(doc.get("trajectory"), list) or isinstance(doc.get("history"), list)
    ):
        raise InputError(
            path, 1, "expected a SWE-agent .traj object with 'trajectory' or 'history'"
        )
    try:
        steps = opt_list(doc.get("trajectory"), "trajectory")
        history = opt_list(doc.get("history"), "history")
    except RecordError as e:
        raise InputError(path, 1, str(e)) from e
    stem = _strip_ext(path)[: -len(".traj")]
    gid = group_or(doc, opts, stem)
    main_agent = next((m.get("agent") for m in history if isinstance(m, dict)), None)
    hist = [m for m in history if isinstance(m, dict) and m.get("agent", main_agent) == main_agent]

    calls, problems = _calls(path, steps, hist)
    yield from problems
    yield from _emit(path, opts, gid, stem, calls)


_Call = tuple[list[dict[str, Any]], dict[str, Any], bool, str]


def _calls(
    path: str, steps: list[Any], hist: list[dict[str, Any]]
) -> tuple[list[_Call], list[Reject]]:
    """(prompt, completion, exact, where) per call, and the calls that do not fit (a misshapen
    message rejects the call whose prompt or completion holds it, naming the field)."""
    calls: list[_Call] = []
    problems: list[Reject] = []

    def reject(reason: str) -> None:
        problems.append(Reject(file=path, line=1, format=NAME, reason=reason))

    # with last_n_observations a prompt leaves the last at the output elided last: the messages
    # after it are converted again
    prompts = ParsedHistory(_convert, per_entry=True)
    if steps and all(isinstance(s, dict) and isinstance(s.get("query"), list) for s in steps):
        assistants = [m for m in hist if m.get("role") == "assistant"]
        for k, s in enumerate(steps):
            try:
                if len(assistants) == len(steps):
                    comp = _message(assistants[k], f"history (assistant message {k})")
                else:
                    comp = {"role": "assistant", "content": s.get("response") or ""}
                prompt = prompts.messages(s["query"], f"trajectory[{k}].query")
            except RecordError as e:
                reject(f"call trajectory[{k}]: {e}")
                continue
            calls.append((prompt, comp, True, f"trajectory[{k}]"))
    elif steps and all(isinstance(s, dict) and isinstance(s.get("messages"), list) for s in steps):
        for k, s in enumerate(steps):
            msgs = s["messages"]
            if (
                len(msgs) < 2
                or not isinstance(msgs[-2], dict)
                or msgs[-2].get("role") != ("assistant")
            ):
                reject(
                    f"trajectory[{k}].messages does not end with the step's "
                    "assistant action and its observation"
                )
                continue
            try:
                if k == 0:
                    prompt = prompts.messages(msgs[:-2], f"trajectory[{k}].messages")
                else:
                    raw = steps[k - 1]["messages"]
                    prompt = prompts.messages(raw, f"trajectory[{k - 1}].messages")
                comp = _message(msgs[-2], f"trajectory[{k}].messages[{len(msgs) - 2}]")
            except RecordError as e:
                reject(f"call trajectory[{k}]: {e}")
                continue
            calls.append((prompt, comp, True, f"trajectory[{k}]"))
    else:
        for i, m in enumerate(hist):
            if m.get("role") == "assistant":
                try:
                    prompt = prompts.messages(hist[:i], "history")
                    comp = _message(m, f"history[{i}]")
                except RecordError as e:
                    reject(f"call history[{i}]: {e}")
                    continue
                calls.append((prompt, comp, False, f"history[{i}]"))

    return calls, problems


def _emit(
    path: str,
    opts: ReadOptions,
    gid: str,
    stem: str,
    calls: list[_Call],
) -> Iterator[Item]:
    prev: tuple[list[dict[str, Any]], dict[str, Any]] | None = None
    for k, (prompt, comp, exact, where) in enumerate(calls):
        reason = None
        if prev is not None:
            ext = prev[0] + [prev[1]]
            if prompt[: len(ext)] != ext:
                reason = "elided-history"
        prev = (prompt, comp)
        fields = {
            "group_id": gid,
            "agent_id": "main",
            "call_id": f"{stem}:{k}",
            "parent_call_id": f"{stem}:{k - 1}" if k else None,
            "messages": prompt,
            "tools": opts.tools,
            "completion": comp,
            "provenance": {
                "exact_tokens": False,
                "exact_messages": exact,
                "reconstructed": not exact,
            },
            "branch_reason": reason,
            "source_file": path,
            "source_line": 1,
            "source_format": NAME,
        }
        item = make_call(fields, file=path, line=1, fmt=NAME)
        if isinstance(item, Reject):
            item.reason = f"{where}: {item.reason}"
        yield item


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=30)
