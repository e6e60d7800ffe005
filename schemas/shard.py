"""The Arrow schema of a tree shard: one row per tree (one tree per group).

Layout of a row (all ``node_*`` lists have ``num_nodes`` entries, all ``seq_*`` lists have
``num_sequences`` entries):

* ``input_ids``: the trie's tokens laid out once, nodes in DFS pre-order, each node's tokens
  contiguous. ``len(input_ids) == tokens_tree``.
* ``node_parent[i]``: pre-order index of node i's parent, -1 for a root (a group may hold several
  roots: a sub-agent with its own system prompt, the thread after a compaction).
* ``node_offset[i]``, ``node_length[i]``: node i is ``input_ids[offset : offset + length]``.
* ``node_depth[i]``: the position id (depth along the root-to-leaf path) of node i's first token;
  token k of node i has position ``node_depth[i] + k``.
* ``node_last[i]``: the largest pre-order index in node i's subtree. Token a may attend to token b
  iff ``pre(b) <= pre(a) <= last(b)`` and, within one node, b <= a.
* ``node_branch_reason[i]``: why node i branches off (``""`` for a node that is its parent's main
  continuation, or the first root); one of :data:`treeprep.schemas.BRANCH_REASONS` otherwise.
* ``node_num_sequences[i]``: input sequences (duplicates counted) whose path passes through node i.
* ``seq_node[s]``: the node where sequence s ends (sequences end on node boundaries; a sequence may
  end at an inner node). The sequence is the root-to-``seq_node`` path, ``seq_length[s]`` tokens.
* ``seq_count[s]``: how many identical input sequences were merged into this entry (identical
  tokens, loss spans, reward, advantage and log-probs).
* ``seq_loss_spans[s]``: flat ``[start0, end0, start1, end1, ...]`` half-open spans of trained
  tokens, in depth coordinates (0 = the path's first token).
* ``seq_logprobs[s]``: the sampler's log-probs of the trained tokens in order, or null.
* ``seq_reward[s]``, ``seq_advantage[s]``: nullable floats.
* ``seq_trajectory_id[s]``: the sample (one agent run: its main thread and sub-agents) the
  sequence belongs to; a tree (a group) holds one or several (a GRPO group of k samples). RL
  advantages from rewards are normalized over the tree's trajectories, not its sequences, and
  ``trajectory-mean`` averages the loss per trajectory.
* ``seq_ref_logprobs[s]``: a reference policy's log-probs of the trained tokens in order (what a
  KL penalty compares against), or null.

:func:`validate_tree_row` checks one row against this layout (what a trainer must be able to rely
on before it packs a tree): node columns of one length, nodes contiguous in DFS order, parents
before children, subtree ends and depths consistent, sequence columns of one length, loss spans in
pairs and per-token values (log-probs) of one per trained token.

With these, any normalization of the linearized loss (token sum, per-sequence mean, batch token
mean, GRPO's 1/(G|o_i|)) and any advantage weighting can be restored exactly per token.

Reading is checked: a shard of a build is only handed to Arrow after its size and sha256 match
its manifest entry (:func:`read_shard`), so a flipped bit stops the reader with a
:class:`~treeprep.errors.ShardError` naming the shard instead of changing tokens silently or
crashing inside Arrow's decoder. Hashing reads the file once per process (about 1 GB/s); a shard
already verified and unchanged since (same size and modification time) is not hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.errors import ShardError
from treeprep.schemas.manifest import check_relative_path, manifest_bytes

#: 2: ``seq_trajectory_id`` and ``seq_ref_logprobs`` (version 1 shards cannot tell a
#: trajectory's calls apart, so their group advantages would be per sequence: they are refused)
SCHEMA_VERSION = 2

_i32 = pa.int32()
_l32 = pa.list_(pa.int32())

TREE_SCHEMA = pa.schema(
    [
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("source_format", pa.string(), nullable=False),
        pa.field("num_nodes", _i32, nullable=False),
        pa.field("num_sequences", _i32, nullable=False),
        pa.field("tokens_tree", pa.int64(), nullable=False),
        pa.field("tokens_linear", pa.int64(), nullable=False),
        pa.field("input_ids", _l32, nullable=False),
        pa.field("node_parent", _l32, nullable=False),
        pa.field("node_offset", _l32, nullable=False),
        pa.field("node_length", _l32, nullable=False),
        pa.field("node_depth", _l32, nullable=False),
        pa.field("node_last", _l32, nullable=False),
        pa.field("node_branch_reason", pa.list_(pa.string()), nullable=False),
        pa.field("node_num_sequences", _l32, nullable=False),
        pa.field("seq_node", _l32, nullable=False),
        pa.field("seq_length", _l32, nullable=False),
        pa.field("seq_count", _l32, nullable=False),
        pa.field("seq_loss_spans", pa.list_(_l32), nullable=False),
        pa.field("seq_logprobs", pa.list_(pa.list_(pa.float32())), nullable=False),
        pa.field("seq_reward", pa.list_(pa.float64()), nullable=False),
        pa.field("seq_advantage", pa.list_(pa.float64()), nullable=False),
        pa.field("seq_agent_id", pa.list_(pa.string()), nullable=False),
        pa.field("seq_call_id", pa.list_(pa.string()), nullable=False),
        pa.field("seq_source", pa.list_(pa.string()), nullable=False),
        pa.field("seq_trajectory_id", pa.list_(pa.string()), nullable=False),
        pa.field("seq_ref_logprobs", pa.list_(pa.list_(pa.float32())), nullable=False),
    ],
    metadata={b"treeprep.schema_version": str(SCHEMA_VERSION).encode()},
)


def _shard_list(out_dir: str) -> list[dict]:
    path, raw = manifest_bytes(out_dir)
    try:
        shards = json.loads(raw)["shards"]
        if not isinstance(shards, list) or not all(isinstance(s["path"], str) for s in shards):
            raise TypeError("'shards' is not a list of entries with a string 'path'")
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(f"{path}: no list of shards with paths ({e})") from e
    return shards


def shard_path(out_dir: str, rel: str) -> str:
    """``OUT/rel`` for a shard path a manifest or plan names; ShardError unless it stays inside
    ``OUT`` (no ``..``, no absolute path, no link leading out)."""
    try:
        check_relative_path(rel)
    except ValueError as e:
        raise ShardError(f"{out_dir}: shard {e}") from e
    full = os.path.join(out_dir, *rel.split("/"))
    root = os.path.realpath(out_dir)
    if os.path.commonpath([root, os.path.realpath(full)]) != root:
        raise ShardError(f"{full}: the shard path leads out of the build folder {out_dir}")
    return full


def shard_paths(out_dir: str) -> list[str]:
    """The shard files of a finished build, in manifest order, each checked to lie inside
    ``out_dir``. Only the manifest's ``shards`` list is read (its ``path`` entries), so it
    serves shards whose manifest holds just that."""
    return [shard_path(out_dir, s["path"]) for s in _shard_list(out_dir)]


#: (realpath, size, mtime_ns) of shards whose sha256 matched their manifest in this process
_verified: set[tuple[str, int, int]] = set()


def verify_shard(path: str) -> None:
    """ShardError unless ``path`` matches the size and sha256 its build's manifest records.

    The build is the folder above ``shards/``; a file no manifest lists (a loose shard written
    by a test or a tool) is not checked."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        raise ShardError(f"{path}: unreadable shard ({e})") from e
    key = (real, st.st_size, st.st_mtime_ns)
    if key in _verified:
        return
    out_dir = os.path.dirname(os.path.dirname(path)) or "."
    rel = f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"
    try:
        entries = _shard_list(out_dir)
    except ShardError:
        return  # not part of a build with a readable manifest
    entry = next((e for e in entries if e.get("path") == rel), None)
    if entry is None:
        return
    if st.st_size != entry.get("bytes"):
        raise ShardError(
            f"{path}: shard is {st.st_size} bytes, the manifest records {entry.get('bytes')} "
            "(truncated, replaced or corrupted); rebuild it"
        )
    with open(real, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    if sha != entry.get("sha256"):
        raise ShardError(
            f"{path}: shard does not match its sha256 in the manifest (corrupted); rebuild it"
        )
    _verified.add(key)


def read_shard(path: str, columns: list[str] | None = None) -> pa.Table:
    """Read one tree shard (zstd Arrow IPC file) with pyarrow, memory-mapped, after checking it
    against its build's manifest (:func:`verify_shard`)."""
    verify_shard(path)
    try:
        with pa.memory_map(path, "r") as src:
            table = ipc.open_file(src).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise ShardError(f"{path}: unreadable shard ({e})") from e
    return table.select(columns) if columns else table


def check_shard_schema(table: pa.Table, path: str) -> None:
    """ShardError unless ``table`` (read from ``path``) is a shard of :data:`SCHEMA_VERSION`."""
    meta = table.schema.metadata or {}
    v = meta.get(b"treeprep.schema_version")
    if v is None or int(v) != SCHEMA_VERSION:
        raise ShardError(
            f"{path}: shard schema version {v.decode() if v else 'missing'}, "
            f"this treeprep reads version {SCHEMA_VERSION}; rebuild the shards"
        )


def open_shard(path: str, columns: list[str] | None = None) -> pa.Table:
    """:func:`read_shard`, checked: ShardError when the file is unreadable or of another schema
    version (the reader the pipeline and the CLI use)."""
    table = read_shard(path)
    check_shard_schema(table, path)
    return table.select(columns) if columns else table


# --------------------------------------------------------------------------------------------
# one row
# --------------------------------------------------------------------------------------------


def _get(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, Mapping) else getattr(row, key)


def _opt(row: Any, key: str) -> Any:
    return row.get(key) if isinstance(row, Mapping) else getattr(row, key, None)


def _ints(row: Any, key: str) -> np.ndarray:
    return np.asarray(_get(row, key), dtype=np.int64)


def validate_tree_row(row: Any, name: str = "tree") -> None:
    """ShardError (a :class:`~treeprep.errors.TreeprepError`) naming ``name`` unless ``row`` (a
    shard row as a dict, or an object with the same attributes) is a tree of this layout: see the
    module docstring. ``seq_ref_logprobs`` may be absent."""
    _validate_nodes(row, name)
    nn = len(_get(row, "node_parent"))
    seq_node = _ints(row, "seq_node")
    ns = len(seq_node)
    spans_raw, lps_raw = _get(row, "seq_loss_spans"), _get(row, "seq_logprobs")
    refs_raw = _opt(row, "seq_ref_logprobs")
    counts, adv = _get(row, "seq_count"), _get(row, "seq_advantage")
    if not (len(counts) == len(spans_raw) == len(lps_raw) == len(adv) == ns):
        raise ShardError(f"{name}: seq_* columns disagree in length")
    if refs_raw is not None and len(refs_raw) != ns:
        raise ShardError(f"{name}: seq_ref_logprobs disagrees in length")
    if ((seq_node < 0) | (seq_node >= nn)).any():
        raise ShardError(f"{name}: seq_node out of range")
    trained = []
    for s, sp in enumerate(spans_raw):
        b = np.asarray(sp if sp is not None else [], dtype=np.int64)
        if len(b) % 2:
            raise ShardError(f"{name}: sequence {s} has an odd number of loss span bounds")
        trained.append(int((b[1::2] - b[0::2]).sum()) if len(b) else 0)
    for raw, what in ((lps_raw, "log-probs"), (refs_raw, "reference log-probs")):
        for s, v in enumerate(raw or ()):
            if v is not None and len(v) != trained[s]:
                raise ShardError(
                    f"{name}: sequence {s} has {len(v)} {what} for {trained[s]} trained tokens"
                )


def _validate_nodes(row: Any, name: str) -> None:
    """The node columns of :func:`validate_tree_row`."""
    ids = _get(row, "input_ids")
    parent, offset, length = (_ints(row, k) for k in ("node_parent", "node_offset", "node_length"))
    depth, last = _ints(row, "node_depth"), _ints(row, "node_last")
    nn = len(parent)
    if not (len(offset) == len(length) == len(depth) == len(last) == nn) or nn == 0:
        raise ShardError(f"{name}: node_* columns disagree in length or are empty")
    if (length <= 0).any():
        raise ShardError(f"{name}: a node has no tokens (node_length must be >= 1)")
    expect_off = np.concatenate([[0], np.cumsum(length)[:-1]])
    if not np.array_equal(offset, expect_off) or int(length.sum()) != len(ids):
        raise ShardError(f"{name}: nodes are not contiguous in DFS order over input_ids")
    ar = np.arange(nn)
    if ((parent >= ar) | (parent < -1)).any():
        raise ShardError(f"{name}: node_parent must point to an earlier node (pre-order) or -1")
    if ((last < ar) | (last >= nn)).any():
        raise ShardError(f"{name}: node_last out of range")
    pp = np.maximum(parent, 0)
    if not np.array_equal(depth, np.where(parent >= 0, depth[pp] + length[pp], 0)):
        raise ShardError(f"{name}: node_depth is not the parent's depth plus its length")
