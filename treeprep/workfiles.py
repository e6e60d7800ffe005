"""Stage 1's work files: one folder per input file under ``OUT/.work/<key>/``.

A folder holds ``sequences.arrow`` (an uncompressed Arrow IPC file of rendered sequences,
:data:`WORK_SCHEMA`), ``rejects.jsonl`` and, written last, ``done.json`` (a :class:`FileResult`):
the marker that makes a rerun skip the file (datatrove's one marker per finished unit). The key
hashes the file's bytes, the format, the options and the tokenizer identity, so any change to
those makes a new folder instead of reusing a stale one.

Stage 2 reads the folders back: :func:`group_rows` finds every group's rows across the work files
from their ``group_id`` columns alone, and :class:`WorkFiles` hands out a group's rows as zero-copy
slices of the memory-mapped files, giving mapped pages back now and then so that memory stays
bounded whatever the input size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.sequence import Sequence

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
    ]
)
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


@dataclass
class FileJob:
    """One input file of a build and the work folder its stage-1 output goes to."""

    path: str
    explicit: bool
    key: str
    work_dir: str
    sha256: str
    size: int

    def is_done(self) -> bool:
        """Whether an earlier run finished this file (its ``done.json`` exists)."""
        return os.path.exists(os.path.join(self.work_dir, DONE))

    def sequences_path(self) -> str:
        return os.path.join(self.work_dir, SEQUENCES)

    def rejects_path(self) -> str:
        return os.path.join(self.work_dir, REJECTS)


@dataclass
class FileResult:
    """What stage 1 made of one file; stored as its ``done.json``."""

    path: str
    format: str
    records_read: int
    records_rejected: int
    sequences: int
    skipped: bool = False


def finish_file(job: FileJob, result: FileResult, rejects: list[dict]) -> None:
    """Write the file's rejects, then its ``done.json`` marker, each atomically."""
    rej_path = job.rejects_path()
    with open(rej_path + ".tmp", "wb") as f:
        for r in rejects:
            f.write(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) + b"\n")
    os.replace(rej_path + ".tmp", rej_path)
    done = os.path.join(job.work_dir, DONE)
    with open(done + ".tmp", "w", encoding="utf-8") as f:
        json.dump(asdict(result), f)
    os.replace(done + ".tmp", done)


def read_result(job: FileJob) -> FileResult:
    """The ``done.json`` of a file an earlier run finished."""
    with open(os.path.join(job.work_dir, DONE), encoding="utf-8") as f:
        return FileResult(**json.load(f))


def sequences_to_batch(seqs: list[Sequence]) -> pa.RecordBatch:
    """Rendered sequences as one record batch of :data:`WORK_SCHEMA`."""
    cols: dict[str, list] = {k: [getattr(s, k) for s in seqs] for k in _SCALARS}
    cols["tokens"] = [s.tokens for s in seqs]
    cols["loss_spans"] = [np.asarray(s.loss_spans, dtype=np.int32).reshape(-1) for s in seqs]
    cols["logprobs"] = [s.logprobs for s in seqs]
    cols["ref_logprobs"] = [s.ref_logprobs for s in seqs]
    return pa.RecordBatch.from_pydict(
        {name: cols[name] for name in WORK_SCHEMA.names}, schema=WORK_SCHEMA
    )


def rows_to_sequences(table: pa.Table) -> list[Sequence]:
    """Work-file rows back as :class:`Sequence` objects (token arrays are views of the table)."""
    out = []
    tokens = table.column("tokens")
    spans = table.column("loss_spans").to_pylist()
    lps = table.column("logprobs")
    refs = table.column("ref_logprobs")
    cols = {k: table.column(k).to_pylist() for k in _SCALARS}
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

    def __init__(self, release_bytes: int = 256 << 20) -> None:
        self.paths: list[str] = []
        self._open: dict[int, tuple[pa.MemoryMappedFile, pa.Table]] = {}
        self._read = 0
        self.release_bytes = release_bytes

    def add(self, path: str) -> int:
        self.paths.append(path)
        return len(self.paths) - 1

    def table(self, i: int) -> pa.Table:
        if i not in self._open:
            src = pa.memory_map(self.paths[i], "r")
            self._open[i] = (src, ipc.open_file(src).read_all())
        return self._open[i][1]

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
        if self._read >= self.release_bytes:
            self.release()

    def release(self) -> None:
        """Close every map now."""
        sources = [src for src, _ in self._open.values()]
        self._open.clear()  # drop the tables (and their buffers) before closing the maps
        for src in sources:
            src.close()
        self._read = 0


#: per group id: (work file index, its rows ascending) for every work file holding the group
GroupRows = dict[str, list[tuple[int, np.ndarray]]]


def group_rows(work: WorkFiles, paths: Iterable[str]) -> GroupRows:
    """Add ``paths`` to ``work`` and find every group's rows in them, reading only ``group_id``."""
    groups: GroupRows = {}
    for p in paths:
        ti = work.add(p)
        gids = work.table(ti).column("group_id").to_numpy(zero_copy_only=False)
        order = np.argsort(gids, kind="stable")
        sorted_g = gids[order]
        bounds = np.flatnonzero(sorted_g[1:] != sorted_g[:-1]) + 1
        for seg in np.split(order, bounds):
            if len(seg):
                groups.setdefault(str(gids[seg[0]]), []).append((ti, np.sort(seg)))
    work.release()
    return groups


def group_sequences(work: WorkFiles, rows: list[tuple[int, np.ndarray]]) -> list[Sequence]:
    """One group's sequences, in work-file order (views into the maps: drop them before
    :meth:`WorkFiles.maybe_release`)."""
    seqs: list[Sequence] = []
    for ti, r in rows:
        seqs.extend(rows_to_sequences(work.rows(ti, r)))
    return seqs
