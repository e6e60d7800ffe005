"""mini-swe-agent trajectories (``*.traj.json``).

Two layouts exist: the saved run (``{"trajectory_format": "mini-swe-agent-1.x", "instance_id",
"info", "messages"}``) and a bare list of messages (the project's test fixtures). mini-swe-agent
sends its whole message list on every query and only appends to it, so each ``assistant`` message is
one call whose prompt is every message before it; the prompt is a slice of the transcript (recorded
as ``reconstructed``) but it is the list that was sent (``exact_messages``). The final ``exit``
message is bookkeeping, not a message the model saw.

The completion's reasoning, when the provider returned one, sits in
``extra.response.choices[0].message.reasoning_content`` (or ``reasoning``, OpenRouter's spelling:
see :mod:`treeprep.formats.aliases`); it is kept on the completion only, since
the transcript (what later prompts carry) does not hold it. Tool schemas are not stored:
``--tools``. One group per run (``instance_id``, else the file name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError
from treeprep.formats import aliases
from treeprep.formats._agentlogs import group_or, load_json, make_call
from treeprep.formats._records import chat_tool_call, file_stem
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


def _message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            chat_tool_call(
                tc.get("id"),
                (tc.get("function") or {}).get("name", ""),
                (tc.get("function") or {}).get("arguments", ""),
            )
            for tc in m["tool_calls"]
        ]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    reasoning = aliases.reasoning_of(m)
    if reasoning:
        out["reasoning_content"] = reasoning
    return out


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    doc, _text = load_json(path)
    if isinstance(doc, list):
        messages, gid = doc, _base(path)[: -len(".traj.json")] or _base(path)
    elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        messages = doc["messages"]
        default = str(doc.get("instance_id") or _base(path).removesuffix(".traj.json"))
        gid = group_or(doc, opts, default)
    else:
        raise InputError(path, 1, "expected a mini-swe-agent trajectory: a 'messages' list")
    model = None
    if isinstance(doc, dict):
        cfg = (doc.get("info") or {}).get("config") or {}
        model = (cfg.get("model") or {}).get("model_name")

    seen: list[dict[str, Any]] = []
    k = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else type(m).__name__
            if role == "exit":
                continue  # mini-swe-agent's end-of-run marker, never sent to the model
            yield Reject(
                file=path,
                line=1,
                format=NAME,
                reason=f"messages[{i}]: unknown role {role!r}; expected system/user/assistant/tool",
            )
            continue
        try:
            msg = _message(m)
        except aliases.AliasError as e:
            yield Reject(file=path, line=1, format=NAME, reason=f"messages[{i}]: {e}")
            continue
        if msg["role"] == "assistant" and seen:
            comp = dict(msg)
            try:
                resp_msg = m["extra"]["response"]["choices"][0]["message"]
                rc = aliases.reasoning_of(resp_msg) if isinstance(resp_msg, dict) else None
            except (KeyError, IndexError, TypeError):
                rc = None
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
        seen.append(msg)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=30)
