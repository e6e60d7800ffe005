"""How an adapter reads its file: :func:`records` for JSONL, :func:`document` for one JSON value.

Every line-based adapter runs the same loop: parse each line, turn a bad one into a reject
tagged with the format, and convert the rest. :func:`records` is that loop, once. It yields
``(line, value)`` for every record in file order and ``(line, Reject)`` for a line that is not
JSON, is over the per-record size limit (``--max-record-mb``), was cut by a broken compressed
stream, or (with ``objects=True``) is not a JSON object; an empty file is one
``(0, Reject("empty file"))``. It never raises, so an adapter always reads to the end.

:func:`document` reads a file holding one JSON value through the one document loader
(:func:`treeprep.io.jsonparse.parse_json_document`) and keeps the file's text, so that an adapter
can name the line where an element of a long pretty-printed document starts
(:meth:`Document.element_lines`, :meth:`Document.line_of`) instead of line 1. A document that
cannot be parsed raises :class:`~treeprep.errors.InputError` naming the file, the line and what
was expected: the file's one reject.

The trade-off for line numbers in documents: one regex scan over the text, trusted only when it
finds as many elements as were parsed (else every element is line 1, never a wrong line).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from treeprep.formats._fields import type_name
from treeprep.io.compressed import read_all
from treeprep.io.jsonparse import parse_json_document, strip_bom
from treeprep.io.lines import iter_json_records
from treeprep.schemas import Reject

__all__ = ["Document", "document", "head_json_objects", "records"]


def records(path: str, fmt: str, *, objects: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` for every JSONL record of ``path``; a bad line as ``(line, Reject)``
    tagged with ``fmt``.

    With ``objects``, a line that is valid JSON but not an object is rejected too (``expected a
    JSON object per line, got array``); otherwise the adapter checks the value's shape.
    """
    for line, value in iter_json_records(path):
        if isinstance(value, Reject):
            value.format = fmt
        elif objects and not isinstance(value, dict):
            reason = f"expected a JSON object per line, got {type_name(value)}"
            value = Reject(file=path, line=line, reason=reason, format=fmt)
        yield line, value


@dataclass(frozen=True)
class Document:
    """A file's one JSON value and its text (for naming the lines of its parts)."""

    value: Any
    text: str

    def element_lines(self, n: int, indent: str = "  ") -> list[int]:
        """Start lines of the ``n`` elements of a pretty-printed top-level JSON list.

        ``[1] * n`` when the text is not laid out that way (one-line JSON), so that a caller can
        always index it.

        >>> Document([{}, {}], '[\\n  {},\\n  {}\\n]').element_lines(2)
        [2, 3]
        """
        starts = [m.start() for m in re.finditer(r"\n" + re.escape(indent) + r"\{", self.text)]
        if len(starts) != n:
            return [1] * n
        lines = []
        line = 1
        pos = 0
        for s in starts:
            line += self.text.count("\n", pos, s + 1)
            pos = s + 1
            lines.append(line)
        return lines

    def line_of(self, needle: str, default: int = 1) -> int:
        """Line of the first occurrence of ``needle`` in the text (``default`` when absent)."""
        i = self.text.find(needle)
        return default if i < 0 else self.text.count("\n", 0, i) + 1


def document(path: str, *, data: bytes | None = None, keep_non_finite: bool = False) -> Document:
    """The one JSON value of ``path`` (``.gz``/``.zst`` decompressed, a leading BOM skipped).

    ``data`` is the file's bytes when the caller has already read them (to look at the layout
    first). With ``keep_non_finite``, ``NaN``/``Infinity`` are kept as
    :class:`~treeprep.io.jsonparse.NonFinite` markers, for an adapter that rejects only the
    records holding one or never reads those fields; otherwise the file is refused naming the
    number's line and field. Raises :class:`~treeprep.errors.InputError`.
    """
    if data is None:
        data = read_all(path)
    value = parse_json_document(path, data, keep_non_finite=keep_non_finite)
    return Document(value, strip_bom(data).decode("utf-8"))


def breaks_later(line: int, why: object) -> str:
    """The reason every later call of a session is rejected with, once line ``line`` could not
    be read (``why``): their prompts would miss what it held.

    >>> breaks_later(7, "role: expected a string, got int")
    'line 7: role: expected a string, got int (the prompts after it would miss it)'
    """
    return f"line {line}: {why} (the prompts after it would miss it)"


def head_json_objects(head: bytes) -> list[dict[str, Any]]:
    """The JSON objects on the complete lines of ``head`` (the first 50), for sniffing JSONL.

    >>> head_json_objects(b'{"a": 1}\\n[2]\\n{"b": 3}\\n{"cut')
    [{'a': 1}, {'b': 3}]
    """
    out: list[dict[str, Any]] = []
    lines = head.split(b"\n")
    if len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    for raw in lines[:50]:
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
