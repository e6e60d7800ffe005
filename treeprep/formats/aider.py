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
  and a block over the per-record limit (``--max-record-mb``). A block is held only until its
  call is made.
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

**Cost.** Every request logs the whole history again, so a session's log grows with the square of
its turns (771 MB at 1,600 generated turns, ``bench/session_scaling.py``). The reader touches what
a request repeats only in C: the blocks are cut at the header lines with bytes searches, not line
by line (:class:`_Scan`), and a request's messages that the one before began with are found by
comparing bytes and kept with their chat messages (:class:`_Prompts`, over
:class:`~treeprep.formats._history.ConvertedHistory`), so each request converts only what it
adds. A build of 1,600 turns went from 74.3 to 5.9-7.8 CPU-seconds (13.9x the time of 400 turns
to 7.7-9.7x); what still grows with the log's size is reading, hashing and searching it, in C.
Files in the chat, which Aider sends after the history, make each prompt leave the one before it
after the history: the reader still converts only what a request adds, but make_call and the
renderer share a history only with the prompt before when it begins this one, so such a session
builds in time that grows with the square of its turns (800 turns 13.5x the time of 200).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

from treeprep.errors import InputError
from treeprep.formats._fields import make_call
from treeprep.formats._history import Converted, ConvertedHistory
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io.jsonparse import strip_bom
from treeprep.io.lines import LineTooLong, iter_lines, read_blocks, record_limit
from treeprep.schemas import Reject

NAME = "aider-llm-history"
CHAT_NAME = "aider-chat-history"

_REQUEST = "TO LLM"
_RESPONSE = "LLM RESPONSE"
_HEADER = re.compile(rb"(TO LLM|LLM RESPONSE) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\r?")
_HEADER_BYTES = re.compile(rb"(?:TO LLM|LLM RESPONSE) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\r?\n")
#: what a header line starts with, after the end of the line before it
_HEADS = (b"\nTO LLM ", b"\nLLM RESPONSE ")
_CHAT_HEADING = b"# aider chat started at "
#: the line that opens each message of a request
_SEP = "-------"
_SEP_LINE = b"-------\n"
_NEXT_SEP = b"\n" + _SEP_LINE  # a separator line after the end of the line before it
_ROLES = {"SYSTEM": "system", "USER": "user", "ASSISTANT": "assistant"}
_ROLE_BYTES = frozenset(r.encode() for r in _ROLES)
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
    after the header (the first at ``line + 1``), each ending in ``\\n``, as read (a CRLF file's
    ``\\r`` removed) until they pass the per-record limit."""

    kind: str
    stamp: str
    line: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    over: bool = False

    def add(self, lines: bytes | None, limit: int) -> None:
        """Keep whole lines, each ending in ``\\n`` (None: a line over the limit, never held)."""
        if lines is None or self.over or self.size + len(lines) > limit:
            self.over, self.parts = True, []
            return
        self.size += len(lines)
        self.parts.append(lines)

    def data(self) -> bytes:
        """The block's lines, each ending in ``\\n``; :class:`_Bad` when over the limit."""
        if self.over:
            why = f"the block is over the limit of {record_limit():,} bytes per record"
            raise _Bad(self.line, f"{why} (--max-record-mb)")
        return b"".join(self.parts)

    def body(self) -> list[str]:
        """The block's lines as text; :class:`_Bad` when over the limit or not UTF-8."""
        data = self.data()
        return _text(data, 0, self.line + 1)[:-1].split("\n") if data else []


def _text(data: bytes, at: int, first: int) -> str:
    """``data[at:]`` (whole lines, ``at`` the start of one) as text; :class:`_Bad` naming the
    first line that is not UTF-8 (``first``: the file's line number of ``data``'s first line)."""
    try:
        return str(memoryview(data)[at:], "utf-8")
    except UnicodeDecodeError as e:
        bad = at + e.start
        byte = bad - data.rfind(b"\n", 0, bad) - 1
        why = f"not UTF-8 text (byte {byte} of the line); Aider writes UTF-8"
        raise _Bad(first + data.count(b"\n", 0, bad), why) from e


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


class _Scan:
    """Cuts a log into its blocks at the header lines (:func:`_blocks`). The lines between two
    headers are found with bytes searches and kept as they come, not one line at a time: a
    request repeats the whole history, so a session's log grows with the square of its turns."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        self.cur: _Block | None = None
        self.crlf: bool | None = None
        self.i = 0  # the lines read

    def line(self, raw: bytes | None) -> Iterator[_Block | Reject]:
        """The next line (None: one over the limit, never held) on its own."""
        self.i += 1
        if self.i == 1 and raw is not None:
            raw = strip_bom(raw)
        m = None if raw is None else _HEADER.fullmatch(raw)
        if m is not None and raw is not None:
            yield from self._open(m, raw)
            return
        if raw is not None and self.crlf and raw.endswith(b"\r"):
            raw = raw[:-1]
        if self.cur is not None:
            self.cur.add(None if raw is None else raw + b"\n", self.limit)
        elif raw is None or raw.strip():
            why = f"expected a '{_REQUEST} <time>' line opening a request, got {_shown_bytes(raw)}"
            yield Reject(file=self.path, line=self.i, format=NAME, reason=why)
            self.cur = _Block("", "", self.i)  # the lines up to the next header: this reject's

    def _open(self, m: re.Match[bytes], raw: bytes) -> Iterator[_Block]:
        """A header line: the block before it is whole."""
        if self.cur is not None:
            yield self.cur
        self.crlf = raw.endswith(b"\r") if self.crlf is None else self.crlf
        self.cur = _Block(m.group(1).decode(), m.group(2).decode(), self.i)

    def lines(self, data: bytes, pos: int, end: int) -> Iterator[_Block | Reject]:
        """The whole lines ``data[pos:end]``, each ending in ``\\n`` (``pos`` > 0)."""
        while pos < end and self.cur is None:  # before the first header: one at a time
            nl = data.index(b"\n", pos)
            yield from self.line(data[pos:nl])
            pos = nl + 1
        if pos >= end:
            return
        for start, m in chain(_headers(data, pos, end), [(end, None)]):
            assert self.cur is not None
            if start > pos and not self.cur.over:
                kept = data[pos:start]
                self.cur.add(kept.replace(b"\r\n", b"\n") if self.crlf else kept, self.limit)
            self.i += data.count(b"\n", pos, start)
            if m is None:
                return
            nl = data.index(b"\n", start)
            self.i += 1
            yield from self._open(m, data[start:nl])
            pos = nl + 1


def _headers(data: bytes, pos: int, end: int) -> Iterator[tuple[int, re.Match[bytes]]]:
    """The header lines among the whole lines ``data[pos:end]`` (``pos`` > 0, the start of a
    line): (where each starts, its match)."""
    at = {h: data.find(h, pos - 1, end) for h in _HEADS}  # the "\n" ending the line before
    while True:
        found = [x for x in at.values() if x >= 0]
        if not found:
            return
        c = min(found)
        nl = data.index(b"\n", c + 1)
        m = _HEADER.fullmatch(data, c + 1, nl)
        if m is not None:
            yield c + 1, m
        at = {h: data.find(h, nl, end) if x == c else x for h, x in at.items()}


def _blocks(path: str) -> Iterator[_Block | Reject]:
    """The file's blocks in order; text before the first header is one reject. A file written
    on Windows (its first header ends in ``\\r``) has the ``\\r`` of every line removed. Read in
    bounded memory, as :func:`~treeprep.io.lines.iter_lines` reads: a line over the limit is
    never held, and a broken compressed stream raises after its complete lines."""
    limit = record_limit()
    scan = _Scan(path, limit)
    pending: list[bytes] = []  # the start of a line that goes on in the next read
    size = 0
    for block in read_blocks(path, lambda: scan.i):
        nl = block.find(b"\n")
        if nl < 0:
            size += len(block)
            pending = [] if size > limit else [*pending, block]
            continue
        whole = None if size + nl > limit else b"".join([*pending, block[:nl]])
        yield from scan.line(whole)
        last = block.rfind(b"\n") + 1
        yield from scan.lines(block, nl + 1, last)
        pending, size = [block[last:]], len(block) - last
    if size:
        yield from scan.line(None if size > limit else b"".join(pending))
    if scan.cur is not None:
        yield scan.cur


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


class _Raw(NamedTuple):
    """One message of a request as logged: the index of its first line among the request's
    lines, those lines (each ending in ``\\n``; ``b""``: none) and whether it is a cache-marked
    text part (:func:`_cached_part`) or written line by line (:func:`_plain`)."""

    line: int
    raw: bytes
    cached: bool


def _separators(data: bytes, at: int) -> list[int]:
    """Where the separator lines of ``data`` (whole lines) start, from ``at`` (one of them) on."""
    out = [at]
    q = data.find(_NEXT_SEP, at + len(_SEP))
    while q >= 0:
        out.append(q + 1)
        q = data.find(_NEXT_SEP, q + len(_SEP_LINE))
    return out


def _cached_end(data: bytes, seps: list[int], ends: list[int], t: int) -> tuple[int | None, bool]:
    """(the segment that ends the cache-marked part opening after separator ``t``, or None when
    it is not one; whether later lines may change that). Read as :func:`_cached_part` reads:
    first line ``ROLE type: text``, second ``ROLE text: ...``, and the part ends at the first
    line from its third on that starts with ``ROLE cache_control: `` and is the last of its
    segment; without one the message is read as plain until a later line ends it."""
    m, end = seps[t] + len(_SEP_LINE), ends[t]
    nl = data.find(b"\n", m, end)
    if nl < 0:
        return None, False
    role = data[m:nl].split(b" ", 1)[0]
    if role not in _ROLE_BYTES or data[m:nl] != role + b" type: text":
        return None, False
    if not data.startswith(role + b" text: ", nl + 1, end):
        return None, False
    third = data.find(b"\n", nl + 1, end) + 1
    mark = role + b" cache_control: "
    for u in range(t, len(seps)):
        start = third if u == t else seps[u] + len(_SEP_LINE)
        if ends[u] > start:
            last = max(data.rfind(b"\n", start, ends[u] - 1) + 1, start)
            if data.startswith(mark, last, ends[u]):
                return u, False
    return None, True


def _split(data: bytes, at: int, line: int) -> tuple[list[_Raw], list[int], int]:
    """The messages of a request's lines ``data`` from ``at``, the start of a separator line
    whose index is ``line``: (the messages, where each ends, how many of them no later line can
    change: all but those from a cache-marked part whose end is not there)."""
    seps = _separators(data, at)
    ends = [*seps[1:], len(data)]
    out: list[_Raw] = []
    stops: list[int] = []
    fixed: int | None = None
    t = 0
    while t < len(seps):
        u, unsure = _cached_end(data, seps, ends, t)
        if unsure and fixed is None:
            fixed = len(out)
        end = ends[t if u is None else u]
        raw = data[seps[t] + len(_SEP_LINE) : end]
        out.append(_Raw(line + 1, raw, u is not None))
        stops.append(end)
        line += 1 + raw.count(b"\n")
        t = (t if u is None else u) + 1
    return out, stops, len(out) if fixed is None else fixed


class _Prompts:
    """The message lists of a file's requests. Each request sends the history again, and Aider
    puts the files and its reminder after it, so a request begins with most of the one before:
    the messages it shares with that one (found by comparing bytes, in C) are the same
    :class:`_Raw` objects, and :class:`ConvertedHistory` converts only the others."""

    def __init__(self) -> None:
        self.converted: ConvertedHistory[_Raw] = ConvertedHistory(self._convert, per_entry=True)
        self.data = b""  # the last request's lines (all UTF-8)
        self.raws: list[_Raw] = []  # its messages
        self.stops: list[int] = []  # where each ends in data
        self.fixed = 0  # how many of them no later line can change
        self.first = 0  # the file's line number of the request's first line (for the rejects)

    def of(self, req: _Block) -> list[dict[str, Any]]:
        """The messages of request ``req``; :class:`_Bad` naming the line when malformed."""
        data = req.data()
        keep = self._kept(data)
        at = self.stops[keep - 1] if keep else 0
        _text(data, at, req.line + 1)  # what the last request did not hold must be UTF-8
        if data in (b"", b"\n"):
            raise _Bad(req.line, "the request holds no messages")
        if not data.startswith(_SEP_LINE):
            got = _shown(data[: data.index(b"\n")].decode())
            raise _Bad(req.line + 1, f"expected '{_SEP}' opening the first message, got {got}")
        line = self.raws[keep - 1].line + self.raws[keep - 1].raw.count(b"\n") if keep else 0
        raws, stops, fixed = _split(data, at, line) if at < len(data) else ([], [], 0)
        self.data, self.raws = data, self.raws[:keep] + raws
        self.stops, self.fixed = self.stops[:keep] + stops, keep + fixed
        self.first = req.line + 1
        return list(self.converted.update(self.raws))

    def _kept(self, data: bytes) -> int:
        """How many of the last request's first messages this one begins with, each ending
        where a separator line or the end follows."""
        last = memoryview(self.data)

        def same(i: int) -> bool:  # data begins with messages 0..i
            return data.startswith(last[: self.stops[i]])

        good, bad, step = self.fixed - 1, self.fixed, 1
        while good >= 0 and not same(good):  # back from the end, twice as far each time
            good, bad, step = good - step, good, step * 2
        good = max(good, -1)
        while bad - good > 1:  # then halve the gap
            mid = (good + bad) // 2
            good, bad = (mid, bad) if same(mid) else (good, mid)
        while good >= 0 and not (
            self.stops[good] == len(data) or data.startswith(_SEP_LINE, self.stops[good])
        ):
            good -= 1
        return good + 1

    def _convert(self, raws: list[_Raw], start: int) -> Converted:
        """Messages ``start`` on, one of each :class:`_Raw`."""
        out = []
        for n, r in enumerate(raws, start):
            lines = str(r.raw, "utf-8")[:-1].split("\n") if r.raw else []
            found = _cached_part(lines, 0) if r.cached else None
            if found is None:
                found = _plain(lines, 0, self.first + r.line, n)
            out.append({"role": _ROLES[found[0]], "content": found[1]})
        return Converted(out)


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


def _call(path: str, k: int, req: _Block, resp: _Block, prompts: _Prompts) -> Item:
    """The call of request ``req`` answered by ``resp`` (the ``k``-th of the file)."""
    call_id = f"{k}@{req.stamp}"
    try:
        messages = prompts.of(req)
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
    prompts = _Prompts()
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
            yield _call(path, k, pending, b, prompts)
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
