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
   The work files and their ``done.json`` markers are :mod:`treeprep.build.workfiles`.
2. **Group, build tries, write shards** (in the main process). The work files are memory-mapped;
   only their ``group_id`` columns are read up front. Groups are processed in sorted order, one at a
   time: their rows are gathered, inserted into a trie (:func:`treeprep.trie.build_tree`) and
   appended to the current shard (:class:`~treeprep.shards.ShardWriter`), which is written
   (temporary name, then rename) once it holds ``shard_tokens`` tokens. Memory is bounded by the
   largest group plus one shard's buffer.

Finally ``rejects.jsonl`` and ``manifest.json`` are written, and the build is published into
``OUT``, the manifest last: its presence means the build is whole. Shards, rejects and manifest
are written into a stage (``OUT/.work/next``) and moved into ``OUT`` only once all are whole
(:func:`~treeprep.build.out.publish`), so a rebuild that fails or is killed leaves the earlier
build in ``OUT`` whole. No timestamps or absolute paths are recorded, so the same inputs give the
same bytes: every input is named by its path relative to the input root (:func:`treeprep.io.
discover_inputs`) in group ids, ``seq_source``, rejects and the manifest. Counts reconcile:
``records_read == records_in_trees + records_rejected + records_filtered``.

Curation: stage 1 filters, merges reasoning and redacts each record as the options ask
(:mod:`~treeprep.build.curate`); between the stages, rows that repeat a call or a token sequence
of an earlier file are left out (:mod:`~treeprep.build.dedup`). What they leave out is counted
as filtered, by reason, in the manifest; a build with nothing to leave out writes the same
bytes as one without them.

What the build withstands (the README's "Guarantees" lists it for users): a file that cannot be
read (dangling link, permissions, a non-UTF-8 name) or is not a regular file (a FIFO, a device)
is a reject, not a crash or a hang; ``OUT`` and any other build's folder inside the inputs are
never read as input; a file whose format cannot be detected within the size and depth limits,
or whose compressed stream breaks before any format is seen, is one reject naming the line; a
second path to one file is read once and listed in the manifest; a worker killed mid-file stops
the build with an error (the files it finished are kept for the rerun) instead of hanging it,
and a build killed outright takes its workers with it; ``OUT`` is locked for the build, by this
process alone; only files builds wrote are deleted; a build where no record reaches a tree stops
with :class:`~treeprep.errors.EmptyBuildError` after writing ``rejects.jsonl`` and no manifest.

:func:`build` reads as these stages, one function each: plan the jobs, render the files, write
the trees, write the rejects and the manifest, publish them, drop stale work. This module is the
driver, and the order of the stages; the pieces are the package's modules, each importing only
those listed before it:

* :mod:`~treeprep.build.config`: :class:`BuildConfig`, holding the
  :class:`~treeprep.build.config.FileOptions` a worker needs (and a file's work is keyed by);
* :mod:`~treeprep.build.curate`: the filters, redaction and reasoning merge stage 1 runs;
* :mod:`~treeprep.build.hints`: the branch hint of a call left out (rejected, filtered, a
  duplicate) passed to the next call of its thread;
* :mod:`~treeprep.build.workrows`: a rendered sequence as a work-file row and back (the layout,
  shared prefixes, the digest deduplication keys on);
* :mod:`~treeprep.build.workfiles`: the work folders, their ``done.json`` markers, the grouping of
  their rows;
* :mod:`~treeprep.build.files`: stage 1 for one file
  (:class:`~treeprep.build.files.FileWorker`: detect, read, render, write the work file);
* :mod:`~treeprep.build.dedup`: the duplicates across files, found between the stages;
* :mod:`~treeprep.build.jobs`: the plan (one job per input file, keyed by everything its work
  depends on) and the two tasks handed to an engine;
* :mod:`~treeprep.build.out`: what a build owns in ``OUT``: its lock, the index of what builds
  wrote, ``rejects.jsonl`` and the manifest;
* :mod:`~treeprep.build.engines`: who runs the two heavy stages, an
  :class:`~treeprep.build.engines.Engine`: :class:`~treeprep.build.engines.LocalEngine` (this
  process and its pool);
* :mod:`~treeprep.build.ray`: with ``engine="ray"``, Ray Data, which calls the same per-file,
  per-group and per-shard functions and so writes the same bytes.

:mod:`treeprep.shards` writes the shards and :mod:`treeprep.atomic` the
temporary-name-then-rename writes they all use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import NoReturn

from treeprep.atomic import crash_point
from treeprep.build.config import BuildConfig, FileOptions
from treeprep.build.dedup import Duplicates, find_duplicates
from treeprep.build.engines import Engine, LocalEngine
from treeprep.build.jobs import Progress, RenderTask, TreeTask, plan_jobs, work_paths
from treeprep.build.out import (
    OutIndex,
    clear_stage,
    failed_rejects,
    lock_out,
    make_manifest,
    publish,
    write_manifest,
    write_rejects,
)
from treeprep.build.workfiles import FileJob, FileResult, read_result
from treeprep.errors import EmptyBuildError, TooManyErrors
from treeprep.schemas import Manifest
from treeprep.schemas.manifest import Counts, HubDataset

__all__ = ["BuildConfig", "FileOptions", "build"]


def build(cfg: BuildConfig, *, on_progress: Progress | None = None) -> Manifest:
    """Run a whole build (see the module docstring). Returns the manifest it wrote."""
    from treeprep.io.hub import dataset_inputs
    from treeprep.io.inputs import discover_inputs
    from treeprep.io.paths import local_path, local_paths
    from treeprep.render import Renderer
    from treeprep.render.gaps import given_gaps

    specs, datasets = dataset_inputs(cfg.inputs)  # hf:ORG/NAME: its folder in the local cache
    cfg = replace(cfg, inputs=local_paths(specs), out=local_path(cfg.out))  # file:// URLs
    renderer = Renderer.load(
        cfg.tokenizer,
        native_templates=cfg.file.native_templates,
        chat_template=cfg.file.chat_template,
        date=cfg.file.date,
        server=cfg.file.server,  # the parser the manifest names is this server's
        harmony=cfg.file.harmony,
    )
    inputs = discover_inputs(cfg.inputs, out=cfg.out, own_links=tuple(d.folder for d in datasets))
    work_root = os.path.join(cfg.out, ".work")
    with lock_out(cfg.out):
        index = OutIndex.load(cfg.out)
        jobs = plan_jobs(cfg, inputs, renderer.cache_key, work_root)
        index.work |= {j.key for j in jobs}
        index.save()
        counts = Counts()
        with open_engine(cfg) as engine:
            task = RenderTask(jobs, cfg, renderer, on_progress)
            results = _render_files(task, engine.render, work_root)
            paths = work_paths(jobs, results)
            dups = find_duplicates(_named_paths(jobs, paths)) if cfg.dedup else Duplicates()
            stage = clear_stage(cfg.out)  # OUT's earlier build stays whole until publish
            trees = TreeTask(
                paths, stage, cfg.shard_tokens, counts, on_progress, index.add_shard, dups.drop
            )
            shards = engine.write_trees(trees)
        rejects_sha256 = write_rejects(jobs, stage)
        manifest = make_manifest(
            group_by=cfg.file.group_by,
            identity=renderer.identity_by_content(),
            jobs=jobs,
            results=results,
            counts=counts,
            shards=shards,
            inputs=inputs,
            duplicates=dups,
        )
        manifest.prompt_given = given_gaps(manifest.prompt_gaps, cfg.file)
        manifest.datasets = [HubDataset(id=d.id, revision=d.revision) for d in datasets]
        manifest.rejects_sha256 = rejects_sha256
        if renderer.response_parser is not None:
            manifest.response_parser = renderer.response_parser.name
        else:
            manifest.response_parser_missing = renderer.response_note
        if counts.records_in_trees == 0:
            _empty(cfg.out, counts, manifest)
        write_manifest(stage, manifest)
        crash_point("before-manifest")
        publish(cfg.out, manifest, index)
        index.drop_unused(cfg.out, {j.key for j in jobs}, {e.path for e in shards})
    return manifest


def _empty(out: str, counts: Counts, manifest: Manifest) -> NoReturn:
    """Stop a build where no record reached a tree: nothing is published (an earlier build in
    ``out`` stays whole), and the error says where this build's rejects are."""
    where = failed_rejects(out)
    kept = "" if where == os.path.join(out, "rejects.jsonl") else "; the earlier build is kept"
    see = f"; see {where}" if counts.records_rejected else ""  # an empty file names nothing
    skipped = len(manifest.skipped_files)
    raise EmptyBuildError(
        f"no record reached a tree ({counts.records_read} read, "
        f"{counts.records_rejected} rejected, {counts.records_filtered} filtered, "
        f"{skipped} file{'' if skipped == 1 else 's'} skipped): nothing to train on, no manifest "
        f"written{kept}{see}"
    )


def _named_paths(jobs: list[FileJob], paths: list[str]) -> list[tuple[str, str]]:
    """(input file name, work file) for each work file stage 2 reads, in job order."""
    names = {job.sequences_path(): job.name for job in jobs}
    return [(names[p], p) for p in paths]


@contextmanager
def open_engine(cfg: BuildConfig) -> Iterator[Engine]:
    """The engine ``cfg.engine`` names, set up for the build and torn down after it."""
    if cfg.engine == "ray":
        from treeprep.build.ray import ray_engine

        with ray_engine(cfg) as engine:
            yield engine
    else:
        yield LocalEngine()


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
