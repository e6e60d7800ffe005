"""Detection that does not depend on the first 64 KB of a file.

The builder hands every sniffer the file's first 64 KB (:func:`treeprep.io.compressed.read_head`).
That is enough for most logs, but not when the first record is longer (a 70 KB first
conversation, a tau2-bench results file whose keys come after a long policy), when the file is one
pretty-printed JSON array (its first line is ``[``), or when it starts with a UTF-8 byte order mark.
So detection runs twice:

1. every sniffer on the head with any BOM removed (the cheap, usual path);
2. when none accepts it and the head was cut, on a *skeleton* of the first record: the record read
   in full (past the head, up to :data:`MAX_FIRST_RECORD` bytes) and re-serialised with long
   strings and long lists shortened, so that every key of the record sits in a few kilobytes that
   any sniffer can parse. A JSON array keeps its brackets (``[first element]``) and a JSONL record
   ends in a newline, so sniffers that look at the layout still see the right one.

Reading the first record in full costs one pass over it, paid only for files the first pass could
not place. A record larger than :data:`MAX_FIRST_RECORD` stays unrecognised (name ``--format``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from treeprep.errors import InputError
from treeprep.io.jsonparse import strip_bom

HEAD = 65536
MAX_FIRST_RECORD = 256 << 20
#: the deepest first record detection looks into (a record nested deeper is not used to detect
#: the format: parsing and walking it would recurse once per level)
MAX_SNIFF_DEPTH = 200
#: past this many bytes, the first record is read up to its limit at once: each read of a part
#: parses it again, and a document of tens of MB was parsed at every doubling of what was read
GREEDY = 1 << 20
#: lines looked through for a record within the limits when the first one is not
MAX_LINES = 16
_KEEP_STR = 256
_KEEP_LIST = 8

_decoder = json.JSONDecoder()


def _parse_first(data: bytes, eof: bool) -> tuple[str, Any] | None:
    """('array', first element) or ('value', first value) of ``data``, or None if incomplete."""
    s = strip_bom(data).lstrip()
    if not s:
        return None
    if not eof and b"\n" in s and not s.startswith(b"["):
        line = s[: s.index(b"\n")]
        try:
            return "value", orjson.loads(line)
        except orjson.JSONDecodeError:
            pass  # a pretty-printed document: its first line is not a whole value
    if s.startswith(b"["):
        i = 1
        while i < len(s) and s[i : i + 1].isspace():
            i += 1
        if i < len(s) and s[i : i + 1] == b"]":
            return "array", None
        return _first_value(s, i, "array", eof)
    return _first_value(s, 0, "value", eof)


def _first_value(s: bytes, start: int, kind: str, eof: bool) -> tuple[str, Any] | None:
    """(kind, the JSON value that starts at ``s[start]``), or None when it is incomplete or not
    JSON. With the whole file read (``eof``), orjson first: a first record can be a document of
    tens of MB, which the standard library parses ten times slower. The standard library where
    orjson refuses what it reads (NaN; invalid UTF-8, which it replaces), and on a part of the
    file: orjson's error on a cut document holds many times the part's size, where a line over
    the record limit must not be held (:func:`_read_capped`)."""
    if eof:
        part = s[start:]
        try:
            return kind, orjson.loads(part)
        except orjson.JSONDecodeError as e:
            if e.msg == "unexpected end of data":
                return None  # read as far as the standard library would: the file is cut
            if e.msg == "unexpected content after document":
                # e.pos counts characters: the bytes of the first ``pos`` ones, which orjson read
                end = len(part.decode("utf-8", errors="ignore")[: e.pos].encode("utf-8"))
                try:
                    return kind, orjson.loads(part[:end])
                except orjson.JSONDecodeError:
                    pass
    text = s.decode("utf-8", errors="replace")
    try:
        return kind, _decoder.raw_decode(text, len(s[:start].decode("utf-8", "replace")))[0]
    except json.JSONDecodeError:
        return None


def _too_deep(value: Any) -> bool:
    from treeprep.io.jsonparse import nested_deeper

    return nested_deeper(value, MAX_SNIFF_DEPTH)


_DEEP = f"nested deeper than {MAX_SNIFF_DEPTH} levels"


def _is_document(path: str) -> bool:
    p = path.lower()
    for ext in (".gz", ".zst", ".zstd"):
        p = p.removesuffix(ext)
    return p.endswith(".json")


def _read_capped(path: str, head: bytes, cap: int) -> tuple[str, Any] | None | int:
    """The first record read past ``head``, holding at most about ``cap`` bytes: the record,
    None when it is unreadable, or the number of bytes read when the record is longer."""
    from treeprep.io.compressed import open_binary

    size = HEAD
    try:
        with open_binary(path) as f:
            data = f.read(min(size, cap + 1))
            while True:
                eof = len(data) < min(size, cap + 1)
                found = _parse_first(data, eof)
                if found is not None or eof:
                    return found
                if len(data) > cap:
                    return len(data)
                if len(data) >= GREEDY:
                    size = cap + 1  # the rest at once: one more parse, not one per doubling
                data += f.read(min(size, cap + 1 - len(data)))
                size *= 2
    except (OSError, EOFError, ValueError):
        return None


def _fitting_line(path: str, limit: int, first_reason: str) -> tuple[str, Any] | None:
    """The first of the first :data:`MAX_LINES` lines that is a JSON record within the size and
    depth limits; a longer line is never held (:func:`treeprep.io.lines.iter_lines`). Raises
    :class:`~treeprep.errors.InputError` naming line 1 when none is."""
    from treeprep.io.lines import LineTooLong, iter_lines

    try:
        for i, (_lineno, raw) in enumerate(iter_lines(path, limit)):
            if i >= MAX_LINES:
                break
            if isinstance(raw, LineTooLong):
                continue
            try:
                rec = orjson.loads(strip_bom(raw))
            except orjson.JSONDecodeError:
                continue
            if not _too_deep(rec):
                return "value", rec
    except (OSError, EOFError, ValueError):
        pass  # a broken stream: the reader names it
    why = f"no record of the first {MAX_LINES} lines is within the limits to detect the format by"
    raise InputError(path, 1, f"{first_reason}; {why}")


def read_first(path: str, head: bytes) -> tuple[str, Any] | None:
    """The file's first record, reading past ``head`` when it is cut (None when unreadable).

    Limits: past the head, at most ``--max-record-mb`` bytes are read (a ``.json`` document, read
    whole by its adapter anyway, up to :data:`MAX_FIRST_RECORD`); a record nested deeper than
    :data:`MAX_SNIFF_DEPTH` is not used. When the first line breaks a limit, the first later
    line that does not is used instead (the reader rejects the first one); when there is none,
    :class:`~treeprep.errors.InputError` naming line 1 (the file's one reject). The answer is
    kept for the next sniffer of the same head.
    """
    if _memo and _memo[0] == path and _memo[1] is head:
        return _memo[2]  # type: ignore[no-any-return]
    found = _read_first(path, head)
    _memo[:] = [path, head, found]
    return found


#: the last answer of :func:`read_first` (path, head, answer): every sniffer asks for it
_memo: list[Any] = []


def forget() -> None:
    """Drop the kept answer of :func:`read_first` (detection is over)."""
    _memo.clear()


def _read_first(path: str, head: bytes) -> tuple[str, Any] | None:
    from treeprep.io.lines import record_limit

    limit = record_limit()
    try:
        found: tuple[str, Any] | None | int = _parse_first(head, eof=len(head) < HEAD)
        if found is None and len(head) >= HEAD:
            cap = MAX_FIRST_RECORD if _is_document(path) else limit
            found = _read_capped(path, head, cap)
    except RecursionError:
        found = 0
    if isinstance(found, int):
        if _is_document(path) or strip_bom(head).lstrip().startswith(b"["):
            reason = _DEEP if found == 0 else f"over {MAX_FIRST_RECORD:,} bytes"
            raise InputError(path, 1, f"the first record is {reason}")
        reason = _DEEP if found == 0 else f"longer than the limit of {limit:,} bytes per record"
        return _fitting_line(path, limit, f"the first record is {reason}")
    if found is not None and found[1] is not None and _too_deep(found[1]):
        if found[0] == "array" or _is_document(path):
            raise InputError(path, 1, f"the first record is {_DEEP}")
        return _fitting_line(path, limit, f"the first record is {_DEEP}")
    return found


def first_record(path: str, head: bytes) -> Any:
    """The first record (first JSONL line, first array element, or the document), or None."""
    found = read_first(path, head)
    return None if found is None else found[1]


def skeleton(v: Any) -> Any:
    """``v`` with strings cut to a few hundred characters and lists to a few elements."""
    if isinstance(v, dict):
        return {k: skeleton(x) for k, x in v.items()}
    if isinstance(v, list):
        return [skeleton(x) for x in v[:_KEEP_LIST]]
    if isinstance(v, str) and len(v) > _KEEP_STR:
        return v[:_KEEP_STR]
    return v


def second_look(path: str, head: bytes) -> bytes | None:
    """A small head holding the skeleton of the first record, or None when there is nothing new."""
    if len(head) < HEAD:
        return None  # the head is the whole file: the first pass saw everything
    found = read_first(path, head)
    if found is None:
        return None
    kind, rec = found
    if kind == "array":
        return _dumps([] if rec is None else [skeleton(rec)])
    return _dumps(skeleton(rec)) + b"\n"


def _dumps(v: Any) -> bytes:
    """``v`` as JSON; an integer beyond 64 bits (which orjson refuses) is written as it is."""
    try:
        return orjson.dumps(v)
    except TypeError:
        return json.dumps(v, ensure_ascii=False).encode()
