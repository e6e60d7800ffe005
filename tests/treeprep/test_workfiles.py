"""treeprep/workfiles.py: rendered sequences survive the work-file format (an Arrow IPC round
trip through pyarrow's own writer and reader) field for field (all but ``order`` and ``extra``,
which the builder sets), with and without log-probs; an
atomic write leaves the new bytes and no temporary file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from treeprep.sequence import Sequence
from treeprep.workfiles import WORK_SCHEMA, rows_to_sequences, sequences_to_batch, write_atomic


def _seqs() -> list[Sequence]:
    return [
        Sequence(
            group_id="g1",
            tokens=np.array([5, 6, 7, 8, 9], np.int32),
            loss_spans=[(1, 3), (4, 5)],
            logprobs=np.array([-0.5, -0.25, -1.0], np.float32),
            ref_logprobs=np.array([-0.75, -0.125, -2.0], np.float32),
            reward=1.5,
            advantage=None,
            agent_id="sub",
            call_id="c1",
            source="a.jsonl:3",
            source_format="tokens",
            branch_reason="resample",
            trajectory_id="t1",
        ),
        Sequence(group_id="g2", tokens=np.array([1, 2], np.int32), loss_spans=[]),
        Sequence(group_id="g2", tokens=np.array([], np.int32), loss_spans=[(0, 0)]),
    ]


def _same(a: Sequence, b: Sequence) -> None:
    for name in a.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if name in ("extra", "order"):
            continue  # not stored in work files: the builder sets them
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert (x is None) == (y is None), name
            np.testing.assert_array_equal(x, y, err_msg=name)
            assert np.asarray(x).dtype == np.asarray(y).dtype, name
        else:
            assert x == y, name


def test_sequences_round_trip_through_arrow_ipc(tmp_path: Path) -> None:
    seqs = _seqs()
    batch = sequences_to_batch(seqs)
    assert batch.schema == WORK_SCHEMA
    path = tmp_path / "work.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, WORK_SCHEMA) as w:
        w.write_batch(batch)
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
    back = rows_to_sequences(table)
    assert len(back) == len(seqs)
    for a, b in zip(seqs, back, strict=True):
        _same(a, b)
    assert back[1].logprobs is None and back[1].ref_logprobs is None


def test_all_rows_with_logprobs_use_the_flat_list_path() -> None:
    seqs = [_seqs()[0], _seqs()[0]]
    table = pa.Table.from_batches([sequences_to_batch(seqs)])
    assert table.column("logprobs").null_count == 0
    for a, b in zip(seqs, rows_to_sequences(table), strict=True):
        _same(a, b)


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(b"old")
    write_atomic(str(path), b"new bytes")
    assert path.read_bytes() == b"new bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
