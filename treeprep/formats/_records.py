"""Record readers for the adapters (:mod:`treeprep.io`'s, a leading UTF-8 BOM tolerated), and the
few record-building helpers that every adapter would otherwise write again.

Editors on Windows and some exporters start a file with a byte order mark (``EF BB BF``). orjson
refuses it ("BOM is not supported"), so without this the first record of such a file is a reject
and a one-document JSON file is unreadable. The BOM is only legal at the start of the stream, so
only line 1 (or the document's start) is retried without it; every other line costs nothing.

The helpers are deliberately tiny and exact: :func:`read_records` is the loop every JSONL adapter
runs (an unreadable line is a reject tagged with the format, every other record is converted),
:func:`file_stem` strips the suffixes each adapter lists (the lists differ on purpose: they are part
of the group ids already written), and :func:`chat_tool_call` is the one place that spells a chat
tool call. Each adapter still decides what it accepts; these only say it once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from treeprep.errors import InputError
from treeprep.formats.base import Item
from treeprep.io import (
    iter_json_records,
    iter_lines,
    load_json_document,
    open_binary,
    parse_json_line,
    record_limit,
)
from treeprep.schemas import Reject

BOM = b"\xef\xbb\xbf"


def strip_bom(data: bytes) -> bytes:
    return data[len(BOM) :] if data.startswith(BOM) else data


def iter_records(path: str) -> Iterator[tuple[int, object]]:
    """:func:`treeprep.io.iter_json_records`, reading a first line that starts with a BOM."""
    for lineno, rec in iter_json_records(path):
        if lineno == 1 and isinstance(rec, Reject):
            raw = next(iter_lines(path, record_limit()), (1, b""))[1]
            if isinstance(raw, bytes) and raw.startswith(BOM):
                rec = parse_json_line(path, 1, raw[len(BOM) :])
        yield lineno, rec


def load_document(path: str) -> object:
    """:func:`treeprep.io.load_json_document`, reading a document that starts with a BOM."""
    try:
        return load_json_document(path)
    except InputError:
        try:
            with open_binary(path) as f:
                data = f.read()
        except (OSError, EOFError, ValueError):
            data = b""
        if not data.startswith(BOM):
            raise
    try:
        return orjson.loads(data[len(BOM) :])
    except orjson.JSONDecodeError as e:
        raise InputError(path, e.lineno, f"malformed JSON at column {e.colno}: {e.msg}") from e


def read_records(
    path: str, fmt: str, convert: Callable[[object, int], Iterable[Item]]
) -> Iterator[Item]:
    """Every record of a JSONL file through ``convert(record, line)``, in file order.

    A line that is not JSON (or over the size limit) is its reject, tagged with ``fmt``.
    """
    for lineno, rec in iter_records(path):
        if isinstance(rec, Reject):
            rec.format = fmt
            yield rec
        else:
            yield from convert(rec, lineno)


def file_stem(path: str, suffixes: tuple[str, ...]) -> str:
    """The file's name without its folders and without ``suffixes``, removed in that order.

    >>> file_stem("runs/a.jsonl.gz", (".gz", ".zst", ".jsonl"))
    'a'
    """
    name = os.path.basename(path)
    for ext in suffixes:
        name = name.removesuffix(ext)
    return name


def chat_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call in chat-completions form (values as the adapter read them)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
