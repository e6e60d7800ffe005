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
import json
import math
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import orjson
import zstandard

from treeprep.errors import InputError
from treeprep.schemas import Reject

__all__ = [
    "InputFile",
    "InputSet",
    "discover_inputs",
    "expand_inputs",
    "file_sha256",
    "head_record",
    "iter_json_records",
    "iter_lines",
    "json_key_in",
    "load_json_document",
    "open_binary",
    "parse_json_line",
    "printable",
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


def printable(path: str) -> str:
    """``path`` as valid UTF-8 text: bytes of a non-UTF-8 file name (held by Python as lone
    surrogates) are written as ``\\xNN`` escapes, so the name can go into JSON and Arrow."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class InputFile:
    """One input file: where to open it, and the name that stands for it in every output."""

    #: the path to open (as found: relative or absolute, through links)
    path: str
    #: the path relative to the input root, ``/``-separated, printable: what reaches shards,
    #: manifest and rejects, so the same inputs give the same bytes wherever they lie
    name: str
    #: named as a file on the command line (not found inside a folder or by a glob)
    explicit: bool
    #: why the file cannot be read (dangling link, permission, non-UTF-8 name): a reject
    error: str | None = None


@dataclass
class InputSet:
    """The files of a build, each once, and what was left out on the way."""

    files: list[InputFile]
    #: (name, name of the file it is the same file as): a second path to one file, read once
    duplicates: list[tuple[str, str]]


def _walk(folder: str, seen_dirs: set[tuple[int, int]], bad: list[tuple[str, str]]) -> list[str]:
    """Every non-hidden file under ``folder``, following symbolic links to folders once each (a
    link loop or a second link to one folder is not walked again). Folders that cannot be listed
    go to ``bad`` as (path, reason); dangling links are returned like files (they become
    rejects when opened)."""
    found: list[str] = []

    def onerror(e: OSError) -> None:
        bad.append((e.filename or folder, f"cannot list folder: {e.strerror or e}"))

    for root, dirs, files in os.walk(folder, onerror=onerror, followlinks=True):
        keep = []
        for d in sorted(dirs):
            if _is_hidden(d):
                continue
            try:
                st = os.stat(os.path.join(root, d))
            except OSError as e:
                bad.append((os.path.join(root, d), f"cannot open folder: {e.strerror or e}"))
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                continue  # a link loop, or a folder reached twice: its files are listed once
            seen_dirs.add((st.st_dev, st.st_ino))
            keep.append(d)
        dirs[:] = keep
        found.extend(os.path.join(root, f) for f in sorted(files) if not _is_hidden(f))
    return found


def _through_loop(path: str) -> bool:
    """Whether two folders on ``path`` are one folder (the path went round a link loop)."""
    seen: set[str] = set()
    d = os.path.dirname(os.path.abspath(path))
    while True:
        real = os.path.realpath(d)
        if real in seen:
            return True
        seen.add(real)
        parent = os.path.dirname(d)
        if parent == d:
            return False
        d = parent


def _glob_base(spec: str) -> str:
    """The folder part of a glob before its first wildcard."""
    parts = spec.split(os.sep)
    plain = []
    for part in parts:
        if glob.has_magic(part):
            break
        plain.append(part)
    base = os.sep.join(plain)
    return base if os.path.isdir(base) else (os.path.dirname(base) or ".")


def _file_error(path: str) -> str | None:
    """Why ``path`` cannot be read as an input file, or None."""
    try:
        printable_ok = path.encode("utf-8") is not None
    except UnicodeEncodeError:
        printable_ok = False
    if not printable_ok:
        return "file name is not valid UTF-8 (rename the file)"
    if os.path.islink(path) and not os.path.exists(path):
        return f"dangling symbolic link (to {printable(os.readlink(path))})"
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot open: {e.strerror or e}"
    return None


def discover_inputs(specs: list[str]) -> InputSet:
    """Files, folders (recursive, links followed once) and globs -> the build's input files.

    Every file is listed once however many paths reach it (links, a repeated argument, a glob
    through a link loop): the others are reported in ``duplicates``. Files that cannot be read
    are kept with their ``error`` (they become rejects, not a crash). Names are relative to the
    input root, the deepest folder holding every named input, so building ``logs`` or
    ``/abs/path/logs`` gives the same names. Hidden files and folders are skipped.
    """
    found: list[tuple[str, bool]] = []
    bases: list[str] = []
    bad: list[tuple[str, str]] = []
    seen_dirs: set[tuple[int, int]] = set()
    for spec in specs:
        if os.path.isdir(spec):
            st = os.stat(spec)
            seen_dirs.add((st.st_dev, st.st_ino))
            files = _walk(spec, seen_dirs, bad)
            if not files and not any(p.startswith(spec) for p, _ in bad):
                raise InputError(printable(spec), 0, "folder holds no files")
            found.extend((f, False) for f in files)
            bases.append(spec)
        elif os.path.isfile(spec) or os.path.islink(spec):
            found.append((spec, True))
            bases.append(os.path.dirname(spec) or ".")
        else:
            matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else []
            n = 0
            for m in matches:
                if _through_loop(m):
                    continue  # ``**`` followed a link back into a folder above it
                if os.path.isdir(m):
                    files = _walk(m, seen_dirs, bad)
                    found.extend((f, False) for f in files)
                    n += len(files)
                else:
                    found.append((m, False))
                    n += 1
            if n == 0:
                raise InputError(printable(spec), 0, "no such file or folder")
            bases.append(_glob_base(spec))
    root = os.path.commonpath([os.path.abspath(b) for b in bases])

    def name_of(path: str) -> str:
        return printable(os.path.relpath(os.path.abspath(path), root)).replace(os.sep, "/")

    by_name: dict[str, InputFile] = {}
    for path, explicit in found:
        name = name_of(path)
        have = by_name.get(name)
        if have is not None:
            have.explicit = have.explicit or explicit
            continue
        by_name[name] = InputFile(path, name, explicit, _file_error(path))
    for path, reason in bad:
        name = name_of(path)
        by_name.setdefault(name, InputFile(path, name, False, reason))
    unique: list[InputFile] = []
    duplicates: list[tuple[str, str]] = []
    first: dict[tuple[int, int], InputFile] = {}
    for name in sorted(by_name):
        f = by_name[name]
        if f.error is None:
            st = os.stat(f.path)
            same = first.get((st.st_dev, st.st_ino))
            if same is not None:
                same.explicit = same.explicit or f.explicit
                duplicates.append((name, same.name))
                continue
            first[(st.st_dev, st.st_ino)] = f
        unique.append(f)
    return InputSet(unique, duplicates)


def expand_inputs(specs: list[str]) -> list[tuple[str, bool]]:
    """Files, folders (recursive) and globs -> sorted unique ``(path, explicit)`` pairs.

    ``explicit`` is True for a file named as such and False for a file found inside a folder or by
    a glob. Hidden files and folders (a name starting with ``.``) inside a folder are skipped, and
    so are files that cannot be read and second paths to one file (see :func:`discover_inputs`,
    which reports both).

    >>> expand_inputs(["sample_data/tokens.jsonl"])
    [('sample_data/tokens.jsonl', True)]
    """
    found = discover_inputs(specs).files
    return sorted((f.path, f.explicit) for f in found if f.error is None)


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


def _zstd_checked_length(path: str) -> tuple[int, str | None]:
    """Decode a zstd file once, keeping nothing: (decompressed bytes in the leading frames that
    decode and pass their checksum, None) or, at the first frame that does not, (those bytes, why).

    A frame's content checksum is only known at the frame's end, after its data was decoded, so a
    reader that hands data out as it decodes would pass altered records on before the failure is
    seen. This pass costs one more decompression (zstd decodes at about 1 GB/s, far faster than
    rendering) and no memory; the reader then stops at the last good frame.
    """
    dctx = zstandard.ZstdDecompressor()
    good = pending = 0
    obj = dctx.decompressobj()
    in_frame = False
    with open(path, "rb") as fh:
        while True:
            data = fh.read(_ZSTD_IN)
            if not data:
                return (good, "stream ends inside a zstd frame") if in_frame else (good, None)
            while data:
                try:
                    pending += len(obj.decompress(data))
                except zstandard.ZstdError as e:
                    return good, str(e)
                in_frame = True
                if obj.eof:  # a frame ended and passed its checksum
                    good += pending
                    pending = 0
                    data = obj.unused_data
                    obj = dctx.decompressobj()
                    in_frame = False
                else:
                    data = b""


class _ZstdRaw(io.RawIOBase):
    """A raw reader that decodes zstd frames one after another and notices truncation.

    With ``limit`` (from :func:`_zstd_checked_length`) it hands out only the bytes of frames that
    were checked whole, then raises ``error``: nothing of a bad or cut frame is ever read.
    """

    def __init__(self, fh: BinaryIO, limit: int | None = None, error: str | None = None) -> None:
        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False  # the current decompressobj has been fed bytes of a frame
        self._out = b""
        self._pos = 0
        self._done = False
        self._left = limit
        self._error = error

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._pos >= len(self._out):
            if self._left is not None and self._left <= 0:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise _CorruptZstd(f"{error} (the frame's records are not used)")
                return
            if self._done:
                return
            data = self._fh.read(_ZSTD_IN)
            if not data:
                self._done = True
                if self._in_frame:
                    raise _Truncated("stream ends inside a zstd frame")
                return
            chunks: list[bytes] = []
            got = 0
            failed = False
            while data:
                if self._left is not None and got >= self._left:
                    break  # the rest is the frame that failed its check: never decoded
                try:
                    chunks.append(self._obj.decompress(data))
                except zstandard.ZstdError as e:
                    if not chunks:
                        raise _CorruptZstd(str(e)) from e
                    failed = True  # hand out what decoded; the next read raises
                    self._error = self._error or str(e)
                    break
                got += len(chunks[-1])
                self._in_frame = True
                if self._obj.eof:  # a frame ended: the rest starts a new frame
                    data = self._obj.unused_data
                    self._obj = self._dctx.decompressobj()
                    self._in_frame = False
                else:
                    data = b""
            out = b"".join(chunks)
            if self._left is not None:
                out = out[: self._left]
                self._left -= len(out)
            if failed:
                self._left = 0
            self._out = out
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


def open_binary(path: str, *, checked: bool = True) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing ``.gz`` and ``.zst`` transparently.

    Reading a truncated or corrupt compressed stream raises (``EOFError``, ``gzip.BadGzipFile``,
    ``zlib.error``, ``zstandard.ZstdError`` or an internal truncation error); :func:`iter_lines`
    and :func:`load_json_document` turn those into :class:`InputError`. A ``.zst`` file is first
    checked frame by frame (``checked``, the default): only bytes of frames that decoded whole and
    matched their checksum are handed out, then the error is raised. ``checked=False`` (sniffing a
    head) reads without that pass.
    """
    codec = _codec(path)
    if codec == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if codec == "zstd":
        limit, error = _zstd_checked_length(path) if checked else (None, None)
        raw = _ZstdRaw(open(path, "rb"), limit, error)
        return io.BufferedReader(raw, buffer_size=_BLOCK)  # type: ignore[return-value]
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
        with open_binary(path, checked=False) as f:
            while got < n:
                b = _read1(f, n - got)
                if not b:
                    break
                parts.append(b)
                got += len(b)
    except _STREAM_ERRORS:
        pass
    return b"".join(parts)


class LineTooLong(int):
    """Yielded by :func:`iter_lines` instead of a line longer than its ``max_bytes``: the line's
    length in bytes (its bytes were never held)."""


#: the longest JSONL line (one record) read, in bytes: a longer one becomes a reject without
#: being held in memory, since rendering costs about 150x a record's size in peak memory
MAX_RECORD_BYTES = 16 << 20
_limits = {"record_bytes": MAX_RECORD_BYTES}


def record_limit() -> int:
    """The per-record limit in bytes now in force (:func:`set_max_record_bytes`)."""
    return _limits["record_bytes"]


def set_max_record_bytes(n: int) -> None:
    """Change the per-record limit of :func:`iter_json_records` (a build sets it per process)."""
    if n < 1:
        raise ValueError(f"the record size limit must be >= 1 byte, got {n}")
    _limits["record_bytes"] = n


def iter_lines(
    path: str, max_bytes: int | None = None
) -> Iterator[tuple[int, bytes | LineTooLong]]:
    """Yield ``(line_number, line)`` for every non-blank line; numbers are 1-based.

    The newline (``\\n`` or ``\\r\\n``) is removed. Blank lines are counted but not yielded. On a
    truncated or corrupt ``.gz``/``.zst`` stream every complete line is yielded first, then
    :class:`InputError` names the line that was being read. With ``max_bytes``, a longer line is
    yielded as a :class:`LineTooLong` holding its size and its bytes are dropped as they are read,
    so memory stays bounded by ``max_bytes`` plus one block.
    """
    lineno = 0
    pending: list[bytes] = []
    pending_len = 0
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
                lineno += 1
                if max_bytes is not None and pending_len + len(piece) > max_bytes:
                    yield lineno, LineTooLong(pending_len + len(piece))
                    pending, pending_len = [], 0
                    continue
                if pending:
                    pending.append(piece)
                    line = b"".join(pending)
                    pending, pending_len = [], 0
                else:
                    line = piece
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line and not line.isspace():
                    yield lineno, line
            if last:
                pending_len += len(last)
                if max_bytes is not None and pending_len > max_bytes:
                    pending = [b""]  # the bytes are dropped; only the length is kept
                else:
                    pending.append(last)
    if pending and max_bytes is not None and pending_len > max_bytes:
        yield lineno + 1, LineTooLong(pending_len)
    elif pending:
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


def lenient_json_loads(data: bytes) -> Any:
    """``json.loads`` that keeps non-finite numbers as :class:`NonFinite` markers."""
    return json.loads(data, parse_constant=NonFinite, parse_float=_parse_float)


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
    if "infinity" not in msg and b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        value = lenient_json_loads(raw)
    except (ValueError, RecursionError):
        return None
    at = find_non_finite(value)
    if at is None:
        return None
    return f"{at}: expected a finite number, got {find_value(value, at)}"


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
    limit = _limits["record_bytes"]
    try:
        for lineno, raw in iter_lines(path, limit):
            seen = True
            if isinstance(raw, LineTooLong):
                reason = (
                    f"record is {int(raw):,} bytes, over the limit of {limit:,} bytes per record "
                    "(--max-record-mb)"
                )
                yield lineno, Reject(file=path, line=lineno, reason=reason)
                continue
            yield lineno, parse_json_line(path, lineno, raw)
    except InputError as e:
        yield e.line, Reject(file=e.file, line=e.line, reason=e.reason)
        return
    if not seen:
        yield 0, Reject(file=path, line=0, reason="empty file")
