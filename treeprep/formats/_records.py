"""Record readers for the adapters (:mod:`treeprep.io`'s, a leading UTF-8 BOM tolerated), and the
few record-building helpers that every adapter would otherwise write again.

Editors on Windows and some exporters start a file with a byte order mark (``EF BB BF``). orjson
refuses it ("BOM is not supported"), so without this the first record of such a file is a reject
and a one-document JSON file is unreadable. The BOM is only legal at the start of the stream, so
only line 1 (or the document's start) is retried without it; every other line costs nothing.

The typed accessors (:func:`expect`, :func:`as_dict`, :func:`opt_dict`, :func:`as_list`,
:func:`opt_list`, :func:`opt_str`, :func:`dicts`) are how an adapter reads a field whose shape it
needs: they return the value when it has that shape and otherwise raise
:class:`~treeprep.errors.RecordError` saying where (a JSON path such as ``messages[3].content``)
and what was expected, e.g. ``messages[3].content: expected a string or a list of parts, got
int``. The adapter catches it once per record (or per call) and turns it into a reject naming the
file and line; a one-document file whose top level is wrong raises it as an
:class:`~treeprep.errors.InputError` instead. One accessor rather than ad hoc ``isinstance`` checks
keeps every such message alike, and a shape an adapter forgot to check still shows up: the fuzz
test (``tests/treeprep/test_formats_malformed.py``) fails on any other exception.

The helpers are deliberately tiny and exact: :func:`read_records` is the loop every JSONL adapter
runs (an unreadable line is a reject tagged with the format, every other record is converted),
:func:`file_stem` strips the suffixes each adapter lists (the lists differ on purpose: they are part
of the group ids already written), and :func:`chat_tool_call` is the one place that spells a chat
tool call. Each adapter still decides what it accepts; these only say it once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import orjson

from treeprep.errors import InputError, RecordError
from treeprep.formats.base import Item
from treeprep.io import (
    iter_json_records,
    iter_lines,
    load_json_document,
    open_binary,
    parse_json_line,
    record_limit,
)
from treeprep.jsonparse import NonFinite
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


# --------------------------------------------------------------------------------------------
# typed accessors: a value of the expected shape, or a RecordError naming its path
# --------------------------------------------------------------------------------------------

_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def type_name(v: object) -> str:
    """The JSON name of ``v``'s type, for messages: ``null``, ``boolean``, ``int``, ``float``,
    ``string``, ``array``, ``object`` (a non-finite number read leniently is named as such)."""
    if v is None:
        return "null"
    if isinstance(v, NonFinite):
        return f"non-finite number {v}"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), type(v).__name__
    )


def one_of(v: object, allowed: Collection[str]) -> bool:
    """Whether ``v`` is one of the strings ``allowed`` (False for any other value, including
    an unhashable one: a set lookup with a list would raise TypeError)."""
    return isinstance(v, str) and v in allowed


def expect(v: Any, where: str, *types: type, what: str | None = None) -> Any:
    """``v`` when it is an instance of one of ``types`` (``bool`` is never an ``int`` here, and a
    non-finite marker never a string); else RecordError ``"<where>: expected <what>, got <type>"``.
    """
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if ok and isinstance(v, NonFinite) and NonFinite not in types:
        ok = False
    if not ok:
        want = what or " or ".join(_NAMES.get(t, t.__name__) for t in types)
        raise RecordError(f"{where}: expected {want}, got {type_name(v)}")
    return v


def as_dict(v: Any, where: str) -> dict[str, Any]:
    """``v`` when it is a JSON object."""
    return expect(v, where, dict)  # type: ignore[no-any-return]


def opt_dict(v: Any, where: str) -> dict[str, Any]:
    """``v`` when it is a JSON object, ``{}`` when null or absent."""
    return {} if v is None else as_dict(v, where)


def as_list(v: Any, where: str) -> list[Any]:
    """``v`` when it is a JSON array."""
    return expect(v, where, list)  # type: ignore[no-any-return]


def opt_list(v: Any, where: str) -> list[Any]:
    """``v`` when it is a JSON array, ``[]`` when null or absent."""
    return [] if v is None else as_list(v, where)


def opt_str(v: Any, where: str) -> str | None:
    """``v`` when it is a string (None when null or absent)."""
    return None if v is None else expect(v, where, str)  # type: ignore[no-any-return]


def dicts(v: Any, where: str) -> list[dict[str, Any]]:
    """``v`` when it is an array of objects (``[]`` when null or absent); the first element that is
    not an object is named by its index."""
    items = opt_list(v, where)
    for i, x in enumerate(items):
        as_dict(x, f"{where}[{i}]")
    return items
