"""JSON from untrusted input: a line to a record or a Reject, a document to a value or an error.

* :func:`parse_json_line` never raises: a bad line becomes a :class:`~treeprep.schemas.Reject`
  (``invalid UTF-8 at byte N``, a non-finite number with its field, or orjson's message), so one
  bad record never stops a file.
* :func:`parse_json_document` is the one loader of a whole JSON document (a file holding one
  value): it raises :class:`~treeprep.errors.InputError` with the file, the line and what was
  expected (the column in the reason); a leading UTF-8 byte order mark is skipped, and a
  non-finite number is refused naming its field unless the caller keeps them as markers.
* ``NaN``, ``Infinity`` and out-of-range numbers (Python's ``json.dump`` writes them by default)
  are refused by orjson; :func:`lenient_json_loads` keeps them as :class:`NonFinite` markers so
  that an adapter can reject only the records that hold one (:func:`find_non_finite`).
* :func:`head_record` and :func:`json_key_in` let format sniffers look at a file's first bytes.

The trade-off: lines are bytes, parsed with orjson (several times faster than ``json``), and UTF-8
is validated only when orjson refuses a line, so good input pays nothing for the error path. The
walks over parsed values are iterative, so a document nested thousands deep cannot exhaust the
stack.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import accumulate, compress
from operator import is_not
from typing import Any

import orjson

from treeprep.errors import InputError
from treeprep.schemas import Reject

__all__ = [
    "BOM",
    "NonFinite",
    "find_non_finite",
    "find_value",
    "head_record",
    "json_key_in",
    "lenient_json_loads",
    "nested_deeper",
    "parse_json_document",
    "parse_json_line",
    "strip_bom",
]

#: the UTF-8 byte order mark some editors and exporters start a file with; orjson refuses it
#: ("BOM is not supported"), and it is legal only at the start of a stream
BOM = b"\xef\xbb\xbf"


#: orjson passes these to ``default`` (which refuses them) instead of writing them its own way
_PLAIN_ONLY = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def json_key(value: Any) -> bytes | None:
    """orjson's text of a plain JSON value, as an exact cache key: two values with the same key
    are equal and of the same types (``1``, ``1.0`` and ``true`` differ). None when ``value``
    holds anything but dicts with string keys, lists, strings, 64-bit integers, floats, booleans
    and None (a subclass, a datetime or a dataclass is refused, not written its own way). orjson
    writes NaN and infinities as ``null``: a caller whose values may hold them checks for that.

    >>> json_key({"a": [1, 1.0, True, None]})
    b'{"a":[1,1.0,true,null]}'
    >>> json_key({1: "a"}) is None
    True
    """
    try:
        return orjson.dumps(value, default=_refuse, option=_PLAIN_ONLY)
    except TypeError:  # orjson.JSONEncodeError is one
        return None


def json_keys(
    values: list[Any], last: list[Any], last_keys: list[bytes | None]
) -> list[bytes | None]:
    """:func:`json_key` of each of ``values``, the one in ``last_keys`` for a value that is the
    very object of ``last`` at its position (known by identity, in C: a session's calls hand
    their history's dicts again, and writing the whole history per call was quadratic).

    >>> a = {"n": 1}
    >>> json_keys([a, {"n": 1.0}], [a, {"n": 1}], [b"kept", b'{"n":1}'])
    [b'kept', b'{"n":1.0}']
    """
    n = min(len(values), len(last))
    keys = last_keys[:n]
    for i in compress(range(n), map(is_not, values, last)):
        keys[i] = json_key(values[i])
    keys += map(json_key, values[n:])
    return keys


def strip_bom(data: bytes) -> bytes:
    """``data`` without a leading :data:`BOM`."""
    return data[len(BOM) :] if data.startswith(BOM) else data


def _utf8_error_at(raw: bytes) -> int | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    return None


def parse_json_line(path: str, lineno: int, raw: bytes) -> dict | list | Reject:
    """Parse one JSON line; a bad line becomes a :class:`Reject` (this never raises).

    Scalars (a bare number or string) are valid JSON but not records: they are rejected too. A
    number that is not finite (``NaN``, ``Infinity``, ``1e400``) is rejected with its field.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        bad = _utf8_error_at(raw)
        if bad is not None:
            return Reject(file=path, line=lineno, reason=f"invalid UTF-8 at byte {bad}")
        field = _non_finite_field(raw, str(e))
        if field is not None:
            return Reject(file=path, line=lineno, reason=field)
        return Reject(file=path, line=lineno, reason=f"malformed JSON: {e}")
    if not isinstance(value, dict | list):
        return Reject(
            file=path,
            line=lineno,
            reason=f"expected a JSON object, got {type(value).__name__}",
        )
    return value


class NonFinite(str):
    """A ``NaN``, ``Infinity`` or out-of-range number of a JSON document (Python's ``json.dump``
    writes them by default), kept as its text so that only the records holding one are
    rejected (:func:`find_non_finite`)."""


def _parse_float(text: str) -> float | NonFinite:
    v = float(text)
    return v if math.isfinite(v) else NonFinite(text)


def lenient_json_loads(data: bytes | str) -> Any:
    """``json.loads`` that keeps non-finite numbers as :class:`NonFinite` markers."""
    return json.loads(data, parse_constant=NonFinite, parse_float=_parse_float)


def lenient_decoder() -> json.JSONDecoder:
    """A decoder (for ``raw_decode`` of concatenated documents) that keeps non-finite numbers as
    :class:`NonFinite` markers, as :func:`lenient_json_loads` does."""
    return json.JSONDecoder(parse_constant=NonFinite, parse_float=_parse_float)


def non_finite_reason(value: Any) -> str | None:
    """``"FIELD: expected a finite number, got TEXT"`` for the first :class:`NonFinite` inside
    ``value`` (parsed by :func:`lenient_json_loads` or :func:`lenient_decoder`), else None.

    >>> non_finite_reason(lenient_json_loads('{"a": [1, NaN]}'))
    'a[1]: expected a finite number, got NaN'
    """
    at = find_non_finite(value)
    if at is None:
        return None
    return f"{at}: expected a finite number, got {find_value(value, at)}"


def find_non_finite(value: Any) -> str | None:
    """The path (``a.b[2]``) of the first :class:`NonFinite` inside ``value``, or None.

    Iterative, so a document nested thousands deep cannot exhaust the stack."""
    for at, v in _walk_json(value):
        if isinstance(v, NonFinite):
            return at
    return None


def find_value(value: Any, path: str) -> str:
    """The text of the :class:`NonFinite` at ``path`` (as :func:`find_non_finite` names it)."""
    for at, v in _walk_json(value):
        if at == path:
            return str(v)
    return "?"


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects/arrays deeper than ``limit`` (iterative: no recursion).

    In C where ``value`` is plain JSON: each object or array writes one ``{`` or ``[`` in its
    JSON text, so a text with at most ``limit`` of them nests no deeper (a session's calls repeat
    their history's arguments, and the walk below cost more than the render); else the depth of
    the brackets outside its strings (:func:`_text_deeper`: a first record can be a document of
    tens of MB, which the walk took seconds over)."""
    if not isinstance(value, dict | list):
        return False
    try:
        blob = orjson.dumps(value)
    except TypeError:  # not plain JSON (orjson.JSONEncodeError is a TypeError): walk it
        pass
    else:
        if blob.count(b"{") + blob.count(b"[") <= limit:
            return False
        return _text_deeper(blob, limit)
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


#: every byte but the quote and the brackets (deleted from a JSON text to read its nesting)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
#: the depth an opening (+1) or closing (-1) bracket adds
_STEP = [1 if b in b"[{" else -1 for b in range(256)]


def _text_deeper(blob: bytes, limit: int) -> bool:
    """Whether ``blob``, orjson's text of a value, nests deeper than ``limit``, in C: without its
    escaped backslashes and quotes, every ``"`` opens or closes a string (the other escapes hold
    neither a quote nor a bracket), so of the quotes and brackets left, every other piece
    between quotes is outside the strings; the depth is the running sum of its brackets."""
    text = blob.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    outside = b"".join(text.split(b'"')[::2])
    return max(accumulate(map(_STEP.__getitem__, outside)), default=0) > limit


def _walk_json(value: Any) -> Iterator[tuple[str, Any]]:
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        at, v = stack.pop()
        yield at, v
        if isinstance(v, dict):
            stack.extend((f"{at}.{k}" if at else str(k), x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((f"{at}[{i}]", x) for i, x in reversed(list(enumerate(v))))


def _non_finite_field(raw: bytes, msg: str) -> str | None:
    """``"FIELD: expected a finite number, got TEXT"`` when orjson refused ``raw`` only for a
    non-finite number, else None."""
    value = _lenient_or_none(raw, msg)
    return None if value is None else non_finite_reason(value)


def _lenient_or_none(raw: bytes, msg: str) -> Any:
    """``raw`` parsed keeping non-finite numbers, when orjson's refusal (``msg``) may be only
    for one of them; else None."""
    if "infinity" not in msg and b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        return lenient_json_loads(raw)
    except (ValueError, RecursionError):
        return None


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, col


def parse_json_document(path: str, data: bytes, *, keep_non_finite: bool = False) -> Any:
    """The one JSON document of ``data`` (the whole of file ``path``), or :class:`InputError`.

    A leading :data:`BOM` is skipped. The error names ``path``, a line and what was expected:
    line 0 for an empty file; the line (and column, in the reason) of malformed JSON or invalid
    UTF-8; for a non-finite number (``NaN``, ``Infinity``, ``1e400``) its line and field. With
    ``keep_non_finite`` such numbers are kept as :class:`NonFinite` markers instead, for an
    adapter that rejects only the records holding one (:func:`find_non_finite`).

    >>> parse_json_document("a.json", b'\\xef\\xbb\\xbf{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> parse_json_document("a.json", b'{"t": NaN}')
    Traceback (most recent call last):
    ...
    treeprep.errors.InputError: a.json:1: t: expected a finite number, got NaN
    """
    body = strip_bom(data)
    if not body.strip():
        raise InputError(path, 0, "empty file")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        bad = _utf8_error_at(data)
        if bad is not None:
            line, col = _line_col(data, bad)
            raise InputError(path, line, f"invalid UTF-8 at byte {bad} (column {col})") from e
        value = _lenient_or_none(body, str(e))
        at = None if value is None else find_non_finite(value)
        if at is not None:
            if keep_non_finite:
                return value
            reason = f"{at}: expected a finite number, got {find_value(value, at)}"
            raise InputError(path, e.lineno, reason) from e
        raise InputError(path, e.lineno, f"malformed JSON at column {e.colno}: {e.msg}") from e


# --------------------------------------------------------------------------------------------
# sniffing helpers
# --------------------------------------------------------------------------------------------


def head_record(head: bytes) -> object | None:
    """The first record of a head: its first line parsed, or the whole head if it has no newline.

    None when that text is not complete JSON (the line is longer than the head) or not valid.
    """
    s = head.lstrip()
    if not s:
        return None
    nl = s.find(b"\n")
    candidates = [s[:nl], s] if nl >= 0 else [s]
    for c in candidates:
        try:
            return orjson.loads(c)
        except orjson.JSONDecodeError:
            continue
    return None


def json_key_in(head: bytes, key: str) -> bool:
    """Whether ``"key":`` occurs in the raw bytes as a real JSON key.

    A key quoted inside a JSON string is escaped (``\\"key\\"``), so an unescaped match is an
    object key of the document, even when the head ends in the middle of a record.
    """
    pat = _key_patterns.get(key)
    if pat is None:
        pat = re.compile(rb'(?<!\\)"' + re.escape(key.encode()) + rb'"\s*:')
        _key_patterns[key] = pat
    return pat.search(head) is not None


_key_patterns: dict[str, re.Pattern[bytes]] = {}
