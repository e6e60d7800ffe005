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
bytes. Counts reconcile: ``records_read == records_in_trees + records_rejected``.

:func:`build` reads as these stages, one function each: plan the jobs, render the files, write
the trees, drop stale work, write the rejects, write the manifest.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep import __version__
from treeprep.errors import InputError, RenderError, TooManyErrors, TreeprepError
from treeprep.schemas import SCHEMA_VERSION, Manifest, Reject, TokenizerIdentity
from treeprep.schemas.manifest import Counts, InputEntry, ShardEntry
from treeprep.sequence import Sequence
from treeprep.shards import ShardWriter
from treeprep.trie import build_tree
from treeprep.workfiles import (
    WORK_BATCH,
    WORK_SCHEMA,
    FileJob,
    FileResult,
    WorkFiles,
    finish_file,
    group_rows,
    group_sequences,
    read_result,
    sequences_to_batch,
)

if TYPE_CHECKING:
    from treeprep.formats import FormatSpec, ReadOptions
    from treeprep.render import Renderer

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


# --------------------------------------------------------------------------------------------
# stage 1: one input file -> work file of sequences + rejects (in a worker)
# --------------------------------------------------------------------------------------------

_worker_state: dict = {}


def _worker_init(tokenizer: str | None, cfg_dict: dict, renderer: Renderer | None = None) -> None:
    from treeprep.render import Renderer

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


def _default_group(path: str, group_by_folder: bool) -> str:
    return (os.path.dirname(path) or ".") if group_by_folder else path


def _reject(**kw: Any) -> dict:
    return Reject(**kw).model_dump(exclude_none=True)


def _process_file(job: FileJob) -> FileResult:
    """Stage 1 for one file, in a worker.

    Writes ``sequences.arrow``, ``rejects.jsonl`` and, last, ``done.json`` under ``job.work_dir``.
    """
    from treeprep.formats import detect_format, get_format
    from treeprep.io import read_head

    cfg = _worker_state["cfg"]
    os.makedirs(job.work_dir, exist_ok=True)
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
    os.replace(tmp, seq_path)
    result = FileResult(job.path, spec.name, n_read, len(rejects), n_seq)
    finish_file(job, result, rejects)
    return result


def _unrecognised(job: FileJob) -> FileResult:
    """A file of no known format: skipped when a folder or glob found it, rejected when named."""
    if not job.explicit:
        result = FileResult(job.path, "", 0, 0, 0, skipped=True)
        finish_file(job, result, [])
        return result
    reason = "unrecognised input format (pass --format to force one)"
    result = FileResult(job.path, "unknown", 1, 1, 0)
    finish_file(job, result, [_reject(file=job.path, line=0, reason=reason)])
    return result


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
    n_read = n_seq = 0
    buf: list[Sequence] = []
    items = spec.read(job.path, opts)
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except InputError as e:  # the rest of the file is unusable
            n_read += 1
            rejects.append(_reject(file=e.file, line=e.line, reason=e.reason, format=spec.name))
            break
        n_read += 1
        if isinstance(item, Reject):
            if item.format is None:
                item.format = spec.name
            rejects.append(item.model_dump(exclude_none=True))
            continue
        gid = item.group_id or _default_group(job.path, spec.group_by_folder)
        if not item.source_file:
            item.source_file = job.path
        if not item.source_format:
            item.source_format = spec.name
        try:
            seq = renderer.render(item, group_id=gid, order=n_seq)
        except RenderError as e:
            where = {"file": item.source_file, "line": item.source_line, "call_id": item.call_id}
            rejects.append(_reject(**where, reason=str(e), format=spec.name))
            continue
        buf.append(seq)
        n_seq += 1
        if len(buf) >= WORK_BATCH:
            writer.write_batch(sequences_to_batch(buf))
            buf.clear()
    if buf:
        writer.write_batch(sequences_to_batch(buf))
    return n_read, n_seq


def _job_key(sha: str, cfg: BuildConfig, tok_sha: str, explicit: bool) -> str:
    h = hashlib.sha256()
    for part in (
        sha,
        cfg.format or "",
        cfg.group_by or "",
        tok_sha,
        _file_digest(cfg.system_prompt),
        _file_digest(cfg.tools),
        str(explicit),
        str(SCHEMA_VERSION),
        __version__,
    ):
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


def _run_stage1(
    jobs: list[FileJob], cfg: BuildConfig, on_progress: Progress | None, renderer: Renderer
) -> Iterator[FileResult]:
    todo = [j for j in jobs if not j.is_done()]
    done_before = len(jobs) - len(todo)
    if on_progress:
        on_progress("render", done_before, len(jobs))
    cfg_dict = {
        "format": cfg.format,
        "group_by": cfg.group_by,
        "system_prompt": cfg.system_prompt,
        "tools": cfg.tools,
        "native_templates": cfg.native_templates,
        "chat_template": cfg.chat_template,
        "date": cfg.date,
    }
    n = done_before
    if cfg.workers > 1 and len(todo) > 1:
        procs = min(cfg.workers, len(todo))
        if "fork" in mp.get_all_start_methods():
            # forked workers inherit the loaded renderer (importing transformers and loading a
            # tokenizer costs seconds per process); the tokenizers library disables its own thread
            # pool in a forked child, which it announces unless told so beforehand
            _worker_init(cfg.tokenizer, cfg_dict, renderer)
            pool_ctx = mp.get_context("fork")
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            try:
                pool = pool_ctx.Pool(procs)
            finally:
                if saved is None:
                    del os.environ["TOKENIZERS_PARALLELISM"]
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved
        else:
            pool = mp.get_context("spawn").Pool(
                procs, initializer=_worker_init, initargs=(cfg.tokenizer, cfg_dict)
            )
        with pool:
            for res in pool.imap_unordered(_process_file, todo):
                n += 1
                if on_progress:
                    on_progress("render", n, len(jobs))
                yield res
    else:
        _worker_init(cfg.tokenizer, cfg_dict, renderer)
        for job in todo:
            res = _process_file(job)
            n += 1
            if on_progress:
                on_progress("render", n, len(jobs))
            yield res


# --------------------------------------------------------------------------------------------
# the build, stage by stage
# --------------------------------------------------------------------------------------------


def build(cfg: BuildConfig, *, on_progress: Progress | None = None) -> Manifest:
    """Run a whole build (see the module docstring). Returns the manifest it wrote."""
    from treeprep.render import Renderer

    renderer = Renderer.load(
        cfg.tokenizer,
        native_templates=cfg.native_templates,
        chat_template=cfg.chat_template,
        date=cfg.date,
    )
    work_root = os.path.join(cfg.out, ".work")
    os.makedirs(work_root, exist_ok=True)
    # an older manifest must not describe shards this build is about to replace
    manifest_path = os.path.join(cfg.out, "manifest.json")
    if os.path.exists(manifest_path):
        os.remove(manifest_path)

    jobs = _plan_jobs(cfg, renderer.cache_key, work_root)
    results = _render_files(jobs, cfg, on_progress, renderer, work_root)
    counts = Counts()
    shards = _write_trees(jobs, results, cfg.shard_tokens, counts, cfg.out, on_progress)
    _drop_stale_work(jobs, work_root)
    _write_rejects(jobs, cfg.out)
    return _write_manifest(cfg, renderer.identity, jobs, results, counts, shards)


def _plan_jobs(cfg: BuildConfig, tokenizer_sha: str, work_root: str) -> list[FileJob]:
    """Every input file, hashed, with the work folder its key names."""
    from treeprep.io import expand_inputs, file_sha256

    jobs: list[FileJob] = []
    for path, explicit in expand_inputs(cfg.inputs):
        try:
            sha = file_sha256(path)
            size = os.path.getsize(path)
        except OSError as e:
            raise InputError(path, 0, f"cannot read: {e}") from e
        key = _job_key(sha, cfg, tokenizer_sha, explicit)
        jobs.append(FileJob(path, explicit, key, os.path.join(work_root, key), sha, size))
    return jobs


def _render_files(
    jobs: list[FileJob],
    cfg: BuildConfig,
    on_progress: Progress | None,
    renderer: Renderer,
    work_root: str,
) -> dict[str, FileResult]:
    """Stage 1 for every file not finished before; the results of all files, by path. Stops
    with :class:`TooManyErrors` once more than ``max_errors`` records are rejected."""
    results: dict[str, FileResult] = {}
    n_rejected = 0
    for res in _run_stage1(jobs, cfg, on_progress, renderer):
        results[res.path] = res
        n_rejected += res.records_rejected
        if cfg.max_errors is not None and n_rejected > cfg.max_errors:
            raise TooManyErrors(
                f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}; "
                f"last file: {res.path} (see {os.path.join(work_root, '*', 'rejects.jsonl')})"
            )
    for job in jobs:
        if job.path not in results:
            results[job.path] = read_result(job)
    n_rejected = sum(r.records_rejected for r in results.values())
    if cfg.max_errors is not None and n_rejected > cfg.max_errors:
        raise TooManyErrors(
            f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}"
        )
    return results


def _write_trees(
    jobs: list[FileJob],
    results: dict[str, FileResult],
    shard_tokens: int,
    counts: Counts,
    out: str,
    on_progress: Progress | None,
) -> list[ShardEntry]:
    """Stage 2: group rows across work files, one trie per group in sorted group order, shards."""
    work = WorkFiles()
    paths = []
    for job in jobs:
        res = results[job.path]
        p = job.sequences_path()
        if not res.skipped and res.sequences and os.path.exists(p):
            paths.append(p)
    groups = group_rows(work, paths)
    writer = ShardWriter(out, shard_tokens)  # shards of an earlier build are replaced
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


def _drop_stale_work(jobs: list[FileJob], work_root: str) -> None:
    """Work of inputs that are no longer part of this build is dropped; the rest stays for
    reruns."""
    keep = {os.path.basename(j.work_dir) for j in jobs}
    for name in os.listdir(work_root):
        if name not in keep:
            shutil.rmtree(os.path.join(work_root, name), ignore_errors=True)


def _write_rejects(jobs: list[FileJob], out: str) -> None:
    """``OUT/rejects.jsonl``: every file's rejects, in input order, atomically."""
    rej_path = os.path.join(out, "rejects.jsonl")
    with open(rej_path + ".tmp", "wb") as rej_out:
        for job in jobs:
            p = job.rejects_path()
            if os.path.exists(p):
                with open(p, "rb") as rej_in:
                    shutil.copyfileobj(rej_in, rej_out)
    os.replace(rej_path + ".tmp", rej_path)


def _write_manifest(
    cfg: BuildConfig,
    identity: TokenizerIdentity,
    jobs: list[FileJob],
    results: dict[str, FileResult],
    counts: Counts,
    shards: list[ShardEntry],
) -> Manifest:
    """Reconcile the counts and write ``OUT/manifest.json`` (last, atomically)."""
    inputs: list[InputEntry] = []
    formats: dict[str, int] = {}
    skipped: list[str] = []
    for job in jobs:
        res = results[job.path]
        if res.skipped:
            skipped.append(job.path)
            continue
        inputs.append(
            InputEntry(
                path=job.path,
                bytes=job.size,
                sha256=job.sha256,
                format=res.format,
                records_read=res.records_read,
                records_rejected=res.records_rejected,
            )
        )
        counts.records_read += res.records_read
        counts.records_rejected += res.records_rejected
        formats[res.format] = formats.get(res.format, 0) + res.records_read
    counts.records_in_trees = counts.sequences
    if counts.records_read != counts.records_in_trees + counts.records_rejected:
        raise TreeprepError(
            f"internal error: counts do not reconcile: read {counts.records_read}, "
            f"in trees {counts.records_in_trees}, rejected {counts.records_rejected}"
        )
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version=__version__,
        tokenizer=identity,
        group_by=cfg.group_by or "group_id",
        inputs=inputs,
        counts=counts,
        shards=shards,
        formats=dict(sorted(formats.items())),
        skipped_files=skipped,
    )
    manifest_path = os.path.join(cfg.out, "manifest.json")
    with open(manifest_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(manifest.model_dump_json(indent=2))
        f.write("\n")
    os.replace(manifest_path + ".tmp", manifest_path)
    return manifest
