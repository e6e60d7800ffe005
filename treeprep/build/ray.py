"""``treeprep build --engine ray``: the same two stages on Ray Data, writing the same bytes.

The driver (this process, :func:`treeprep.build.build`) plans the jobs and writes
``rejects.jsonl`` and ``manifest.json`` whichever engine runs; this module only replaces the
engine of the two heavy stages (:class:`~treeprep.build.engines.LocalEngine`),
and every piece of work it hands to Ray calls the local engine's own function for that piece, so
byte identity follows from shared code rather than from a second implementation:

1. **Render** (:meth:`RayEngine.render`). The jobs without a ``done.json`` become a dataset of one
   row per file, mapped by a pool of ``workers`` actors (:class:`_RenderActor`), each of which
   loads the renderer once and runs :meth:`treeprep.build.files.FileWorker.process` per file:
   the same work
   folder, work rows, rejects and ``done.json`` marker as the local engine. Resume is therefore
   one mechanism for both engines (a build started with one engine can be finished with the
   other), and a task Ray retries after a worker died rewrites the same folder under temporary
   names: its rows replace the half-written ones instead of adding to them.
2. **Trees and shards** (:meth:`RayEngine.write_trees`). The work files are read back as a dataset
   of work rows tagged with their file's index and row number, shuffled by ``group_id``
   (``groupby().map_groups`` with Ray Data's sort-based shuffle, which spills to disk through
   the object store); each group is put back in input order (file index, then row) and built
   with :func:`treeprep.trie.build_tree`. Shard boundaries cannot be decided by whichever group
   finishes first, so the driver collects only each tree's group id and sizes, sorts them as the
   local engine does, and cuts shards with :class:`~treeprep.shards.ShardWriter`'s rule
   (:func:`plan_shards`). Each tree is tagged with its shard, a second shuffle brings a shard's
   trees together, and a worker writes the shard with :func:`treeprep.shards.write_shard` (whole
   trees per record batch, temporary name then rename).

Paths: inputs and the output may be local paths or ``file://`` URLs (:mod:`treeprep.io.paths`). On
a multi-node cluster the output folder must be shared by the nodes (the work files and shards are
written by workers), and treeprep must be installed on them. Ray is imported only here, and only
when this engine is chosen (this module itself imports it inside its functions).

Trade-offs: the trees are materialized in Ray's object store between the two shuffles (spilled to
disk when large), and the group ids of all trees, not their tokens, pass through the driver.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep.atomic import make_dirs
from treeprep.build.config import BuildConfig, FileOptions
from treeprep.build.files import FileWorker
from treeprep.build.jobs import RenderTask, TreeTask
from treeprep.build.workfiles import FileJob, FileResult, drop_rows
from treeprep.build.workrows import rows_to_sequences
from treeprep.errors import TreeprepError, install_hint
from treeprep.schemas import TREE_SCHEMA
from treeprep.schemas.manifest import ShardEntry
from treeprep.shards import write_shard
from treeprep.trie import Tree, build_tree

__all__ = ["RayEngine", "plan_shards", "ray_engine"]

#: the per-tree sizes the driver collects to cut shards (the trees stay in the object store)
_STATS = ["group_id", "num_nodes", "tokens_tree", "tokens_linear", "sequences"]
#: work-file bytes per partition of the group shuffle (a partition's groups are built by one task)
_PARTITION_BYTES = 256 << 20
#: Ray Data's own default number of shuffle partitions, here the most
_MAX_PARTITIONS = 200
#: list<int32> columns of a tree row, read back as numpy arrays rather than Python lists
_INT_LISTS = {f.name for f in TREE_SCHEMA if f.type == pa.list_(pa.int32())}


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise TreeprepError(
            f"--engine ray needs Ray Data: {install_hint('ray')} (or pip install 'ray[data]')"
        ) from e
    return ray


@contextmanager
def ray_engine(cfg: BuildConfig) -> Iterator[RayEngine]:
    """Join the Ray cluster at ``cfg.ray_address``, or start a local Ray with ``cfg.workers`` CPUs
    (and shut it down afterwards); a Ray already initialized in this process is used as it is."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        if cfg.ray_address:
            ray.init(address=cfg.ray_address, logging_level="warning")
        else:
            ray.init(num_cpus=cfg.workers, include_dashboard=False, logging_level="warning")
        started = True
    from ray.data.context import ShuffleStrategy

    ctx = ray.data.DataContext.get_current()
    saved = (ctx.enable_progress_bars, ctx.shuffle_strategy)
    ctx.enable_progress_bars = False  # progress goes through on_progress, like the local engine
    # sort-based shuffles run as tasks; the hash shuffle starts aggregator actors, which costs
    # more than the whole shuffle at small inputs (about 15 s against 2 s for the shard step)
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    try:
        yield RayEngine(cfg.workers)
    finally:
        ctx.enable_progress_bars, ctx.shuffle_strategy = saved
        if started:
            ray.shutdown()


class RayEngine:
    """The two heavy stages of a build on Ray Data (see the module docstring)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    # ---------------------------------------------------------------------------------------
    # stage 1: render each file in an actor that loaded the renderer once
    # ---------------------------------------------------------------------------------------

    def render(self, task: RenderTask) -> Iterator[FileResult]:
        import ray.data

        todo, n = task.start()
        if not todo:
            return
        cfg = task.cfg
        todo.sort(key=lambda j: -j.size)  # largest first: the last file to start is a small one
        files = ray.data.from_items([asdict(j) for j in todo], override_num_blocks=len(todo))
        ds = files.map_batches(
            _RenderActor,
            fn_constructor_kwargs={
                "tokenizer": cfg.tokenizer,
                "options": cfg.file,
                "cwd": os.getcwd(),
            },
            batch_size=1,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=min(self.workers, len(todo))),
            num_cpus=1,
        )
        rows = iter(ds.iter_rows())
        try:
            for row in rows:
                n += 1
                task.report(n)
                error = row.pop("error")
                if error:
                    _raise_error(error)
                yield FileResult(**_counts_of_file(row))
        finally:  # stopped early (an error, --max-errors): Ray stops the actors now, not at GC
            close = getattr(rows, "close", None)
            if close is not None:
                close()

    # ---------------------------------------------------------------------------------------
    # stage 2: shuffle by group, one trie per group, shards cut in sorted group order
    # ---------------------------------------------------------------------------------------

    def write_trees(self, task: TreeTask) -> list[ShardEntry]:
        import ray.data

        shard_dir = os.path.abspath(os.path.join(task.out, "shards"))
        make_dirs(shard_dir)
        paths = [os.path.abspath(p) for p in task.paths]
        if not paths:
            return []
        files = ray.data.from_items(
            [
                {"file_index": i, "path": p, "drop": [int(r) for r in task.drop.get(q, [])]}
                for i, (p, q) in enumerate(zip(paths, task.paths, strict=True))
            ],
            override_num_blocks=min(len(paths), 4 * self.workers),  # a few read tasks per worker
        )
        rows = files.map_batches(_read_work_rows, batch_size=None, batch_format="pyarrow")
        work_bytes = sum(os.path.getsize(p) for p in paths)
        parts = max(self.workers, min(_MAX_PARTITIONS, -(-work_bytes // _PARTITION_BYTES)))
        trees = (
            rows.groupby("group_id", num_partitions=parts)
            .map_groups(_build_group, batch_format="pyarrow")
            .materialize()
        )

        starts = self._plan(trees, task)
        if task.before_write is not None:  # the build's index of what it wrote (never delete)
            for i in range(len(starts)):
                task.before_write(f"shards/shard-{i:05d}.arrow")  # ShardWriter's names
        tagged = trees.map_batches(_tag_shard, fn_kwargs={"starts": starts}, batch_format="pyarrow")
        written = tagged.groupby("shard", num_partitions=len(starts)).map_groups(
            _write_shard_group, fn_kwargs={"shard_dir": shard_dir}, batch_format="pyarrow"
        )
        entries: dict[int, ShardEntry] = {}
        for row in written.iter_rows():
            shard = row.pop("shard")
            entries[shard] = ShardEntry(**row)
            if task.on_progress:
                task.on_progress("shards", len(entries), len(starts))
        if sorted(entries) != list(range(len(starts))):
            raise TreeprepError(
                f"internal error: planned {len(starts)} shards, wrote {sorted(entries)}"
            )
        return [entries[i] for i in range(len(starts))]

    @staticmethod
    def _plan(trees: Any, task: TreeTask) -> list[str]:
        """Collect every tree's sizes, add them to the task's ``counts`` and cut the shards; the
        first group id of each shard."""
        stats = pa.concat_tables(
            list(trees.select_columns(_STATS).iter_batches(batch_format="pyarrow", batch_size=None))
        )
        gids = stats.column("group_id").to_pylist()
        order = sorted(range(len(gids)), key=gids.__getitem__)
        if len(set(gids)) != len(gids):
            raise TreeprepError("internal error: a group was built twice")
        sizes = stats.column("tokens_tree").to_numpy()
        counts = task.counts
        counts.trees += len(gids)
        counts.sequences += int(stats.column("sequences").to_numpy().sum())
        counts.nodes += int(stats.column("num_nodes").to_numpy().astype(np.int64).sum())
        counts.tokens_linear += int(stats.column("tokens_linear").to_numpy().sum())
        counts.tokens_tree += int(sizes.sum())
        if task.on_progress:
            task.on_progress("trees", len(gids), len(gids))
        first = plan_shards([int(sizes[i]) for i in order], task.shard_tokens)
        return [gids[order[i]] for i in first]


def plan_shards(sizes: list[int], shard_tokens: int) -> list[int]:
    """Where :class:`~treeprep.shards.ShardWriter` starts a new shard, given the trees' sizes in
    writing order: the index of each shard's first tree. Its rule: a shard is written once it
    holds ``shard_tokens`` tree tokens or more.

    >>> plan_shards([5, 5, 5, 20, 1], 10)  # shards [5, 5], [5, 20], [1]
    [0, 2, 4]
    >>> plan_shards([30, 1, 1], 10)  # a tree over the limit closes its shard alone
    [0, 1]
    """
    first: list[int] = []
    pending = 0
    for i, size in enumerate(sizes):
        if pending == 0:
            first.append(i)
        pending += size
        if pending >= shard_tokens:
            pending = 0
    return first


# --------------------------------------------------------------------------------------------
# the functions Ray runs in its workers
# --------------------------------------------------------------------------------------------


class _RenderActor:
    """Stage 1 in a Ray actor: the renderer is loaded once per actor, then one file per call."""

    def __init__(self, tokenizer: str | None, options: FileOptions, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative input and option paths mean what they meant to the driver
        self.worker = FileWorker.load(tokenizer, options)

    def __call__(self, batch: pa.Table) -> pa.Table:
        done = []
        for job in batch.to_pylist():
            try:
                done.append({**asdict(self.worker.process(FileJob(**job))), "error": None})
            except TreeprepError as e:  # Ray would hand the driver its text only, not the error
                empty = dict.fromkeys(f.name for f in fields(FileResult))
                done.append({**empty, "error": orjson.dumps(_error_fields(e)).decode()})
        return pa.Table.from_pylist(done)


def _counts_of_file(row: dict) -> dict:
    """A result row as Ray hands it back: Arrow stores the count dicts (``filtered``,
    ``curated``, ``normalized``) as structs whose fields are the union over a batch's rows, so a
    file gets the other files' keys with None; those are no counts of this file."""
    for k in ("filtered", "curated", "normalized"):
        row[k] = {key: n for key, n in (row[k] or {}).items() if n is not None}
    return row


def _error_fields(e: TreeprepError) -> dict:
    attrs = {k: v for k, v in vars(e).items() if isinstance(v, str | int)}
    return {"class": type(e).__name__, "message": str(e), "fields": attrs}


def _raise_error(text: str) -> None:
    """Raise again, in the driver, the TreeprepError a worker sent back as data."""
    from treeprep import errors

    err = orjson.loads(text)
    cls = getattr(errors, err["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, TreeprepError)):
        raise TreeprepError(err["message"])
    raise cls(**err["fields"]) if err["fields"] else cls(err["message"])


def _read_work_rows(batch: pa.Table) -> Iterator[pa.Table]:
    """A work file's rows, one record batch at a time, tagged with ``file_index`` and ``row``."""
    for f in batch.to_pylist():
        reader = ipc.open_file(pa.memory_map(f["path"], "r"))
        if f["drop"]:  # duplicates left out (treeprep.build.dedup): the whole file at once
            table = reader.read_all()
            table = table.append_column(
                "file_index", pa.array(np.full(len(table), f["file_index"]))
            )
            table = table.append_column("row", pa.array(np.arange(len(table))))
            kept = drop_rows(table, np.asarray(f["drop"], np.int64))
            if kept.num_rows:
                yield kept
            continue
        start = 0
        for b in range(reader.num_record_batches):
            rb = reader.get_batch(b)
            n = rb.num_rows
            table = pa.Table.from_batches([rb])
            table = table.append_column("file_index", pa.array(np.full(n, f["file_index"])))
            table = table.append_column("row", pa.array(np.arange(start, start + n)))
            start += n
            yield table


def _build_group(rows: pa.Table) -> pa.Table:
    """One group's work rows -> its tree as one row of :data:`TREE_SCHEMA` (plus ``sequences``),
    the rows first put back in input order, as
    :func:`~treeprep.build.workfiles.group_sequences` gives them to the local engine."""
    rows = rows.sort_by([("file_index", "ascending"), ("row", "ascending")])
    gid = rows.column("group_id")[0].as_py()
    files = rows.column("file_index").to_numpy()
    tree = build_tree(rows_to_sequences(rows, rows.column("row").to_numpy(), files), gid)
    cols = tree.to_row()
    table = pa.Table.from_pydict({k: [cols[k]] for k in TREE_SCHEMA.names}, schema=TREE_SCHEMA)
    return table.append_column("sequences", pa.array([int(tree.seq_count.sum())], pa.int64()))


def _tag_shard(trees: pa.Table, starts: list[str]) -> pa.Table:
    """Each tree's shard: the last shard whose first group id sorts at or before its own."""
    gids = trees.column("group_id").to_pylist()
    shard = [bisect.bisect_right(starts, g) - 1 for g in gids]
    return trees.append_column("shard", pa.array(shard, pa.int64()))


def _tree_at(trees: pa.Table, i: int) -> Tree:
    row: dict[str, Any] = {}
    for name in TREE_SCHEMA.names:
        v = trees.column(name)[i]
        row[name] = v.values.to_numpy(zero_copy_only=False) if name in _INT_LISTS else v.as_py()
    return Tree.from_row(row)


def _write_shard_group(trees: pa.Table, shard_dir: str) -> pa.Table:
    """One shard's trees, in sorted group order, written with the local engine's writer."""
    shard = int(trees.column("shard")[0].as_py())
    gids = trees.column("group_id").to_pylist()
    batch = [_tree_at(trees, i) for i in sorted(range(len(gids)), key=gids.__getitem__)]
    name = f"shard-{shard:05d}.arrow"  # ShardWriter's names
    size, sha = write_shard(batch, os.path.join(shard_dir, name))
    entry = ShardEntry(
        path=f"shards/{name}",
        bytes=size,
        sha256=sha,
        trees=len(batch),
        tokens_tree=sum(t.tokens_tree for t in batch),
        tokens_linear=sum(t.tokens_linear for t in batch),
    )
    return pa.Table.from_pylist([{**entry.model_dump(), "shard": shard}])
