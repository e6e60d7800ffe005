"""Lines and JSONL records of an input file, read in bounded memory.

:func:`iter_lines` yields ``(line_number, bytes)`` reading fixed 1 MiB blocks: a line is the join
of its pieces, made once, so a single 50 MB line costs one copy, not a quadratic series of them.
A truncated or corrupt compressed stream yields every complete line and then raises
:class:`~treeprep.errors.InputError` naming the line that was cut. A line longer than the
per-record limit (:func:`set_max_record_bytes`) is never held: it is yielded as its length.
:func:`iter_json_records` builds on it and never raises, so an adapter always reads to the end;
a UTF-8 byte order mark at the start of line 1 (Windows editors, some exporters) is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from treeprep.errors import InputError
from treeprep.io.compressed import BLOCK, STREAM_ERRORS, open_binary, read1, stream_error
from treeprep.io.jsonparse import parse_json_line, strip_bom
from treeprep.schemas import Reject

__all__ = [
    "MAX_RECORD_BYTES",
    "LineTooLong",
    "iter_json_records",
    "iter_lines",
    "record_limit",
    "set_max_record_bytes",
]


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


def read_blocks(path: str, line: Callable[[], int]) -> Iterator[bytes]:
    """The file's bytes (decompressed) a block at a time; :class:`InputError` when it does not
    open, or when its compressed stream breaks (naming line ``line() + 1``, the one being read,
    after the blocks before it)."""
    try:
        f = open_binary(path)
    except OSError as e:
        raise InputError(path, 0, f"cannot open: {e}") from e
    with f:
        while True:
            try:
                block = read1(f, BLOCK)
            except STREAM_ERRORS as e:
                raise stream_error(path, line() + 1, e) from e
            if not block:
                return
            yield block


def iter_lines(
    path: str, max_bytes: int | None = None, *, every: bool = False
) -> Iterator[tuple[int, bytes | LineTooLong]]:
    """Yield ``(line_number, line)`` for every non-blank line; numbers are 1-based.

    The newline (``\\n`` or ``\\r\\n``) is removed. Blank lines are counted but not yielded.
    With ``every``, every line is yielded as read, blank ones too, only its ``\\n`` removed (a
    ``\\r`` is kept: formats whose texts span lines decide what it means). On a
    truncated or corrupt ``.gz``/``.zst`` stream every complete line is yielded first, then
    :class:`InputError` names the line that was being read. With ``max_bytes``, a longer line is
    yielded as a :class:`LineTooLong` holding its size and its bytes are dropped as they are read,
    so memory stays bounded by ``max_bytes`` plus one block.
    """
    lineno = 0
    pending: list[bytes] = []
    pending_len = 0
    # (the line a broken stream names is the one being read: lineno as it is then)
    for block in read_blocks(path, lambda: lineno):  # noqa: B023
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
            kept = _kept(line, every)
            if kept is not None:
                yield lineno, kept
        if last:
            pending_len += len(last)
            if max_bytes is not None and pending_len > max_bytes:
                pending = [b""]  # the bytes are dropped; only the length is kept
            else:
                pending.append(last)
    if pending and max_bytes is not None and pending_len > max_bytes:
        yield lineno + 1, LineTooLong(pending_len)
    elif pending:
        kept = _kept(b"".join(pending), every)
        if kept is not None:
            yield lineno + 1, kept


def _kept(line: bytes, every: bool) -> bytes | None:
    """:func:`iter_lines`' line as yielded (None: a blank line, not yielded)."""
    if every:
        return line
    if line.endswith(b"\r"):
        line = line[:-1]
    return line if line and not line.isspace() else None


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
            if lineno == 1:
                raw = strip_bom(raw)
            yield lineno, parse_json_line(path, lineno, raw)
    except InputError as e:
        yield e.line, Reject(file=e.file, line=e.line, reason=e.reason)
        return
    if not seen:
        yield 0, Reject(file=path, line=0, reason="empty file")
