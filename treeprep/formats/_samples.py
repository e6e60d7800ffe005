"""The ``sampling`` branch hint: the first call of each sample (run) a log names.

A GRPO group holds k samples of one task, and a NeMo-Gym file the rollouts of its tasks: their trees
branch where two samples' tokens first differ, which is often a call after the one that started the
sample. An adapter whose records name their sample (a trajectory id among
:data:`~treeprep.formats.openai_chat.TRAJECTORY_KEYS`, or a NeMo-Gym record: its
``responses_create_params``, ``_ng_task_index`` or ``_ng_rollout_index``; one record is one rollout)
hints the first call of each sample ``sampling``; :func:`treeprep.trie.build_tree` carries the hint
to where the sample leaves another sample's path (``RUN_REASONS``). The group's first sample carries
the hint too and it never shows: the earliest sample is the main continuation at every branch of its
path.

Memory: one id per sample of the file (the calls of a sample need not be adjacent).
"""

from __future__ import annotations

from typing import Any

from treeprep.formats.base import Item
from treeprep.formats.openai_chat import RecordError, trajectory_of
from treeprep.schemas import Reject

_NEMO_KEYS = ("_ng_task_index", "_ng_rollout_index")


def names_sample(rec: Any) -> bool:
    """Whether a record says which sample it belongs to (a bad id is the record's reject)."""
    if not isinstance(rec, dict):
        return False
    if any(k in rec for k in _NEMO_KEYS) or isinstance(rec.get("responses_create_params"), dict):
        return True
    try:
        return trajectory_of(rec) is not None
    except RecordError:
        return False


class Samples:
    """One file's samples seen so far; :meth:`mark` hints the first call of each new one."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def mark(self, rec: Any, items: list[Item]) -> list[Item]:
        """``items`` (one record's), the first call of a sample not met before hinted
        ``sampling`` where it has no hint of its own; unchanged when ``rec`` names no sample."""
        if not names_sample(rec):
            return items
        for item in items:
            if isinstance(item, Reject) or item.trajectory_id is None:
                continue
            if item.trajectory_id not in self._seen:
                self._seen.add(item.trajectory_id)
                if item.branch_reason is None:
                    item.branch_reason = "sampling"
        return items
