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
read (dangling link, permissions, a non-UTF-8 name) or is not a regular file (a FIFO, a device)
is a reject, not a crash or a hang; ``OUT`` and any other build's folder inside the inputs are
never read as input; a file whose format cannot be detected within the size and depth limits,
or whose compressed stream breaks before any format is seen, is one reject naming the line; a
second path to one file is read once and listed in the manifest; a worker killed mid-file stops
the build with an error (the files it finished are kept for the rerun) instead of hanging it,
and a build killed outright takes its workers with it; ``OUT`` is locked for the build, by this
process alone; only files builds wrote are deleted; a build where no record reaches a tree stops
with :class:`EmptyBuildError` after writing ``rejects.jsonl`` and no manifest.

:func:`build` reads as these stages, one function each: plan the jobs, render the files, write
the trees, drop stale work, write the rejects, write the manifest. The pieces live in their own
modules, and this one holds the configuration, the plan and the order of the stages:

* :mod:`treeprep.worker`: stage 1 for one file (detect, read, render, write the work file);
* :mod:`treeprep.engine`: who runs the two heavy stages, an :class:`~treeprep.engine.Engine`:
  :class:`~treeprep.engine.LocalEngine` (this process and its pool) or, with ``engine="ray"``,
  Ray Data (:mod:`treeprep.build_ray`), which calls the same per-file, per-group and per-shard
  functions and so writes the same bytes;
* :mod:`treeprep.workfiles`: the work folders, their markers, the grouping of their rows;
* :mod:`treeprep.shards` and :mod:`treeprep.outputs`: the shards, ``rejects.jsonl`` and the
  manifest; :mod:`treeprep.atomic`: the temporary-name-then-rename writes they all use.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from treeprep import __version__, modes
from treeprep.atomic import crash_point, sha256_of
from treeprep.engine import (
    Engine,
    LocalEngine,
    Progress,
    RenderTask,
    TreeTask,
    WorkerDied,
    open_engine,
    work_paths,
)
from treeprep.errors import TooManyErrors, TreeprepError
from treeprep.outputs import forget_manifest, make_manifest, write_manifest, write_rejects
from treeprep.schemas import SCHEMA_VERSION, Manifest
from treeprep.schemas.manifest import Counts
from treeprep.workfiles import WORK_FORMAT, FileJob, FileResult, OutIndex, lock_out, read_result

if TYPE_CHECKING:
    from treeprep.io import InputSet

__all__ = [
    "BuildConfig",
    "EmptyBuildError",
    "Engine",
    "LocalEngine",
    "Progress",
    "WorkerDied",
    "build",
]


class EmptyBuildError(TreeprepError):
    """No record reached a tree: there is nothing to train on (the rejects say why)."""


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
    engine: modes.Engine = modes.Engine.local
    #: the Ray cluster to join (``ray.init(address=...)``); None starts a local Ray
    ray_address: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TreeprepError("no inputs given")
        for name, least in (
            ("workers", 1),
            ("max_errors", 0),
            ("shard_tokens", 1),
            ("max_record_bytes", 1),
        ):
            value = getattr(self, name)
            if value is None and name == "max_errors":  # the one optional limit
                continue
            if not isinstance(value, int):
                raise TreeprepError(f"{name} must be an integer, got {value!r}")
            if value < least:
                raise TreeprepError(f"{name} must be >= {least}, got {value}")
        modes.coerce_modes(self, TreeprepError)


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
    inputs = discover_inputs(cfg.inputs, out=cfg.out)
    work_root = os.path.join(cfg.out, ".work")
    with lock_out(cfg.out):
        index = OutIndex.load(cfg.out)
        index.shards |= forget_manifest(cfg.out)
        jobs = _plan_jobs(cfg, inputs, renderer.cache_key, work_root)
        index.work |= {j.key for j in jobs}
        index.save()
        counts = Counts()
        with open_engine(cfg) as engine:
            task = RenderTask(jobs, cfg, renderer, on_progress)
            results = _render_files(task, engine.render, work_root)
            trees = TreeTask(
                work_paths(jobs, results),
                cfg.out,
                cfg.shard_tokens,
                counts,
                on_progress,
                index.add_shard,
            )
            shards = engine.write_trees(trees)
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


# --------------------------------------------------------------------------------------------
# planning: every input file, hashed, keyed by everything its work depends on
# --------------------------------------------------------------------------------------------


def _plan_jobs(
    cfg: BuildConfig, inputs: InputSet, tokenizer_sha: str, work_root: str
) -> list[FileJob]:
    """Every input file, hashed, with the work folder its key names. A file that cannot be read
    keeps its error (it becomes a reject)."""
    options = _options_digest(cfg, tokenizer_sha)
    jobs: list[FileJob] = []
    for f in inputs.files:
        sha, size, error = "", 0, f.error
        if error is None:
            try:
                sha = sha256_of(f.path)
                size = os.path.getsize(f.path)
            except OSError as e:
                error = f"cannot read: {e.strerror or e}"
        key = _job_key(sha, options, f.name, f.explicit, error)
        job = FileJob(f.path, f.explicit, key, os.path.join(work_root, key), sha, size, f.name)
        job.error = error
        jobs.append(job)
    return jobs


def _digest(parts: tuple[str, ...]) -> str:
    """SHA-256 of ``parts``, each ended by a NUL byte (so no two tuples run together)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _options_digest(cfg: BuildConfig, tok_sha: str) -> str:
    """What every file's work depends on besides the file itself: format, options, tokenizer."""
    return _digest(
        (
            cfg.format or "",
            cfg.group_by or "",
            tok_sha,
            _file_digest(cfg.system_prompt),
            _file_digest(cfg.tools),
            str(cfg.max_record_bytes),
            str(SCHEMA_VERSION),
            WORK_FORMAT,
            __version__,
        )
    )


def _job_key(sha: str, options: str, name: str, explicit: bool, error: str | None) -> str:
    """A file's work folder: its bytes, the options, and the name that goes into its records."""
    return _digest((sha, options, name, str(explicit), error or ""))[:32]


def _file_digest(path: str | None) -> str:
    if not path:
        return ""
    try:
        return sha256_of(path)
    except OSError as e:
        raise TreeprepError(f"{path}: cannot read: {e}") from e


# --------------------------------------------------------------------------------------------
# stage 1, as the driver sees it: results by file, and the --max-errors stop
# --------------------------------------------------------------------------------------------


def _render_files(
    task: RenderTask,
    render: Callable[[RenderTask], Iterator[FileResult]],
    work_root: str,
) -> dict[str, FileResult]:
    """Stage 1 for every file not finished before (``render``: the engine's); the results of
    all files, by name. Stops with :class:`TooManyErrors` once more than ``max_errors`` records
    are rejected."""
    max_errors = task.cfg.max_errors
    results: dict[str, FileResult] = {}
    n_rejected = 0
    for res in render(task):
        results[res.path] = res
        n_rejected += res.records_rejected
        if max_errors is not None and n_rejected > max_errors:
            raise TooManyErrors(
                f"{n_rejected} records rejected, more than --max-errors {max_errors}; "
                f"last file: {res.path} (see {os.path.join(work_root, '*', 'rejects.jsonl')})"
            )
    for job in task.jobs:
        if job.name not in results:
            results[job.name] = read_result(job)
    n_rejected = sum(r.records_rejected for r in results.values())
    if max_errors is not None and n_rejected > max_errors:
        raise TooManyErrors(f"{n_rejected} records rejected, more than --max-errors {max_errors}")
    return results
