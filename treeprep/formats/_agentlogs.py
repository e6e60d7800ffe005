"""Small helpers shared by the agent-log adapters (Claude Code, Anthropic, SWE-agent, tau-bench).

Reading goes through :mod:`treeprep.io` when it is present (transparent ``.gz``/``.zst``, one place
that turns bad bytes into rejects); a minimal fallback keeps the adapters usable on their own. The
transcript formats share three needs that live here:

* parsing JSONL into ``(line, dict)`` pairs where a bad line becomes a :class:`Reject` and reading
  goes on, and loading one-document JSON files where a bad document is one :class:`InputError`;
* finding the line where each element of a pretty-printed top-level JSON list starts, so that a
  reject in a 50,000-line tau-bench file names a useful line instead of line 1 (cheap: one regex
  scan, and only trusted when the count matches the parsed list);
* building a :class:`ChatCall` from already-converted parts, turning a pydantic validation error
  (for instance a tool result whose call is missing) into a reject instead of an exception, in the
  group that ``--group-by`` names when the run's document carries that field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
from pydantic import ValidationError

from treeprep.errors import InputError
from treeprep.formats.base import ReadOptions
from treeprep.io import lenient_json_loads
from treeprep.schemas import ChatCall, Reject


def read_bytes(path: str) -> bytes:
    """The whole file, decompressed (``.gz``, ``.zst``), a leading BOM removed.

    Raises InputError when unreadable.
    """
    from treeprep.formats._records import strip_bom
    from treeprep.io import open_binary

    try:
        with open_binary(path) as f:
            return strip_bom(f.read())
    except InputError:
        raise
    except (OSError, EOFError, ValueError) as e:  # zstd/gzip errors are OSError/ValueError
        raise InputError(path, 0, f"cannot read file: {e}") from e


def iter_json_lines(path: str) -> Iterator[tuple[int, dict[str, Any] | Reject]]:
    """``(line, record)`` for every non-blank line; a line that is not a JSON object is a Reject.

    Streamed through :func:`treeprep.formats._records.iter_records` (a BOM tolerated, a record over
    the size limit or a cut compressed stream rejected, memory bounded by one record)."""
    from treeprep.formats._records import iter_records

    for i, obj in iter_records(path):
        if isinstance(obj, Reject):
            if i == 0 and obj.reason == "empty file":
                continue
            yield i, obj
        elif not isinstance(obj, dict):
            reason = f"expected a JSON object per line, got {type(obj).__name__}"
            yield i, Reject(file=path, line=i, reason=reason)
        else:
            yield i, obj


def load_json(path: str) -> tuple[Any, str]:
    """Parse a one-document JSON file. Returns (document, text). Raises InputError when bad."""
    data = read_bytes(path)
    if not data.strip():
        raise InputError(path, 1, "empty file; expected one JSON document")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        doc = _NOT_PARSED
        if _NON_FINITE.search(data):  # NaN/Infinity: parse them as markers, reject per record
            try:
                doc = lenient_json_loads(data)
            except (ValueError, RecursionError):
                pass
        if doc is _NOT_PARSED:
            line = _error_line(data, str(e))
            raise InputError(path, line, f"malformed JSON document: {e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # orjson already validated UTF-8; keep the type checker calm
        raise InputError(path, 1, f"invalid UTF-8: {e}") from e
    return doc, text


_NOT_PARSED = object()
_NON_FINITE = re.compile(rb"(?<![\w\"])-?(NaN|Infinity)(?![\w\"])")


def _error_line(data: bytes, msg: str) -> int:
    m = re.search(r"line (\d+)", msg)
    if m:
        return int(m.group(1))
    m = re.search(r"char (\d+)", msg)
    if m:
        return data[: int(m.group(1))].count(b"\n") + 1
    return 1


def head_json_objects(head: bytes) -> list[dict[str, Any]]:
    """The JSON objects on the complete lines of ``head`` (for sniffing JSONL formats)."""
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


def list_element_lines(text: str, n: int, indent: str = "  ") -> list[int]:
    """Start lines of the ``n`` elements of a pretty-printed top-level JSON list.

    Returns ``[1] * n`` when the text is not laid out that way (one-line JSON), so callers can
    always index it.
    """
    starts = [m.start() for m in re.finditer(r"\n" + re.escape(indent) + r"\{", text)]
    if len(starts) != n:
        return [1] * n
    lines = []
    line = 1
    pos = 0
    for s in starts:
        line += text.count("\n", pos, s + 1)
        pos = s + 1
        lines.append(line)
    return lines


def line_of(text: str, needle: str, default: int = 1) -> int:
    """Line of the first occurrence of ``needle`` in ``text`` (``default`` when absent)."""
    i = text.find(needle)
    return default if i < 0 else text.count("\n", 0, i) + 1


def make_call(fields: dict[str, Any], *, file: str, line: int, fmt: str) -> ChatCall | Reject:
    """Validate a ChatCall; a validation error becomes a Reject naming the file and line."""
    try:
        return ChatCall.model_validate(fields)
    except ValidationError as e:
        errs = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()[:3]
        )
        return Reject(
            file=file,
            line=line,
            reason=f"invalid call: {errs}",
            format=fmt,
            call_id=fields.get("call_id"),
        )


def group_or(doc: dict[str, Any], opts: ReadOptions, default: str) -> str:
    """The value of ``--group-by FIELD`` in ``doc`` when given and present, else ``default``."""
    if opts.group_by and doc.get(opts.group_by) is not None:
        return str(doc[opts.group_by])
    return default


def system_message(text: str | None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": text}] if text else []
