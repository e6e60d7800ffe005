"""``treeprep export``: every input sequence back out of the trees, for other trainers.

Each record holds ``group_id``, ``agent_id``, ``call_id``, ``trajectory_id``, ``input_ids`` and
``loss_mask`` (and ``logprobs``, ``ref_logprobs``, ``reward``, ``advantage`` when present) and,
when a tokenizer is at hand, ``text``: the input ids decoded, i.e. the rendered chat. Duplicates
merged in the trie come out as many times as they went in, so ``export(build(x)) == x`` as a
multiset. Three formats (:class:`~treeprep.modes.ExportFormat`):

* ``jsonl``: one JSON object per line;
* ``parquet``: one row per sequence (``input_ids`` int32 lists, ``loss_mask`` int8 lists), written
  in row groups of :data:`ROWS_PER_GROUP`;
* ``hf``: a folder ``datasets.load_from_disk`` opens (the ``hf`` extra: ``datasets``), made from the
  same Parquet rows.

Every output is written under a temporary name and renamed into place, so an interrupted export
leaves nothing half written under the name asked for.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator

import orjson
import pyarrow as pa

from treeprep.atomic import commit, writing
from treeprep.errors import TreeprepError, install_hint
from treeprep.modes import ExportFormat
from treeprep.shards import iter_trees

__all__ = ["ROWS_PER_GROUP", "build_decoder", "export_sequences"]

#: Parquet rows per row group
ROWS_PER_GROUP = 4096

Decode = Callable[[list[int]], str]

_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("agent_id", pa.string()),
        ("call_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("ref_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("text", pa.string()),
    ]
)


def export_sequences(
    out_dir: str,
    dest: str,
    *,
    groups: list[str] | None = None,
    fmt: ExportFormat | str = ExportFormat.jsonl,
    decode: Decode | None = None,
) -> int:
    """Write every sequence of the build in ``out_dir`` to ``dest`` in ``fmt``; ``decode`` (a
    tokenizer's) adds each sequence's ``text``. Returns the number of sequences written."""
    fmt = ExportFormat.of(fmt, "format", TreeprepError)
    records = _records(out_dir, groups, decode)
    if fmt is ExportFormat.jsonl:
        return _write_jsonl(records, dest)
    if fmt is ExportFormat.parquet:
        return _write_parquet(records, dest)
    return _write_hf(records, dest)


def build_decoder(out_dir: str, tokenizer: str | None = None) -> Decode:
    """The decoder of the build's tokenizer: ``tokenizer`` (a folder), else the folder the
    manifest names, else the built-in one for a build made with it. TreeprepError when none is
    at hand (pass one, or export without text)."""
    from treeprep.render import Renderer
    from treeprep.schemas.manifest import load_manifest

    ident = load_manifest(out_dir).tokenizer
    path = tokenizer or ident.path
    if path is None and ident.name != "builtin-bytes":
        raise TreeprepError(
            f"{out_dir}: the build's tokenizer ({ident.name}) has no recorded folder: pass "
            "--tokenizer, or --no-text"
        )
    if path is not None and not os.path.isdir(path):
        raise TreeprepError(f"{path}: no tokenizer folder here: pass --tokenizer, or --no-text")
    renderer = Renderer.load(path)
    if renderer.identity.sha256 != ident.sha256:
        raise TreeprepError(
            f"{path or 'the built-in tokenizer'} is not the tokenizer {out_dir} was built with "
            f"({ident.name}): its text would not match the ids"
        )
    return renderer.decode


def _records(out_dir: str, groups: list[str] | None, decode: Decode | None) -> Iterator[dict]:
    for tree in iter_trees(out_dir, groups=groups):
        for rec in tree.iter_sequences():
            if decode is not None:
                rec["text"] = decode(rec["input_ids"])
            yield rec


def _write_jsonl(records: Iterator[dict], dest: str) -> int:
    n = 0
    tmp = dest + ".tmp"
    with writing(dest, tmp):
        with open(tmp, "wb") as f:
            for rec in records:
                f.write(orjson.dumps(rec))
                f.write(b"\n")
                n += 1
        os.replace(tmp, dest)
    return n


def _write_parquet(records: Iterator[dict], dest: str) -> int:
    import pyarrow.parquet as pq

    n = 0
    tmp = dest + ".tmp"
    with writing(dest, tmp):
        with pq.ParquetWriter(tmp, _SCHEMA, compression="zstd") as writer:
            batch: list[dict] = []
            for rec in records:
                batch.append(rec)
                n += 1
                if len(batch) >= ROWS_PER_GROUP:
                    writer.write_table(_table(batch))
                    batch.clear()
            if batch or n == 0:
                writer.write_table(_table(batch))
        commit(tmp, dest)
    return n


def _table(batch: list[dict]) -> pa.Table:
    cols = {name: [r.get(name) for r in batch] for name in _SCHEMA.names}
    return pa.Table.from_pydict(cols, schema=_SCHEMA)


def _write_hf(records: Iterator[dict], dest: str) -> int:
    try:
        import datasets
    except ImportError as e:
        raise TreeprepError(f"--format hf needs the datasets library: {install_hint('hf')}") from e
    if os.path.exists(dest):
        raise TreeprepError(f"{dest}: exists; export --format hf writes a new folder")
    tmp = dest.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        with writing(dest):
            parquet = os.path.join(tmp, "sequences.parquet")
            n = _write_parquet(records, parquet)
            ds = datasets.Dataset.from_parquet(parquet, cache_dir=os.path.join(tmp, "cache"))
            ds.save_to_disk(os.path.join(tmp, "dataset"))
            del ds
            os.replace(os.path.join(tmp, "dataset"), dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return n
