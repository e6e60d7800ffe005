"""A rendered sequence as a row of a work file (:mod:`treeprep.build.workfiles`) and back.

:data:`WORK_SCHEMA` is the layout, and :data:`WORK_FORMAT` names it in every work folder's key.
Stage 1 writes a sequence with the tokens after the prefix it shares with the row before
(:class:`PrefixSharing`) and a digest of what it trains (:func:`sequence_digest`, the key of the
cross-file deduplication; :class:`TokenHashes` hashes a session's calls without hashing each
history again); stage 2 reads rows back as sequences (:func:`rows_to_sequences`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

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
