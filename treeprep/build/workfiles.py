"""Stage 1's work files: one folder per input file under ``OUT/.work/<key>/``.

A folder holds ``sequences.arrow`` (an uncompressed Arrow IPC file of rendered sequences,
:data:`~treeprep.build.workrows.WORK_SCHEMA`), ``rejects.jsonl`` (written as the rejects come:
:class:`RejectLog`) and, written last, ``done.json`` (a :class:`FileResult`): the marker that
makes a rerun skip the file (datatrove's one marker per finished unit). The key hashes the file's
bytes, the format, the options and the tokenizer identity, so any change to those makes a new
folder instead of reusing a stale one.

Stage 2 reads the folders back: :func:`group_rows` finds every group's rows across the work files
from their ``group_id`` columns alone, and :class:`WorkFiles` hands out a group's rows as zero-copy
slices of the memory-mapped files, giving mapped pages back now and then so that memory stays
bounded whatever the input size, and keeping at most ``max_open`` files mapped at once (20,000
inputs must not run out of file descriptors).

Crash safety. Every file is written to a temporary name, fsynced and renamed
(:mod:`treeprep.atomic`), so after a crash a name holds either nothing or a whole file.
``done.json`` records the size and sha256 of the work files it vouches for, and
:meth:`FileJob.is_done` checks them, so a work file that a crash, a full disk or a stray edit left
short is redone rather than trusted.

What a build owns in ``OUT`` besides these folders, and the lock on it, are
:mod:`treeprep.build.out`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.atomic import commit, crash_point, sha256_of, write_atomic, writing
from treeprep.build.hints import HINT_COLUMNS, carried_hints, with_carried_hints
from treeprep.build.workrows import rows_to_sequences
from treeprep.io.reads import stale
from treeprep.sequence import Sequence

#: sequences per record batch of a work file
WORK_BATCH = 512
SEQUENCES = "sequences.arrow"
REJECTS = "rejects.jsonl"
DONE = "done.json"
# --------------------------------------------------------------------------------------------
# one input file's work
# --------------------------------------------------------------------------------------------


@dataclass
class FileJob:
    """One input file of a build and the work folder its stage-1 output goes to."""

    #: the path to open
    path: str
    explicit: bool
    key: str
    work_dir: str
    sha256: str
    size: int
    #: the name that stands for the file in every output (relative to the input root)
    name: str = ""
    #: why the file cannot be read: stage 1 turns it into a reject
    error: str | None = None
    #: the file's :func:`file_stamp` taken before it was hashed (empty: not hashed)
    stamp: tuple[int, ...] = ()
    #: stop reading the file once it has more rejects than this (the build's ``--max-errors``;
    #: None: never). Not part of the key: a file stopped early gets no ``done.json``
    max_rejects: int | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.path

    def is_done(self) -> bool:
        """Whether an earlier run finished this file: its ``done.json`` is readable, every
        work file it vouches for has the recorded size and sha256, and every file its adapter
        read with it (its companions, :mod:`treeprep.io.reads`) is as it was then."""
        try:
            result = read_result(self)
        except (OSError, ValueError, TypeError):
            return False
        checks = [(self.rejects_path(), result.rejects_bytes, result.rejects_sha256)]
        if result.sequences:
            checks.append((self.sequences_path(), result.sequences_bytes, result.sequences_sha256))
        for path, size, sha in checks:
            try:
                if os.path.getsize(path) != size or sha256_of(path) != sha:
                    return False
            except OSError:
                return False
        return not result.reads or stale(self.path, result.reads) is None

    def changed(self) -> str | None:
        """Why the bytes stage 1 read may not be those hashed when the build planned the file
        (its sha256 now differs, or it was written to since: size, times or inode moved), or
        None. Called after reading, so a file rewritten at any time after its hash is caught."""
        if not self.sha256:
            return None
        try:
            stamp = file_stamp(self.path)
            sha = sha256_of(self.path)
        except OSError as e:
            return f"cannot be read again: {e.strerror or e}"
        if sha != self.sha256:
            return f"sha256 {self.sha256[:16]}... when hashed, {sha[:16]}... after reading"
        if self.stamp and stamp != tuple(self.stamp):  # a list, after a trip through Arrow
            return "written to while it was read (its size, times or inode moved)"
        return None

    def sequences_path(self) -> str:
        return os.path.join(self.work_dir, SEQUENCES)

    def rejects_path(self) -> str:
        return os.path.join(self.work_dir, REJECTS)


@dataclass
class FileResult:
    """What stage 1 made of one file; stored as its ``done.json``."""

    #: the file's name (relative to the input root)
    path: str
    format: str
    records_read: int
    records_rejected: int
    sequences: int
    skipped: bool = False
    sequences_bytes: int = 0
    sequences_sha256: str = ""
    rejects_bytes: int = 0
    rejects_sha256: str = ""
    #: records the build's filters left out, by reason (never silently: the manifest counts them)
    filtered: dict[str, int] = field(default_factory=dict)
    #: what curation changed, by kind (``redacted:<secret kind>``, ``reasoning-merge:fold``)
    curated: dict[str, int] = field(default_factory=dict)
    #: calls the renderer normalized, by kind (``inline-think``, ``whitespace``)
    normalized: dict[str, int] = field(default_factory=dict)
    #: what the adapter read besides the file (:class:`treeprep.io.reads.Reads`): a rerun redoes
    #: the file when any of it changed
    reads: dict[str, str] = field(default_factory=dict)


def file_stamp(path: str) -> tuple[int, ...]:
    """What changes when a file is written to: (device, inode, size, mtime, ctime), in ns. The
    ctime moves on every write and cannot be set back, so equal stamps mean no write between."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def finish_file(
    job: FileJob, result: FileResult, rejects: list[dict] | RejectLog, *, done: bool = True
) -> None:
    """Commit the file's rejects (a :class:`RejectLog` written as they came, or a list written
    now), then write its ``done.json`` marker (with the size and sha256 of the work files), each
    atomically and durably. ``done=False``: no marker (and none left from before), so the rerun
    does the file again (one that changed during the build, or stopped by ``--max-errors``)."""
    if not isinstance(rejects, RejectLog):
        log = RejectLog(job)
        for r in rejects:
            log.append(r)
        rejects = log
    result.rejects_bytes, result.rejects_sha256 = rejects.commit()
    if result.sequences:
        result.sequences_bytes = os.path.getsize(job.sequences_path())
        result.sequences_sha256 = sha256_of(job.sequences_path())
    crash_point("before-done")
    if not done:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(job.work_dir, DONE))
        return
    write_atomic(os.path.join(job.work_dir, DONE), json.dumps(asdict(result)).encode())


class TooManyRejects(Exception):
    """A file's rejects went over its :attr:`FileJob.max_rejects`: stage 1 stops reading it."""


class RejectLog:
    """A file's ``rejects.jsonl``, written as the rejects come (to its temporary name, which
    :func:`finish_file` commits), so that a file of millions of bad lines costs disk, not
    memory: a 57 KB ``.zst`` of 39 M bad lines once held 23.5 GB of rejects. The bytes are
    hashed as they are written, for ``done.json``. With ``limit``, the reject that makes more
    than ``limit`` raises :class:`TooManyRejects` once it is written (``--max-errors`` stops
    within a file, not after it)."""

    def __init__(self, job: FileJob, limit: int | None = None) -> None:
        self.path = job.rejects_path()
        self.tmp = self.path + ".tmp"
        self.limit = limit
        self.count = 0
        self.size = 0
        self._sha = hashlib.sha256()
        with writing(self.path, self.tmp):
            self._f = open(self.tmp, "wb")  # noqa: SIM115 (closed by commit or discard)

    def __len__(self) -> int:
        return self.count

    def append(self, reject: dict) -> None:
        """Write one reject (a ``Reject`` dumped as a dict), sorted keys, one line."""
        line = orjson.dumps(reject, option=orjson.OPT_SORT_KEYS) + b"\n"
        with writing(self.path, self.tmp):
            self._f.write(line)
        self._sha.update(line)
        self.size += len(line)
        self.count += 1
        if self.limit is not None and self.count > self.limit:
            raise TooManyRejects(self.count)

    def commit(self) -> tuple[int, str]:
        """Close and rename the file into place; its (size, sha256)."""
        with writing(self.path, self.tmp):
            self._f.close()
        commit(self.tmp, self.path)
        return self.size, self._sha.hexdigest()

    def discard(self) -> None:
        """Close and remove the temporary file (what was written is not used)."""
        self._f.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


def read_result(job: FileJob) -> FileResult:
    """The ``done.json`` of a file an earlier run finished."""
    with open(os.path.join(job.work_dir, DONE), encoding="utf-8") as f:
        return FileResult(**json.load(f))


class WorkFiles:
    """Stage 1's work files, memory-mapped, with the mapped pages given back now and then.

    A group's rows are read as zero-copy slices of the mapped file (``Table.take`` would first
    concatenate every chunk of the table, touching and copying the whole file for each group).
    Pages a map has touched stay resident, and counted in the process's RSS, until the map is
    closed, so once ``release_bytes`` of rows have been read every map is closed between two groups
    and reopened (a footer read) when next needed. Peak memory is then bounded by
    ``release_bytes`` plus one group, whatever the input size.
    """

    def __init__(self, release_bytes: int = 256 << 20, max_open: int = 64) -> None:
        self.paths: list[str] = []
        self._open: dict[int, tuple[pa.MemoryMappedFile | None, pa.Table]] = {}
        self._pinned: set[int] = set()  # maps whose slices the current group may still use
        self._read = 0
        self.release_bytes = release_bytes
        self.max_open = max_open
        #: per work file: kept rows that take a dropped row's branch hint (:func:`group_rows`)
        self.hints: dict[int, dict[int, str]] = {}

    def add(self, path: str) -> int:
        self.paths.append(path)
        return len(self.paths) - 1

    def table(self, i: int) -> pa.Table:
        """Work file ``i`` as a table (mapped; pinned until the next :meth:`maybe_release`).

        At most ``max_open`` files stay mapped: past that, maps no slice of the current group uses
        are closed, and if every one is in use the file is read into memory instead (its
        descriptor closed at once)."""
        if i not in self._open:
            if len(self._open) >= self.max_open:
                for j in [j for j in self._open if j not in self._pinned]:
                    self._close(j)
            if len(self._open) >= self.max_open:
                with pa.OSFile(self.paths[i], "rb") as f:
                    self._open[i] = (None, ipc.open_file(f).read_all())
            else:
                src = pa.memory_map(self.paths[i], "r")
                self._open[i] = (src, ipc.open_file(src).read_all())
        self._pinned.add(i)
        return self._open[i][1]

    def _close(self, i: int) -> None:
        src, _table = self._open.pop(i)
        del _table
        if src is not None:
            src.close()

    def group_ids(self, i: int) -> np.ndarray:
        """The ``group_id`` column of work file ``i``, read through a map closed at once."""
        with pa.memory_map(self.paths[i], "r") as src:
            col = ipc.open_file(src).read_all().column("group_id")
            return col.to_numpy(zero_copy_only=False)

    def drop_hints(self, i: int, drop: np.ndarray) -> None:
        """Which kept rows of work file ``i`` take the hint of a row ``drop`` leaves out."""
        with pa.memory_map(self.paths[i], "r") as src:
            self.hints[i] = carried_hints(ipc.open_file(src).read_all().select(HINT_COLUMNS), drop)

    def rows(self, i: int, rows: np.ndarray) -> pa.Table:
        """Rows ``rows`` (ascending) of work file ``i``: slices of the map, valid until release."""
        table = self.table(i)
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        parts = [table.slice(int(r[0]), len(r)) for r in np.split(rows, cuts)]
        out = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        self._read += 4 * sum(len(c.values) for c in out.column("tokens").chunks)
        return out

    def maybe_release(self) -> None:
        """Close every map if enough has been read since the last release (call between groups,
        when no slice handed out is in use any more)."""
        self._pinned.clear()
        if self._read >= self.release_bytes:
            self.release()

    def release(self) -> None:
        """Close every map now."""
        sources = [src for src, _ in self._open.values()]
        self._open.clear()  # drop the tables (and their buffers) before closing the maps
        self._pinned.clear()
        for src in sources:
            if src is not None:
                src.close()
        self._read = 0


#: per group id: (work file index, its rows ascending) for every work file holding the group
GroupRows = dict[str, list[tuple[int, np.ndarray]]]


def group_rows(
    work: WorkFiles, paths: Iterable[str], drop: Mapping[str, np.ndarray] | None = None
) -> GroupRows:
    """Add ``paths`` to ``work`` and find every group's rows in them, reading only ``group_id``;
    the rows ``drop`` lists for a path (duplicates, :mod:`treeprep.build.dedup`) are left out."""
    groups: GroupRows = {}
    for p in paths:
        ti = work.add(p)
        gids = work.group_ids(ti)
        keep = np.ones(len(gids), bool)
        if drop and p in drop:
            keep[np.asarray(drop[p], np.int64)] = False
            work.drop_hints(ti, drop[p])
        order = np.argsort(gids, kind="stable")
        sorted_g = gids[order]
        bounds = np.flatnonzero(sorted_g[1:] != sorted_g[:-1]) + 1
        for seg in np.split(order, bounds):
            seg = seg[keep[seg]]
            if len(seg):
                groups.setdefault(str(gids[seg[0]]), []).append((ti, np.sort(seg)))
    work.release()
    return groups


def group_sequences(work: WorkFiles, rows: list[tuple[int, np.ndarray]]) -> list[Sequence]:
    """One group's sequences, in work-file order (views into the maps: drop them before
    :meth:`WorkFiles.maybe_release`)."""
    seqs: list[Sequence] = []
    for ti, r in rows:
        part = rows_to_sequences(work.rows(ti, r), r)
        hints = work.hints.get(ti, {})
        for k, s in enumerate(part):
            s.branch_reason = hints.get(int(r[k]), s.branch_reason)
            if s.prefix >= 0:
                s.prefix += len(seqs)
            elif s.prefix_len > 0:  # its prefix row was left out (a duplicate): made whole
                s.tokens = whole_tokens(work.table(ti), int(r[k]))
                s.prefix_len = 0
        seqs.extend(part)
    return seqs


def whole_tokens(table: pa.Table, row: int) -> np.ndarray:
    """Row ``row`` of a work file's table with the prefix it shares put back: its whole tokens."""
    prefix_row = table.column("prefix_row")
    chain = [row]
    while (p := prefix_row[chain[-1]].as_py()) >= 0:
        chain.append(p)
    tokens, prefix_len = table.column("tokens"), table.column("prefix_len")
    whole = tokens[chain[-1]].values.to_numpy(zero_copy_only=False)
    for r in reversed(chain[:-1]):
        tail = tokens[r].values.to_numpy(zero_copy_only=False)
        whole = np.concatenate([whole[: prefix_len[r].as_py()], tail])
    return whole.astype(np.int32, copy=False)


def drop_rows(table: pa.Table, drop: np.ndarray) -> pa.Table:
    """A whole work file's table without the rows ``drop``, the rows that shared a prefix with
    a dropped row made whole (``prefix_row`` -1), and a dropped row's branch hint passed on
    (:mod:`treeprep.build.hints`)."""
    keep = np.ones(table.num_rows, bool)
    keep[np.asarray(drop, np.int64)] = False
    table = with_carried_hints(table, drop)
    prefix_row = table.column("prefix_row").to_numpy().copy()
    prefix_len = table.column("prefix_len").to_numpy().copy()
    fix = [r for r in np.flatnonzero(keep) if prefix_row[r] >= 0 and not keep[prefix_row[r]]]
    if fix:
        tokens = table.column("tokens").to_pylist()
        for r in fix:
            tokens[r] = whole_tokens(table, int(r)).tolist()
            prefix_row[r], prefix_len[r] = -1, 0
        i = table.schema.get_field_index
        table = table.set_column(i("tokens"), "tokens", pa.array(tokens, pa.list_(pa.int32())))
        table = table.set_column(i("prefix_row"), "prefix_row", pa.array(prefix_row, pa.int32()))
        table = table.set_column(i("prefix_len"), "prefix_len", pa.array(prefix_len, pa.int32()))
    return table.filter(pa.array(keep))
