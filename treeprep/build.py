"""``treeprep build``: log files in, one token trie per group out, as zstd Arrow shards.

The build runs in two stages, so that it streams, resumes and parallelises without holding the
input in memory:

1. **Render, per input file** (in parallel across files with ``workers``). The file's format is
   detected (or forced), its records are read, each record is rendered to a token
   :class:`~treeprep.sequence.Sequence` with the model's chat template, and the sequences are
   streamed into an uncompressed Arrow IPC work file under ``OUT/.work/``; unusable records go to a
   per-file rejects list. A file's work is keyed by the hash of its bytes, the format, the options
   and the tokenizer identity, and its ``done.json`` is written last: a build killed half-way and
   run again skips every file that finished and redoes only the rest.
   The work files and their ``done.json`` markers are :mod:`treeprep.workfiles`.
2. **Group, build tries, write shards** (in the main process). The work files are memory-mapped;
   only their ``group_id`` columns are read up front. Groups are processed in sorted order, one at a
   time: their rows are gathered, inserted into a trie (:func:`treeprep.trie.build_tree`) and
   appended to the current shard (:class:`~treeprep.shards.ShardWriter`), which is written
   (temporary name, then rename) once it holds ``shard_tokens`` tokens. Memory is bounded by the
   largest group plus one shard's buffer.

Finally ``rejects.jsonl`` and ``manifest.json`` are written, the manifest last: its presence means
the build is whole. No timestamps or absolute paths are recorded, so the same inputs give the same
bytes: every input is named by its path relative to the input root (:func:`treeprep.io.
discover_inputs`) in group ids, ``seq_source``, rejects and the manifest. Counts reconcile:
``records_read == records_in_trees + records_rejected``.

What the build withstands (the README's "Guarantees" lists it for users): a file that cannot be
read (dangling link, permissions, a non-UTF-8 name) is a reject, not a crash; a second path to one
file is read once and listed in the manifest; a worker killed mid-file stops the build with an
error (the files it finished are kept for the rerun) instead of hanging it; ``OUT`` is locked for
the build; only files builds wrote are deleted; a build where no record reaches a tree stops
with :class:`EmptyBuildError` after writing ``rejects.jsonl`` and no manifest.

:func:`build` reads as these stages, one function each: plan the jobs, render the files, write
the trees, drop stale work, write the rejects, write the manifest. The two heavy stages are run by
an :class:`Engine`: :class:`LocalEngine` (this process and its pool) or, with ``engine="ray"``,
Ray Data (:mod:`treeprep.build_ray`), which calls the same per-file, per-group and per-shard
functions and so writes the same bytes.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep import __version__
from treeprep.errors import InputError, RenderError, TooManyErrors, TreeprepError
from treeprep.outputs import forget_manifest, make_manifest, write_manifest, write_rejects
from treeprep.schemas import SCHEMA_VERSION, Manifest, Reject
from treeprep.schemas.manifest import Counts, ShardEntry
from treeprep.sequence import Sequence
from treeprep.shards import ShardWriter
from treeprep.trie import build_tree
from treeprep.workfiles import (
    WORK_BATCH,
    WORK_SCHEMA,
    FileJob,
    FileResult,
    OutIndex,
    WorkFiles,
    commit,
    crash_point,
    finish_file,
    group_rows,
    group_sequences,
    lock_out,
    read_result,
    sequences_to_batch,
)

if TYPE_CHECKING:
    from treeprep.formats import FormatSpec, ReadOptions
    from treeprep.io import InputSet
    from treeprep.render import Renderer

#: the deepest nesting of JSON objects and arrays accepted in a call's tools and tool-call
#: arguments (real schemas nest about ten deep; a JSON encoder recurses once per level)
MAX_JSON_DEPTH = 100


class EmptyBuildError(TreeprepError):
    """No record reached a tree: there is nothing to train on (the rejects say why)."""


class WorkerDied(TreeprepError):
    """A stage-1 worker process died (killed, out of memory) while rendering a file."""


#: Progress callback: (stage, done, total). Stages: "render" (files), "trees" (groups).
Progress = Callable[[str, int, int], None]


@dataclass
class BuildConfig:
    """What ``treeprep build`` does. Paths are kept as given (they go into the manifest)."""

    #: files, folders or globs; plain, ``.gz`` or ``.zst``
    inputs: list[str]
    #: the output folder (created; an earlier build's shards there are replaced)
    out: str
    #: a Hugging Face tokenizer folder; None uses the built-in byte-level ChatML tokenizer
    tokenizer: str | None = None
    #: force one input format for every file instead of detecting it per file
    format: str | None = None
    #: a record field whose value is the group id (default: the format's own group id)
    group_by: str | None = None
    #: processes rendering input files in parallel
    workers: int = 1
    #: stop with an error once more records than this are rejected (None: never)
    max_errors: int | None = None
    #: a file whose text is the system prompt, for formats whose logs hold none
    system_prompt: str | None = None
    #: a JSON file with a list of tool (function) schemas, for formats whose logs hold none
    tools: str | None = None
    #: render with a verified Python port of the chat template where there is one (False: jinja)
    native_templates: bool = True
    #: a jinja file to render with instead of the tokenizer's chat template
    chat_template: str | None = None
    #: the date (ISO 8601) a template's strftime_now reports for records without a timestamp
    date: str | None = None
    #: a shard is closed once it holds this many tree tokens
    shard_tokens: int = 32 * 1024 * 1024
    #: a JSONL record longer than this many bytes is rejected without being held in memory
    max_record_bytes: int = 16 << 20
    #: who runs the stages: this process and its pool, or Ray Data (:mod:`treeprep.build_ray`);
    #: the bytes written are the same
    engine: Literal["local", "ray"] = "local"
    #: the Ray cluster to join (``ray.init(address=...)``); None starts a local Ray
    ray_address: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TreeprepError("no inputs given")
        if self.workers < 1:
            raise TreeprepError(f"workers must be >= 1, got {self.workers}")
        if self.max_errors is not None and self.max_errors < 0:
            raise TreeprepError(f"max_errors must be >= 0, got {self.max_errors}")
        if self.shard_tokens < 1:
            raise TreeprepError(f"shard_tokens must be >= 1, got {self.shard_tokens}")
        if self.max_record_bytes < 1:
            raise TreeprepError(f"max_record_bytes must be >= 1, got {self.max_record_bytes}")
        if self.engine not in ("local", "ray"):
            raise TreeprepError(f"engine must be 'local' or 'ray', got {self.engine!r}")


# --------------------------------------------------------------------------------------------
# stage 1: one input file -> work file of sequences + rejects (in a worker)
# --------------------------------------------------------------------------------------------

_worker_state: dict = {}


def _worker_init(tokenizer: str | None, cfg_dict: dict, renderer: Renderer | None = None) -> None:
    from treeprep.io import set_max_record_bytes
    from treeprep.render import Renderer

    set_max_record_bytes(cfg_dict.get("max_record_bytes", 16 << 20))
    _worker_state["renderer"] = (
        renderer
        if renderer is not None
        else Renderer.load(
            tokenizer,
            native_templates=cfg_dict.get("native_templates", True),
            chat_template=cfg_dict.get("chat_template"),
            date=cfg_dict.get("date"),
        )
    )
    _worker_state["cfg"] = cfg_dict


def _read_options(cfg: dict) -> ReadOptions:
    from treeprep.formats import ReadOptions

    system_prompt = None
    tools = None
    if cfg.get("system_prompt"):
        try:
            with open(cfg["system_prompt"], encoding="utf-8") as f:
                system_prompt = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TreeprepError(f"{cfg['system_prompt']}: cannot read system prompt: {e}") from e
    if cfg.get("tools"):
        try:
            with open(cfg["tools"], "rb") as f:
                tools = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError) as e:
            raise TreeprepError(f"{cfg['tools']}: cannot read tools JSON: {e}") from e
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise TreeprepError(f"{cfg['tools']}:1: expected a JSON list of tool schemas")
    return ReadOptions(system_prompt=system_prompt, tools=tools, group_by=cfg.get("group_by"))


def _default_group(name: str, group_by_folder: bool) -> str:
    return (os.path.dirname(name) or ".") if group_by_folder else name


def _reject(**kw: Any) -> dict:
    return Reject(**kw).model_dump(exclude_none=True)


def _process_file(job: FileJob) -> FileResult:
    """Stage 1 for one file, in a worker.

    Writes ``sequences.arrow``, ``rejects.jsonl`` and, last, ``done.json`` under ``job.work_dir``.
    A file that cannot be read (``job.error``) is one reject.
    """
    from treeprep.formats import detect_format, get_format
    from treeprep.io import read_head

    cfg = _worker_state["cfg"]
    os.makedirs(job.work_dir, exist_ok=True)
    if job.error is not None:
        result = FileResult(job.name, "unknown", 1, 1, 0)
        finish_file(job, result, [_reject(file=job.name, line=0, reason=job.error)])
        return result
    spec = (
        get_format(cfg["format"])
        if cfg.get("format")
        else detect_format(job.path, read_head(job.path))
    )
    if spec is None:
        return _unrecognised(job)
    rejects: list[dict] = []
    seq_path = job.sequences_path()
    tmp = seq_path + ".tmp"
    with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, WORK_SCHEMA) as writer:
        n_read, n_seq = _render_records(job, spec, _read_options(cfg), writer, rejects)
    commit(tmp, seq_path)
    crash_point("after-work-file")
    result = FileResult(job.name, spec.name, n_read, len(rejects), n_seq)
    finish_file(job, result, rejects)
    return result


def _unrecognised(job: FileJob) -> FileResult:
    """A file of no known format: skipped when a folder or glob found it, rejected when named."""
    if not job.explicit:
        result = FileResult(job.name, "", 0, 0, 0, skipped=True)
        finish_file(job, result, [])
        return result
    reason = "unrecognised input format (pass --format to force one)"
    result = FileResult(job.name, "unknown", 1, 1, 0)
    finish_file(job, result, [_reject(file=job.name, line=0, reason=reason)])
    return result


def _json_depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects/arrays deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def _too_deep(item: Any) -> str | None:
    """Why a call's tools or tool-call arguments nest too deep to render, or None."""
    tools = getattr(item, "tools", None)
    if tools and _json_depth_over(tools, MAX_JSON_DEPTH):
        return f"tools: nested deeper than {MAX_JSON_DEPTH} levels"
    msgs = [*getattr(item, "messages", []), getattr(item, "completion", None)]
    for i, m in enumerate(msgs):
        for tc in getattr(m, "tool_calls", None) or []:
            if _json_depth_over(tc.function.arguments, MAX_JSON_DEPTH):
                return f"messages[{i}]: tool call arguments nested deeper than {MAX_JSON_DEPTH}"
    return None


class _Names:
    """Puts a file's name (relative to the input root) where an adapter put the path it opened."""

    def __init__(self, job: FileJob) -> None:
        self.path, self.name = job.path, job.name

    def __call__(self, text: str | None) -> str:
        if not text or self.path == self.name:
            return text or ""
        return self.name if text == self.path else text.replace(self.path, self.name)


def _render_records(
    job: FileJob,
    spec: FormatSpec,
    opts: ReadOptions,
    writer: ipc.RecordBatchFileWriter,
    rejects: list[dict],
) -> tuple[int, int]:
    """Read the file's records, render them and write the sequences in batches; unusable records
    go to ``rejects``. Returns (records read, sequences written)."""
    renderer = _worker_state["renderer"]
    named = _Names(job)
    n_read = n_seq = 0
    buf: list[Sequence] = []
    items = spec.read(job.path, opts)
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except (InputError, RecursionError) as e:  # the rest of the file is unusable
            n_read += 1
            line, why = (e.line, e.reason) if isinstance(e, InputError) else (0, "nested too deep")
            rejects.append(_reject(file=job.name, line=line, reason=named(why), format=spec.name))
            break
        n_read += 1
        if isinstance(item, Reject):
            item.file, item.reason = named(item.file), named(item.reason)
            if item.format is None:
                item.format = spec.name
            rejects.append(item.model_dump(exclude_none=True))
            continue
        item.source_file = named(item.source_file) or job.name
        if not item.source_format:
            item.source_format = spec.name
        gid = item.group_id or _default_group(job.name, spec.group_by_folder)
        where = {"file": item.source_file, "line": item.source_line, "call_id": item.call_id}
        deep = _too_deep(item)
        if deep is not None:
            rejects.append(_reject(**where, reason=deep, format=spec.name))
            continue
        try:
            seq = renderer.render(item, group_id=gid, order=n_seq)
        except RenderError as e:
            rejects.append(_reject(**where, reason=str(e), format=spec.name))
            continue
        except RecursionError:
            rejects.append(_reject(**where, reason="nested too deep to render", format=spec.name))
            continue
        buf.append(seq)
        n_seq += 1
        if len(buf) >= WORK_BATCH:
            writer.write_batch(sequences_to_batch(buf))
            buf.clear()
    if buf:
        writer.write_batch(sequences_to_batch(buf))
    return n_read, n_seq


def _options_digest(cfg: BuildConfig, tok_sha: str) -> str:
    """What every file's work depends on besides the file itself: format, options, tokenizer."""
    h = hashlib.sha256()
    for part in (
        cfg.format or "",
        cfg.group_by or "",
        tok_sha,
        _file_digest(cfg.system_prompt),
        _file_digest(cfg.tools),
        str(cfg.max_record_bytes),
        str(SCHEMA_VERSION),
        __version__,
    ):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _job_key(sha: str, options: str, name: str, explicit: bool, error: str | None) -> str:
    """A file's work folder: its bytes, the options, and the name that goes into its records."""
    h = hashlib.sha256()
    for part in (sha, options, name, str(explicit), error or ""):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


def _file_digest(path: str | None) -> str:
    if not path:
        return ""
    from treeprep.io import file_sha256

    try:
        return file_sha256(path)
    except OSError as e:
        raise TreeprepError(f"{path}: cannot read: {e}") from e


def worker_options(cfg: BuildConfig) -> dict:
    """The options a stage-1 worker needs (what :func:`_worker_init` takes), picklable."""
    return {
        "format": cfg.format,
        "group_by": cfg.group_by,
        "system_prompt": cfg.system_prompt,
        "tools": cfg.tools,
        "native_templates": cfg.native_templates,
        "max_record_bytes": cfg.max_record_bytes,
        "chat_template": cfg.chat_template,
        "date": cfg.date,
    }


def _run_stage1(
    jobs: list[FileJob], cfg: BuildConfig, on_progress: Progress | None, renderer: Renderer
) -> Iterator[FileResult]:
    todo = [j for j in jobs if not j.is_done()]
    n = len(jobs) - len(todo)
    if on_progress:
        on_progress("render", n, len(jobs))
    cfg_dict = worker_options(cfg)
    results = (
        _run_pool(todo, cfg, cfg_dict, renderer)
        if cfg.workers > 1 and len(todo) > 1
        else _run_inline(todo, cfg, cfg_dict, renderer)
    )
    for res in results:
        n += 1
        if on_progress:
            on_progress("render", n, len(jobs))
        yield res


def _run_inline(
    todo: list[FileJob], cfg: BuildConfig, cfg_dict: dict, renderer: Renderer
) -> Iterator[FileResult]:
    _worker_init(cfg.tokenizer, cfg_dict, renderer)
    for job in todo:
        yield _process_file(job)


def _run_pool(
    todo: list[FileJob], cfg: BuildConfig, cfg_dict: dict, renderer: Renderer
) -> Iterator[FileResult]:
    """Stage 1 in ``cfg.workers`` processes, at most one file per process in flight, so that a
    worker that dies (kill -9, out of memory) is noticed at once and named: the build stops
    with :class:`WorkerDied`; the files finished so far are kept for the rerun."""
    procs = min(cfg.workers, len(todo))
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    if "fork" in mp.get_all_start_methods():
        # forked workers inherit the loaded renderer (importing transformers and loading a
        # tokenizer costs seconds per process); the tokenizers library disables its own thread
        # pool in a forked child, which it announces unless told so beforehand
        _worker_init(cfg.tokenizer, cfg_dict, renderer)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        pool = ProcessPoolExecutor(procs, mp_context=mp.get_context("fork"))
    else:
        pool = ProcessPoolExecutor(
            procs,
            mp_context=mp.get_context("spawn"),
            initializer=_worker_init,
            initargs=(cfg.tokenizer, cfg_dict),
        )
    queue = list(reversed(todo))
    running: dict[Future, FileJob] = {}
    try:
        with pool:
            while queue or running:
                while queue and len(running) < procs:
                    job = queue.pop()
                    running[pool.submit(_process_file, job)] = job
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    try:
                        yield fut.result()
                    except BrokenProcessPool as e:
                        names = sorted({job.name, *(j.name for j in running.values())})
                        raise WorkerDied(
                            "a worker process died (killed or out of memory) while rendering "
                            f"{' or '.join(names)}; the files finished so far are kept: run the "
                            "same build again to resume"
                        ) from e
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


# --------------------------------------------------------------------------------------------
# the build, stage by stage
# --------------------------------------------------------------------------------------------


class Engine(Protocol):
    """Who runs the two heavy stages. Planning, rejects and the manifest stay in this process, so
    every engine shares the ``done.json`` markers and writes the same bytes."""

    def render(
        self,
        jobs: list[FileJob],
        cfg: BuildConfig,
        on_progress: Progress | None,
        renderer: Renderer,
    ) -> Iterator[FileResult]:
        """Stage 1 for every job without a ``done.json``; one result per file, as they finish."""
        ...

    def write_trees(
        self,
        jobs: list[FileJob],
        results: dict[str, FileResult],
        shard_tokens: int,
        counts: Counts,
        out: str,
        on_progress: Progress | None,
        before_write: Callable[[str], None] | None = None,
    ) -> list[ShardEntry]:
        """Stage 2: one trie per group in sorted group order, cut into shards; the shard entries
        (``before_write`` is told each shard's manifest path before it is written)."""
        ...


class LocalEngine:
    """This process, with a pool of ``workers`` processes for stage 1."""

    def render(
        self,
        jobs: list[FileJob],
        cfg: BuildConfig,
        on_progress: Progress | None,
        renderer: Renderer,
    ) -> Iterator[FileResult]:
        return _run_stage1(jobs, cfg, on_progress, renderer)

    def write_trees(
        self,
        jobs: list[FileJob],
        results: dict[str, FileResult],
        shard_tokens: int,
        counts: Counts,
        out: str,
        on_progress: Progress | None,
        before_write: Callable[[str], None] | None = None,
    ) -> list[ShardEntry]:
        return _write_trees(jobs, results, shard_tokens, counts, out, on_progress, before_write)


@contextmanager
def _engine(cfg: BuildConfig) -> Iterator[Engine]:
    if cfg.engine == "ray":
        from treeprep.build_ray import ray_engine

        with ray_engine(cfg) as engine:
            yield engine
    else:
        yield LocalEngine()


def build(cfg: BuildConfig, *, on_progress: Progress | None = None) -> Manifest:
    """Run a whole build (see the module docstring). Returns the manifest it wrote."""
    from treeprep.io import discover_inputs
    from treeprep.paths import local_path, local_paths
    from treeprep.render import Renderer

    cfg = replace(cfg, inputs=local_paths(cfg.inputs), out=local_path(cfg.out))  # file:// URLs
    renderer = Renderer.load(
        cfg.tokenizer,
        native_templates=cfg.native_templates,
        chat_template=cfg.chat_template,
        date=cfg.date,
    )
    inputs = discover_inputs(cfg.inputs)
    work_root = os.path.join(cfg.out, ".work")
    with lock_out(cfg.out):
        index = OutIndex.load(cfg.out)
        index.shards |= forget_manifest(cfg.out)
        jobs = _plan_jobs(cfg, inputs, renderer.cache_key, work_root)
        index.work |= {j.key for j in jobs}
        index.save()
        counts = Counts()
        with _engine(cfg) as engine:
            results = _render_files(jobs, cfg, on_progress, renderer, work_root, engine.render)
            shards = engine.write_trees(
                jobs, results, cfg.shard_tokens, counts, cfg.out, on_progress, index.add_shard
            )
        index.drop_unused(cfg.out, {j.key for j in jobs}, {e.path for e in shards})
        write_rejects(jobs, cfg.out)
        manifest = make_manifest(
            cfg.group_by, renderer.identity, jobs, results, counts, shards, inputs
        )
        if counts.records_in_trees == 0:
            raise EmptyBuildError(
                f"no record reached a tree ({counts.records_read} read, "
                f"{counts.records_rejected} rejected, {len(manifest.skipped_files)} files "
                f"skipped): nothing to train on, no manifest written; see "
                f"{os.path.join(cfg.out, 'rejects.jsonl')}"
            )
        crash_point("before-manifest")
        write_manifest(cfg.out, manifest)
    return manifest


def _plan_jobs(
    cfg: BuildConfig, inputs: InputSet, tokenizer_sha: str, work_root: str
) -> list[FileJob]:
    """Every input file, hashed, with the work folder its key names. A file that cannot be read
    keeps its error (it becomes a reject)."""
    from treeprep.io import file_sha256

    options = _options_digest(cfg, tokenizer_sha)
    jobs: list[FileJob] = []
    for f in inputs.files:
        sha, size, error = "", 0, f.error
        if error is None:
            try:
                sha = file_sha256(f.path)
                size = os.path.getsize(f.path)
            except OSError as e:
                error = f"cannot read: {e.strerror or e}"
        key = _job_key(sha, options, f.name, f.explicit, error)
        job = FileJob(f.path, f.explicit, key, os.path.join(work_root, key), sha, size, f.name)
        job.error = error
        jobs.append(job)
    return jobs


def _render_files(
    jobs: list[FileJob],
    cfg: BuildConfig,
    on_progress: Progress | None,
    renderer: Renderer,
    work_root: str,
    run_stage1: Callable[..., Iterator[FileResult]] = _run_stage1,
) -> dict[str, FileResult]:
    """Stage 1 for every file not finished before (``run_stage1``: the engine's); the results of
    all files, by name. Stops with :class:`TooManyErrors` once more than ``max_errors`` records
    are rejected."""
    results: dict[str, FileResult] = {}
    n_rejected = 0
    for res in run_stage1(jobs, cfg, on_progress, renderer):
        results[res.path] = res
        n_rejected += res.records_rejected
        if cfg.max_errors is not None and n_rejected > cfg.max_errors:
            raise TooManyErrors(
                f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}; "
                f"last file: {res.path} (see {os.path.join(work_root, '*', 'rejects.jsonl')})"
            )
    for job in jobs:
        if job.name not in results:
            results[job.name] = read_result(job)
    n_rejected = sum(r.records_rejected for r in results.values())
    if cfg.max_errors is not None and n_rejected > cfg.max_errors:
        raise TooManyErrors(
            f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}"
        )
    return results


def work_paths(jobs: list[FileJob], results: dict[str, FileResult]) -> list[str]:
    """The work files stage 2 reads, in job order (files with sequences only)."""
    paths = []
    for job in jobs:
        res = results[job.name]
        p = job.sequences_path()
        if not res.skipped and res.sequences and os.path.exists(p):
            paths.append(p)
    return paths


def _write_trees(
    jobs: list[FileJob],
    results: dict[str, FileResult],
    shard_tokens: int,
    counts: Counts,
    out: str,
    on_progress: Progress | None,
    before_write: Callable[[str], None] | None = None,
) -> list[ShardEntry]:
    """Stage 2: group rows across work files, one trie per group in sorted group order, shards."""
    work = WorkFiles()
    groups = group_rows(work, work_paths(jobs, results))
    writer = ShardWriter(out, shard_tokens, before_write)
    gids_sorted = sorted(groups)
    for gi, gid in enumerate(gids_sorted):
        seqs = group_sequences(work, groups[gid])
        tree = build_tree(seqs, gid)
        del seqs  # views into the maps: gone before the maps may be released
        work.maybe_release()
        counts.trees += 1
        counts.sequences += int(tree.seq_count.sum())
        counts.nodes += tree.num_nodes
        counts.tokens_linear += tree.tokens_linear
        counts.tokens_tree += tree.tokens_tree
        writer.add(tree)
        if on_progress:
            on_progress("trees", gi + 1, len(gids_sorted))
    writer.close()
    work.release()
    return writer.entries
