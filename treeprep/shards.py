"""Tree shards on disk: zstd-compressed Arrow IPC files, one row per tree, whole trees per batch.

Why Arrow IPC rather than Parquet: both compress these token lists about equally with zstd (the
ids are int32 and shared prefixes are already stored once), but IPC files are memory-mapped and read
about twice as fast, with no decode of nested lists, and the trainer reads them with pyarrow alone.
polars (``pl.read_ipc``), pyarrow (``pa.ipc.open_file``) and Hugging Face datasets
(``Dataset.from_file`` / the ``arrow`` builder) all read them. ``bench/build`` prints both sizes and
read speeds side by side.

Writes are atomic: a shard is written to ``NAME.tmp`` and renamed; readers never see half a file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.errors import ShardError
from treeprep.schemas import SCHEMA_VERSION, TREE_SCHEMA, Manifest
from treeprep.schemas.shard import read_shard, shard_paths
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
    with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, TREE_SCHEMA, options=opts) as w:
        for i in range(0, len(trees), BATCH_TREES):
            w.write_table(trees_to_table(trees[i : i + BATCH_TREES]))
    h = hashlib.sha256()
    with open(tmp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    return size, h.hexdigest()


def check_schema(table: pa.Table, path: str) -> None:
    meta = table.schema.metadata or {}
    v = meta.get(b"treeprep.schema_version")
    if v is None or int(v) != SCHEMA_VERSION:
        raise ShardError(
            f"{path}: shard schema version {v.decode() if v else 'missing'}, "
            f"this treeprep reads version {SCHEMA_VERSION}; rebuild the shards"
        )


def load_manifest(out_dir: str) -> Manifest:
    """Read and validate ``OUT/manifest.json`` (ShardError when the build is missing or
    unfinished, or the file is not a treeprep manifest)."""
    p = os.path.join(out_dir, "manifest.json")
    if not os.path.exists(p):
        raise ShardError(f"{out_dir}: no manifest.json; not a finished treeprep build")
    try:
        with open(p, encoding="utf-8") as f:
            return Manifest.model_validate_json(f.read())
    except (OSError, ValueError) as e:
        raise ShardError(f"{p}: not a valid treeprep manifest: {e}") from e


def iter_trees(out_dir: str, *, groups: Iterable[str] | None = None) -> Iterator[Tree]:
    """Every tree of a finished build, in shard order (optionally only some group ids)."""
    if not os.path.exists(os.path.join(out_dir, "manifest.json")):
        raise ShardError(f"{out_dir}: no manifest.json; not a finished treeprep build")
    wanted = set(groups) if groups is not None else None
    for path in shard_paths(out_dir):
        table = read_shard(path)
        check_schema(table, path)
        for batch in table.to_batches():
            if wanted is not None:
                gids = batch.column("group_id").to_pylist()
                if not wanted.intersection(gids):
                    continue
            for row in batch.to_pylist():
                if wanted is None or row["group_id"] in wanted:
                    yield Tree.from_row(row)
