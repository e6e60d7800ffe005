"""The adapter interface: every input format turns a file into canonical records or rejects.

An adapter is a :class:`FormatSpec`: a ``sniff`` that looks at a file's path and first bytes
(already decompressed) and says whether the file is in its format, and a ``read`` that yields, in
file order, :class:`~treeprep.schemas.ChatCall` / :class:`~treeprep.schemas.TokenRollout` records or
:class:`~treeprep.schemas.Reject` entries (file, line, reason). ``read`` never raises on bad
records: one bad line is one reject and reading goes on. It raises
:class:`~treeprep.errors.InputError` only when the whole file is unusable and says so (then the
builder records one reject for the file).

Every record carries ``source_file`` (the path as given), ``source_line`` (1-based line of the
record, or of the record's start in a one-document JSON file) and ``source_format``. ``group_id`` is
set when the format knows the task; when it is None the builder groups by file (or by folder for
one-call-per-file JSON, see ``FormatSpec.group_by_folder``).

A rollout whose log holds its text as well as its ids (ATIF steps, ``tokens`` records with a
text field, NeMo-Gym items) is a :class:`TextRollout`: the renderer decodes its generation ids
and rejects it when the decoded text lacks the logged text or a tool-call name
(:mod:`treeprep.render.idcheck`). ``ReadOptions.extra["check_ids"] = False`` (``--no-check-ids``)
makes adapters yield plain :class:`~treeprep.schemas.TokenRollout` records, trained unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pydantic import Field

from treeprep.schemas import ChatCall, Reject, TokenRollout

Record: TypeAlias = ChatCall | TokenRollout
Item: TypeAlias = ChatCall | TokenRollout | Reject


class TextRollout(TokenRollout):
    """A token rollout whose log also holds what the generation says: the message text and the
    names of the tool calls (checked against the decoded ids before anything is trained)."""

    logged_text: str = ""
    logged_tool_names: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class ReadOptions:
    #: ``--system-prompt FILE`` contents, for formats whose logs hold none (Claude Code).
    system_prompt: str | None = None
    #: ``--tools FILE`` contents (a list of OpenAI function tool schemas).
    tools: list[dict[str, Any]] | None = None
    #: ``--group-by FIELD``: a top-level field of the raw record whose value is the group id.
    group_by: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def check_ids(self) -> bool:
        """Whether logged ids are checked against logged text (``--check-ids``, the default)."""
        return bool(self.extra.get("check_ids", True))


@dataclass(frozen=True)
class FormatSpec:
    name: str
    #: (path, first bytes decompressed) -> is this file in my format?
    sniff: Callable[[str, bytes], bool]
    #: (path, options) -> records and rejects in file order
    read: Callable[[str, ReadOptions], Iterator[Item]]
    #: records with no group id are grouped by their folder rather than their file
    group_by_folder: bool = False
    #: lower runs first when sniffing; specific formats before generic ones
    priority: int = 100
