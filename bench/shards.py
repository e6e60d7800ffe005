"""bench/shards: zstd Arrow IPC against zstd Parquet for tree shards, side by side.

Takes the trees of a finished build, writes them both ways (same record batches, zstd level 3 for
both) and prints file size, write time and full-read time with pyarrow and polars, best of
``--repeat`` runs. This is the measurement behind the choice of Arrow IPC in the README.

    python bench/shards.py out/logs
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from report import print_result

from treeprep.schemas.shard import read_shard, shard_paths


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", help="a treeprep build folder")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import polars as pl

    table = pa.concat_tables(read_shard(p) for p in shard_paths(args.out)).combine_chunks()
    batches = table.to_batches(max_chunksize=64)
    with tempfile.TemporaryDirectory() as d:
        ipc_path = os.path.join(d, "t.arrow")
        pq_path = os.path.join(d, "t.parquet")

        def write_ipc() -> None:
            opts = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=3))
            with (
                pa.OSFile(ipc_path, "wb") as sink,
                ipc.new_file(sink, table.schema, options=opts) as w,
            ):
                for b in batches:
                    w.write_batch(b)

        def write_pq() -> None:
            with pq.ParquetWriter(
                pq_path, table.schema, compression="zstd", compression_level=3
            ) as w:
                for b in batches:
                    w.write_batch(b)  # one row group per batch of whole trees

        def read_ipc_pa() -> None:
            with pa.memory_map(ipc_path) as src:
                ipc.open_file(src).read_all()

        rows = []
        for name, write, path, read_pa, read_pl in (
            ("arrow-ipc-zstd", write_ipc, ipc_path, read_ipc_pa, lambda: pl.read_ipc(ipc_path)),
            (
                "parquet-zstd",
                write_pq,
                pq_path,
                lambda: pq.read_table(pq_path),
                lambda: pl.read_parquet(pq_path),
            ),
        ):
            w = _best(write, args.repeat)
            rows.append(
                {
                    "format": name,
                    "bytes": os.path.getsize(path),
                    "write_s": round(w, 4),
                    "read_pyarrow_s": round(_best(read_pa, args.repeat), 4),
                    "read_polars_s": round(_best(read_pl, args.repeat), 4),
                }
            )
    raw = table.nbytes
    result = {"trees": table.num_rows, "uncompressed_bytes": raw, "rows": rows}
    ipc_r, pq_r = rows
    result["parquet_over_ipc"] = {
        "bytes": round(pq_r["bytes"] / ipc_r["bytes"], 3),
        "read_pyarrow": round(pq_r["read_pyarrow_s"] / ipc_r["read_pyarrow_s"], 2),
        "read_polars": round(pq_r["read_polars_s"] / ipc_r["read_polars_s"], 2),
    }
    print_result(
        result,
        rows,
        title=f"bench/shards: {table.num_rows} trees, {raw / 1e6:.1f} MB in memory",
        as_json=args.json,
        notes=(f"parquet / ipc: {result['parquet_over_ipc']}",),
    )


if __name__ == "__main__":
    main()
