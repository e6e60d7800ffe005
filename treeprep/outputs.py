"""The published files of a build: ``rejects.jsonl`` and ``manifest.json`` (written last).

:func:`make_manifest` reconciles the counts (every record read is in a tree or rejected) and
:func:`write_manifest` writes the manifest atomically and durably: its presence means the build is
whole. :func:`forget_manifest` removes an earlier build's manifest before its shards are replaced,
keeping the list of those shards so that only they (and no file a user put there) are deleted.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import orjson

from treeprep import __version__
from treeprep.atomic import commit, write_atomic, writing
from treeprep.errors import TreeprepError
from treeprep.schemas import SCHEMA_VERSION, Manifest, TokenizerIdentity
from treeprep.schemas.manifest import Counts, DuplicateInput, InputEntry, ShardEntry
from treeprep.workfiles import FileJob, FileResult

if TYPE_CHECKING:
    from treeprep.io.inputs import InputSet


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
) -> Manifest:
    """The manifest, with the counts reconciled."""
    entries: list[InputEntry] = []
    formats: dict[str, int] = {}
    skipped: list[str] = []
    for job in jobs:
        res = results[job.name]
        if res.skipped:
            skipped.append(job.name)
            continue
        entries.append(
            InputEntry(
                path=job.name,
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
    )


def write_manifest(out: str, manifest: Manifest) -> None:
    """``OUT/manifest.json``, last, atomically and durably."""
    data = (manifest.model_dump_json(indent=2) + "\n").encode()
    write_atomic(os.path.join(out, "manifest.json"), data)
