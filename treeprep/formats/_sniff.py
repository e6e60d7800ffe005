"""Detection that does not depend on the first 64 KB of a file.

The builder hands every sniffer the file's first 64 KB (``treeprep.io.read_head``). That is enough
for most logs, but not when the first record is longer (a 70 KB first conversation, a tau2-bench
results file whose keys come after a long policy), when the file is one pretty-printed JSON array
(its first line is ``[``), or when it starts with a UTF-8 byte order mark. So detection runs twice:

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

from treeprep.formats._records import strip_bom

HEAD = 65536
MAX_FIRST_RECORD = 256 << 20
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
    text = s.decode("utf-8", errors="replace")
    if text.startswith("["):
        i = 1
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "]":
            return "array", None
        try:
            return "array", _decoder.raw_decode(text, i)[0]
        except json.JSONDecodeError:
            return None
    try:
        return "value", _decoder.raw_decode(text)[0]
    except json.JSONDecodeError:
        return None


def read_first(path: str, head: bytes) -> tuple[str, Any] | None:
    """The file's first record, reading past ``head`` when it is cut (None when unreadable)."""
    found = _parse_first(head, eof=len(head) < HEAD)
    if found is not None or len(head) < HEAD:
        return found
    from treeprep.io import open_binary

    size = HEAD
    try:
        with open_binary(path) as f:
            data = f.read(size)
            while True:
                eof = len(data) < size
                found = _parse_first(data, eof)
                if found is not None or eof or size >= MAX_FIRST_RECORD:
                    return found
                more = f.read(size)
                data += more
                size *= 2
    except (OSError, EOFError, ValueError):
        return None


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
        return orjson.dumps([] if rec is None else [skeleton(rec)])
    return orjson.dumps(skeleton(rec)) + b"\n"
