"""Deduplication across input files, between stage 1 and stage 2 of a build.

The same log given twice (two copies, a resumed session that repeats the calls before it, a
dataset shipped in two splits) would otherwise be trained twice and inflate the speedup
estimate. After stage 1, :func:`find_duplicates` reads the small columns of every work file, in
job order, and marks a row as a duplicate of an earlier file's row when its **token sequence** is
the same: the :func:`~treeprep.build.workrows.sequence_digest` of its tokens, loss spans,
log-probs, reward and advantage. The reason says whether its **call identity** is the same too,
``(source_format, group_id, trajectory_id, agent_id, call_id)``: ``duplicate call`` (a copy of
the call), else ``duplicate tokens`` (the same text under another group or call id). Ids alone
never make a duplicate: logs reuse them across files (Harbor's golden files normalize session
ids, agent-data-protocol repeats a task's id in every file), and two trials of one task may
number their calls alike.

Rows of one file are never duplicates of each other: the trie already merges exact copies within
a group and keeps their count (k samples of one prompt are k samples). A kept row that stage 1
stored as a suffix of a dropped row (prefix sharing) gets its whole tokens back in stage 2
(:func:`~treeprep.build.workfiles.group_sequences`, :func:`~treeprep.build.workfiles.drop_rows`).
Each dropped row is one record,
counted in the manifest as filtered (``duplicate call`` or ``duplicate tokens``), so
``records_read == records_in_trees + records_rejected + records_filtered`` still holds; a
dropped row that the renderer normalized is taken out of the manifest's ``normalized`` counts
too (:attr:`Duplicates.normalized`), which count calls in trees. A build
with no duplicates drops nothing and writes the same bytes as without this pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["DUPLICATE_CALL", "DUPLICATE_TOKENS", "Duplicates", "find_duplicates"]

#: the filtered reasons of rows this pass drops
DUPLICATE_CALL = "duplicate call"
DUPLICATE_TOKENS = "duplicate tokens"

_COLUMNS = ["source_format", "group_id", "trajectory_id", "agent_id", "call_id", "digest"]
_READ = [*_COLUMNS, "normalized"]


@dataclass
class Duplicates:
    """What :func:`find_duplicates` found."""

    #: per work file path: the rows to leave out of the trees (ascending)
    drop: dict[str, np.ndarray] = field(default_factory=dict)
    #: per input file name: rows dropped, by reason
    by_file: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per input file name: rows dropped that the renderer had normalized, by kind
    normalized: dict[str, dict[str, int]] = field(default_factory=dict)


def find_duplicates(paths: list[tuple[str, str]]) -> Duplicates:
    """``paths``: (input file name, work file path) in job order. The rows of later files that
    repeat a call or a token sequence of an earlier file (see the module docstring)."""
    calls: dict[tuple, int] = {}
    digests: dict[bytes, int] = {}
    out = Duplicates()
    for fi, (name, path) in enumerate(paths):
        with pa.memory_map(path, "r") as src:
            table = ipc.open_file(src).read_all().select(_READ)
        cols = {k: table.column(k).to_pylist() for k in _READ}
        n = table.num_rows
        why: list[str | None] = [None] * n
        for r in range(n):
            digest = cols["digest"][r]
            call = (*(cols[k][r] for k in _COLUMNS[:-1]), digest)
            if cols["call_id"][r] is not None and calls.get(call, fi) != fi:
                why[r] = DUPLICATE_CALL
            elif digests.get(digest, fi) != fi:
                why[r] = DUPLICATE_TOKENS
            calls.setdefault(call, fi)
            digests.setdefault(digest, fi)
        dropped = [r for r in range(n) if why[r] is not None]
        if dropped:
            out.drop[path] = np.asarray(dropped, np.int64)
            counts = out.by_file.setdefault(name, {})
            for r in dropped:
                reason = why[r]
                assert reason is not None
                counts[reason] = counts.get(reason, 0) + 1
                for kind in (cols["normalized"][r] or "").split(","):
                    if kind:
                        kinds = out.normalized.setdefault(name, {})
                        kinds[kind] = kinds.get(kind, 0) + 1
    return out
