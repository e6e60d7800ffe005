"""Tree shards on disk: zstd-compressed Arrow IPC files, one row per tree, whole trees per batch.

Why Arrow IPC rather than Parquet: both compress these token lists about equally with zstd (the
ids are int32 and shared prefixes are already stored once), but IPC files are memory-mapped and read
about twice as fast, with no decode of nested lists, and the trainer reads them with pyarrow alone.
polars (``pl.read_ipc``), pyarrow (``pa.ipc.open_file``) and Hugging Face datasets
(``Dataset.from_file`` / the ``arrow`` builder) all read them. ``bench/build`` prints both sizes and
read speeds side by side.

Writes are atomic and durable: a shard is written to ``NAME.tmp``, fsynced and renamed; readers
never see half a file. The writer deletes nothing: replacing an earlier build's shards is the
build's job, and it deletes only the files a build wrote (:class:`treeprep.build.out.OutIndex`).
:class:`ShardWriter` cuts a stream of trees into shards of about ``shard_tokens`` tokens. Reading
(manifest, shard paths, the schema-version check) is the contract's, in :mod:`treeprep.schemas`;
:func:`iter_trees` turns shard rows back into :class:`~treeprep.trie.Tree` objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.atomic import commit, make_dirs, sha256_of, writing
from treeprep.schemas import TREE_SCHEMA
from treeprep.schemas.manifest import ShardEntry
from treeprep.schemas.shard import open_shard, shard_paths
from treeprep.trie import Tree

#: trees per Arrow record batch; a tree never spans two batches
BATCH_TREES = 64


def trees_to_table(trees: list[Tree]) -> pa.Table:
    rows = [t.to_row() for t in trees]
    cols = {f.name: [r[f.name] for r in rows] for f in TREE_SCHEMA}
    return pa.Table.from_pydict(cols, schema=TREE_SCHEMA)


def write_shard(trees: list[Tree], path: str) -> tuple[int, str]:
    """Write ``trees`` to ``path`` atomically. Returns (bytes, sha256)."""
    tmp = path + ".tmp"
    opts = ipc.IpcWriteOptions(compression="zstd")
    with (
        writing(path, tmp),
        pa.OSFile(tmp, "wb") as sink,
        ipc.new_file(sink, TREE_SCHEMA, options=opts) as w,
    ):
        for i in range(0, len(trees), BATCH_TREES):
            w.write_table(trees_to_table(trees[i : i + BATCH_TREES]))
    sha = sha256_of(tmp)
    size = os.path.getsize(tmp)
    commit(tmp, path)
    return size, sha


class ShardWriter:
    """Trees in, shards out: appends trees to the current shard and writes it (atomically) once it
    holds ``shard_tokens`` tree tokens; :meth:`close` writes the rest. ``entries`` lists the
    written shards for the manifest, named ``shards/shard-00000.arrow`` and on under ``out``.

    ``before_write`` is called with a shard's manifest path (``shards/shard-00000.arrow``) before
    the shard is written (a build records it in its index there). Nothing is deleted.
    """

    def __init__(
        self,
        out: str,
        shard_tokens: int,
        before_write: Callable[[str], None] | None = None,
    ) -> None:
        self.shard_dir = os.path.join(out, "shards")
        make_dirs(self.shard_dir)
        self.before_write = before_write
        self.shard_tokens = shard_tokens
        self.entries: list[ShardEntry] = []
        self._pending: list[Tree] = []
        self._pending_tokens = 0

    def add(self, tree: Tree) -> None:
        """Append one tree; writes the shard once it is full."""
        self._pending.append(tree)
        self._pending_tokens += tree.tokens_tree
        if self._pending_tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Write the pending trees as one shard (nothing when none are pending)."""
        if not self._pending:
            return
        name = f"shard-{len(self.entries):05d}.arrow"
        if self.before_write is not None:
            self.before_write(f"shards/{name}")
        size, sha = write_shard(self._pending, os.path.join(self.shard_dir, name))
        self.entries.append(
            ShardEntry(
                path=f"shards/{name}",
                bytes=size,
                sha256=sha,
                trees=len(self._pending),
                tokens_tree=sum(t.tokens_tree for t in self._pending),
                tokens_linear=sum(t.tokens_linear for t in self._pending),
            )
        )
        self._pending = []
        self._pending_tokens = 0

    close = flush


def iter_trees(out_dir: str, *, groups: Iterable[str] | None = None) -> Iterator[Tree]:
    """Every tree of a finished build, in shard order (optionally only some group ids)."""
    wanted = set(groups) if groups is not None else None
    for path in shard_paths(out_dir):
        table = open_shard(path)
        for batch in table.to_batches():
            if wanted is not None:
                gids = batch.column("group_id").to_pylist()
                if not wanted.intersection(gids):
                    continue
            for row in batch.to_pylist():
                if wanted is None or row["group_id"] in wanted:
                    yield Tree.from_row(row)
