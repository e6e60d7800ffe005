"""``codex``: Codex CLI session rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Each line is ``{"timestamp", "type", "payload"}`` (codex-rs ``RolloutLine``/``RolloutItem``):

* ``session_meta``: the session ``id`` (the group), ``cwd``, ``cli_version`` and, in newer
  versions, ``base_instructions.text`` (the system prompt sent as ``instructions``);
* ``response_item``: one Responses API item exactly as sent or received: ``message`` (user,
  developer, assistant), ``reasoning``, ``function_call``/``function_call_output`` and the
  freeform ``custom_tool_call``/``custom_tool_call_output`` (``apply_patch``: its ``input`` is the
  raw text the model wrote, kept as the call's arguments string);
* ``turn_context`` (the ``model``), ``event_msg`` (UI events, duplicates of items): not prompt;
* ``compacted``: the history was replaced. With ``replacement_history`` the next prompts continue
  from it (the next call is hinted ``compaction``); without it (older versions summarised locally
  and the rebuilt history is not stored) later calls are rejected, since their prompt is unknown.

Codex sends the whole history on every request and appends to it, so each assistant turn (a
maximal run of ``reasoning``/``function_call``/``custom_tool_call``/assistant ``message`` items) is
one call whose prompt is every item before it. Items are converted by the ``openai-responses``
adapter (:func:`treeprep.formats.openai_responses.segments`). Items treeprep cannot render
(``local_shell_call``, ``web_search_call``, encrypted ``compaction``) reject every call whose prompt
or completion holds them, naming the item and line; ``ghost_snapshot`` items are harness
bookkeeping that Codex never sends and are skipped. Tool schemas are not stored: ``--tools``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from treeprep.formats._fields import one_of
from treeprep.formats._read import records
from treeprep.formats._sniff import first_record
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import RecordError, validation_reason
from treeprep.formats.openai_responses import segments
from treeprep.schemas import ChatCall, Provenance, Reject

NAME = "codex"
_LINE_TYPES = {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
_ASSISTANT = {"reasoning", "function_call", "custom_tool_call"}
_UNSUPPORTED = {"local_shell_call", "web_search_call", "compaction", "compaction_summary"}
_SKIP = {"ghost_snapshot"}


def sniff(path: str, head: bytes) -> bool:
    rec = first_record(path, head)
    return (
        isinstance(rec, dict)
        and one_of(rec.get("type"), _LINE_TYPES)
        and isinstance(rec.get("payload"), dict)
        and "timestamp" in rec
    )


def _is_assistant(it: dict[str, Any]) -> bool:
    t = it.get("type")
    return one_of(t, _ASSISTANT) or (t == "message" and it.get("role") == "assistant")


def _as_responses_item(it: dict[str, Any]) -> dict[str, Any]:
    """Freeform custom tool calls as function calls (their raw input is the arguments string)."""
    t = it.get("type")
    if t == "custom_tool_call":
        return {
            "type": "function_call",
            "call_id": it.get("call_id"),
            "name": it.get("name"),
            "arguments": it.get("input", ""),
        }
    if t == "custom_tool_call_output":
        return {
            "type": "function_call_output",
            "call_id": it.get("call_id"),
            "output": it.get("output"),
        }
    return it


class _Session:
    def __init__(self, path: str, opts: ReadOptions) -> None:
        self.path = path
        self.opts = opts
        self.gid = os.path.basename(path)
        self.system: str | None = opts.system_prompt
        self.model: str | None = None
        self.history: list[tuple[int, dict[str, Any]]] = []
        self.turn: list[tuple[int, dict[str, Any]]] = []
        self.lost: int | None = None  # line of a compaction whose new history is not stored
        self.hint: str | None = None
        self.k = 0

    def flush(self) -> Iterator[Item]:
        if not self.turn:
            return
        turn, self.turn = self.turn, []
        line = turn[0][0]
        call_id = f"{self.gid}#{self.k}"
        self.k += 1
        hint, self.hint = self.hint, None
        try:
            yield self._call(turn, line, call_id, hint)
        except RecordError as e:
            yield Reject(file=self.path, line=line, reason=str(e), format=NAME, call_id=call_id)
        self.history.extend(turn)

    def _call(
        self, turn: list[tuple[int, dict[str, Any]]], line: int, call_id: str, hint: str | None
    ) -> ChatCall:
        if self.lost is not None:
            raise RecordError(
                f"the history was compacted at line {self.lost} without a stored "
                "replacement_history, so this call's prompt is unknown"
            )
        for no, it in self.history + turn:
            if one_of(it.get("type"), _UNSUPPORTED):
                raise RecordError(
                    f"line {no}: {it.get('type')} item (a hosted tool or encrypted state that "
                    "has no chat form), so the prompt or completion cannot be rendered"
                )
        prompt = [{"role": "system", "content": self.system}] if self.system else []
        items = [_as_responses_item(it) for _, it in self.history]
        prompt.extend(s.message for s in segments(items, "history"))
        done = segments([_as_responses_item(it) for _, it in turn], f"line {line}")
        try:
            return ChatCall(
                group_id=self.gid,
                call_id=call_id,
                parent_call_id=f"{self.gid}#{self.k - 2}" if self.k > 1 else None,
                model=self.model,
                messages=prompt,  # type: ignore[arg-type]
                tools=self.opts.tools,
                completion=done[0].message,  # type: ignore[arg-type]
                provenance=Provenance(exact_messages=True, reconstructed=True),
                branch_reason=hint,  # type: ignore[arg-type]
                source_file=self.path,
                source_line=line,
                source_format=NAME,
            )
        except ValidationError as e:
            raise RecordError(validation_reason(e)) from e


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    s = _Session(path, opts)
    for no, rec in records(path, NAME):
        if isinstance(rec, Reject):
            yield rec
            continue
        p = rec.get("payload") if isinstance(rec, dict) else None
        t = rec.get("type") if isinstance(rec, dict) else None
        if not one_of(t, _LINE_TYPES) or not isinstance(p, dict):
            yield Reject(
                file=path,
                line=no,
                format=NAME,
                reason="expected a rollout line {timestamp, type, payload} with type "
                f"{', '.join(sorted(_LINE_TYPES))}",
            )
            continue
        if t == "session_meta":
            meta: dict[str, Any] = p["meta"] if isinstance(p.get("meta"), dict) else p
            if isinstance(meta.get("id"), str):
                s.gid = meta["id"]
            base = meta.get("base_instructions")
            if opts.system_prompt is None and isinstance(base, dict) and base.get("text"):
                s.system = str(base["text"])
        elif t == "turn_context" and isinstance(p.get("model"), str):
            s.model = p["model"]
        elif t == "compacted":
            yield from s.flush()
            new = p.get("replacement_history")
            if isinstance(new, list):
                s.history = [(no, it) for it in new if isinstance(it, dict)]
                s.lost = None
                s.hint = "compaction"
            else:
                s.lost = no
        elif t == "response_item":
            if one_of(p.get("type"), _SKIP):
                continue
            if _is_assistant(p):
                s.turn.append((no, p))
            else:
                yield from s.flush()
                s.history.append((no, p))
    yield from s.flush()


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=22)
