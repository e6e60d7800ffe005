"""``cline``: Cline and Roo Code task histories (``tasks/<task id>/api_conversation_history.json``).

Learnt from cline/cline (``src/core/storage/disk.ts``, ``ClineStorageMessage`` in
``src/shared/messages/content.ts``): each task folder keeps the conversation exactly as sent to
the model, a JSON array of Anthropic ``MessageParam``s (``role``, ``content`` as a string or
``text``/``image``/``thinking``/``tool_use``/``tool_result`` blocks) with Cline's own fields
beside them (``id``, ``ts``, ``modelInfo.modelId``, ``metrics``), which Cline strips before
sending. Roo Code, a fork, keeps the same file. The blocks are converted as the ``anthropic``
format converts a request (:func:`~treeprep.formats.anthropic.assistant_message`,
:func:`~treeprep.formats.anthropic.user_messages`): tool results become ``tool`` messages, and
Cline's XML tool calls written in text stay text, as the model wrote them.

Every assistant message is one call whose prompt is every message before it. Cline does not store
its system prompt or tool schemas in this file: ``--system-prompt`` and ``--tools`` give them
(calls without them are trained on a prompt that lacks the system prompt Cline sent). One task
folder is one group (the folder's name, Cline's task id). A message that does not fit is one
reject naming ``[i]``; the calls after it are rejected with it, their prompts would miss it.
Detected by the file name and a JSON array whose first element has a ``role``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import make_call, type_name
from treeprep.formats._read import document
from treeprep.formats.anthropic import assistant_message, user_messages
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.schemas import Reject

NAME = "cline"
FILE = "api_conversation_history.json"


def sniff(path: str, head: bytes) -> bool:
    h = head.lstrip()
    return os.path.basename(path).startswith(FILE) and h[:1] == b"[" and b'"role"' in h[:4096]


def _model(m: dict[str, Any]) -> str | None:
    info = m.get("modelInfo")
    v = info.get("modelId") if isinstance(info, dict) else None
    return v if isinstance(v, str) and v else None


def _call(
    path: str,
    line: int,
    task: str,
    k: int,
    prompt: list[Any],
    reply: Any,
    model: Any,
    opts: ReadOptions,
) -> Item:
    """The task's k-th call (1-based), prompted with the history before it."""
    fields = {
        "group_id": task, "call_id": f"{task}#{k - 1}",
        "parent_call_id": f"{task}#{k - 2}" if k > 1 else None,
        "model": model, "messages": list(prompt), "completion": reply, "tools": opts.tools,
        "provenance": {"exact_messages": False, "reconstructed": True},
        "source_file": path, "source_line": line, "source_format": NAME,
    }  # fmt: skip
    return make_call(fields, file=path, line=line, fmt=NAME)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    parsed = document(path)
    history = parsed.value
    if not isinstance(history, list):
        raise InputError(path, 1, f"expected a JSON array of messages, got {type_name(history)}")
    lines = parsed.element_lines(len(history))
    task = os.path.basename(os.path.dirname(os.path.abspath(path)))
    prompt: list[dict[str, Any]] = []
    if opts.system_prompt:
        prompt.append({"role": "system", "content": opts.system_prompt})
    k = 0
    broken: str | None = None  # why the history stops being usable
    for i, m in enumerate(history):
        where = f"[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        cid = f"{task}#{k}"
        try:
            if broken is not None:
                if role == "assistant":
                    k += 1
                    yield Reject(file=path, line=lines[i], format=NAME, call_id=cid, reason=broken)
                continue
            if role == "user":
                prompt.extend(user_messages(m.get("content"), f"{where}.content"))
                continue
            if role != "assistant":
                raise RecordError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")
            reply = assistant_message(m.get("content"), f"{where}.content")
        except RecordError as e:
            broken = f"{e} (the prompts after it would miss it)"
            yield Reject(file=path, line=lines[i], format=NAME, reason=str(e))
            continue
        k += 1
        yield _call(path, lines[i], task, k, prompt, reply, _model(m), opts)
        prompt.append(reply)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=26)
__all__ = ["FORMAT", "NAME"]
