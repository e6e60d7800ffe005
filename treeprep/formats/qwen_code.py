"""``qwen-code``: Qwen Code's request logs (``--openai-logging``), one LLM call per file.

Qwen Code (QwenLM/qwen-code, a Gemini CLI fork) writes, when started with ``--openai-logging``
(or ``model.enableOpenAILogging`` in its settings), one pretty-printed JSON file per LLM call
attempt to ``<project>/logs/openai/`` (``--openai-logging-dir`` elsewhere), named
``openai-<ISO time, ':' as '-'>-<8 hex>[-<suffix>].json``. Learnt from 0.24.4's
``packages/core/src/utils/openaiLogger.ts``, ``core/loggingContentGenerator`` and the OpenAI
pipeline (``core/openaiContentGenerator/pipeline.ts``); 0.15 writes the same file without
``context`` and the suffix. Its session file (``chats/<session>.jsonl``) records less than
Qwen Code sends (``docs/building.md``), so these logs are the way to train on Qwen Code: the prompt
is the request body as sent, not a rebuild.

A file is ``{timestamp, request, response, error, context: {promptId, sessionId}, system}``:

* ``request`` is the chat-completions body handed to the OpenAI SDK, captured after the
  provider's additions (DashScope's ``cache_control`` parts and ``metadata``, ``extra_body``): the
  prompt is ``request.messages`` and ``request.tools`` exactly (earlier turns' reasoning is sent
  back as ``reasoning_content``; Qwen Code's default provider mirrors it into ``reasoning``, the
  same field here). Where Qwen Code talks to a non-OpenAI API (Anthropic, Gemini, the Responses
  API), the body is rebuilt for the log from the same history, without ``stream`` and the
  provider's fields: such a call is read with ``provenance.reconstructed``.
* ``response`` is one ``chat.completion`` Qwen Code rebuilds from the streamed chunks: the
  completion is its ``choices[0].message`` (text, ``reasoning_content``, ``tool_calls``, whose
  ``arguments`` Qwen Code parsed and wrote back as compact JSON, as it sends them again in the
  next request). ``finish_reason`` is ``stop`` for tool calls too; ``length`` (the limit
  cut the reply, or the JSON of its tool call, which Qwen Code then repaired) is a reject.
* A failed attempt has ``response: null`` and ``error.message``: one reject with that message
  (a retry is its own file).
* ``context.promptId`` names the caller: ``<session>########<n>`` the main session (agent
  ``main``), ``<session>#<name>-<8 hex>#<k>`` a sub-agent (agent ``<name>-<8 hex>``, its round
  ``k``; round 0 is hinted ``sub-agent``), ``compress-<ms>`` a ``/compress`` summary (hinted
  ``compaction``), and Qwen Code's own side calls (``prompt_suggestion``, ``side-query:...``)
  that agent.

Qwen Code's session files (``~/.qwen/projects/<cwd>/chats/<session>.jsonl``: Claude Code's
envelope around Gemini ``parts``) are detected (``qwen-code-chat``) and refused, one reject per
file naming these logs: they record less than Qwen Code sends (``docs/building.md``).

Group: ``--group-by``, else the record's group keys
(:func:`~treeprep.formats.openai_chat.group_of`), else the session (``context.sessionId``, else
DashScope's ``request.metadata.sessionId``), else the folder: Qwen Code writes every session of a
project into one folder, and a call with no session id (a ``/compress`` without DashScope) joins
the folder's group.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import opt_str, type_name
from treeprep.formats._read import document, head_json_objects
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import chat_call, obj_at
from treeprep.io.jsonparse import head_record
from treeprep.schemas import ChatCall, Provenance, Reject

NAME = "qwen-code"

#: the names Qwen Code gives its log files (``.gz``/``.zst`` when compressed afterwards)
_FILE = re.compile(
    r"openai-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(\.\d+)?Z-[0-9a-f]{8}(-[A-Za-z0-9._-]+)?"
    r"\.json(\.gz|\.zst|\.zstd)?$"
)
#: the opening of one, when the head is cut inside a long request
_OPENING = re.compile(rb'^\s*\{\s*"timestamp"\s*:\s*"[^"\\]*"\s*,\s*"request"\s*:\s*\{')
#: the keys of a log file (``context`` since 0.2x)
_KEYS = frozenset({"timestamp", "request", "response", "error", "system"})
#: the main session's prompt ids: ``<session>`` + this + the prompt's number
_MAIN = "########"
_SUBAGENT = re.compile(r"^[^#]+#([^#]+)#(\d+)$")


def caller(prompt_id: str | None) -> tuple[str, str | None]:
    """(agent id, branch hint) of a call from its ``context.promptId``.

    >>> caller("s1########3"), caller("s1#general-purpose-9f3c2a1b#0"), caller("s1#reviewer-0a1b#4")
    (('main', None), ('general-purpose-9f3c2a1b', 'sub-agent'), ('reviewer-0a1b', None))
    >>> caller("compress-1790000000000"), caller("prompt_suggestion"), caller(None)
    (('main', 'compaction'), ('prompt_suggestion', None), ('main', None))
    """
    if not prompt_id or _MAIN in prompt_id:
        return "main", None
    if m := _SUBAGENT.match(prompt_id):
        return m[1], ("sub-agent" if m[2] == "0" else None)
    if prompt_id.startswith("compress-"):
        return "main", "compaction"
    return prompt_id, None


def _session(rec: dict[str, Any], context: dict[str, Any]) -> str | None:
    sid = opt_str(context.get("sessionId"), "context.sessionId")
    if sid:
        return sid
    meta = obj_at(obj_at(rec, "request"), "metadata")
    return opt_str(meta.get("sessionId"), "request.metadata.sessionId") or None


def convert(rec: Any, *, file: str, opts: ReadOptions) -> ChatCall:
    """One log file's call (raises :class:`RecordError` when it does not fit)."""
    if not isinstance(rec, dict):
        raise RecordError(f"expected a JSON object, got {type_name(rec)}")
    context = obj_at(rec, "context")
    if rec.get("response") is None:
        err = rec.get("error")
        said = err.get("message") if isinstance(err, dict) else None
        raise RecordError(
            f"the call failed and no response was logged (error: {said!r}); a retry is its own file"
        )
    call = chat_call(rec, file=file, line=1, fmt=NAME, opts=opts)
    if call.group_id is None and not opts.group_by:
        call.group_id = _session(rec, context)
    call.agent_id, call.branch_reason = caller(opt_str(context.get("promptId"), "context.promptId"))
    if "stream" not in obj_at(rec, "request"):
        # a non-OpenAI API: the body was rebuilt for the log from the same history
        call.provenance = Provenance(exact_messages=False, reconstructed=True)
    return call


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    try:
        doc = document(path).value
        yield convert(doc, file=path, opts=opts)
    except InputError as e:
        yield Reject(file=e.file, line=e.line, reason=e.reason, format=NAME)
    except RecordError as e:
        yield Reject(file=path, line=1, reason=str(e), format=NAME)


def sniff(path: str, head: bytes) -> bool:
    rec = head_record(head)
    if isinstance(rec, dict):
        system = rec.get("system")
        return _KEYS <= rec.keys() and isinstance(system, dict) and "nodeVersion" in system
    return _FILE.search(os.path.basename(path)) is not None and _OPENING.match(head) is not None


CHAT_NAME = "qwen-code-chat"
#: the envelope of a session file's records (Claude Code's keys; ``message`` a Gemini content)
_CHAT_ENVELOPE = ("sessionId", "parentUuid", "uuid")


def sniff_chat(path: str, head: bytes) -> bool:
    """A Qwen Code session file: records in Claude Code's envelope whose ``message`` holds
    Gemini ``parts`` (a Claude Code message holds ``content``)."""
    for o in head_json_objects(head):
        msg = o.get("message")
        if all(k in o for k in _CHAT_ENVELOPE) and isinstance(msg, dict):
            return isinstance(msg.get("parts"), list) and "content" not in msg
    return False


def read_chat(path: str, opts: ReadOptions) -> Iterator[Item]:
    """Refuses a session file as a whole (see the module's docstring)."""
    why = (
        "a Qwen Code session file records less than Qwen Code sends (the startup context with "
        "the folder structure, its reminders, IDE context, cleared tool results), so its prompts "
        "cannot be rebuilt; start qwen with --openai-logging and build from the files it writes "
        "to <project>/logs/openai"
    )
    raise InputError(path, 1, why)
    yield  # a generator, like every reader


FORMATS = [
    FormatSpec(
        name=NAME, sniff=sniff, read=read, group_by_folder=True, priority=55, whole_requests=True
    ),
    # before claude-code (20), whose envelope it shares
    FormatSpec(name=CHAT_NAME, sniff=sniff_chat, read=read_chat, priority=19),
]
FORMAT = FORMATS[0]
