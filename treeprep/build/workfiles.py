"""Stage 1's work files: one folder per input file under ``OUT/.work/<key>/``.

A folder holds ``sequences.arrow`` (an uncompressed Arrow IPC file of rendered sequences,
:data:`WORK_SCHEMA`), ``rejects.jsonl`` (written as the rejects come: :class:`RejectLog`)
and, written last, ``done.json`` (a :class:`FileResult`): the marker that makes a rerun skip the
file (datatrove's one marker per finished unit). The key hashes the file's bytes, the format, the
options and the tokenizer identity, so any change to those makes a new folder instead of reusing a
stale one.

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
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.atomic import commit, crash_point, sha256_of, write_atomic, writing
from treeprep.build.hints import HINT_COLUMNS, carried_hints, with_carried_hints
from treeprep.io.reads import stale
from treeprep.sequence import Sequence, common_prefix

WORK_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("tokens", pa.list_(pa.int32())),
        ("loss_spans", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("agent_id", pa.string()),
        ("call_id", pa.string()),
        ("source", pa.string()),
        ("source_format", pa.string()),
        ("branch_reason", pa.string()),
        ("trajectory_id", pa.string()),
        ("ref_logprobs", pa.list_(pa.float32())),
        # the row of this file whose first prefix_len tokens come before ``tokens`` (-1: none)
        ("prefix_row", pa.int32()),
        ("prefix_len", pa.int32()),
        # a digest of the whole sequence (tokens, loss spans, log-probs, reward, advantage):
        # the cross-file deduplication's key (:mod:`treeprep.build.dedup`)
        ("digest", pa.binary(16)),
        # how the renderer normalized the call (comma-separated kinds of
        # :mod:`treeprep.render.coverage`, and the gaps of its prompt, :mod:`treeprep.render.gaps`;
        # null: none), so that deduplication can take a dropped row's kinds out of the manifest's
        # ``normalized`` and ``prompt_gaps`` counts
        ("normalized", pa.string()),
    ]
)
#: the layout of a work file: part of every work folder's key, so a rerun after a change of
#: layout never reads an older folder
WORK_FORMAT = "6: prefix_row, prefix_len, digest, normalized (+ prompt gaps); done.json reads"
#: sequences per record batch of a work file
WORK_BATCH = 512
SEQUENCES = "sequences.arrow"
REJECTS = "rejects.jsonl"
DONE = "done.json"
#: the plain (non-list) columns of a work file, besides tokens, loss spans and log-probs
_SCALARS = (
    "group_id",
    "reward",
    "advantage",
    "agent_id",
    "call_id",
    "source",
    "source_format",
    "branch_reason",
    "trajectory_id",
)


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


class PrefixSharing:
    """Stage 1's side of shared prefixes: a sequence keeps only the tokens after its common
    prefix with the row before it when that row is of the same group (``prefix_row``,
    ``prefix_len``). The turns of one conversation, and the calls of an agent session logged in
    a row, then cost the work file what they add, not their whole history again: a record of N
    turns writes O(N) tokens, not O(N^2). Only the previous row's tokens are held."""

    def __init__(self) -> None:
        self._gid: str | None = None
        self._tokens: np.ndarray | None = None
        self._row = -1

    def share(self, seq: Sequence, row: int) -> Sequence:
        """``seq`` (row ``row`` of the work file) with its prefix shared, where it has one."""
        whole = seq.tokens
        if self._tokens is not None and self._gid == seq.group_id:
            p = common_prefix(whole, self._tokens)
            if p > 0:
                seq.tokens = whole[p:].copy()  # a copy: a view would keep the whole array
                seq.prefix, seq.prefix_len = self._row, p
        self._gid, self._tokens, self._row = seq.group_id, whole, row
        return seq


class TokenHashes:
    """The hash of each row's tokens, going on from the row before's where the row starts with
    all of its tokens (an agent session's calls each extend the last: hashing each whole would
    cost a session's build time quadratic in its length). ``hashlib``'s ``copy()`` keeps the
    state, so the hash equals the hash of the whole token bytes."""

    def __init__(self) -> None:
        self._state: Any = None
        self._len = 0

    def of(self, tokens: np.ndarray, shared: int) -> Any:
        """The blake2b state fed with ``tokens`` (int32 bytes); ``shared``: how many of its first
        tokens equal the row before's (0 when unknown)."""
        ids = np.asarray(tokens, np.int32)
        if self._state is not None and shared == self._len:
            h = self._state.copy()
            h.update(ids[shared:].tobytes())
        else:
            h = hashlib.blake2b(digest_size=16)
            h.update(ids.tobytes())
        self._state, self._len = h.copy(), len(ids)
        return h


def sequence_digest(seq: Sequence, tokens_hash: Any = None) -> bytes:
    """16 bytes naming what a sequence trains: its tokens, loss spans, log-probs, reward and
    advantage (not its group, call or file), for deduplication across files. ``tokens_hash``: a
    blake2b state already fed with the whole sequence's token bytes (:class:`TokenHashes`).

    >>> ids = np.arange(4, dtype=np.int32)
    >>> a = Sequence(tokens=ids, loss_spans=[(2, 4)], group_id="g")
    >>> b = Sequence(tokens=ids, loss_spans=[(1, 4)], group_id="g")
    >>> c = Sequence(tokens=ids, loss_spans=[(2, 4)], group_id="other", call_id="x")
    >>> sequence_digest(a) == sequence_digest(c), sequence_digest(a) == sequence_digest(b)
    (True, False)
    """
    h = tokens_hash
    if h is None:
        h = hashlib.blake2b(digest_size=16)
        h.update(np.asarray(seq.tokens, np.int32).tobytes())
    h.update(orjson.dumps([list(map(int, sp)) for sp in seq.loss_spans]))
    h.update(orjson.dumps([seq.reward, seq.advantage]))
    for lp in (seq.logprobs, seq.ref_logprobs):
        h.update(b"-" if lp is None else b"+" + np.asarray(lp, np.float32).tobytes())
    return h.digest()


def sequences_to_batch(
    seqs: list[Sequence],
    digests: list[bytes] | None = None,
    normalized: list[str | None] | None = None,
) -> pa.RecordBatch:
    """Rendered sequences as one record batch of :data:`WORK_SCHEMA`; ``digests`` are their
    :func:`sequence_digest` values, taken before prefix sharing cut their tokens (default:
    computed from the sequences as they are); ``normalized``, how the renderer normalized each
    (default: none was)."""
    cols: dict[str, Any] = {k: [getattr(s, k) for s in seqs] for k in _SCALARS}
    cols["normalized"] = pa.array(
        normalized if normalized is not None else [None] * len(seqs), pa.string()
    )
    cols["digest"] = pa.array(
        digests if digests is not None else [sequence_digest(s) for s in seqs], pa.binary(16)
    )
    cols["prefix_row"] = pa.array([s.prefix for s in seqs], pa.int32())
    cols["prefix_len"] = pa.array([s.prefix_len for s in seqs], pa.int32())
    # list columns from one flat array and offsets (a list of per-row arrays converts row by row)
    cols["tokens"] = _list_array([s.tokens for s in seqs], np.int32)
    cols["loss_spans"] = _list_array([np.asarray(s.loss_spans).reshape(-1) for s in seqs], np.int32)
    lps = [s.logprobs for s in seqs]
    if any(lp is None for lp in lps):
        cols["logprobs"] = pa.array(lps, type=pa.list_(pa.float32()))
    else:
        cols["logprobs"] = _list_array(lps, np.float32)
    refs = [s.ref_logprobs for s in seqs]
    if any(r is None for r in refs):
        cols["ref_logprobs"] = pa.array(refs, type=pa.list_(pa.float32()))
    else:
        cols["ref_logprobs"] = _list_array(refs, np.float32)
    return pa.RecordBatch.from_pydict(
        {name: cols[name] for name in WORK_SCHEMA.names}, schema=WORK_SCHEMA
    )


def _list_array(rows: list[Any], dtype: Any) -> pa.ListArray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    flat = np.concatenate(rows).astype(dtype, copy=False) if rows else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def rows_to_sequences(
    table: pa.Table, rows: np.ndarray | None = None, files: np.ndarray | None = None
) -> list[Sequence]:
    """Work-file rows back as :class:`Sequence` objects (token arrays are views of the table).

    ``rows`` are the rows' numbers in their work file (default: 0, 1, ...) and ``files`` which
    work file each row is from (default: one file); a sequence that
    shares a prefix with an earlier row (``prefix_row``) gets that row's position in the list
    returned as its ``prefix``, as :func:`treeprep.trie.build_tree` takes it. A group's rows of
    one file always hold the rows they share a prefix with (stage 1 shares only with the row
    before, of the same group)."""
    out = []
    tokens = table.column("tokens")
    spans = table.column("loss_spans").to_pylist()
    lps = table.column("logprobs")
    refs = table.column("ref_logprobs")
    cols = {k: table.column(k).to_pylist() for k in _SCALARS}
    prefix_row = table.column("prefix_row").to_numpy()
    prefix_len = table.column("prefix_len").to_pylist()
    numbers = np.arange(table.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    file_of = np.zeros(table.num_rows, np.int64) if files is None else np.asarray(files, np.int64)
    where = {(int(f), int(r)): i for i, (f, r) in enumerate(zip(file_of, numbers, strict=True))}
    for i in range(table.num_rows):
        lp = lps[i]
        ref = refs[i]
        sp = spans[i]
        out.append(
            Sequence(
                tokens=tokens[i].values.to_numpy(zero_copy_only=False),
                loss_spans=list(zip(sp[0::2], sp[1::2], strict=True)),
                logprobs=None if not lp.is_valid else lp.values.to_numpy(zero_copy_only=False),
                ref_logprobs=(
                    None if not ref.is_valid else ref.values.to_numpy(zero_copy_only=False)
                ),
                # a prefix row outside these rows (a duplicate left out) keeps prefix -1 and its
                # prefix_len: group_sequences puts the prefix's tokens back
                prefix=-1
                if prefix_row[i] < 0
                else where.get((int(file_of[i]), int(prefix_row[i])), -1),
                prefix_len=prefix_len[i],
                **{k: v[i] for k, v in cols.items()},
            )
        )
    return out


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
