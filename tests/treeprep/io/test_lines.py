"""treeprep.io.lines: lines and JSONL records of plain and compressed files, and their failure
modes."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
import zstandard

from treeprep.errors import InputError
from treeprep.io.compressed import open_binary, read_head
from treeprep.io.jsonparse import parse_json_line
from treeprep.io.lines import iter_json_records, iter_lines
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


def test_iter_json_records_skips_a_bom_on_line_1_only(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\xef\xbb\xbf{"b": 2}\n')
    (first, second) = list(iter_json_records(str(p)))
    assert first == (1, {"a": 1})
    line, r = second  # a BOM inside the stream is not a BOM: the line is not JSON
    assert line == 2 and isinstance(r, Reject) and r.reason.startswith("malformed JSON: ")
