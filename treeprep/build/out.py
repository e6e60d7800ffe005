"""What a build owns in ``OUT``: the lock, the index of what it wrote, and the published files.

* :func:`lock_out` takes an exclusive lock on ``OUT/.work/build.lock`` for the whole build, so two
  builds into one folder cannot interleave their temporary files: the second stops with an error
  naming the holder's pid (:mod:`treeprep.locks`).
* :class:`OutIndex` (``OUT/.work/index.json``) lists the work folders and shard files builds into
  this folder wrote; a later build deletes only those (and the shards of the earlier manifest)
  when it no longer needs them, never a file it did not write.
* ``rejects.jsonl`` and ``manifest.json``: :func:`make_manifest` reconciles the counts (every
  record read is in a tree or rejected). A build writes its shards, its rejects and its manifest
  into the stage ``OUT/.work/next/`` (:func:`clear_stage`), and only once all of them are whole
  does :func:`publish` move them into ``OUT``, the manifest last: until then an earlier build in
  ``OUT`` stays whole and readable, so a rebuild that fails (every record rejected,
  ``--max-errors``, a full disk, kill -9) never destroys it. Publishing is renames only; the
  earlier manifest is removed first (:func:`forget_manifest`, keeping the list of its shards so
  that only they, and no file a user put there, are deleted), so no manifest ever describes
  shards being replaced.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from treeprep import __version__
from treeprep.atomic import commit, crash_point, fsync_path, make_dirs, write_atomic, writing
from treeprep.build.dedup import Duplicates
from treeprep.build.workfiles import FileJob, FileResult
from treeprep.errors import TreeprepError
from treeprep.formats import companion_format
from treeprep.schemas import SCHEMA_VERSION, Manifest, TokenizerIdentity
from treeprep.schemas.manifest import (
    Counts,
    DuplicateInput,
    ExcludedInput,
    InputEntry,
    ShardEntry,
)

if TYPE_CHECKING:
    from treeprep.io.inputs import InputSet

__all__ = [
    "OutIndex",
    "clear_stage",
    "failed_rejects",
    "forget_manifest",
    "lock_out",
    "make_manifest",
    "publish",
    "stage_dir",
    "write_manifest",
    "write_rejects",
]

INDEX = "index.json"
LOCK = "build.lock"
#: ``OUT/.work/next``: a build's shards, rejects and manifest until :func:`publish` moves them
STAGE = "next"
MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"

# --------------------------------------------------------------------------------------------
# the lock, and what builds into this OUT wrote
# --------------------------------------------------------------------------------------------


@dataclass
class OutIndex:
    """``OUT/.work/index.json``: the work folders (keys) and shard files builds into this OUT
    wrote. Only these, and the shards of an earlier manifest, are ever deleted."""

    path: str
    work: set[str] = field(default_factory=set)
    shards: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, out: str) -> OutIndex:
        path = os.path.join(out, ".work", INDEX)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
            return cls(path, set(d.get("work", [])), set(d.get("shards", [])))
        except (OSError, ValueError, AttributeError, TypeError):
            return cls(path)  # no index (first build, or made before indexes): nothing owned

    def save(self) -> None:
        d = {"work": sorted(self.work), "shards": sorted(self.shards)}
        write_atomic(self.path, json.dumps(d, indent=1).encode())

    def add_shard(self, name: str) -> None:
        """Record a shard before it is written, so a crash never leaves an unlisted one."""
        if name not in self.shards:
            self.shards.add(name)
            self.save()

    def drop_unused(self, out: str, work: set[str], shards: set[str]) -> None:
        """Delete the owned work folders and shards this build did not use; keep the rest."""
        for key in sorted(self.work - work):
            if os.sep not in key and "/" not in key and key not in (".", ".."):
                shutil.rmtree(os.path.join(out, ".work", key), ignore_errors=True)
        for name in sorted(self.shards - shards):
            if _is_shard_name(name):
                for p in (os.path.join(out, name), os.path.join(out, name) + ".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(p)
        self.work, self.shards = set(work), set(shards)
        self.save()


def _whole_requests(fmt: str | None) -> bool:
    """Whether ``fmt``'s logs hold each request whole (a gap there is what the model saw)."""
    from treeprep.formats import formats

    spec = formats().get(fmt or "")
    return spec is not None and spec.whole_requests


def _is_shard_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0] == "shards" and parts[1] not in ("", ".", "..")


@contextlib.contextmanager
def lock_out(out: str) -> Iterator[None]:
    """Hold an exclusive lock on ``OUT`` for a build; :class:`~treeprep.errors.FolderLocked` at
    once, naming the holder's pid, when another build (in this or another process) holds it. The
    OS drops the lock when the holder dies, and the lock is not inherited by a forked worker
    (:mod:`treeprep.locks`), so only the build's own process holds it."""
    from treeprep.locks import take_lock

    work = os.path.join(out, ".work")
    make_dirs(work)
    path = os.path.join(work, LOCK)
    what = (
        f"{out}: another treeprep build is writing this folder; wait for it to finish or build "
        "into another --out"
    )
    with writing(path):
        lock = take_lock(path, what=what)
    try:
        yield
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------
# the published files: rejects.jsonl and manifest.json
# --------------------------------------------------------------------------------------------


def stage_dir(out: str) -> str:
    """``OUT/.work/next``: where a build writes its shards, rejects and manifest."""
    return os.path.join(out, ".work", STAGE)


def clear_stage(out: str) -> str:
    """The stage, emptied of what a build that stopped before publishing left there (only the
    names builds write: shards, their temporaries, the rejects and the manifest). Returns it."""
    stage = stage_dir(out)
    for folder in (stage, os.path.join(stage, "shards")):
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            if _staged_name(name):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.remove(os.path.join(folder, name))
    make_dirs(stage)
    return stage


def _staged_name(name: str) -> bool:
    base = name.removesuffix(".tmp")
    return base in (MANIFEST, REJECTS) or (base.startswith("shard-") and base.endswith(".arrow"))


def forget_manifest(out: str) -> set[str]:
    """Remove an earlier build's manifest (it must not describe shards this build is about to
    replace); returns the shard paths it listed, which this build may then delete."""
    from treeprep.schemas.manifest import check_relative_path

    path = os.path.join(out, MANIFEST)
    if not os.path.exists(path):
        return set()
    shards: set[str] = set()
    try:
        with open(path, "rb") as f:
            for s in orjson.loads(f.read()).get("shards", []):
                try:
                    shards.add(check_relative_path(s["path"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a path outside OUT is never deleted
    except (OSError, orjson.JSONDecodeError, AttributeError):
        pass
    os.remove(path)
    return shards


def publish(out: str, manifest: Manifest, index: OutIndex) -> None:
    """Move the staged build (its shards, ``rejects.jsonl`` and, last, ``manifest.json``, all
    written whole before) into ``OUT``, replacing the earlier build. The earlier manifest goes
    first, so no manifest ever describes a shard being replaced; its shards are added to
    ``index`` (saved), for :meth:`OutIndex.drop_unused` to delete those this build did not
    replace. Renames only: a crash part way leaves no manifest, and the rerun publishes again."""
    stage = stage_dir(out)
    index.shards |= forget_manifest(out)
    index.save()
    make_dirs(os.path.join(out, "shards"))
    for entry in manifest.shards:
        _move(os.path.join(stage, entry.path), os.path.join(out, entry.path))
    fsync_path(os.path.join(out, "shards"))
    crash_point("publishing")
    _move(os.path.join(stage, REJECTS), os.path.join(out, REJECTS))
    _move(os.path.join(stage, MANIFEST), os.path.join(out, MANIFEST))
    fsync_path(out)
    for folder in (os.path.join(stage, "shards"), stage):  # gone once empty
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def failed_rejects(out: str) -> str:
    """Where the rejects of a build that published nothing are: ``OUT/rejects.jsonl`` when
    ``OUT`` holds no earlier build (moved there), else the stage's, beside the earlier build,
    which is kept whole with its own rejects."""
    staged = os.path.join(stage_dir(out), REJECTS)
    if os.path.exists(os.path.join(out, MANIFEST)):
        return staged
    _move(staged, os.path.join(out, REJECTS))
    return os.path.join(out, REJECTS)


def _move(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (replacing it); across file systems (a linked ``shards``
    folder), copy to ``dst.tmp`` and :func:`commit` it."""
    with writing(dst):
        try:
            os.replace(src, dst)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
        with writing(dst, dst + ".tmp"):
            shutil.copyfile(src, dst + ".tmp")
    commit(dst + ".tmp", dst)
    os.remove(src)


def write_rejects(jobs: list[FileJob], folder: str) -> str | None:
    """``rejects.jsonl`` in ``folder`` (the stage): every file's rejects, in input order,
    atomically. Returns the sha256 of its bytes, which the manifest records
    (:attr:`~treeprep.schemas.manifest.Manifest.rejects_sha256`), or None when it is empty (a
    build that rejected nothing: its count, 0, is check enough)."""
    rej_path = os.path.join(folder, REJECTS)
    digest = hashlib.sha256()
    with writing(rej_path, rej_path + ".tmp"), open(rej_path + ".tmp", "wb") as rej_out:
        for job in jobs:
            p = job.rejects_path()
            if os.path.exists(p):
                with open(p, "rb") as rej_in:
                    while block := rej_in.read(1 << 20):
                        digest.update(block)
                        rej_out.write(block)
        empty = rej_out.tell() == 0
    commit(rej_path + ".tmp", rej_path)
    return None if empty else digest.hexdigest()


def make_manifest(
    *,
    group_by: str | None,
    identity: TokenizerIdentity,
    jobs: list[FileJob],
    results: dict[str, FileResult],
    counts: Counts,
    shards: list[ShardEntry],
    inputs: InputSet,
    duplicates: Duplicates | None = None,
) -> Manifest:
    """The manifest, with the counts reconciled (``counts`` gets the records' counts).
    ``duplicates``: what deduplication left out, per file name by reason, and those of them the
    renderer had normalized, by kind (:class:`~treeprep.build.dedup.Duplicates`)."""
    tally = _tally_inputs(jobs, results, counts, duplicates or Duplicates())
    _check_counts(counts, tally.normalized)
    return Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version=__version__,
        tokenizer=identity,
        group_by=group_by or "group_id",
        inputs=tally.entries,
        counts=counts,
        shards=shards,
        formats=dict(sorted(tally.formats.items())),
        skipped_files=tally.skipped,
        companion_files={f: names for f, names in sorted(tally.companions.items())},
        duplicate_inputs=[DuplicateInput(path=p, same_as=q) for p, q in inputs.duplicates],
        filtered=dict(sorted(tally.filtered.items())),
        curation=dict(sorted(tally.curation.items())),
        normalized={k: n for k, n in sorted(tally.normalized.items()) if n},
        prompt_gaps=_nonzero(tally.gaps),
        excluded_inputs=[ExcludedInput(path=p, reason=r) for p, r in inputs.excluded],
    )


@dataclass
class _InputTally:
    """What the input files' results add up to, for the manifest."""

    entries: list[InputEntry] = field(default_factory=list)
    #: records read, by format
    formats: dict[str, int] = field(default_factory=dict)
    #: files stage 1 skipped: of no known format
    skipped: list[str] = field(default_factory=list)
    #: files stage 1 skipped that a format reads through its sessions, by that format
    companions: dict[str, list[str]] = field(default_factory=dict)
    #: records left out by filters or as duplicates, by reason
    filtered: dict[str, int] = field(default_factory=dict)
    #: records changed by curation, by kind
    curation: dict[str, int] = field(default_factory=dict)
    #: records in trees the renderer normalized, by kind
    normalized: dict[str, int] = field(default_factory=dict)
    #: records in trees whose prompt lacks a system prompt or tool schemas, by format and kind
    #: (:mod:`treeprep.render.gaps`)
    gaps: dict[str, dict[str, int]] = field(default_factory=dict)


def _tally_inputs(
    jobs: list[FileJob], results: dict[str, FileResult], counts: Counts, duplicates: Duplicates
) -> _InputTally:
    """Each input file's entry and counts, in job order, with the records deduplication left
    out counted as filtered (and no longer as normalized); the records read and rejected are
    added to ``counts``."""
    from treeprep.render.gaps import split_gaps

    t = _InputTally()
    for job in jobs:
        res = results[job.name]
        if res.skipped:  # a file another format reads with its sessions is listed apart
            fmt = companion_format(job.path)
            (t.companions.setdefault(fmt, []) if fmt else t.skipped).append(job.name)
            continue
        why = dict(res.filtered)
        _add(why, duplicates.by_file.get(job.name, {}))
        _add(t.filtered, why)
        _add(t.curation, res.curated)
        kinds = dict(res.normalized)
        _add(kinds, {k: -n for k, n in duplicates.normalized.get(job.name, {}).items()})
        kinds, gaps = split_gaps(kinds)
        _add(t.normalized, kinds)
        if not _whole_requests(res.format):
            _add(t.gaps.setdefault(res.format, {}), gaps)
        t.entries.append(
            InputEntry(
                path=job.name,
                bytes=job.size,
                sha256=job.sha256,
                format=res.format,
                records_read=res.records_read,
                records_rejected=res.records_rejected,
                records_filtered=sum(why.values()),
            )
        )
        counts.records_read += res.records_read
        counts.records_rejected += res.records_rejected
        t.formats[res.format] = t.formats.get(res.format, 0) + res.records_read
    counts.records_in_trees = counts.sequences
    counts.records_filtered = sum(t.filtered.values())
    return t


def _check_counts(counts: Counts, normalized: dict[str, int]) -> None:
    """Every record read is in a tree, rejected or filtered, and no kind of normalization counts
    more records than the trees hold (else an internal error)."""
    if counts.records_read != (
        counts.records_in_trees + counts.records_rejected + counts.records_filtered
    ):
        raise TreeprepError(
            f"internal error: counts do not reconcile: read {counts.records_read}, "
            f"in trees {counts.records_in_trees}, rejected {counts.records_rejected}, "
            f"filtered {counts.records_filtered}"
        )
    if any(not 0 <= n <= counts.records_in_trees for n in normalized.values()):
        raise TreeprepError(
            f"internal error: normalized calls {normalized} do not fit the "
            f"{counts.records_in_trees} records in trees"
        )


def _nonzero(gaps: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``gaps`` sorted, without its zero counts and the formats left with none."""
    kept = {f: {k: n for k, n in sorted(kinds.items()) if n} for f, kinds in sorted(gaps.items())}
    return {f: kinds for f, kinds in kept.items() if kinds}


def _add(total: dict[str, int], more: dict[str, int]) -> None:
    for k, n in more.items():
        total[k] = total.get(k, 0) + n


def write_manifest(folder: str, manifest: Manifest) -> None:
    """``manifest.json`` in ``folder`` (the stage), atomically and durably."""
    data = (manifest.model_dump_json(indent=2) + "\n").encode()  # fields at defaults left out
    write_atomic(os.path.join(folder, MANIFEST), data)
