"""A build's work as the driver plans it and hands it to an engine.

:func:`plan_jobs` turns every input file into a :class:`~treeprep.build.workfiles.FileJob`: the
file hashed, and the work folder named by a key over everything its work depends on (its bytes,
its name, every field of the build's :class:`~treeprep.build.config.FileOptions`, the tokenizer,
the schema, the work-file layout and treeprep's version: :func:`options_digest`), so a rerun
reuses a folder exactly when the work would come out the same.

An engine (:mod:`treeprep.build.engines`) then gets two tasks, each one value:

* :class:`RenderTask` (stage 1): every input file without a ``done.json`` is rendered into its
  work folder by a :class:`~treeprep.build.files.FileWorker`; one
  :class:`~treeprep.build.workfiles.FileResult` per file comes back as it finishes.
* :class:`TreeTask` (stage 2): the work files (:func:`work_paths`) are grouped by ``group_id``,
  one trie is built per group in sorted group order and the trees are cut into shards; the shard
  entries come back and the tree counts are added to the task's ``counts``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from treeprep import __version__
from treeprep.atomic import sha256_of
from treeprep.build.config import BuildConfig, FileOptions, file_fields
from treeprep.build.workfiles import FileJob, FileResult, file_stamp
from treeprep.build.workrows import WORK_FORMAT
from treeprep.errors import TreeprepError
from treeprep.schemas import SCHEMA_VERSION
from treeprep.schemas.manifest import Counts

if TYPE_CHECKING:
    from treeprep.io.inputs import InputSet
    from treeprep.render import Renderer

__all__ = ["Progress", "RenderTask", "TreeTask", "options_digest", "plan_jobs", "work_paths"]

#: Progress callback: (stage, done, total). Stages: "render" (files), "trees" (groups), and
#: "reused" (files an earlier run finished, whose work this build takes as it is: told once).
Progress = Callable[[str, int, int], None]


def plan_jobs(
    cfg: BuildConfig, inputs: InputSet, tokenizer_sha: str, work_root: str
) -> list[FileJob]:
    """Every input file, hashed, with the work folder its key names. A file that cannot be read
    keeps its error (it becomes a reject). Each job keeps the file's stamp from before the hash,
    for stage 1 to tell a file written to after it (:meth:`FileJob.changed`)."""
    options = options_digest(cfg.file, tokenizer_sha)
    jobs: list[FileJob] = []
    for f in inputs.files:
        sha, size, error = "", 0, f.error
        stamp: tuple[int, ...] = ()
        if error is None:
            try:
                stamp = file_stamp(f.path)  # before the hash: a write after it moves the stamp
                sha = sha256_of(f.path)
                size = os.path.getsize(f.path)
            except OSError as e:
                error = f"cannot read: {e.strerror or e}"
        key = _job_key(sha, options, f.name, f.explicit, error)
        job = FileJob(f.path, f.explicit, key, os.path.join(work_root, key), sha, size, f.name)
        job.error, job.stamp = error, stamp
        job.max_rejects = cfg.max_errors  # one file over it stops within the file
        jobs.append(job)
    return jobs


def _digest(parts: tuple[str, ...]) -> str:
    """SHA-256 of ``parts``, each ended by a NUL byte (so no two tuples run together).

    >>> _digest(("a", "bc")) == _digest(("ab", "c"))
    False
    """
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def options_digest(options: FileOptions, tok_sha: str) -> str:
    """What every file's work depends on besides the file itself: every field of ``options``
    (``dataclasses.asdict``; a field marked :data:`~treeprep.build.config.FILE` by the content
    of the file it names), the tokenizer, the schema, the work-file layout and treeprep's
    version. Derived from the dataclass, so a new option changes the key without being listed.

    >>> a = options_digest(FileOptions(), "tok")
    >>> a == options_digest(FileOptions(), "tok")
    True
    >>> a == options_digest(FileOptions(date="2024-01-02"), "tok")
    False
    """
    values = dataclasses.asdict(options)
    for name in file_fields(options):
        values[name] = _file_digest(values[name])
    fields = json.dumps(values, sort_keys=True, ensure_ascii=False)  # StrEnums as their values
    return _digest((fields, tok_sha, str(SCHEMA_VERSION), WORK_FORMAT, __version__))


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


@dataclass
class RenderTask:
    """Stage 1 of a build: render every job without a ``done.json``."""

    #: every input file of the build, in input order (finished ones included, for progress)
    jobs: list[FileJob]
    cfg: BuildConfig
    #: the renderer the driver loaded (forked workers inherit it)
    renderer: Renderer
    on_progress: Progress | None = None

    def start(self) -> tuple[list[FileJob], int]:
        """The jobs left to render and the number finished before; reports that progress."""
        todo = [j for j in self.jobs if not j.is_done()]
        done = len(self.jobs) - len(todo)
        if done and self.on_progress:
            self.on_progress("reused", done, len(self.jobs))
        self.report(done)
        return todo, done

    def report(self, done: int) -> None:
        """Tell ``on_progress`` that ``done`` files of the build are rendered."""
        if self.on_progress:
            self.on_progress("render", done, len(self.jobs))


@dataclass
class TreeTask:
    """Stage 2 of a build: the work files' groups as tries, cut into shards under ``out``."""

    #: the work files to read, in job order (:func:`work_paths`)
    paths: list[str]
    out: str
    #: a shard is closed once it holds this many tree tokens
    shard_tokens: int
    #: the tree counts of the manifest, added to in place
    counts: Counts
    on_progress: Progress | None = None
    #: told each shard's manifest path before the shard is written (the build's index)
    before_write: Callable[[str], None] | None = None
    #: per work file: the rows to leave out (duplicates, :mod:`treeprep.build.dedup`)
    drop: dict[str, np.ndarray] = field(default_factory=dict)


def work_paths(jobs: list[FileJob], results: dict[str, FileResult]) -> list[str]:
    """The work files stage 2 reads, in job order (files with sequences only)."""
    paths = []
    for job in jobs:
        res = results[job.name]
        p = job.sequences_path()
        if not res.skipped and res.sequences and os.path.exists(p):
            paths.append(p)
    return paths
