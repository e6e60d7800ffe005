"""formats._read: records(path, fmt) and document(path), the two ways an adapter reads a file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from treeprep.errors import InputError
from treeprep.formats._read import Document, document, records
from treeprep.io.jsonparse import NonFinite
from treeprep.schemas import Reject


def _reasons(got: list[tuple[int, object]]) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    for line, v in got:
        if isinstance(v, Reject):
            out.append((line, (v.file, v.line, v.format, v.reason)))
        else:
            out.append((line, v))
    return out


def test_records_yields_values_and_tagged_rejects_in_file_order(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{oops\n[1, 2]\n{"t": NaN}\n')
    got = _reasons(list(records(str(p), "fmt-x")))
    assert got[0] == (1, {"a": 1})
    line, (file, rline, fmt, reason) = got[1]  # type: ignore[misc]
    assert (line, file, rline, fmt) == (3, str(p), 3, "fmt-x")
    assert reason.startswith("malformed JSON: ")
    assert got[2] == (4, [1, 2])
    assert got[3] == (5, (str(p), 5, "fmt-x", "t: expected a finite number, got NaN"))


def test_records_objects_rejects_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"a": 1}\n[1, 2]\n'))
    got = _reasons(list(records(str(p), "agent", objects=True)))
    assert got == [
        (1, {"a": 1}),
        (2, (str(p), 2, "agent", "expected a JSON object per line, got array")),
    ]


def test_records_of_an_empty_file_is_one_reject(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    p.write_bytes(b"\n \n")
    assert _reasons(list(records(str(p), "f"))) == [(0, (str(p), 0, "f", "empty file"))]


def test_document_value_text_and_element_lines(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    p.write_bytes(b'\xef\xbb\xbf[\n  {"id": "a"},\n  {\n    "id": "b"\n  }\n]\n')
    d = document(str(p))
    assert d.value == [{"id": "a"}, {"id": "b"}]
    assert d.text.startswith("[\n")  # the BOM is not part of the text
    assert d.element_lines(2) == [2, 3]
    assert d.element_lines(3) == [1, 1, 1]  # the layout does not match the count: never a guess
    assert d.line_of('"b"') == 4
    assert d.line_of('"zz"', default=7) == 7
    assert Document([1], "[1]").element_lines(1) == [1]


def test_document_from_bytes_keeps_non_finite_only_when_asked(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    data = b'{\n  "reward": NaN\n}'
    p.write_bytes(data)
    d = document(str(p), data=data, keep_non_finite=True)
    assert isinstance(d.value["reward"], NonFinite) and d.value["reward"] == "NaN"
    with pytest.raises(InputError) as ei:
        document(str(p))
    assert (ei.value.file, ei.value.line, ei.value.reason) == (
        str(p),
        2,
        "reward: expected a finite number, got NaN",
    )


def test_document_errors_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "d.json.gz"
    p.write_bytes(gzip.compress(b'{\n  "a": 1\n  "b": 2\n}'))
    with pytest.raises(InputError) as ei:
        document(str(p))
    assert (ei.value.file, ei.value.line) == (str(p), 3)
    assert ei.value.reason.startswith("malformed JSON at column 3: ")
    empty = tmp_path / "e.json"
    empty.write_bytes(b"")
    with pytest.raises(InputError) as ei:
        document(str(empty))
    assert (ei.value.file, ei.value.line, ei.value.reason) == (str(empty), 0, "empty file")
