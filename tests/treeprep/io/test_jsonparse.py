"""treeprep.io.jsonparse: a JSON line to a record or a Reject, a document to a value or an
InputError naming the file, the line and what was expected."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.errors import InputError
from treeprep.io.jsonparse import (
    NonFinite,
    head_record,
    json_key_in,
    nested_deeper,
    parse_json_document,
    parse_json_line,
)
from treeprep.schemas import Reject


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


def test_sniff_helpers() -> None:
    assert head_record(b'{"a": 1}\n{"b"') == {"a": 1}
    assert head_record(b'{\n  "a": 1\n}') == {"a": 1}  # a whole small document
    assert head_record(b'{"a": "cut in the mid') is None
    head = b'{"text": "the key \\"prompt_token_ids\\": is quoted here", "generation_token_ids" : [1'
    assert json_key_in(head, "generation_token_ids")
    assert not json_key_in(head, "prompt_token_ids")


def _doc_error(data: bytes) -> tuple[str, int, str]:
    with pytest.raises(InputError) as ei:
        parse_json_document("d.json", data)
    return ei.value.file, ei.value.line, ei.value.reason


def test_parse_json_document_values() -> None:
    assert parse_json_document("d.json", b'{\n  "a": [1, 2]\n}\n') == {"a": [1, 2]}
    assert parse_json_document("d.json", b'\xef\xbb\xbf[1, {"b": null}]') == [1, {"b": None}]
    kept = parse_json_document("d.json", b'{"x": [1, NaN]}', keep_non_finite=True)
    assert kept == {"x": [1, "NaN"]} and isinstance(kept["x"][1], NonFinite)


def test_parse_json_document_errors_name_file_line_and_what_was_expected() -> None:
    assert _doc_error(b'{\n  "a": 1,\n  "b": ]\n}\n') == (
        "d.json",
        3,
        "malformed JSON at column 8: unexpected character, expected a JSON value",
    )
    assert _doc_error(b'{\n  "a": "\xfe"\n}') == (
        "d.json",
        2,
        "invalid UTF-8 at byte 10 (column 9)",
    )
    assert _doc_error(b"  \n") == ("d.json", 0, "empty file")
    assert _doc_error(b"\xef\xbb\xbf\n") == ("d.json", 0, "empty file")
    assert _doc_error(b'{\n  "t": {"p": 1.0,\n    "q": Infinity}\n}') == (
        "d.json",
        3,
        "t.q: expected a finite number, got Infinity",
    )


def _depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


#: strings that look like JSON structure: brackets, quotes and backslashes, escaped or not
_tricky = st.lists(
    st.sampled_from(["[", "]", "{", "}", '"', "\\", '\\"', "\\\\", "a", "é", "\n", ","]),
    max_size=6,
).map("".join)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | _tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky, inner, max_size=4),
    max_leaves=60,
)


@given(value=_json, limit=st.integers(0, 12))
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
def test_nested_deeper_is_the_depth_of_the_value_whatever_its_strings_hold(
    value: Any, limit: int
) -> None:
    """The C path reads the depth from the JSON text, outside the strings: brackets, quotes and
    backslashes inside strings and keys do not count."""
    assert nested_deeper(value, limit) == (_depth(value) > limit)


def test_nested_deeper_of_a_large_document_that_is_shallow_or_not() -> None:
    rows = [{"role": "tool", "content": '}]"\\' * 3, "calls": [{"a": [i]}]} for i in range(5000)]
    doc = {"trajectory": [{"messages": rows}]}
    assert _depth(doc) == 8
    assert not nested_deeper(doc, 8) and nested_deeper(doc, 7)
    doc["deep"] = json.loads("[" * 300 + "]" * 300)
    assert nested_deeper(doc, 200) and not nested_deeper(doc, 301)
