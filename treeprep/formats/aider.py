"""Aider's logs: the ``--llm-history-file`` log becomes calls; the chat history is refused.

Aider (github.com/Aider-AI/aider) writes two text logs. The format is learnt from its source
(``aider/io.py``, ``aider/utils.py``, ``aider/coders/base_coder.py``); it has not changed since
the option came in (June 2024).

**The LLM history** (``aider --llm-history-file FILE``, usually ``.aider.llm.history``) holds every
request of the main model: a ``TO LLM <time>`` line and the message list sent, then a
``LLM RESPONSE <time>`` line and the reply. Each message opens with a ``-------`` line, and every
line of its text is written behind its role in capitals and a space::

    TO LLM 2025-03-01T10:00:00
    -------
    SYSTEM Act as an expert software developer.
    -------
    USER Add a --verbose flag to cli.py
    LLM RESPONSE 2025-03-01T10:00:07
    ASSISTANT cli.py
    ASSISTANT ...

A request and the reply after it are one call, with the exact message list Aider sent (system
prompt, examples, repo map, file contents, history, reminder): the prompts are not rebuilt. The
calls of a file are one group (Aider appends every session to the same file; the calls of a
session extend each other, and sessions share the system prompt, so the trie merges them).
The request's time is the call's ``timestamp``. What the log cannot give back, and what follows:

* **Line ends.** A text is written line by line, so a message's final newline is lost and any
  other line break inside it (``\\r\\n``, ``\\r``...) comes back as ``\\n``: the texts are exact up
  to that, and calls carry ``exact_messages = False``. A file written on Windows (``\\r\\n``
  after its first header) is read with ``\\n`` line ends.
* **Prompt caching** (``--cache-prompts``) sends some messages as one text part with a
  ``cache_control`` mark. The log writes such a message as ``ROLE type: text``, ``ROLE text: ...``
  (the text's later lines without the role) and ``ROLE cache_control: ...``; it is read back as
  its text, exactly (the mark changes billing, not the prompt).
* **Rejected calls**, each naming the line: a message logged with no role (an empty text is
  written as one empty line), an image (logged as its URL only), a request with no reply after
  it (a cut log), a reply with no request, an empty reply (Aider logs the reply even when the call
  failed, and a function-call reply is not logged at all), reasoning that never ends (a cut
  stream), a line of a message that does not carry the message's role, a line that is not UTF-8,
  and a block over the per-record limit (``--max-record-mb``). The file is read line by line: a
  block is held only until its call is made.
* **Reasoning.** A streamed reply logs the reasoning first, between Aider's
  ``<thinking-content-…>`` tag and a closing tag; it becomes the completion's reasoning. Aider
  removes it before the reply joins the history, so later prompts do not hold it either.
* A reply cut by Ctrl-C is logged as far as it came, and the log cannot tell it from a whole one.
  Commit messages and history summaries (the weak model) are not logged, so they are not read.
  The model's name is not logged (``model`` is unset). Aider sends no tool schemas.

**The chat history** (``.aider.chat.history.md``, always written) is a transcript for people:
``# aider chat started at <time>`` headings, the user's input after ``#### ``, Aider's own
messages quoted with ``> ``, and each reply stripped. It holds none of what made each prompt (the
system prompt, repo map, file contents and reminders, which change from request to request, so no
``--system-prompt`` could fill them in), and the commands typed (``/add``, ``/run``) and their
output read like turns that never reached the model in that form. Calls rebuilt from it would
train the model on prompts it never saw, so the file is detected and refused as a whole with a
reason that says to rebuild from ``--llm-history-file``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from treeprep.errors import InputError
from treeprep.formats._fields import make_call
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io.jsonparse import strip_bom
from treeprep.io.lines import LineTooLong, iter_lines, record_limit
from treeprep.schemas import Reject

NAME = "aider-llm-history"
CHAT_NAME = "aider-chat-history"

_REQUEST = "TO LLM"
_RESPONSE = "LLM RESPONSE"
_HEADER = re.compile(rb"(TO LLM|LLM RESPONSE) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\r?")
_HEADER_BYTES = re.compile(rb"(?:TO LLM|LLM RESPONSE) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\r?\n")
_CHAT_HEADING = b"# aider chat started at "
#: the line that opens each message of a request
_SEP = "-------"
_ROLES = {"SYSTEM": "system", "USER": "user", "ASSISTANT": "assistant"}
#: Aider's own reasoning tags around a streamed reply's reasoning (the closing one is the model's
#: reasoning tag when it has one, so any tag name closes)
_THINK_OPEN = re.compile(r"<(thinking-content-[0-9a-f]{32})>(?:\n|\Z)")
_THINK_CLOSE = re.compile(r"\n</[\w-]+>\n\n")
_SHOWN = 60


class _Bad(Exception):
    """A malformed block: the line and what was expected (becomes the call's reject)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line, self.reason = line, reason


@dataclass
class _Block:
    """One ``TO LLM`` or ``LLM RESPONSE`` block: its header's kind, time and line, and the lines
    after the header (the first at ``line + 1``) as read, until they pass the per-record limit."""

    kind: str
    stamp: str
    line: int
    raw: list[bytes] = field(default_factory=list)
    size: int = 0
    over: bool = False

    def add(self, raw: bytes | None, limit: int) -> None:
        """Keep a line of the block (None: a line over the limit, never held)."""
        if raw is None or self.over or self.size + len(raw) + 1 > limit:
            self.over, self.raw = True, []
            return
        self.size += len(raw) + 1
        self.raw.append(raw)

    def body(self) -> list[str]:
        """The block's lines as text; :class:`_Bad` when over the limit or not UTF-8."""
        if self.over:
            why = f"the block is over the limit of {record_limit():,} bytes per record"
            raise _Bad(self.line, f"{why} (--max-record-mb)")
        out = []
        for k, raw in enumerate(self.raw):
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                why = f"not UTF-8 text (byte {e.start} of the line); Aider writes UTF-8"
                raise _Bad(self.line + 1 + k, why) from e
        return out


def sniff(path: str, head: bytes) -> bool:
    """An LLM history log: its first line is a ``TO LLM <time>`` (or ``LLM RESPONSE``) header."""
    return _HEADER_BYTES.match(strip_bom(head).lstrip(b"\r\n")) is not None


def sniff_chat(path: str, head: bytes) -> bool:
    """Aider's chat history: it opens with ``# aider chat started at``."""
    return strip_bom(head).lstrip().startswith(_CHAT_HEADING)


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _shown_bytes(raw: bytes | None) -> str:
    return "a line over the size limit" if raw is None else _shown(raw.decode("utf-8", "replace"))


def _blocks(path: str) -> Iterator[_Block | Reject]:
    """The file's blocks in order; text before the first header is one reject. A file written
    on Windows (its first header ends in ``\\r``) has the ``\\r`` of every line removed."""
    limit = record_limit()
    cur: _Block | None = None
    crlf: bool | None = None
    for i, line in iter_lines(path, limit, every=True):
        raw = None if isinstance(line, LineTooLong) else line  # over the limit: never held
        if i == 1 and raw is not None:
            raw = strip_bom(raw)
        m = None if raw is None else _HEADER.fullmatch(raw)
        if m is not None and raw is not None:
            if cur is not None:
                yield cur
            crlf = raw.endswith(b"\r") if crlf is None else crlf
            cur = _Block(m.group(1).decode(), m.group(2).decode(), i)
            continue
        if raw is not None and crlf and raw.endswith(b"\r"):
            raw = raw[:-1]
        if cur is not None:
            cur.add(raw, limit)
        elif raw is None or raw.strip():
            why = f"expected a '{_REQUEST} <time>' line opening a request, got {_shown_bytes(raw)}"
            yield Reject(file=path, line=i, format=NAME, reason=why)
            cur = _Block("", "", i)  # the rest up to the next header belongs to this reject
    if cur is not None:
        yield cur


def _role_of(line: str) -> str | None:
    """The role a message line is written behind (``USER`` for ``USER text``), or None."""
    head = line.split(" ", 1)[0]
    return head if head in _ROLES else None


def _strip_role(line: str, role: str, lineno: int) -> str:
    """The text of a line written as ``ROLE text`` (``ROLE`` alone: an empty line)."""
    if line == role:
        return ""
    if not line.startswith(role + " "):
        why = f"expected a line starting with '{role} ' (every line of the message carries its "
        raise _Bad(lineno, f"{why}role), got {_shown(line)}")
    return line[len(role) + 1 :]


def _cached_part(body: list[str], j: int) -> tuple[str, str, int] | None:
    """(role, text, index after it) of a message sent as a cache-marked text part starting at
    ``body[j]``, or None when it is not one."""
    role = _role_of(body[j]) if j < len(body) else None
    if role is None or body[j] != f"{role} type: text" or j + 1 >= len(body):
        return None
    lead = f"{role} text: "
    if not body[j + 1].startswith(lead):
        return None
    for k in range(j + 2, len(body)):
        if body[k].startswith(f"{role} cache_control: ") and (
            k + 1 == len(body) or body[k + 1] == _SEP
        ):
            text = "\n".join([body[j + 1][len(lead) :], *body[j + 2 : k]])
            return role, text, k + 1
    return None


def _plain(body: list[str], j: int, first: int, n: int) -> tuple[str, str, int]:
    """(role, text, index after it) of message ``n``, written line by line from ``body[j]``."""
    end = j
    while end < len(body) and body[end] != _SEP:
        end += 1
    if end == j:
        raise _Bad(first + j - 1, f"message {n} has no lines (no text was logged)")
    role = _role_of(body[j])
    if role is None:
        if end == j + 1 and body[j] == "":
            why = f"message {n} has an empty text, which Aider's log writes without its role"
            raise _Bad(first + j, why)
        roles = ", ".join(_ROLES)
        raise _Bad(
            first + j, f"expected a message line starting with {roles}; got {_shown(body[j])}"
        )
    texts = []
    for k in range(j, end):
        if body[k].startswith(f"{role} Image_url URL: "):
            why = f"message {n} holds an image, which Aider's log keeps only as its URL"
            raise _Bad(first + k, why)
        texts.append(_strip_role(body[k], role, first + k))
    return role, "\n".join(texts), end


def _messages(body: list[str], line: int) -> list[dict[str, Any]]:
    """The message list of the request whose header is at ``line``; :class:`_Bad` naming the
    line when malformed."""
    first = line + 1
    if not body or body == [""]:
        raise _Bad(line, "the request holds no messages")
    if body[0] != _SEP:
        raise _Bad(first, f"expected '{_SEP}' opening the first message, got {_shown(body[0])}")
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(body):
        # body[i] is the separator of message len(out)
        found = _cached_part(body, i + 1)
        if found is None:
            found = _plain(body, i + 1, first, len(out))
        role, text, i = found
        out.append({"role": _ROLES[role], "content": text})
    return out


def _reply(body: list[str], line: int) -> dict[str, Any]:
    """The completion of the reply whose header is at ``line`` (reasoning split off);
    :class:`_Bad` when unusable."""
    first = line + 1
    body = [] if body == [""] else body  # an empty reply is logged as an empty line
    text = "\n".join(_strip_role(x, "ASSISTANT", first + k) for k, x in enumerate(body))
    reasoning = None
    opened = _THINK_OPEN.match(text)
    if opened is not None:
        same = text.find(f"\n</{opened.group(1)}>\n\n", opened.end())
        closed = _THINK_CLOSE.search(text, opened.end()) if same < 0 else None
        if same < 0 and closed is None:
            raise _Bad(line, "the reply's reasoning never ends (the stream was cut)")
        start, end = (same, same + len(opened.group(1)) + 6) if closed is None else closed.span()
        reasoning = text[opened.end() : start].strip()
        text = text[end:]
    if not text.strip():
        why = "the reply is empty (Aider logs a reply even when the call failed; a function-call "
        raise _Bad(line, why + "reply is not logged)")
    comp: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        comp["reasoning_content"] = reasoning
    return comp


def _call(path: str, k: int, req: _Block, resp: _Block) -> Item:
    """The call of request ``req`` answered by ``resp`` (the ``k``-th of the file)."""
    call_id = f"{k}@{req.stamp}"
    try:
        messages = _messages(req.body(), req.line)
        completion = _reply(resp.body(), resp.line)
    except _Bad as e:
        return Reject(file=path, line=e.line, format=NAME, reason=e.reason, call_id=call_id)
    fields = {
        "call_id": call_id,
        "messages": messages,
        "completion": completion,
        "timestamp": req.stamp,
        "provenance": {"exact_tokens": False, "exact_messages": False, "reconstructed": False},
        "source_file": path,
        "source_line": req.line,
        "source_format": NAME,
    }
    return make_call(fields, file=path, line=req.line, fmt=NAME)


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    """One call per request and the reply after it; rejects for the rest, each naming its line."""
    pending: _Block | None = None
    k = 0
    for b in _blocks(path):
        if isinstance(b, Reject):
            yield b
            continue
        if b.kind == _REQUEST:
            if pending is not None:
                why = f"no '{_RESPONSE}' follows this request (the next request starts at line "
                yield Reject(file=path, line=pending.line, format=NAME, reason=f"{why}{b.line})")
            pending = b
        elif b.kind == _RESPONSE:
            if pending is None:
                why = f"a '{_RESPONSE}' with no '{_REQUEST}' before it"
                yield Reject(file=path, line=b.line, format=NAME, reason=why)
                continue
            yield _call(path, k, pending, b)
            k += 1
            pending = None
    if pending is not None:
        why = f"no '{_RESPONSE}' follows this request (the log ends; it was cut)"
        yield Reject(file=path, line=pending.line, format=NAME, reason=why)


def read_chat(path: str, opts: ReadOptions) -> Iterator[Item]:
    """Refuses Aider's chat history as a whole (see the module's docstring for why)."""
    line = 1
    for i, raw in iter_lines(path, record_limit(), every=True):
        if not isinstance(raw, LineTooLong) and strip_bom(raw).startswith(_CHAT_HEADING):
            line = i
            break
    why = (
        "Aider's chat history is a transcript for people, not the prompts Aider sent: it lacks "
        "the system prompt, repo map and file contents of every request; run aider with "
        "--llm-history-file FILE and build from that file"
    )
    raise InputError(path, line, why)
    yield  # a generator, like every reader


FORMATS = [
    FormatSpec(name=NAME, sniff=sniff, read=read, priority=10),
    FormatSpec(name=CHAT_NAME, sniff=sniff_chat, read=read_chat, priority=10),
]
