"""treeprep.io: input expansion, transparent decompression, lines, JSON, and their failure modes."""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

import pytest
import zstandard

from treeprep.errors import InputError
from treeprep.io import (
    expand_inputs,
    file_sha256,
    head_record,
    iter_json_records,
    iter_lines,
    json_key_in,
    load_json_document,
    open_binary,
    parse_json_line,
    read_head,
)
from treeprep.schemas import Reject

LINES = [b'{"i": %d, "text": "%s"}' % (i, b"abc" * (i % 50)) for i in range(30_000)]
DATA = b"\n".join(LINES) + b"\n"


def _zstd_two_frames(data: bytes) -> bytes:
    half = len(data) // 2
    c = zstandard.ZstdCompressor()
    return c.compress(data[:half]) + c.compress(data[half:])


def _zstd_streamed(data: bytes) -> bytes:
    """A frame without a content size (written by a streaming compressor)."""
    obj = zstandard.ZstdCompressor().compressobj()
    return obj.compress(data) + obj.flush()


# --------------------------------------------------------------------------------------------
# expand_inputs
# --------------------------------------------------------------------------------------------


def test_expand_inputs_files_folders_globs(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".hidden").mkdir()
    for rel in ["d/b.jsonl", "d/a.json", "d/sub/c.jsonl.gz", "d/.x.jsonl", "d/.hidden/y.jsonl"]:
        (tmp_path / rel).write_bytes(b"{}\n")
    (tmp_path / "top.jsonl").write_bytes(b"{}\n")
    d = str(tmp_path / "d")
    got = expand_inputs([d, str(tmp_path / "top.jsonl"), os.path.join(d, "b.jsonl")])
    assert got == sorted(
        [
            (os.path.join(d, "a.json"), False),
            (os.path.join(d, "b.jsonl"), True),  # also named explicitly: explicit wins
            (os.path.join(d, "sub", "c.jsonl.gz"), False),
            (str(tmp_path / "top.jsonl"), True),
        ]
    )
    assert expand_inputs([str(tmp_path / "d" / "*.json*")]) == [
        (os.path.join(d, "a.json"), False),
        (os.path.join(d, "b.jsonl"), False),
    ]
    assert expand_inputs([str(tmp_path / "**" / "c.jsonl.gz")]) == [
        (os.path.join(d, "sub", "c.jsonl.gz"), False)
    ]


@pytest.mark.parametrize("spec", ["missing.jsonl", "nothing-*.jsonl"])
def test_expand_inputs_missing(tmp_path: Path, spec: str) -> None:
    with pytest.raises(InputError) as ei:
        expand_inputs([str(tmp_path / spec)])
    assert ei.value.file == str(tmp_path / spec)
    assert ei.value.line == 0
    assert ei.value.reason == "no such file or folder"


def test_file_sha256(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(DATA)
    assert file_sha256(str(p)) == hashlib.sha256(DATA).hexdigest()


# --------------------------------------------------------------------------------------------
# decompression and lines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,encode",
    [
        ("a.jsonl", lambda d: d),
        ("a.jsonl.gz", gzip.compress),
        ("a.jsonl.zst", _zstd_two_frames),
        ("b.jsonl.zst", _zstd_streamed),
    ],
)
def test_open_binary_and_lines_roundtrip(tmp_path: Path, name: str, encode) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_bytes(encode(DATA))
    with open_binary(str(p)) as f:
        assert f.read() == DATA
    assert read_head(str(p), 1000) == DATA[:1000]
    got = list(iter_lines(str(p)))
    assert [n for n, _ in got] == list(range(1, len(LINES) + 1))
    assert [line for _, line in got] == LINES


def test_iter_lines_crlf_blank_lines_and_no_final_newline(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\r\n\r\n   \n{"b": 2}\n\n{"c": 3}')
    assert list(iter_lines(str(p))) == [(1, b'{"a": 1}'), (4, b'{"b": 2}'), (6, b'{"c": 3}')]


def _complete_lines_in(prefix_data: bytes) -> int:
    return prefix_data.count(b"\n")


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_truncated_stream_yields_complete_lines_then_names_the_cut_line(
    tmp_path: Path, codec: str
) -> None:
    if codec == "gzip":
        blob = gzip.compress(DATA)
        cut = blob[: len(blob) * 2 // 3]
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        recovered = d.decompress(cut)
        p = tmp_path / "t.jsonl.gz"
    else:
        blob = _zstd_two_frames(DATA)
        cut = blob[: len(blob) * 2 // 3]  # inside the second frame
        first_frame_len = len(zstandard.ZstdCompressor().compress(DATA[: len(DATA) // 2]))
        # only whole frames, checked against their checksum, are read (issue 15 item 5): the
        # lines of the cut second frame never reach a caller
        recovered = zstandard.ZstdDecompressor().decompress(cut[:first_frame_len])
        p = tmp_path / "t.jsonl.zst"
    p.write_bytes(cut)
    n_complete = _complete_lines_in(recovered)
    assert 0 < n_complete < len(LINES)
    got: list[tuple[int, bytes]] = []
    with pytest.raises(InputError) as ei:
        for item in iter_lines(str(p)):
            got.append(item)
    assert got == [(i + 1, LINES[i]) for i in range(n_complete)]
    assert ei.value.file == str(p)
    assert ei.value.line == n_complete + 1
    assert ei.value.reason.startswith(f"truncated or corrupt {codec} stream: ")
    # read_head never raises on a broken stream; it returns what it could decode
    head = read_head(str(p), len(DATA))
    assert DATA.startswith(head) and len(head) >= len(recovered) - (1 << 20)


def test_corrupt_zstd_raises_input_error(tmp_path: Path) -> None:
    blob = bytearray(_zstd_streamed(DATA))
    blob[len(blob) // 2 : len(blob) // 2 + 64] = b"\x00" * 64
    p = tmp_path / "c.jsonl.zst"
    p.write_bytes(bytes(blob))
    with pytest.raises(InputError) as ei:
        for _ in iter_lines(str(p)):
            pass
    assert ei.value.reason.startswith("truncated or corrupt zstd stream: ")


def test_not_gzip_at_all(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl.gz"
    p.write_bytes(b'{"plain": true}\n')
    with pytest.raises(InputError) as ei:
        list(iter_lines(str(p)))
    assert (ei.value.line, ei.value.reason[:34]) == (1, "truncated or corrupt gzip stream: ")


def test_single_50mb_line(tmp_path: Path) -> None:
    big = b"x" * (50 * 1024 * 1024)
    line = b'{"messages": [{"role": "user", "content": "' + big + b'"}]}'
    p = tmp_path / "big.jsonl"
    p.write_bytes(b'{"a": 1}\n' + line + b"\r\n" + b'{"b": 2}\n')
    got = list(iter_lines(str(p)))
    assert [n for n, _ in got] == [1, 2, 3]
    assert got[1][1] == line
    rec = parse_json_line(str(p), 2, got[1][1])
    assert isinstance(rec, dict) and len(rec["messages"][0]["content"]) == len(big)


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def test_parse_json_line_rejects() -> None:
    assert parse_json_line("f", 3, b'{"a": [1, 2]}') == {"a": [1, 2]}
    r = parse_json_line("f", 7, b'{"a": "caf\xc3\xa9 \xff"}')
    assert isinstance(r, Reject)
    assert (r.file, r.line, r.reason) == ("f", 7, "invalid UTF-8 at byte 13")
    r = parse_json_line("f", 8, b'{"a": 1,}')
    assert isinstance(r, Reject) and r.line == 8 and r.reason.startswith("malformed JSON: ")
    assert "column" in r.reason
    r = parse_json_line("f", 9, b"42")
    assert isinstance(r, Reject) and r.reason == "expected a JSON object, got int"


def test_load_json_document(tmp_path: Path) -> None:
    p = tmp_path / "ok.json.gz"
    p.write_bytes(gzip.compress(b'{\n  "a": [1, 2]\n}\n'))
    assert load_json_document(str(p)) == {"a": [1, 2]}

    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{\n  "a": 1,\n  "b": ]\n}\n')
    with pytest.raises(InputError) as ei:
        load_json_document(str(bad))
    assert (ei.value.file, ei.value.line) == (str(bad), 3)
    assert ei.value.reason.startswith("malformed JSON at column 8")

    utf = tmp_path / "utf.json"
    utf.write_bytes(b'{\n  "a": "\xfe"\n}')
    with pytest.raises(InputError) as ei:
        load_json_document(str(utf))
    assert (ei.value.line, ei.value.reason) == (2, "invalid UTF-8 at byte 10 (column 9)")

    empty = tmp_path / "empty.json"
    empty.write_bytes(b"  \n")
    with pytest.raises(InputError) as ei:
        load_json_document(str(empty))
    assert (ei.value.line, ei.value.reason) == (0, "empty file")


def test_iter_json_records(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\n{oops\n\n[1]\n')
    got = list(iter_json_records(str(p)))
    assert got[0] == (1, {"a": 1})
    assert got[1][0] == 2 and isinstance(got[1][1], Reject) and got[1][1].line == 2
    assert got[2] == (4, [1])
    e = tmp_path / "e.jsonl"
    e.write_bytes(b"\n\n")
    ((line, r),) = list(iter_json_records(str(e)))
    assert (
        line == 0
        and isinstance(r, Reject)
        and (r.file, r.line, r.reason) == (str(e), 0, "empty file")
    )


def test_sniff_helpers() -> None:
    assert head_record(b'{"a": 1}\n{"b"') == {"a": 1}
    assert head_record(b'{\n  "a": 1\n}') == {"a": 1}  # a whole small document
    assert head_record(b'{"a": "cut in the mid') is None
    head = b'{"text": "the key \\"prompt_token_ids\\": is quoted here", "generation_token_ids" : [1'
    assert json_key_in(head, "generation_token_ids")
    assert not json_key_in(head, "prompt_token_ids")
