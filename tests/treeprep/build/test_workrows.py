"""treeprep.build.workrows: rendered sequences survive the work-file format (an Arrow IPC round
trip through pyarrow's own writer and reader) field for field (all but ``order`` and ``extra``,
which the builder sets), with and without log-probs, and shared prefixes stay linked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from treeprep.build.workrows import (
    WORK_SCHEMA,
    PrefixSharing,
    TokenHashes,
    rows_to_sequences,
    sequence_digest,
    sequences_to_batch,
)
from treeprep.sequence import Sequence


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


# ---- issue 26 item 6: one long conversation costs its work file and memory O(turns) -------------


def _long_conversation(path: Path, turns: int) -> None:
    import json

    msgs = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i}"})
        msgs.append({"role": "assistant", "content": f"a{i}"})
    path.write_text(json.dumps({"messages": msgs}) + "\n")


def test_regression_one_conversation_wrote_every_history_again(tmp_path: Path) -> None:
    """Every target kept messages[:i]: 4,000 turns wrote 146 MB of work files (and held 2.6 GB)."""
    import pyarrow.ipc as ipc

    from treeprep.build import BuildConfig, build

    _long_conversation(tmp_path / "c.jsonl", 300)
    m = build(BuildConfig(inputs=[str(tmp_path / "c.jsonl")], out=str(tmp_path / "o")))
    (work,) = (tmp_path / "o" / ".work").glob("*/sequences.arrow")
    table = ipc.open_file(pa.memory_map(str(work))).read_all()
    stored = sum(len(x) for x in table.column("tokens").to_pylist())
    assert m.counts.sequences == 300
    assert m.counts.tokens_linear > 100 * m.counts.tokens_tree  # quadratic without sharing
    assert stored <= 2 * m.counts.tokens_tree  # linear: each turn adds only its own tokens


def test_regression_one_conversation_held_every_history_at_once(tmp_path: Path) -> None:
    import tracemalloc

    from treeprep.formats import ReadOptions, get_format

    _long_conversation(tmp_path / "c.jsonl", 400)
    size = (tmp_path / "c.jsonl").stat().st_size
    spec = get_format("chat-messages")
    tracemalloc.start()
    try:
        n = sum(1 for _ in spec.read(str(tmp_path / "c.jsonl"), ReadOptions()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 400
    # before the fix: 400 calls of up to 800 messages each, all alive (about 40 MB)
    assert peak < 400 * size, f"{peak:,} bytes for a {size:,}-byte record"


def test_shared_prefix_rows_round_trip_and_link_to_their_row() -> None:
    from treeprep.build.workrows import PrefixSharing

    share = PrefixSharing()
    whole = [[1, 2, 3, 4], [1, 2, 3, 9, 9], [7], [7, 8]]
    gids = ["a", "a", "a", "b"]
    seqs = [
        share.share(Sequence(group_id=g, tokens=np.array(t), loss_spans=[(0, len(t))]), i)
        for i, (g, t) in enumerate(zip(gids, whole, strict=True))
    ]
    assert [(s.prefix, s.prefix_len, s.tokens.tolist()) for s in seqs] == [
        (-1, 0, [1, 2, 3, 4]),
        (0, 3, [9, 9]),
        (-1, 0, [7]),  # no common prefix
        (-1, 0, [7, 8]),  # another group: never shared
    ]
    table = pa.Table.from_batches([sequences_to_batch(seqs)])
    back = rows_to_sequences(table.slice(0, 3), np.array([0, 1, 2]))  # group a's rows
    assert [(s.prefix, s.prefix_len, s.tokens.tolist()) for s in back] == [
        (s.prefix, s.prefix_len, s.tokens.tolist()) for s in seqs[:3]
    ]
    assert [s.length for s in back] == [4, 5, 1]


def test_chained_token_hashes_give_each_sequence_its_whole_digest() -> None:
    """An agent session's rows each extend the last (the hash goes on from the row before's);
    a retry, another group, a shorter row and a longer row that diverges start afresh. Every
    digest equals the digest of the whole sequence hashed alone."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 1000, 50, dtype=np.int32)
    tokens = [base[:10], base[:25], base[:50], base[:30], np.concatenate([base[:20], base[:5]])]
    groups = ["g", "g", "g", "g", "h"]
    tokens += [np.concatenate([base, base]), base[:60]]
    groups += ["h", "h"]
    sharing, hashes = PrefixSharing(), TokenHashes()
    for row, (ids, gid) in enumerate(zip(tokens, groups, strict=True)):
        seq = Sequence(tokens=ids, loss_spans=[(1, len(ids))], group_id=gid, reward=float(row))
        alone = sequence_digest(Sequence(tokens=ids.copy(), loss_spans=seq.loss_spans,
                                         group_id=gid, reward=seq.reward))  # fmt: skip
        sharing.share(seq, row)
        shared = seq.prefix_len if seq.prefix >= 0 else 0
        assert sequence_digest(seq, hashes.of(ids, shared)) == alone, row
