"""Record readers for the adapters: :mod:`treeprep.io`'s, with a leading UTF-8 BOM tolerated.

Editors on Windows and some exporters start a file with a byte order mark (``EF BB BF``). orjson
refuses it ("BOM is not supported"), so without this the first record of such a file is a reject
and a one-document JSON file is unreadable. The BOM is only legal at the start of the stream, so
only line 1 (or the document's start) is retried without it; every other line costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from treeprep.errors import InputError
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
