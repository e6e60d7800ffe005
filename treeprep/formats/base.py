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
(:mod:`treeprep.render.idcheck`). ``ReadOptions(check_ids=False)`` (``--no-check-ids``) makes
adapters yield plain :class:`~treeprep.schemas.TokenRollout` records, trained unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

from pydantic import BaseModel, Field

from treeprep.modes import Server
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
    #: ``--map``/``--map-file``, checked: the field and role names of a chat-like dataset (a
    #: :class:`~treeprep.formats.trajectory.FieldMap`; typed by its base, which the adapters
    #: narrow, so that this module imports no adapter)
    field_map: BaseModel | None = None
    #: check logged ids against logged text (``--check-ids``, the default); False: adapters
    #: yield plain :class:`~treeprep.schemas.TokenRollout` records, trained unchecked
    check_ids: bool = True
    #: how many Codex spawn links were followed to reach this file (:mod:`treeprep.formats.codex`)
    codex_spawn_depth: int = 0
    #: ``--server``: the inference server whose Messages endpoint converted an Anthropic request
    server: Server = Server.vllm
    #: vLLM's Messages endpoint merges a request's inline ``system`` messages into the leading
    #: system prompt, as it does for a template that takes no system message after the first
    #: (:func:`~treeprep.render.template_kwargs.merges_inline_system`); False: keeps them in place
    merge_inline_system: bool = False


@dataclass(frozen=True)
class FormatSpec:
    """A log format: what an adapter module provides so that ``build`` can read its files.

    **Where it lives.** One module ``treeprep/formats/<name>.py`` whose module docstring says
    what the log is, where it comes from (the upstream code the layout was learnt from) and what
    one call is; it ends with ``FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, ...)``
    (or ``FORMATS = [...]`` for several related layouts), and its module name is added to
    ``_MODULES`` in :mod:`treeprep.formats`, which imports it lazily. ``docs/extending.md`` lists
    every file a new format touches.

    **sniff(path, head) -> bool** decides, without reading the file, whether it is in this
    format. ``path`` is the path as given (it may end in ``.gz`` or ``.zst``); ``head`` is the
    file's first 64 KiB, decompressed, a byte-order mark removed, and possibly cut inside a
    record (when no format accepts a cut head, every sniffer gets a second look at the skeleton
    of the whole first record: :mod:`treeprep.formats._sniff`). Test for a signature only this
    format has (a key, a file name, a first byte); a sniffer must not raise. Formats are asked
    in :attr:`priority` order and the first that accepts the file reads it; a file no format
    accepts is skipped when a folder walk found it, rejected when named (a sidecar that its
    log's adapter reads, like Mistral Vibe's ``meta.json``, is accepted by no format).

    **read(path, opts) -> Iterator[Item]** yields, in file order,
    :class:`~treeprep.schemas.ChatCall` or :class:`~treeprep.schemas.TokenRollout` records and
    :class:`~treeprep.schemas.Reject` entries. One bad record is one reject (naming the line
    and what was expected) and reading goes on; :class:`~treeprep.errors.InputError` only when
    the whole file is unusable (the file's one reject). The helpers do the common parts:
    :func:`~treeprep.formats._read.records` (JSON lines, bad lines made rejects),
    :func:`~treeprep.formats._read.document` (one JSON value, with the line where each element
    starts), and in :mod:`treeprep.formats._fields` ``make_call`` (fields -> a validated
    ``ChatCall`` or a ``Reject``), ``openai_tool_calls`` / ``chat_tool_call`` (tool calls in
    chat form, arguments exactly as logged), ``assistant_turn``, ``group_or`` (``--group-by``),
    ``token_rollout``, and the typed accessors (``expect``, ``as_dict``, ``opt_str``, ...) whose
    errors name the field.

    A record sets ``source_file`` (``path`` as given), ``source_line`` (1-based: the record's
    line, or the line where its element starts in a one-document file) and ``source_format``
    (:attr:`name`); ``group_id`` when the log knows the task or session (else the build groups
    by file, or by folder with :attr:`group_by_folder`); ``call_id`` / ``parent_call_id`` /
    ``trajectory_id`` / ``agent_id`` when the log links calls (sub-agents, trials); and
    ``provenance`` honestly: ``exact_messages=False`` where the log does not keep the prompt
    exactly as sent, ``reconstructed=True`` where the prompt is rebuilt from a transcript. A
    prompt is never invented: what the log lacks (system prompt, tool schemas) comes from
    ``opts`` (:class:`ReadOptions`: ``--system-prompt``, ``--tools``) or stays absent.
    ``branch_reason`` may hint why a call leaves its predecessor's prefix (``new-trial``,
    ``compaction``, ``sub-agent``, ...: :data:`~treeprep.schemas.records.BRANCH_REASONS`).

    A new format also brings a sample under ``sample_data/`` (with its section in
    ``sample_data/README.md`` and its entry in the golden test's ``SAMPLE_GOLDEN``) and a test
    module ``tests/treeprep/formats/test_<name>.py`` with expected messages written out by hand.
    """

    #: the format's name: ``--format NAME``, and the ``source_format`` of its records and rejects
    #: (written into shards, so it never changes once released)
    name: str
    #: (path, first bytes decompressed) -> is this file in my format?
    sniff: Callable[[str, bytes], bool]
    #: (path, options) -> records and rejects in file order
    read: Callable[[str, ReadOptions], Iterator[Item]]
    #: records with no group id are grouped by their folder rather than their file (logs of
    #: one call per file)
    group_by_folder: bool = False
    #: lower sniffs first: a format whose signature is specific (a file name, a distinctive
    #: key) before generic ones (chat lists: 58-60, which would accept much)
    priority: int = 100
    #: path -> is this a file the format reads through another one (OpenCode storage's message
    #: and part files, read with their session)? A folder build skips such files as it skips
    #: files of no known format, and says which format reads them instead of suggesting --format
    companion: Callable[[str], bool] | None = None
    #: the log holds each call's whole request as sent (system prompt and tools included where
    #: there were any): a call without a system prompt or tool schemas had none, so the build does
    #: not count it among the prompts with gaps (:mod:`treeprep.render.gaps`)
    whole_requests: bool = False
