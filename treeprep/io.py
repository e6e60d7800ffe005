"""Reading input files: which files, their (decompressed) bytes, their lines, their JSON.

Everything an adapter needs to get from a path on the command line to parsed records, with the
error behaviour the build relies on:

* :func:`expand_inputs` turns files, folders and globs into a sorted, de-duplicated list of paths,
  remembering which were named explicitly (an unrecognised file inside a folder is skipped, an
  unrecognised file named on the command line is an error).
* :func:`open_binary` decompresses ``.gz`` and ``.zst`` transparently. zstd is decoded frame by
  frame with a ``decompressobj`` rather than ``stream_reader``, because the latter silently stops at
  a truncated frame; here a stream that ends inside a frame raises, so truncation is never mistaken
  for the end of the data. Multi-frame files and frames without a content size both work.
* :func:`iter_lines` yields ``(line_number, bytes)`` reading fixed 1 MiB blocks: a line is the join
  of its pieces, made once, so a single 50 MB line costs one copy, not a quadratic series of them.
  A truncated or corrupt compressed stream yields every complete line and then raises
  :class:`~treeprep.errors.InputError` naming the line that was cut.
* :func:`parse_json_line` never raises: a bad line becomes a :class:`~treeprep.schemas.Reject`
  (``invalid UTF-8 at byte N`` or orjson's message), so one bad record never stops a file.

The trade-off: lines are bytes, parsed with orjson (several times faster than ``json``), and UTF-8
is validated only when orjson refuses a line, so good input pays nothing for the error path.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import os
import re
import zlib
from collections.abc import Iterator
from typing import BinaryIO, cast

import orjson
import zstandard

from treeprep.errors import InputError
from treeprep.schemas import Reject

__all__ = [
    "expand_inputs",
    "file_sha256",
    "head_record",
    "iter_json_records",
    "iter_lines",
    "json_key_in",
    "load_json_document",
    "open_binary",
    "parse_json_line",
    "read_head",
]

_BLOCK = 1 << 20  # bytes read per block by iter_lines
_ZSTD_IN = 1 << 16  # compressed bytes fed to zstd per step (bounds one step's output)


class _Truncated(EOFError):
    """A compressed stream ended in the middle of a frame."""


class _CorruptZstd(OSError):
    """zstd refused the data (an OSError, like gzip's BadGzipFile, so callers catch one family)."""


# --------------------------------------------------------------------------------------------
# which files
# --------------------------------------------------------------------------------------------


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _walk(folder: str) -> list[str]:
    found: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        found.extend(os.path.join(root, f) for f in sorted(files) if not _is_hidden(f))
    return found


def expand_inputs(specs: list[str]) -> list[tuple[str, bool]]:
    """Files, folders (recursive) and globs -> sorted unique ``(path, explicit)`` pairs.

    ``explicit`` is True for a file named as such and False for a file found inside a folder or by
    a glob. Hidden files and folders (a name starting with ``.``) inside a folder are skipped.

    >>> expand_inputs(["sample_data/tokens.jsonl"])
    [('sample_data/tokens.jsonl', True)]
    """
    chosen: dict[str, bool] = {}

    def add(path: str, explicit: bool) -> None:
        chosen[path] = chosen.get(path, False) or explicit

    for spec in specs:
        if os.path.isfile(spec):
            add(spec, True)
        elif os.path.isdir(spec):
            files = _walk(spec)
            if not files:
                raise InputError(spec, 0, "folder holds no files")
            for f in files:
                add(f, False)
        else:
            matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else []
            n = 0
            for m in matches:
                if os.path.isfile(m):
                    add(m, False)
                    n += 1
                elif os.path.isdir(m):
                    for f in _walk(m):
                        add(f, False)
                        n += 1
            if n == 0:
                raise InputError(spec, 0, "no such file or folder")
    return sorted(chosen.items())


def file_sha256(path: str) -> str:
    """Hex SHA-256 of the file's bytes as stored (compressed files are not decompressed)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# --------------------------------------------------------------------------------------------
# bytes
# --------------------------------------------------------------------------------------------


def _codec(path: str) -> str:
    p = path.lower()
    if p.endswith(".gz"):
        return "gzip"
    if p.endswith(".zst") or p.endswith(".zstd"):
        return "zstd"
    return ""


class _ZstdRaw(io.RawIOBase):
    """A raw reader that decodes zstd frames one after another and notices truncation."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False  # the current decompressobj has been fed bytes of a frame
        self._out = b""
        self._pos = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._pos >= len(self._out) and not self._done:
            data = self._fh.read(_ZSTD_IN)
            if not data:
                self._done = True
                if self._in_frame:
                    raise _Truncated("stream ends inside a zstd frame")
                return
            chunks: list[bytes] = []
            while data:
                try:
                    chunks.append(self._obj.decompress(data))
                except zstandard.ZstdError as e:
                    raise _CorruptZstd(str(e)) from e
                self._in_frame = True
                if self._obj.eof:  # a frame ended: the rest starts a new frame
                    data = self._obj.unused_data
                    self._obj = self._dctx.decompressobj()
                    self._in_frame = False
                else:
                    data = b""
            self._out = b"".join(chunks)
            self._pos = 0

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        self._fill()
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


def open_binary(path: str) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing ``.gz`` and ``.zst`` transparently.

    Reading a truncated or corrupt compressed stream raises (``EOFError``, ``gzip.BadGzipFile``,
    ``zlib.error``, ``zstandard.ZstdError`` or an internal truncation error); :func:`iter_lines`
    and :func:`load_json_document` turn those into :class:`InputError`.
    """
    codec = _codec(path)
    if codec == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if codec == "zstd":
        return io.BufferedReader(_ZstdRaw(open(path, "rb")), buffer_size=_BLOCK)  # type: ignore[return-value]
    return open(path, "rb")


def _read1(f: BinaryIO, n: int) -> bytes:
    """At most one underlying read: data decoded before a stream error is not lost in a buffer."""
    return cast(io.BufferedIOBase, f).read1(n)


_STREAM_ERRORS = (EOFError, OSError, zlib.error, zstandard.ZstdError, _Truncated)


def _stream_error(path: str, line: int, e: BaseException) -> InputError:
    kind = "zstd" if _codec(path) == "zstd" else "gzip"
    if not _codec(path):  # a plain file: an OS error while reading
        return InputError(path, line, f"cannot read: {e}")
    return InputError(path, line, f"truncated or corrupt {kind} stream: {e or type(e).__name__}")


def read_head(path: str, n: int = 65536) -> bytes:
    """The first ``n`` decompressed bytes (fewer if the file is shorter or its stream is broken)."""
    parts: list[bytes] = []
    got = 0
    try:
        with open_binary(path) as f:
            while got < n:
                b = _read1(f, n - got)
                if not b:
                    break
                parts.append(b)
                got += len(b)
    except _STREAM_ERRORS:
        pass
    return b"".join(parts)


def iter_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` for every non-blank line; numbers are 1-based.

    The newline (``\\n`` or ``\\r\\n``) is removed. Blank lines are counted but not yielded. On a
    truncated or corrupt ``.gz``/``.zst`` stream every complete line is yielded first, then
    :class:`InputError` names the line that was being read.
    """
    lineno = 0
    pending: list[bytes] = []
    try:
        f = open_binary(path)
    except OSError as e:
        raise InputError(path, 0, f"cannot open: {e}") from e
    with f:
        while True:
            try:
                block = _read1(f, _BLOCK)
            except _STREAM_ERRORS as e:
                raise _stream_error(path, lineno + 1, e) from e
            if not block:
                break
            pieces = block.split(b"\n")
            last = pieces.pop()
            for piece in pieces:
                if pending:
                    pending.append(piece)
                    line = b"".join(pending)
                    pending = []
                else:
                    line = piece
                lineno += 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line and not line.isspace():
                    yield lineno, line
            if last:
                pending.append(last)
    if pending:
        line = b"".join(pending)
        if line.endswith(b"\r"):
            line = line[:-1]
        if line and not line.isspace():
            yield lineno + 1, line


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def _utf8_error_at(raw: bytes) -> int | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    return None


def parse_json_line(path: str, lineno: int, raw: bytes) -> dict | list | Reject:
    """Parse one JSON line; a bad line becomes a :class:`Reject` (this never raises).

    Scalars (a bare number or string) are valid JSON but not records: they are rejected too.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        bad = _utf8_error_at(raw)
        if bad is not None:
            return Reject(file=path, line=lineno, reason=f"invalid UTF-8 at byte {bad}")
        return Reject(file=path, line=lineno, reason=f"malformed JSON: {e}")
    if not isinstance(value, dict | list):
        return Reject(
            file=path,
            line=lineno,
            reason=f"expected a JSON object, got {type(value).__name__}",
        )
    return value


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, col


def load_json_document(path: str) -> object:
    """Parse a file holding one JSON document (``.gz``/``.zst`` decompressed).

    Raises :class:`InputError` with the line (and column in the reason) for malformed JSON or
    invalid UTF-8, with line 0 for an empty file or an unreadable stream.
    """
    try:
        with open_binary(path) as f:
            data = f.read()
    except _STREAM_ERRORS as e:
        raise _stream_error(path, 0, e) from e
    if not data.strip():
        raise InputError(path, 0, "empty file")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        bad = _utf8_error_at(data)
        if bad is not None:
            line, col = _line_col(data, bad)
            raise InputError(path, line, f"invalid UTF-8 at byte {bad} (column {col})") from e
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


def iter_json_records(path: str) -> Iterator[tuple[int, object]]:
    """JSONL records of a file as ``(line, value)``; bad lines and broken files as Rejects.

    A bad line yields ``(line, Reject)`` and reading goes on; an empty file yields one
    ``(0, Reject("empty file"))``; a truncated or corrupt compressed stream yields its complete
    records and then one Reject naming the line that was cut. This never raises
    :class:`InputError`, so an adapter built on it always reads to the end.
    """
    seen = False
    try:
        for lineno, raw in iter_lines(path):
            seen = True
            yield lineno, parse_json_line(path, lineno, raw)
    except InputError as e:
        yield e.line, Reject(file=e.file, line=e.line, reason=e.reason)
        return
    if not seen:
        yield 0, Reject(file=path, line=0, reason="empty file")
