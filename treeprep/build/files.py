"""Stage 1 of a build in a worker: one input file in, its work folder out.

A :class:`FileWorker` holds what every file needs, set up once: the renderer (loaded, or
inherited from the driver) and the build's :class:`~treeprep.build.config.FileOptions`. It is then
handed one :class:`~treeprep.build.workfiles.FileJob` at a time (:meth:`FileWorker.process`). For
each file it detects
the format (or takes the forced one), reads the records with the format's adapter, renders each
record to a token :class:`~treeprep.sequence.Sequence` and streams the sequences in batches into
``sequences.arrow`` (temporary name, then rename); every unusable record becomes a reject with
its reason, written to ``rejects.jsonl`` as it comes
(:class:`~treeprep.build.workfiles.RejectLog`: a file of millions of bad lines costs disk, not
memory). ``--max-errors`` (:attr:`~treeprep.build.workfiles.FileJob.max_rejects`) stops within
the file: no ``done.json``, and the driver stops the build. ``rejects.jsonl`` is committed and,
last, ``done.json`` written by :func:`treeprep.build.workfiles.finish_file`, so a file is either
finished or redone on the rerun. A file written to after the build hashed it
(:meth:`~treeprep.build.workfiles.FileJob.changed`, checked after reading it) is one reject,
"changed during the build", and none of what was read is used: the manifest's sha256 always names
the bytes the trees came from.

The same worker runs in every engine: inline, in a forked or spawned pool process
(:mod:`treeprep.build.engines`) or in a Ray actor (:mod:`treeprep.build.ray`), which is why the
bytes do not depend on the engine. A process pool's initializer can only set globals, so a pool
process keeps its worker in this module (:func:`init_worker`) and runs :func:`process_file`.

Detection is part of a file's work: a first record over the size or depth limits, or a
compressed stream that breaks before any format is seen, makes the file one reject naming the
line (:func:`_detect`), never a crashed build. Rows of one group share their common prefix with
the row before (:class:`~treeprep.build.workrows.PrefixSharing`), so a conversation of N turns
writes O(N) tokens.

An adapter turns malformed records into rejects and raises InputError when the whole file is
unusable; any other exception escaping it is a bug in the adapter, and it too becomes a reject
(``internal error in adapter X: TypeError: ...``, the rest of that file) rather than the end of
the build: see :func:`_adapter_bug`.

Names: an adapter reports the path it opened; the worker puts the file's name (relative to the
input root) in its place everywhere (:class:`_Names`), so outputs do not depend on where the input
lay. Records whose tools or tool-call arguments nest deeper than :data:`MAX_JSON_DEPTH` are
rejected before rendering (a JSON encoder recurses once per level). The branch hint of a call
rejected or filtered out passes to the next call of its thread (:mod:`treeprep.build.hints`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.atomic import commit, crash_point, make_dirs, writing
from treeprep.build.config import FileOptions
from treeprep.build.curate import Curator
from treeprep.build.hints import HeldHints
from treeprep.build.workfiles import (
    WORK_BATCH,
    FileJob,
    FileResult,
    RejectLog,
    TooManyRejects,
    finish_file,
)
from treeprep.build.workrows import (
    WORK_SCHEMA,
    PrefixSharing,
    TokenHashes,
    sequence_digest,
    sequences_to_batch,
)
from treeprep.errors import InputError, RenderError, TreeprepError
from treeprep.io.jsonparse import nested_deeper
from treeprep.io.reads import Reads
from treeprep.modes import ParallelCalls
from treeprep.schemas import Reject
from treeprep.sequence import Sequence

if TYPE_CHECKING:
    from treeprep.formats import FormatSpec, Item, ReadOptions
    from treeprep.render import Renderer

__all__ = ["MAX_JSON_DEPTH", "FileWorker", "init_worker", "process_file"]

#: the deepest nesting of JSON objects and arrays accepted in a call's tools and tool-call
#: arguments (real schemas nest about ten deep; a JSON encoder recurses once per level)
MAX_JSON_DEPTH = 100


class FileWorker:
    """Stage 1, one file at a time, with the renderer and the options set up once."""

    def __init__(self, options: FileOptions, renderer: Renderer) -> None:
        from treeprep.io.lines import set_max_record_bytes

        set_max_record_bytes(options.max_record_bytes)  # the per-record limit of this process
        self.options = options
        self.renderer = renderer
        renderer.parallel_calls = ParallelCalls(options.parallel_calls)
        renderer.set_server(options.server, options.harmony, options.sglang())
        renderer.server_side.set_settings(*options.server_settings())

    @classmethod
    def load(cls, tokenizer: str | None, options: FileOptions) -> FileWorker:
        """A worker with its own renderer, loaded from ``tokenizer`` as ``options`` say."""
        from treeprep.render import Renderer

        renderer = Renderer.load(
            tokenizer,
            native_templates=options.native_templates,
            chat_template=options.chat_template,
            date=options.date,
            server=options.server,
            harmony=options.harmony,
        )
        return cls(options, renderer)

    def process(self, job: FileJob) -> FileResult:
        """Stage 1 for one file.

        Writes ``sequences.arrow``, ``rejects.jsonl`` and, last, ``done.json`` under
        ``job.work_dir``. A file that cannot be read (``job.error``) is one reject.
        """
        from treeprep.formats import get_format

        make_dirs(job.work_dir)
        if job.error is not None:
            return _one_reject(job, 0, job.error)
        fmt = self.options.read_format()
        seen = Reads(job.path)  # the files read with it: redone when one changes
        try:
            with seen.active():
                spec = get_format(fmt) if fmt else _detect(job)
        except InputError as e:  # no record to detect the format by: the file's one reject
            return _one_reject(job, e.line, _Names(job)(e.reason))
        if spec is None:
            return _unrecognised(job)
        rejects = RejectLog(job, job.max_rejects)  # on disk as they come, not in memory
        try:
            return self._read_file(job, spec, rejects, seen)
        except TooManyRejects:  # --max-errors: the rest of the file is not read
            with contextlib.suppress(FileNotFoundError):
                os.remove(job.sequences_path() + ".tmp")
            result = FileResult(job.name, spec.name, len(rejects), len(rejects), 0)
            finish_file(job, result, rejects, done=False)  # no marker: redone on the rerun
            return result
        except BaseException:
            rejects.discard()
            raise

    def _read_file(
        self, job: FileJob, spec: FormatSpec, rejects: RejectLog, seen: Reads
    ) -> FileResult:
        """Read, render and write one file of a known format; its rejects go to ``rejects``, and
        the files read with it to ``seen`` (into ``done.json``: a rerun redoes the file when one
        of them changed)."""
        seq_path = job.sequences_path()
        tmp = seq_path + ".tmp"
        from treeprep.formats import forget_shared_messages

        opts = _read_options(self.options, self.renderer)
        curator = Curator(self.options)
        forget_shared_messages()  # curation rewrites shared messages: none from another file
        with writing(seq_path, tmp), curator.active(), seen.active():
            with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, WORK_SCHEMA) as writer:
                n_read, n_seq, normalized = _render_records(
                    job, spec, opts, self.renderer, writer, rejects, curator
                )
        commit(tmp, seq_path)
        crash_point("after-work-file")
        reads, moved = seen.result()
        if (changed := job.changed() or moved) is not None:
            rejects.discard()
            return _changed(job, spec.name, changed)
        result = FileResult(job.name, spec.name, n_read, len(rejects), n_seq)
        result.reads = reads
        result.filtered, result.curated = dict(sorted(curator.filtered.items())), curator.curated
        result.curated = dict(sorted(result.curated.items()))
        result.normalized = dict(sorted(normalized.items()))
        finish_file(job, result, rejects)
        return result


#: this process's worker, for :func:`process_file` (set by :func:`init_worker`)
_worker: FileWorker | None = None


def init_worker(
    tokenizer: str | None, options: FileOptions, renderer: Renderer | None = None
) -> None:
    """Set this process up for :func:`process_file`: a worker with the renderer given (a forked
    pool inherits the driver's), else one loaded from ``tokenizer``. A pool's initializer."""
    global _worker
    _worker = (
        FileWorker(options, renderer)
        if renderer is not None
        else FileWorker.load(tokenizer, options)
    )


def process_file(job: FileJob) -> FileResult:
    """Stage 1 for one file in this process's worker (:func:`init_worker`): what a pool runs."""
    if _worker is None:
        raise TreeprepError("internal error: stage 1 ran before init_worker")
    return _worker.process(job)


def _read_options(options: FileOptions, renderer: Renderer) -> ReadOptions:
    """The adapters' options: the system prompt and tools files read (per file, so that an
    unreadable one stops the build with its own error, not a dead pool), and how the server's
    Messages endpoint treats the renderer's template."""
    from treeprep.formats import ReadOptions

    system_prompt = None
    tools = None
    if options.system_prompt:
        try:
            with open(options.system_prompt, encoding="utf-8") as f:
                system_prompt = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TreeprepError(f"{options.system_prompt}: cannot read system prompt: {e}") from e
    if options.tools:
        from treeprep.io.compressed import read_all
        from treeprep.io.jsonparse import parse_json_document

        try:
            tools = parse_json_document(options.tools, read_all(options.tools))
        except OSError as e:
            raise TreeprepError(f"{options.tools}: cannot read tools JSON: {e}") from e
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise TreeprepError(f"{options.tools}:1: expected a JSON list of tool schemas")
    return ReadOptions(
        system_prompt=system_prompt,
        tools=tools,
        group_by=options.group_by,
        field_map=options.field_map(),
        check_ids=options.check_ids,  # False: adapters yield plain token rollouts
        server=options.server,
        merge_inline_system=renderer.server_side.merges_inline_system,
    )


def _default_group(name: str, group_by_folder: bool) -> str:
    return (os.path.dirname(name) or ".") if group_by_folder else name


def _reject(**kw: Any) -> dict:
    return Reject(**kw).model_dump(exclude_none=True)


def _detect(job: FileJob) -> FormatSpec | None:
    """The file's format by its first bytes (None: no known format). Raises :class:`InputError`
    when the first record breaks the size or depth limits, or when a compressed stream breaks
    before any format could be seen (the decoder's message, not "no known format")."""
    from treeprep.formats import detect_format
    from treeprep.io.compressed import read_head_checked

    head, broken = read_head_checked(job.path)
    spec = detect_format(job.path, head)
    if spec is None and broken is not None:
        raise broken
    return spec


def _one_reject(job: FileJob, line: int, reason: str) -> FileResult:
    """A file that is one reject as a whole (unreadable, or no record to detect it by)."""
    result = FileResult(job.name, "unknown", 1, 1, 0)
    finish_file(job, result, [_reject(file=job.name, line=line, reason=reason)])
    return result


def _changed(job: FileJob, fmt: str, why: str) -> FileResult:
    """A file rewritten after the build hashed it: what was read may not be the bytes the
    manifest names, so none of it is used. One reject, and no ``done.json``: the rerun reads the
    file as it is then."""
    os.remove(job.sequences_path())
    reason = f"changed during the build ({why}): none of it is used; rerun to read it as it is now"
    result = FileResult(job.name, fmt, 1, 1, 0)
    rejects = [_reject(file=job.name, line=0, reason=reason, format=fmt)]
    finish_file(job, result, rejects, done=False)
    return result


def _unrecognised(job: FileJob) -> FileResult:
    """A file of no known format: skipped when a folder or glob found it, rejected when named."""
    if not job.explicit:
        result = FileResult(job.name, "", 0, 0, 0, skipped=True)
        finish_file(job, result, [])
        return result
    return _one_reject(job, 0, "unrecognised input format (pass --format to force one)")


def _too_deep(item: Any) -> str | None:
    """Why a call's tools or tool-call arguments nest too deep to render, or None. The prompt
    messages it begins with that are the last passed call's (the same objects: a session's
    history, :func:`treeprep.formats._fields.make_call`) are not walked again."""
    from treeprep.schemas.records import shared_prefix

    global _PASSED
    tools = getattr(item, "tools", None)
    if tools and nested_deeper(tools, MAX_JSON_DEPTH):
        return f"tools: nested deeper than {MAX_JSON_DEPTH} levels"
    prompt = list(getattr(item, "messages", []))
    k = shared_prefix(prompt, _PASSED)
    msgs = [*prompt, getattr(item, "completion", None)]
    for i in range(k, len(msgs)):
        for tc in getattr(msgs[i], "tool_calls", None) or []:
            if nested_deeper(tc.function.arguments, MAX_JSON_DEPTH):
                return f"messages[{i}]: tool call arguments nested deeper than {MAX_JSON_DEPTH}"
    _PASSED = prompt
    return None


#: the prompt messages of the last call :func:`_too_deep` passed (curation rewrites no nesting)
_PASSED: list[Any] = []


def _adapter_bug(job: FileJob, spec: FormatSpec, e: Exception, named: _Names) -> dict:
    """The last line of defence: an adapter raised something other than the project's errors.

    That is a bug in the adapter (malformed input must come out as rejects), but one bad file
    must not stop a build of thousands, so the rest of the file becomes one reject whose reason
    starts with ``internal error in adapter`` and names the exception: counted in the manifest
    and listed in ``rejects.jsonl`` like any reject, and easy to search for. Tests assert that no
    input, however malformed, produces one (``tests/treeprep/formats/test_malformed.py``).
    """
    why = f"internal error in adapter {spec.name}: {type(e).__name__}: {named(str(e))}"
    return _reject(file=job.name, line=0, reason=why, format=spec.name)


class _Names:
    """Puts a file's name (relative to the input root) where an adapter put the path it opened,
    and names the files it read with it (OpenCode's part and message files, ATIF's siblings, a
    Claude Code parent session) relative to the input root too: a moved copy of the inputs, or
    the same inputs named by another path, rejects with the same bytes.

    The input root is the file's path less its name, as given (``logs/``) and made absolute
    (``/home/me/logs/``, as adapters that resolve their sidecars name them); either is cut only
    where a path starts, never inside a word (``catalogs/`` holds no ``logs/``)."""

    def __init__(self, job: FileJob) -> None:
        self.path, self.name = job.path, job.name
        self.root: re.Pattern[str] | None = None
        given = job.path[: -len(job.name)] if job.path.endswith(job.name) else None
        if given is None or (given and not given.endswith(os.sep)):
            return  # the path does not end in the name: no root to cut
        absolute = os.path.join(os.path.abspath(given or os.curdir), "")
        roots = sorted({r for r in (absolute, given) if r and r != os.sep}, key=len, reverse=True)
        if roots:
            self.root = re.compile(r"(?<![\w.\-/])(?:" + "|".join(map(re.escape, roots)) + ")")

    def __call__(self, text: str | None) -> str:
        if not text:
            return ""
        if text == self.path:
            return self.name
        if self.path != self.name:
            text = text.replace(self.path, self.name)
        return self.root.sub("", text) if self.root is not None else text


def _render_records(
    job: FileJob,
    spec: FormatSpec,
    opts: ReadOptions,
    renderer: Renderer,
    writer: ipc.RecordBatchFileWriter,
    rejects: RejectLog,
    curator: Curator,
) -> tuple[int, int, dict[str, int]]:
    """Read the file's records, render them and write the sequences in batches; unusable records
    go to ``rejects``, and those the curator's filters leave out are counted there. Returns
    (records read, sequences written, calls the renderer normalized by kind)."""
    records = _Records(job, spec, renderer, curator, rejects)
    rows = _Rows(writer)
    n_read = 0
    for item in records.read(opts):
        n_read += 1
        seq = None if item is None else records.render(item, order=rows.n_seq)
        if seq is not None:
            rows.add(seq, ",".join(renderer.last_normalized) or None)
            records.count_rewrites()
    rows.flush()
    if first_only := renderer.take_unanswered():
        from treeprep.render.parallel import FIRST_ONLY

        curator.curated[FIRST_ONLY] = curator.curated.get(FIRST_ONLY, 0) + first_only
    return n_read, rows.n_seq, records.normalized


class _Records:
    """One file's records through the adapter, the curator and the renderer; what is unusable
    goes to ``rejects`` with its reason, named as the file is (:class:`_Names`)."""

    def __init__(
        self,
        job: FileJob,
        spec: FormatSpec,
        renderer: Renderer,
        curator: Curator,
        rejects: RejectLog,
    ) -> None:
        self.job, self.spec, self.renderer = job, spec, renderer
        self.curator, self.rejects = curator, rejects
        self.named = _Names(job)
        #: calls the renderer normalized, by kind
        self.normalized: dict[str, int] = {}
        #: hints of the calls left out, for the next call of their thread
        self.hints = HeldHints()

    def read(self, opts: ReadOptions) -> Iterator[Item | None]:
        """The adapter's items in file order. An error that ends the file is one more record
        read, yielded as None once its reject is in ``rejects``."""
        job, spec, named = self.job, self.spec, self.named
        items = spec.read(job.path, opts)
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except (InputError, RecursionError) as e:  # the rest of the file is unusable
                line, why = (
                    (e.line, e.reason) if isinstance(e, InputError) else (0, "nested too deep")
                )
                self.rejects.append(
                    _reject(file=job.name, line=line, reason=named(why), format=spec.name)
                )
                yield None
                return
            except MemoryError:
                raise
            except Exception as e:  # a bug in the adapter: see _adapter_bug
                self.rejects.append(_adapter_bug(job, spec, e, named))
                yield None
                return
            yield item

    def render(self, item: Item, *, order: int) -> Sequence | None:
        """The sequence of one item; None for a reject (passed on, named), a call the curator's
        filters leave out, or a record that cannot be rendered (a reject)."""
        spec, named = self.spec, self.named
        if isinstance(item, Reject):
            item.file, item.reason = named(item.file), named(item.reason)
            if item.format is None:
                item.format = spec.name
            self.rejects.append(item.model_dump(exclude_none=True))
            return None
        gid = item.group_id or _default_group(self.job.name, spec.group_by_folder)
        thread = (gid, item.trajectory_id, item.agent_id)
        item.branch_reason = self.hints.take(thread, item.branch_reason)  # type: ignore[assignment]
        if not self.curator.keep(item):
            self.hints.hold(thread, item.branch_reason)
            return None
        item.source_file = named(item.source_file) or self.job.name
        if not item.source_format:
            item.source_format = spec.name
        where = {"file": item.source_file, "line": item.source_line, "call_id": item.call_id}
        why = _too_deep(item)
        if why is None:
            try:
                return self.renderer.render(item, group_id=gid, order=order)
            except RenderError as e:
                why = str(e)
            except RecursionError:
                why = "nested too deep to render"
        self.hints.hold(thread, item.branch_reason)
        self.rejects.append(_reject(**where, reason=why, format=spec.name))
        return None

    def count_rewrites(self) -> None:
        """Count what the renderer did to the call it rendered last: its normalizations, a
        history it kept (:mod:`treeprep.render.prompted`), its rewrites
        (:mod:`treeprep.render.parallel`)."""
        renderer, curated = self.renderer, self.curator.curated
        for kind in renderer.last_normalized:
            self.normalized[kind] = self.normalized.get(kind, 0) + 1
        if renderer.last_prompt_kept:
            curated["history-kept"] = curated.get("history-kept", 0) + 1
        for kind, n in renderer.last_rewrites.items():
            curated[kind] = curated.get(kind, 0) + n


class _Rows:
    """The work file's rows, written in batches of :data:`WORK_BATCH`: each sequence's digest
    (of the whole sequence) and how it was normalized, and its tokens after the prefix it
    shares with the row before (:class:`PrefixSharing`)."""

    def __init__(self, writer: ipc.RecordBatchFileWriter) -> None:
        self.writer = writer
        self.sharing = PrefixSharing()
        self.hashes = TokenHashes()
        self.n_seq = 0
        self.buf: list[Sequence] = []
        self.digests: list[bytes] = []
        self.kinds: list[str | None] = []  # how each row was normalized (the work file's column)

    def add(self, seq: Sequence, kind: str | None) -> None:
        whole = seq.tokens
        self.buf.append(self.sharing.share(seq, self.n_seq))  # cuts seq.tokens to what it adds
        shared = seq.prefix_len if seq.prefix >= 0 else 0
        # of the whole sequence (its tokens' hash goes on from the row before's)
        self.digests.append(sequence_digest(seq, self.hashes.of(whole, shared)))
        self.kinds.append(kind)
        self.n_seq += 1
        if len(self.buf) >= WORK_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.writer.write_batch(sequences_to_batch(self.buf, self.digests, self.kinds))
            self.buf, self.digests, self.kinds = [], [], []
