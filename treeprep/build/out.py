"""What a build owns in ``OUT``: the lock, the index of what it wrote, and the published files.

* :func:`lock_out` takes an exclusive lock on ``OUT/.work/build.lock`` for the whole build, so two
  builds into one folder cannot interleave their temporary files: the second stops with an error.
* :class:`OutIndex` (``OUT/.work/index.json``) lists the work folders and shard files builds into
  this folder wrote; a later build deletes only those (and the shards of the earlier manifest)
  when it no longer needs them, never a file it did not write.
* ``rejects.jsonl`` and ``manifest.json`` (written last): :func:`make_manifest` reconciles the
  counts (every record read is in a tree or rejected) and :func:`write_manifest` writes the
  manifest atomically and durably: its presence means the build is whole.
  :func:`forget_manifest` removes an earlier build's manifest before its shards are replaced,
  keeping the list of those shards so that only they (and no file a user put there) are deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from treeprep import __version__
from treeprep.atomic import commit, make_dirs, write_atomic, writing
from treeprep.build.workfiles import FileJob, FileResult
from treeprep.errors import TreeprepError
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
    "forget_manifest",
    "lock_out",
    "make_manifest",
    "write_manifest",
    "write_rejects",
]

INDEX = "index.json"
LOCK = "build.lock"

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


def _is_shard_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[0] == "shards" and parts[1] not in ("", ".", "..")


#: descriptors of the ``OUT`` locks this process holds: a forked child closes them at once
_held_locks: set[int] = set()


def _drop_inherited_locks() -> None:
    """In a forked child: close the lock descriptors the parent holds. An ``flock`` belongs to
    the open file, which a fork shares, so a worker that outlived its build would otherwise
    keep ``OUT`` locked against the rerun. The parent's lock is untouched."""
    for fd in _held_locks:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_locks.clear()


_fork_hook = [False]  # registered on the first lock, not at import


@contextlib.contextmanager
def lock_out(out: str) -> Iterator[None]:
    """Hold an exclusive lock on ``OUT`` for a build; TreeprepError at once when another build
    (in this or another process) holds it. The OS drops the lock when the holder dies. The lock
    is not inherited: its descriptor is closed on exec (Python's default) and in a forked child
    (:func:`_drop_inherited_locks`), so only the build's own process holds it."""
    import fcntl

    work = os.path.join(out, ".work")
    make_dirs(work)
    path = os.path.join(work, LOCK)
    if not _fork_hook[0]:
        os.register_at_fork(after_in_child=_drop_inherited_locks)
        _fork_hook[0] = True
    with writing(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _held_locks.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise TreeprepError(
                f"{out}: another treeprep build is writing this folder (lock {path} is held); "
                "wait for it to finish or build into another --out"
            ) from e
        yield
    finally:
        _held_locks.discard(fd)
        os.close(fd)


# --------------------------------------------------------------------------------------------
# the published files: rejects.jsonl and manifest.json
# --------------------------------------------------------------------------------------------


def forget_manifest(out: str) -> set[str]:
    """Remove an earlier build's manifest (it must not describe shards this build is about to
    replace); returns the shard paths it listed, which this build may then delete."""
    from treeprep.schemas.manifest import check_relative_path

    path = os.path.join(out, "manifest.json")
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


def write_rejects(jobs: list[FileJob], out: str) -> None:
    """``OUT/rejects.jsonl``: every file's rejects, in input order, atomically."""
    rej_path = os.path.join(out, "rejects.jsonl")
    with writing(rej_path, rej_path + ".tmp"), open(rej_path + ".tmp", "wb") as rej_out:
        for job in jobs:
            p = job.rejects_path()
            if os.path.exists(p):
                with open(p, "rb") as rej_in:
                    shutil.copyfileobj(rej_in, rej_out)
    commit(rej_path + ".tmp", rej_path)


def make_manifest(
    group_by: str | None,
    identity: TokenizerIdentity,
    jobs: list[FileJob],
    results: dict[str, FileResult],
    counts: Counts,
    shards: list[ShardEntry],
    inputs: InputSet,
    duplicates: dict[str, dict[str, int]] | None = None,
    dropped_normalized: dict[str, dict[str, int]] | None = None,
) -> Manifest:
    """The manifest, with the counts reconciled. ``duplicates``: per file name, the records
    deduplication left out, by reason, and ``dropped_normalized`` those of them the renderer had
    normalized, by kind (:class:`~treeprep.build.dedup.Duplicates`)."""
    entries: list[InputEntry] = []
    formats: dict[str, int] = {}
    skipped: list[str] = []
    filtered: dict[str, int] = {}
    curation: dict[str, int] = {}
    normalized: dict[str, int] = {}
    for job in jobs:
        res = results[job.name]
        if res.skipped:
            skipped.append(job.name)
            continue
        why = dict(res.filtered)
        for reason, n in (duplicates or {}).get(job.name, {}).items():
            why[reason] = why.get(reason, 0) + n
        _add(filtered, why)
        _add(curation, res.curated)
        _add(normalized, res.normalized)
        _add(normalized, {k: -n for k, n in (dropped_normalized or {}).get(job.name, {}).items()})
        entries.append(
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
        formats[res.format] = formats.get(res.format, 0) + res.records_read
    counts.records_in_trees = counts.sequences
    counts.records_filtered = sum(filtered.values())
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
    return Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version=__version__,
        tokenizer=identity,
        group_by=group_by or "group_id",
        inputs=entries,
        counts=counts,
        shards=shards,
        formats=dict(sorted(formats.items())),
        skipped_files=skipped,
        duplicate_inputs=[DuplicateInput(path=p, same_as=q) for p, q in inputs.duplicates],
        filtered=dict(sorted(filtered.items())),
        curation=dict(sorted(curation.items())),
        normalized={k: n for k, n in sorted(normalized.items()) if n},
        excluded_inputs=[ExcludedInput(path=p, reason=r) for p, r in inputs.excluded],
    )


def _add(total: dict[str, int], more: dict[str, int]) -> None:
    for k, n in more.items():
        total[k] = total.get(k, 0) + n


def write_manifest(out: str, manifest: Manifest) -> None:
    """``OUT/manifest.json``, last, atomically and durably."""
    data = (manifest.model_dump_json(indent=2) + "\n").encode()  # fields at defaults left out
    write_atomic(os.path.join(out, "manifest.json"), data)
