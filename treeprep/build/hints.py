"""Branch hints of calls that leave no sequence behind, passed on to the call that takes the branch.

An adapter hints the call where a branch starts (``compaction`` on the first call after a
summary, ``sub-agent`` on a sub-agent's first call, :mod:`treeprep.trie`). When that call leaves
no sequence, the branch starts at the next call of its thread that does, and that call carries
no hint: the tree would show the branch as ``unknown``. Two steps of a build leave calls out:

* stage 1 rejects a call the renderer cannot render (Codex's freeform ``apply_patch`` through a
  template that writes tool arguments as JSON) and leaves out the calls the curator's filters
  drop (:mod:`treeprep.build.files`);
* deduplication drops a row whose tokens an earlier file already holds
  (:mod:`treeprep.build.dedup`), which may be a call of another group.

One rule for both (:class:`HeldHints`): the hint of a call left out waits for the next kept call
of the same thread, ``(group, trajectory, agent)`` in the same file, and that call takes it when
it has none of its own. Only hints move: no token, loss span or order changes.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pyarrow as pa

__all__ = ["HINT_COLUMNS", "HeldHints", "carried_hints", "with_carried_hints"]

#: the work-file columns :func:`carried_hints` reads: the thread, then the hint
HINT_COLUMNS = ["group_id", "trajectory_id", "agent_id", "branch_reason"]


class HeldHints:
    """The hint of the last call left out of each thread, until a kept call of it takes it."""

    def __init__(self) -> None:
        self._held: dict[Hashable, str] = {}

    def hold(self, thread: Hashable, hint: str | None) -> None:
        """A call of ``thread`` with ``hint`` is left out."""
        if hint:
            self._held[thread] = hint

    def take(self, thread: Hashable, hint: str | None) -> str | None:
        """The hint of a kept call of ``thread`` whose own is ``hint``: its own, else the one
        held for the thread (taken: it names one branch)."""
        held = self._held.pop(thread, None)
        return hint or held


def carried_hints(table: pa.Table, drop: np.ndarray) -> dict[int, str]:
    """Row -> hint for the kept rows of a work file (``table``, at least :data:`HINT_COLUMNS`)
    that take the hint of a row ``drop`` leaves out."""
    drop = np.asarray(drop, np.int64)
    if not any(table.column("branch_reason").take(pa.array(drop)).to_pylist()):
        return {}  # no row left out carries a hint (most builds): nothing more to read
    dropped = np.zeros(table.num_rows, bool)
    dropped[drop] = True
    cols = [table.column(k).to_pylist() for k in HINT_COLUMNS]
    held = HeldHints()
    out: dict[int, str] = {}
    for r, (gid, traj, agent, hint) in enumerate(zip(*cols, strict=True)):
        if dropped[r]:
            held.hold((gid, traj, agent), hint)
        elif (taken := held.take((gid, traj, agent), hint)) != hint and taken is not None:
            out[r] = taken
    return out


def with_carried_hints(table: pa.Table, drop: np.ndarray) -> pa.Table:
    """``table`` (a whole work file) with the hints :func:`carried_hints` passes on set."""
    hints = carried_hints(table, drop)
    if not hints:
        return table
    reasons = table.column("branch_reason").to_pylist()
    for r, h in hints.items():
        reasons[r] = h
    i = table.schema.get_field_index("branch_reason")
    return table.set_column(i, "branch_reason", pa.array(reasons, pa.string()))
