"""mini-swe-agent trajectories (``*.traj.json``).

Two layouts exist: the saved run (``{"trajectory_format": "mini-swe-agent-1.x", "instance_id",
"info", "messages"}``) and a bare list of messages (the project's test fixtures). mini-swe-agent
sends its whole message list on every query and only appends to it, so each ``assistant`` message is
one call whose prompt is every message before it; the prompt is a slice of the transcript (recorded
as ``reconstructed``) but it is the list that was sent (``exact_messages``). The final ``exit``
message is bookkeeping, not a message the model saw.

The completion's reasoning, when the provider returned one, sits in
``extra.response.choices[0].message.reasoning_content`` (or ``reasoning``, OpenRouter's spelling:
see :mod:`treeprep.formats._fields`); it is kept on the completion only, since
the transcript (what later prompts carry) does not hold it: mini-swe-agent sends a message
without its ``extra``. So the next call's prompt leaves the previous call's sequence where that
reasoning was, and it is hinted ``reasoning-dropped`` (the renderer's own check compares a
call with its history rendered again, which lacks the reasoning too, so it cannot see it). Tool
schemas are not stored: ``--tools``. One group per run (``instance_id``, else the file name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    AliasError,
    file_stem,
    group_or,
    make_call,
    openai_tool_calls,
    opt_dict,
    opt_str,
    reasoning_of,
    type_name,
)
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "mini-swe-agent"
_ROLES = {"system", "user", "assistant", "tool"}


def _base(path: str) -> str:
    return file_stem(path, (".gz", ".zst"))


def sniff(path: str, head: bytes) -> bool:
    """``*.traj.json`` holding a message list, or any JSON declaring mini-swe-agent's format."""
    if b'"trajectory_format"' in head and b"mini-swe-agent" in head:
        return True
    if not _base(path).endswith(".traj.json"):
        return False
    h = head.lstrip()
    return (h.startswith(b"[") and b'"role"' in head) or (
        h.startswith(b"{") and b'"messages"' in head
    )


def _message(m: dict[str, Any], where: str) -> dict[str, Any]:
    """A transcript message in OpenAI form; RecordError (naming ``where``) when misshapen."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = openai_tool_calls(m["tool_calls"], f"{where}.tool_calls")
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    reasoning = reasoning_of(m)
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def _response_reasoning(m: dict[str, Any], where: str) -> str | None:
    """The provider's reasoning in ``extra.response.choices[0].message``, when recorded."""
    try:
        resp_msg = m["extra"]["response"]["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None  # no provider response recorded (or not in this shape): nothing to keep
    if not isinstance(resp_msg, dict):
        return None
    try:
        return reasoning_of(resp_msg)
    except AliasError as e:
        raise RecordError(f"{where}.extra.response.choices[0].message: {e}") from e


def _model(path: str, doc: object) -> str | None:
    """``info.config.model.model_name`` of a saved run (None when not recorded); InputError
    when one of those levels has another shape (it names the model of every call)."""
    if not isinstance(doc, dict):
        return None
    try:
        cfg = opt_dict(opt_dict(doc.get("info"), "info").get("config"), "info.config")
        name = opt_dict(cfg.get("model"), "info.config.model").get("model_name")
        return opt_str(name, "info.config.model.model_name")
    except RecordError as e:
        raise InputError(path, 1, str(e)) from e


def _not_a_message(m: Any, where: str) -> str | None:
    """Why ``m`` is not a transcript message (``"exit"`` for the end-of-run marker), or None."""
    if not isinstance(m, dict):
        return f"{where}: expected a message object, got {type_name(m)}"
    role = m.get("role")
    if role == "exit":
        return "exit"
    if isinstance(role, str) and role in _ROLES:
        return None
    shown = repr(role) if isinstance(role, str | None) else type_name(role)
    return f"{where}: unknown role {shown}; expected system/user/assistant/tool"


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    doc = document(path, keep_non_finite=True).value
    if isinstance(doc, list):
        messages, gid = doc, _base(path)[: -len(".traj.json")] or _base(path)
    elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        messages = doc["messages"]
        default = str(doc.get("instance_id") or _base(path).removesuffix(".traj.json"))
        gid = group_or(doc, opts, default)
    else:
        raise InputError(path, 1, "expected a mini-swe-agent trajectory: a 'messages' list")
    model = _model(path, doc)

    seen: list[dict[str, Any]] = []
    k = 0
    dropped = False  # the last reply's reasoning is not in the transcript the next call sends
    for i, m in enumerate(messages):
        reason = _not_a_message(m, f"messages[{i}]")
        if reason == "exit":
            continue  # mini-swe-agent's end-of-run marker, never sent to the model
        if reason is not None:
            yield Reject(file=path, line=1, format=NAME, reason=reason)
            continue
        role = m["role"]
        try:
            msg = _message(m, f"messages[{i}]")
            rc = _response_reasoning(m, f"messages[{i}]") if role == "assistant" else None
        except (AliasError, RecordError) as e:
            reason = str(e) if isinstance(e, RecordError) else f"messages[{i}]: {e}"
            yield Reject(file=path, line=1, format=NAME, reason=reason)
            continue
        if msg["role"] == "assistant" and seen:
            comp = dict(msg)
            if rc:
                comp["reasoning_content"] = rc
            item = make_call(
                {
                    "group_id": gid,
                    "agent_id": "main",
                    "call_id": f"{gid}:{k}",
                    "parent_call_id": f"{gid}:{k - 1}" if k else None,
                    "model": model,
                    "messages": list(seen),
                    "tools": opts.tools,
                    "completion": comp,
                    "branch_reason": "reasoning-dropped" if dropped else None,
                    "provenance": {
                        "exact_tokens": False,
                        "exact_messages": True,
                        "reconstructed": True,
                    },
                    "source_file": path,
                    "source_line": 1,
                    "source_format": NAME,
                },
                file=path,
                line=1,
                fmt=NAME,
            )
            if isinstance(item, Reject):
                item.reason = f"messages[{i}]: {item.reason}"
            yield item
            k += 1
        if role == "assistant":
            dropped = bool(rc) and rc != msg.get("reasoning_content")
        seen.append(msg)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=30)
