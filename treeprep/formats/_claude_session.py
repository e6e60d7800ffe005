"""The lines of one Claude Code session, indexed, and the messages made of them.

Helpers of :mod:`treeprep.formats.claude_code` (kept apart to keep that module short): a
:class:`Session` indexes the lines a thread can reach (the file's own and, for a sub-agent, its
parent session's) by ``uuid``, by API response (``message.id``), by ``tool_use`` id and by the
line an ``isMeta`` context line hangs off; the builders turn lines into the request's content
blocks, as Claude Code sends them, and a server's Messages endpoint
(:func:`~treeprep.formats.anthropic.turn_messages`) turns those into chat messages. How a
thread of lines becomes a prompt is :mod:`treeprep.formats._claude_replay`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from treeprep.formats._fields import content_parts
from treeprep.formats.anthropic import assistant_message, turn_messages
from treeprep.modes import Server

#: where a line was written: (in the file being read, its line number). Parent-session lines
#: (``False``) precede the sub-agent file's own, so tuple order is file order.
Pos = tuple[bool, int]


@dataclass
class Line:
    no: int  # 1-based line number in its file
    rec: dict[str, Any]
    own: bool  # in the file being read (False: in the parent session file)

    @property
    def pos(self) -> Pos:
        return (self.own, self.no)


@dataclass
class Session:
    """The lines that a thread can reach: the file's own, plus its parent session's."""

    path: str
    #: the server whose Messages endpoint converted Claude Code's requests (``--server``)
    server: Server = Server.vllm
    by_uuid: dict[str, Line] = field(default_factory=dict)
    # message.id -> its lines (file order); keyed per origin so a parent's ids never mix with ours
    responses: dict[tuple[bool, str], list[Line]] = field(default_factory=dict)
    tool_use_owner: dict[str, tuple[bool, str]] = field(default_factory=dict)
    results: dict[str, list[tuple[Line, dict[str, Any]]]] = field(default_factory=dict)
    meta_children: dict[str, list[Line]] = field(default_factory=dict)
    #: uuid -> line of the lines rejected as misshapen (so a chain through one says so)
    rejected: dict[str, int] = field(default_factory=dict)
    #: the messages made of lines, by the lines' (and blocks') identity: see :meth:`made`
    _made: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def made(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()``, made once per session for ``key`` (what it is made of, by identity: the
        session holds those lines and blocks, so their ids stay theirs).

        The messages are pure functions of their lines, and handing the same dicts to every call
        lets :func:`~treeprep.formats._fields.make_call` know a history by identity; nothing
        changes a dict once it is handed over."""
        m = self._made.get(key)
        if m is None:
            m = self._made[key] = make()
        return m

    def add(self, ln: Line) -> None:
        r = ln.rec
        u = r.get("uuid")
        if isinstance(u, str):
            # own lines win over the parent's (a file never needs the parent's copy of its line)
            if u not in self.by_uuid or ln.own:
                self.by_uuid[u] = ln
        msg = r.get("message")
        content = msg.get("content") if isinstance(msg, dict) else None
        if (
            r.get("type") == "assistant"
            and isinstance(msg, dict)
            and isinstance(msg.get("id"), str)
        ):
            key = (ln.own, msg["id"])
            self.responses.setdefault(key, []).append(ln)
            if isinstance(content, list):
                for b in content:
                    if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id"):
                        self.tool_use_owner[b["id"]] = key
        if r.get("type") == "user" and isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    self.results.setdefault(str(b.get("tool_use_id")), []).append((ln, b))
        if r.get("type") == "user" and r.get("isMeta") and isinstance(r.get("parentUuid"), str):
            self.meta_children.setdefault(r["parentUuid"], []).append(ln)


def response_blocks(lines: list[Line], *, sent: bool = False) -> list[Any]:
    """The content blocks of one API response (its lines in file order), merged. ``sent``: as
    a later request sends them, the blocks of its lines merged as Claude Code merges them
    (``normalizeMessagesForAPI``, read in 2.1.112: a text block of whitespace alone, not empty,
    is left out, unless only thinking would remain); else as the model wrote them."""
    blocks: list[Any] = []
    for ln in lines:
        content = ln.rec["message"].get("content")
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        else:
            blocks.extend(content or [])
    if sent and len(lines) > 1:
        kept = [b for b in blocks if not _blank(b)]
        if any(not (isinstance(b, dict) and b.get("type") in _THINKING) for b in kept):
            blocks = kept
    return blocks


def sent_response(
    lines: list[Line], server: Server, where: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """One API response (``where``: its line) as a later request sends it, converted by the
    ``server``'s Messages endpoint (no message or one), and the ids of its tool calls."""
    blocks = response_blocks(lines, sent=True)
    turn = {"role": "assistant", "content": blocks}
    ids = [str(b["id"]) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    return turn_messages(turn, f"{where}: message.content", server), ids


def response_message(lines: list[Line]) -> dict[str, Any]:
    """The completion of one API response: its blocks as the model wrote them, one message
    (several text blocks stay parts, which the renderer joins as the server did)."""
    return assistant_message(response_blocks(lines), parts=True)


_THINKING = ("thinking", "redacted_thinking")
#: what JavaScript's ``String.prototype.trim`` removes (white space and line terminators: not
#: Python's ``isspace``, which takes U+001C..U+001F and leaves U+FEFF)
_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000\ufeff")
)


def _blank(block: Any) -> bool:
    """A text block of whitespace alone, not empty."""
    if not (isinstance(block, dict) and block.get("type") == "text"):
        return False
    text = block.get("text")
    return isinstance(text, str) and text != "" and text.strip(_JS_SPACE) == ""


def user_content(ln: Line) -> Any:
    """What a user line adds to its request turn: its content, a string as it is, or its blocks
    but the tool results (they come with their assistant turn); None when nothing is left."""
    content = ln.rec.get("message", {}).get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    blocks = [b for b in content if isinstance(b, dict) and b.get("type") != "tool_result"]
    return blocks or None


def merged_user(first: Any, then: Any) -> list[Any]:
    """The contents of two user messages in a row as Claude Code sends them, one message
    (``normalizeMessagesForAPI``'s merge, read in 2.1.112 and 2.1.337): the blocks in order, a
    string taken as one text block, and a newline added to the first's last text block where
    the second begins with text (the tool results, which the API wants first, are put first by
    the replay: :class:`~treeprep.formats._claude_replay.Replay`).

    >>> merged_user("A", [{"type": "text", "text": "B"}])
    [{'type': 'text', 'text': 'A\\n'}, {'type': 'text', 'text': 'B'}]
    """
    a, b = content_parts(first), content_parts(then)
    if a and b and a[-1].get("type") == "text" and b[0].get("type") == "text":
        a = [*a[:-1], {**a[-1], "text": (a[-1].get("text") or "") + "\n"}]
    return [*a, *b]


#: attachment types Claude Code sends no message for (``normalizeAttachmentForAPI``, read in
#: 2.1.112; ``prompt_snapshot``, from 2.1.252, records the request and sends nothing either)
SILENT_ATTACHMENTS = frozenset(
    "dynamic_skill already_read_file command_permissions edited_image_file hook_cancelled "
    "hook_error_during_execution hook_non_blocking_error hook_system_message "
    "hook_permission_decision hook_deferred_tool structured_output max_turns_reached "
    "current_session_memory teammate_shutdown_batch context_efficiency autocheckpointing "
    "background_task_status todo task_progress ultramemory compaction_reminder companion_intro "
    "pen_mode_enter pen_mode_exit prompt_snapshot".split()
)
#: attachment types that send nothing when this field of theirs is empty (2.1.112)
_EMPTY_SENDS_NOTHING = {
    "hook_additional_context": "content",
    "skill_listing": "content",
    "invoked_skills": "skills",
    "diagnostics": "files",
}
#: the hook events whose successful output Claude Code sends (2.1.112)
_HOOK_SUCCESS_SENT = ("SessionStart", "UserPromptSubmit")


def attachment_sent(rec: dict[str, Any]) -> str | None:
    """The type of an ``attachment`` line (Claude Code 2.1.97 on writes every one) when Claude
    Code sends it to the model, as ``<system-reminder>`` user text before the next prompt or
    folded into the last tool result (``normalizeMessagesForAPI``); None when it sends nothing.
    A line that carries its ``rendered`` text (2.1.268 on) sends it."""
    att = rec.get("attachment")
    kind = att.get("type") if isinstance(att, dict) else None
    if not isinstance(att, dict) or not isinstance(kind, str):
        return None
    if rec.get("rendered"):
        return kind
    if kind in SILENT_ATTACHMENTS:
        return None
    if kind in _EMPTY_SENDS_NOTHING and not att.get(_EMPTY_SENDS_NOTHING[kind]):
        return None
    if kind == "hook_success" and (
        att.get("hookEvent") not in _HOOK_SUCCESS_SENT or att.get("content") in (None, "")
    ):
        return None
    return kind
