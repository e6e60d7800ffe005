"""Hostile inputs (issue 15): each one ends as a reject with its reason, or a clean error, and
nothing else is lost. Items: 5 (zstd frames), 6 (duplicates), 7 (out-of-range numbers),
8 and 14 (links, unreadable files), 9 (NaN in tau-bench), 10 (huge ids), 11 (deep schemas),
12 (many files), 13 (non-UTF-8 names), 21 (huge lines), 22 (paths do not change the bytes)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import zstandard
from hostile import (
    ROOT,
    assert_reconciles,
    build_cli,
    good_rows,
    manifest,
    output_hashes,
    rejects,
    rollout,
    run_subprocess,
    write_jsonl,
)

from treeprep.shards import iter_trees


def _calls_in_trees(out: Path) -> list[str]:
    return sorted(c for t in iter_trees(str(out)) for c in t.seq_call_id)


# ---- 5: a record reaches a tree only after its zstd frame passed its checksum ---------------


def _flip_caught_only_by_checksum(frame: bytes) -> bytes:
    for i in range(6, len(frame) - 4):
        bad = bytearray(frame)
        bad[i] ^= 0x01
        try:
            zstandard.ZstdDecompressor().decompressobj().decompress(bytes(bad))
        except zstandard.ZstdError as e:
            if "checksum" in str(e):
                return bytes(bad)
    raise AssertionError("no such flip")


def test_zstd_flipped_bit_rejects_the_frame_and_keeps_its_records_out(tmp_path: Path) -> None:
    rows_a = [rollout("a", [1, 2], [3, i], call_id=f"a{i}") for i in range(6)]
    rows_b = [rollout("b", [5, 6], [7, i], call_id=f"b{i}") for i in range(6)]
    text_a = "".join(json.dumps(r) + "\n" for r in rows_a).encode()
    text_b = "".join(json.dumps(r) + "\n" for r in rows_b).encode()
    c = zstandard.ZstdCompressor(level=1, write_checksum=True)
    frame_a, frame_b = c.compress(text_a), c.compress(text_b)
    # a one-bit flip in frame b that still decodes: only the frame's checksum can tell
    bad = _flip_caught_only_by_checksum(frame_b)
    p = tmp_path / "in" / "r.jsonl.zst"
    p.parent.mkdir()
    p.write_bytes(frame_a + bytes(bad))
    code, out = build_cli(tmp_path / "o", p)
    assert code == 0, out
    assert _calls_in_trees(tmp_path / "o") == [f"a{i}" for i in range(6)]
    (rej,) = rejects(tmp_path / "o")
    assert rej["file"] == "r.jsonl.zst" and "zstd" in rej["reason"]
    assert "not used" in rej["reason"]
    assert_reconciles(tmp_path / "o")


# ---- 6: the same file through two paths is read once, and reported ---------------------------


def test_symlink_loop_and_repeated_argument_read_each_file_once(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", good_rows(4, "a"))
    write_jsonl(logs / "sub" / "b.jsonl", good_rows(3, "b"))
    (logs / "sub" / "loop").symlink_to(logs, target_is_directory=True)
    (logs / "again.jsonl").symlink_to(logs / "a.jsonl")
    glob = str(logs / "**" / "*.jsonl")
    code, out = build_cli(tmp_path / "o", glob, logs / "a.jsonl", logs)
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    assert m["counts"]["records_read"] == 7
    assert sorted(i["path"] for i in m["inputs"]) == ["a.jsonl", "sub/b.jsonl"]
    dups = {d["path"]: d["same_as"] for d in m["duplicate_inputs"]}
    assert dups["again.jsonl"] == "a.jsonl"
    assert all(v in ("a.jsonl", "sub/b.jsonl") for v in dups.values())


# ---- 7: numbers outside float32 and NaN are rejected with the field name ---------------------


@pytest.mark.parametrize(
    ("field", "raw", "reason"),
    [
        ("generation_log_probs", "[-1e39, -0.5]", "generation_log_probs[0]"),
        ("generation_log_probs", "[-0.1, 1e400]", "generation_log_probs[1]"),
        ("reward", "1e400", "reward"),
        ("advantage", "-1e999", "advantage"),
    ],
)
def test_out_of_range_numbers_are_rejected_with_the_field(
    tmp_path: Path, field: str, raw: str, reason: str
) -> None:
    good = json.dumps(rollout("g", [1, 2], [3, 4]))
    bad = json.dumps(rollout("g", [1, 2], [3, 4], call_id="bad"))[:-1] + f', "{field}": {raw}}}'
    p = tmp_path / "r.jsonl"
    p.write_text(good + "\n" + bad + "\n")
    code, out = build_cli(tmp_path / "o", p)
    assert code == 0, out
    (rej,) = rejects(tmp_path / "o")
    assert rej["line"] == 2 and reason in rej["reason"]
    assert_reconciles(tmp_path / "o")


# ---- 8, 14: links followed where safe; dangling and unreadable files are rejects -------------


def test_symlinked_folder_is_followed_and_broken_files_are_rejects(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    write_jsonl(real / "c.jsonl", good_rows(2, "c"))
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", good_rows(3, "a"))
    (logs / "linked").symlink_to(real, target_is_directory=True)
    (logs / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    unreadable = write_jsonl(logs / "locked.jsonl", good_rows(1))
    unreadable.chmod(0)
    try:
        code, out = build_cli(tmp_path / "o", logs)
    finally:
        unreadable.chmod(0o644)
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    by_file = {r["file"]: r["reason"] for r in rejects(tmp_path / "o")}
    assert "dangling symbolic link" in by_file["dangling.jsonl"]
    assert {i["path"] for i in m["inputs"]} >= {"a.jsonl", "linked/c.jsonl", "dangling.jsonl"}
    if os.geteuid() != 0:  # root reads a chmod 000 file
        assert "Permission denied" in by_file["locked.jsonl"]
    # the files repeat each other's calls: the copies are left out as duplicates, and counted
    kept = m["counts"]["records_in_trees"] + m["counts"].get("records_filtered", 0)
    assert kept == 5 + (1 if os.geteuid() == 0 else 0)


# ---- 9: one NaN in a tau-bench file rejects only the calls holding it -------------------------


def test_tau_bench_nan_rejects_only_the_calls_that_hold_it(tmp_path: Path) -> None:
    def traj(task: int, nan_at: int | None) -> dict:
        msgs: list[dict] = [{"role": "system", "content": "policy"}]
        for k in range(3):
            msgs.append({"role": "user", "content": f"q{k}"})
            args = '{"x": 1}' if k != nan_at else '{"x": NaN}'
            msgs.append({"role": "assistant", "content": f"a{k}", "tool_calls": None})
            msgs[-1]["content"] = f"answer {k} {args}"
        return {"task_id": task, "trial": 0, "reward": 1.0, "info": {}, "traj": msgs}

    doc = [traj(0, None), traj(1, None), traj(2, None)]
    text = json.dumps(doc, indent=2)
    # Python's json.dump writes NaN: put one in task 1's reward and one in task 2's info
    text = text.replace('"reward": 1.0', '"reward": NaN', 2).replace(
        '"reward": NaN', '"reward": 1.0', 1
    )
    text = (
        text[: text.rindex('"info": {}')]
        + '"info": {"cost": NaN}'
        + text[text.rindex('"info": {}') + len('"info": {}') :]
    )
    p = tmp_path / "tau.json"
    p.write_text(text)
    code, out = build_cli(tmp_path / "o", p, extra=("--format", "tau-bench"))
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    assert m["counts"]["records_read"] == 9
    rej = rejects(tmp_path / "o")
    assert [r["call_id"] for r in rej] == [f"task-1/trial-0/{k}" for k in range(3)]
    assert all("reward: expected a finite number, got NaN" in r["reason"] for r in rej)
    assert m["counts"]["records_in_trees"] == 6  # task 2's NaN is in no call


# ---- 10, 11: huge ids and deep schemas are rejects, not crashes -------------------------------


def test_token_id_of_2_to_63_is_a_reject(tmp_path: Path) -> None:
    p = write_jsonl(
        tmp_path / "r.jsonl",
        [rollout("g", [1, 2], [3]), rollout("g", [1, 2**63], [3]), rollout("g", [1], [2**64 - 1])],
    )
    code, out = build_cli(tmp_path / "o", p)
    assert code == 0, out
    reasons = [r["reason"] for r in rejects(tmp_path / "o")]
    assert len(reasons) == 2 and all("out of range" in r for r in reasons)
    assert_reconciles(tmp_path / "o")


@pytest.mark.parametrize("depth", [150, 300, 1000])
def test_deeply_nested_tool_schema_is_a_reject(tmp_path: Path, depth: int) -> None:
    # written by hand: Python's own json.dumps gives up at this depth
    schema = '{"type": "object", "properties": {"x": ' * depth + '{"type": "string"}' + "}}" * depth
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + schema + "}}"
    ok = json.dumps({"messages": [{"role": "user", "content": "hi"}],
                     "completion": {"role": "assistant", "content": "yo"}})  # fmt: skip
    deep = ok[:-1] + ', "tools": [' + tool + "]}"
    p = tmp_path / "c.jsonl"
    p.write_text(ok + "\n" + deep + "\n")
    code, out = build_cli(tmp_path / "o", p, extra=("--format", "openai-chat"))
    assert code == 0, out
    (rej,) = rejects(tmp_path / "o")
    assert rej["line"] == 2
    assert "nested deeper than 100 levels" in rej["reason"] or "depth limit" in rej["reason"]
    assert_reconciles(tmp_path / "o")


# ---- 12: many input files do not run out of file descriptors ----------------------------------


def test_many_files_under_a_low_descriptor_limit(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for i in range(300):
        write_jsonl(logs / f"f{i:04d}.jsonl", [rollout("shared", [1, 2, 3], [i % 200 + 4])])
    script = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96)); "
        "from treeprep.cli.app import main; sys.argv = ['treeprep'] + sys.argv[1:]; main()"
    )
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", script, "build", str(logs), "-o", str(tmp_path / "o"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    m = assert_reconciles(tmp_path / "o")
    kept = m["counts"]["records_in_trees"] + m["counts"].get("records_filtered", 0)
    assert kept == 300 and m["counts"]["trees"] == 1  # copies across files: duplicates


# ---- 13: a non-UTF-8 file name is a reject --------------------------------------------------


def test_non_utf8_file_name_is_a_reject(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "ok.jsonl", good_rows(2))
    bad = os.path.join(os.fsencode(logs), b"caf\xe9.jsonl")
    with open(bad, "wb") as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in good_rows(2)))
    code, out = build_cli(tmp_path / "o", logs)
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    (rej,) = rejects(tmp_path / "o")
    assert rej["file"] == "caf\\xe9.jsonl" and "not valid UTF-8" in rej["reason"]
    assert m["counts"]["records_in_trees"] == 2


# ---- 21: a huge line is rejected without being held --------------------------------------------


def test_huge_line_is_rejected_past_the_record_limit(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    big = json.dumps(rollout("g", [1] * 10, [2], pad="x" * (3 << 20)))
    p.write_text(json.dumps(rollout("g", [1], [2])) + "\n" + big + "\n")
    code, out = build_cli(tmp_path / "o", p, extra=("--max-record-mb", "2"))
    assert code == 0, out
    (rej,) = rejects(tmp_path / "o")
    assert rej["line"] == 2 and "over the limit of 2,097,152 bytes" in rej["reason"]
    assert_reconciles(tmp_path / "o")


def test_default_record_limit_rejects_a_50mb_line(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps(rollout("g", [1], [2])) + "\n")
        f.write('{"messages": [{"role": "user", "content": "' + "x" * (50 << 20) + '"}]}\n')
    res = run_subprocess(["build", str(p), "-o", str(tmp_path / "o"), "--json"])
    assert res.returncode == 0, res.stderr[-2000:]
    (rej,) = rejects(tmp_path / "o")
    assert rej["line"] == 2 and "per record" in rej["reason"]


# ---- 22: where the inputs lie does not change a byte -------------------------------------------


def test_relative_and_absolute_paths_give_the_same_bytes(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "sample_data", tmp_path / "logs_copy")
    res = run_subprocess(["build", "logs_copy", "-o", "o1"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_subprocess(["build", str(tmp_path / "logs_copy"), "-o", str(tmp_path / "o2")])
    assert res.returncode == 0, res.stderr[-2000:]
    moved = tmp_path / "deeper" / "renamed"
    shutil.copytree(tmp_path / "logs_copy", moved)
    res = run_subprocess(["build", str(moved), "-o", str(tmp_path / "o3")])
    assert res.returncode == 0, res.stderr[-2000:]
    h1, h2, h3 = (output_hashes(tmp_path / o) for o in ("o1", "o2", "o3"))
    assert h1 == h2 == h3
    assert not any(str(tmp_path) in json.dumps(manifest(tmp_path / o)) for o in ("o1", "o2"))


# ---- issue 26 item 1: a FIFO or a link to a device is one reject, not a hang --------------------


def test_fifo_and_link_to_a_device_are_rejects_not_a_hang(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "good.jsonl", good_rows(3))
    os.mkfifo(logs / "p.jsonl")
    (logs / "z.jsonl").symlink_to("/dev/zero")
    # a subprocess with a timeout: before the fix, opening the FIFO blocked the build forever
    res = run_subprocess(["build", str(logs), "-o", str(tmp_path / "o"), "--json"], timeout=30)
    assert res.returncode == 0, res.stderr[-2000:]
    m = assert_reconciles(tmp_path / "o")
    by_file = {r["file"]: r["reason"] for r in rejects(tmp_path / "o")}
    assert by_file["p.jsonl"].startswith("not a regular file: a named pipe (FIFO)")
    assert "a character device" in by_file["z.jsonl"]
    assert m["counts"]["records_in_trees"] == 3 and m["counts"]["records_rejected"] == 2
    # named on the command line, a FIFO is a reject too (it was "no such file or folder")
    res = run_subprocess(
        ["build", str(logs / "good.jsonl"), str(logs / "p.jsonl"), "-o", str(tmp_path / "o2")],
        timeout=30,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["file"] for r in rejects(tmp_path / "o2")] == ["p.jsonl"]


# ---- issue 26 item 10: an OUT inside the input folder is never read back ------------------------


def test_out_inside_the_input_folder_is_not_read_back(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", good_rows(3, "a"))
    write_jsonl(logs / "sub" / "b.jsonl", good_rows(2, "b"))
    # another build's folder (manifest, rejects, shards) in the input folder: left out as well
    code, out = build_cli(logs / "old", logs / "sub")
    assert code == 0, out
    (logs / "old" / "rejects.jsonl").write_text(json.dumps(rollout("x", [1], [2])) + "\n")
    o = logs / "o"
    code, out = build_cli(o, logs)
    assert code == 0, out
    first = output_hashes(o)
    code, out = build_cli(o, logs)  # OUT now holds manifest.json, rejects.jsonl and shards
    assert code == 0, out
    assert output_hashes(o) == first
    m = assert_reconciles(o)
    assert [i["path"] for i in m["inputs"]] == ["a.jsonl", "sub/b.jsonl"]
    assert m["skipped_files"] == [] and m["counts"]["records_read"] == 5
    code, out = build_cli(tmp_path / "g", str(logs / "**" / "*.jsonl"))  # a glob leaves them out
    assert code == 0, out
    assert [i["path"] for i in manifest(tmp_path / "g")["inputs"]] == ["a.jsonl", "sub/b.jsonl"]


def test_folders_left_out_are_listed_in_the_manifest(tmp_path: Path) -> None:
    """Issue 26 item 10 leftover: the folders discovery left out are named, with the reason,
    the same on a first build and its rerun; a build that left none out writes no such key, so
    its bytes and older manifests stay as they were."""
    from treeprep.schemas.manifest import load_manifest

    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", good_rows(3, "a"))
    write_jsonl(logs / "sub" / "b.jsonl", good_rows(2, "b"))
    code, out = build_cli(logs / "old", logs / "sub")
    assert code == 0, out
    assert "excluded_inputs" not in manifest(logs / "old")  # nothing left out: no key
    assert load_manifest(str(logs / "old")).excluded_inputs == []  # and it loads
    expected = [
        {"path": "o", "reason": "the build's output folder"},
        {"path": "old", "reason": "holds a treeprep build (manifest.json)"},
    ]
    o = logs / "o"
    for _ in range(2):  # before OUT exists, and once it holds a build
        code, out = build_cli(o, logs)
        assert code == 0, out
        assert manifest(o)["excluded_inputs"] == expected
    assert [e.path for e in load_manifest(str(o)).excluded_inputs] == ["o", "old"]
    # a glob, OUT elsewhere: o is now another build; a folder with only a lock is one too
    write_jsonl(logs / "locked" / "c.jsonl", good_rows(1, "c"))
    (logs / "locked" / ".work").mkdir()
    (logs / "locked" / ".work" / "build.lock").write_text("")
    code, out = build_cli(tmp_path / "g", str(logs / "**" / "*.jsonl"))
    assert code == 0, out
    build = "holds a treeprep build (manifest.json)"
    assert manifest(tmp_path / "g")["excluded_inputs"] == [
        {"path": "locked", "reason": "holds a treeprep build's lock (.work/build.lock)"},
        {"path": "o", "reason": build},
        {"path": "old", "reason": build},
    ]


# ---- issue 26 item 3: a deeply nested first record is a reject, not a crashed detection ---------


def test_deeply_nested_first_record_is_a_reject_naming_the_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "good.jsonl", good_rows(2))
    (logs / "deep.jsonl").write_text('{"a": ' * 1000 + "1" + "}" * 1000 + "\n")
    schema = '{"type": "object", "properties": {"x": ' * 495 + '{"type": "string"}' + "}}" * 495
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + schema + "}}"
    ok = json.dumps({"messages": [{"role": "user", "content": "hi"}],
                     "completion": {"role": "assistant", "content": "yo"}})  # fmt: skip
    (logs / "tools.jsonl").write_text(ok[:-1] + ', "tools": [' + tool + "]}\n" + ok + "\n")
    code, out = build_cli(tmp_path / "o", logs)  # before the fix: RecursionError, nothing written
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    by_file = {r["file"]: r for r in rejects(tmp_path / "o")}
    assert by_file["deep.jsonl"]["line"] == 1
    assert "nested deeper than 200 levels" in by_file["deep.jsonl"]["reason"]
    assert by_file["tools.jsonl"]["line"] == 1  # detected by its line 2; line 1 is its reject
    assert "nested deeper than 100 levels" in by_file["tools.jsonl"]["reason"]
    assert m["counts"]["records_in_trees"] == 3


# ---- issue 26 item 8: a compressed file cut inside its first block is a reject ------------------


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_file_cut_in_its_first_block_is_a_reject(tmp_path: Path, suffix: str) -> None:
    import gzip

    logs = tmp_path / "logs"
    write_jsonl(logs / "good.jsonl", good_rows(2))
    data = "".join(json.dumps(r) + "\n" for r in good_rows(50)).encode()
    packed = gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data)
    (logs / f"cut.jsonl{suffix}").write_bytes(packed[:24])  # no whole line decodes
    code, out = build_cli(tmp_path / "o", logs)
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    (rej,) = rejects(tmp_path / "o")  # before the fix: "no known format", skipped, no reject
    kind = "gzip" if suffix == ".gz" else "zstd"
    assert rej["file"] == f"cut.jsonl{suffix}" and rej["line"] >= 1
    assert f"truncated or corrupt {kind} stream" in rej["reason"]
    assert m["skipped_files"] == []


# ---- issue 26 items 7, 9: Parquet rows have a size limit; a corrupt page names its row group ----


def _chat(i: int, text: str = "") -> dict:
    return {"messages": [{"role": "user", "content": f"q{i} {text}"},
                         {"role": "assistant", "content": f"a{i}"}]}  # fmt: skip


def test_parquet_row_over_the_record_limit_is_a_reject_and_unused_columns_are_not_read(
    tmp_path: Path,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_chat(0), _chat(1, "x" * (2 << 20)), _chat(2)]
    blobs = ["", "", "y" * (2 << 20)]  # a column no conversation reads
    table = pa.Table.from_pylist([{**r, "blob": b} for r, b in zip(rows, blobs, strict=True)])
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "c.parquet")
    code, out = build_cli(tmp_path / "o", tmp_path / "in", extra=("--max-record-mb", "1"))
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    (rej,) = rejects(tmp_path / "o")  # before the fix: the 2 MB row was accepted
    assert rej["line"] == 2 and "over the limit of 1,048,576 bytes per record" in rej["reason"]
    assert m["counts"]["records_in_trees"] == 2


def test_corrupt_parquet_page_names_the_row_group_and_the_rest_is_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([_chat(i, "w " * 40) for i in range(40)]), good,
                   row_group_size=20, compression="zstd")  # fmt: skip
    page = pq.ParquetFile(good).metadata.row_group(1).column(1).data_page_offset
    (tmp_path / "in").mkdir()
    bad = tmp_path / "in" / "c.parquet"
    for k in range(64):  # a flip in row group 1's page that its decoder refuses
        data = bytearray(good.read_bytes())
        data[page + k] ^= 0x5A
        bad.write_bytes(bytes(data))
        try:
            for _ in pq.ParquetFile(bad).iter_batches(row_groups=[1]):
                pass
        except (OSError, ValueError):
            break
    else:
        raise AssertionError("no flip breaks the page")
    code, out = build_cli(tmp_path / "o", bad)
    assert code == 0, out
    m = assert_reconciles(tmp_path / "o")
    (rej,) = rejects(tmp_path / "o")  # before the fix: "internal error in adapter"
    assert rej["line"] == 21 and "internal error" not in rej["reason"]
    assert rej["reason"].startswith("cannot read Parquet row group 1 (rows 21-40): ")
    assert m["counts"]["records_in_trees"] == 20
