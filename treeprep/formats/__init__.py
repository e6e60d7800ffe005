"""Input formats. Each module here defines ``FORMAT: FormatSpec``; :func:`formats` lists them.

Modules are imported lazily by name so that one broken optional adapter cannot break the others and
so that ``import treeprep.formats`` stays cheap.
"""

from __future__ import annotations

import difflib
import importlib

from treeprep.errors import InputError, TreeprepError
from treeprep.formats.base import FormatSpec, Item, ReadOptions, Record

_MODULES = (
    "conversations",
    "openai_chat",
    "tokens",
    "claude_code",
    "codex",
    "gemini_cli",
    "openhands_events",
    "openai_responses",
    "anthropic",
    "swe_agent",
    "mini_swe_agent",
    "tau_bench",
    "atif",
    "trajectory",
    "aider",
    "vibe",
    "pi",
    "cline",
    "gptme",
    "opencode",
    "opencode_db",
    "goose",
    "crush",
    "session_traces",
    "cursor",
    "kimi_cli",
    "copilot_cli",
    "qwen_code",
    "gemini_telemetry",
)

_cache: dict[str, FormatSpec] | None = None


def formats() -> dict[str, FormatSpec]:
    """Every available format by name, in sniffing order."""
    global _cache
    if _cache is None:
        found: list[FormatSpec] = []
        for mod in _MODULES:
            try:
                m = importlib.import_module(f"treeprep.formats.{mod}")
            except ModuleNotFoundError as e:
                if e.name == f"treeprep.formats.{mod}":
                    continue  # adapter not present in this checkout
                raise
            specs = getattr(m, "FORMATS", None) or [m.FORMAT]
            found.extend(specs)
        found.sort(key=lambda s: (s.priority, s.name))
        _cache = {s.name: s for s in found}
    return _cache


def get_format(name: str) -> FormatSpec:
    fm = formats()
    if name not in fm:
        close = difflib.get_close_matches(name.replace("_", "-"), list(fm), n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}? " if close else ""
        raise TreeprepError(
            f"unknown format {name!r}; {hint}known formats: {', '.join(sorted(fm))}"
        )
    return fm[name]


def companion_format(path: str) -> str | None:
    """The name of the format that reads ``path`` through another file
    (:attr:`FormatSpec.companion`), or None."""
    for spec in formats().values():
        if spec.companion is not None and spec.companion(path):
            return spec.name
    return None


def detect_format(path: str, head: bytes) -> FormatSpec | None:
    """The first format (by priority) whose sniff accepts the file, or None.

    ``head`` is the file's first bytes. A leading BOM is removed; when no sniffer accepts a head
    that was cut, they get a second look at the skeleton of the whole first record (see
    :mod:`treeprep.formats._sniff`), so detection does not depend on the first 64 KB.

    Raises :class:`~treeprep.errors.InputError` naming the line when no record within the size
    and depth limits can be found to detect by (the file's one reject, never a crashed build).
    """
    from treeprep.formats._sniff import MAX_SNIFF_DEPTH, forget

    try:
        return _detect(path, head)
    except RecursionError as e:  # a sniffer walked a record nested too deep
        raise InputError(
            path, 1, f"the first record is nested deeper than {MAX_SNIFF_DEPTH} levels"
        ) from e
    finally:
        forget()


def _detect(path: str, head: bytes) -> FormatSpec | None:
    from treeprep.formats._sniff import second_look
    from treeprep.io.jsonparse import strip_bom

    head = strip_bom(head)
    for spec in formats().values():
        if spec.sniff(path, head):
            return spec
    alt = second_look(path, head)
    if alt is None:
        return None
    for spec in formats().values():
        if spec.sniff(path, alt):
            return spec
    return None


def forget_shared_messages() -> None:
    """Before a new input file: the calls of one file share their history's message objects
    (:func:`treeprep.formats._fields.make_call`); none is shared with another file's."""
    from treeprep.formats._fields import forget_shared_messages as forget

    forget()


__all__ = [
    "FormatSpec",
    "Item",
    "ReadOptions",
    "Record",
    "detect_format",
    "forget_shared_messages",
    "formats",
    "get_format",
]
