"""Detection does not depend on the first 64 KB of a file (issue 14 item 9).

Each test is a regression named after the bug: a long first record, a pretty-printed JSON array and
a UTF-8 byte order mark used to make a file "unrecognised" (or its first record a reject).
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from treeprep.formats import ReadOptions, detect_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall

BOM = b"\xef\xbb\xbf"


def _detect(p: Path) -> str | None:
    spec = detect_format(str(p), read_head(str(p)))
    return None if spec is None else spec.name


def _all(p: Path) -> list:
    spec = detect_format(str(p), read_head(str(p)))
    assert spec is not None
    return list(spec.read(str(p), ReadOptions()))


def _conversation(text_len: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "x" * text_len},
            {"role": "assistant", "content": "ok"},
        ]
    }


def test_regression_70kb_first_record_was_unrecognised(tmp_path: Path) -> None:
    p = tmp_path / "big.jsonl"
    p.write_bytes(
        orjson.dumps(_conversation(70_000)) + b"\n" + orjson.dumps(_conversation(3)) + b"\n"
    )
    assert len(read_head(str(p))) == 65536
    assert _detect(p) == "chat-messages"
    assert [type(x) for x in _all(p)] == [ChatCall, ChatCall]


def test_regression_70kb_first_record_with_keys_after_the_head(tmp_path: Path) -> None:
    """A Responses rollout whose distinguishing key comes after 70 KB of input."""
    rec = {
        "input": [{"role": "user", "content": "y" * 70_000}],
        "output": [{"type": "message", "role": "assistant", "content": "done"}],
    }
    p = tmp_path / "rollouts.jsonl"
    p.write_bytes(orjson.dumps(rec) + b"\n")
    assert _detect(p) == "openai-responses"


def test_regression_pretty_json_array_was_unrecognised(tmp_path: Path) -> None:
    calls = [
        {
            "messages": [{"role": "user", "content": "z" * 40_000}],
            "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]},
        }
        for _ in range(3)
    ]
    p = tmp_path / "calls.json"
    p.write_text(json.dumps(calls, indent=2))
    assert _detect(p) == "openai-chat-json"
    assert [type(x) for x in _all(p)] == [ChatCall] * 3


def test_regression_bom_made_jsonl_unrecognised_and_its_first_line_a_reject(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(
        BOM + orjson.dumps(_conversation(5)) + b"\n" + orjson.dumps(_conversation(6)) + b"\n"
    )
    assert _detect(p) == "chat-messages"
    items = _all(p)
    assert [type(x) for x in items] == [ChatCall, ChatCall]
    assert items[0].source_line == 1


def test_regression_bom_per_call_log_and_json_document(tmp_path: Path) -> None:
    rec = {
        "messages": [{"role": "user", "content": "q"}],
        "completion": {"role": "assistant", "content": "a"},
    }
    p = tmp_path / "calls.jsonl"
    p.write_bytes(BOM + orjson.dumps(rec) + b"\n")
    assert _detect(p) == "openai-chat"
    assert [type(x) for x in _all(p)] == [ChatCall]
    q = tmp_path / "share.json"
    q.write_bytes(
        BOM
        + orjson.dumps(
            [{"conversations": [{"from": "human", "value": "h"}, {"from": "gpt", "value": "g"}]}]
        )
    )
    assert _detect(q) == "sharegpt"
    assert [type(x) for x in _all(q)] == [ChatCall]


def test_truly_unknown_long_file_stays_unrecognised(tmp_path: Path) -> None:
    p = tmp_path / "other.jsonl"
    p.write_bytes(orjson.dumps({"payload": "w" * 80_000}) + b"\n")
    assert _detect(p) is None
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{" + b"a" * 70_000)
    assert _detect(bad) is None


# ---- issue 26 item 4: sniffing never holds or parses a line over --max-record-mb -------------


def _with_record_limit(n: int):  # type: ignore[no-untyped-def]
    import contextlib

    from treeprep.io.lines import record_limit, set_max_record_bytes

    @contextlib.contextmanager
    def limited():  # type: ignore[no-untyped-def]
        old = record_limit()
        set_max_record_bytes(n)
        try:
            yield
        finally:
            set_max_record_bytes(old)

    return limited()


def test_regression_first_line_over_the_record_limit_was_parsed_whole(tmp_path: Path) -> None:
    import tracemalloc

    p = tmp_path / "big.jsonl"
    p.write_bytes(orjson.dumps(_conversation(8 << 20)) + b"\n" + orjson.dumps(_conversation(3)))
    with _with_record_limit(1 << 20):
        tracemalloc.start()
        try:
            assert _detect(p) == "chat-messages"  # detected by line 2
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # before the fix the 8 MB line was read, decoded to text and parsed, once per sniffer
    assert peak < 4 << 20, f"detection held {peak:,} bytes"


def test_regression_first_line_over_the_limit_hid_the_rest_of_the_file(tmp_path: Path) -> None:
    """A first line of 3 MB that is not JSON made the file "unrecognised": a folder build skipped
    its good records without a reject."""
    p = tmp_path / "r.jsonl"
    good = orjson.dumps({"prompt_token_ids": [1, 2], "generation_token_ids": [3]})
    p.write_bytes(b"x" * (3 << 20) + b"\n" + good + b"\n" + good + b"\n")
    with _with_record_limit(1 << 20):
        assert _detect(p) == "tokens"
        items = _all(p)
    assert items[0].line == 1 and "over the limit of 1,048,576 bytes" in items[0].reason
    assert len(items) == 3


def test_no_line_within_the_limits_is_an_input_error_naming_line_1(tmp_path: Path) -> None:
    import pytest

    from treeprep.errors import InputError

    p = tmp_path / "r.jsonl"
    p.write_bytes(b"[" * 5000 + b"1" + b"]" * 5000 + b"\n" + b"y" * (2 << 20) + b"\n")
    with _with_record_limit(1 << 20), pytest.raises(InputError, match=r"r\.jsonl:1: the first"):
        _detect(p)


def _stdlib_first(data: bytes, eof: bool) -> tuple[str, object] | None:
    """What the first record of ``data`` is by the standard library's ``raw_decode`` (how
    detection read it before orjson did): the reference for :func:`_parse_first`."""
    s = data.removeprefix(BOM).lstrip()
    if not s:
        return None
    if not eof and b"\n" in s and not s.startswith(b"["):
        try:
            return "value", json.loads(s[: s.index(b"\n")])
        except ValueError:
            pass
    text = s.decode("utf-8", errors="replace")
    kind, at = ("array", len(text) - len(text[1:].lstrip())) if text[0] == "[" else ("value", 0)
    if kind == "array" and text[at : at + 1] == "]":
        return "array", None
    try:
        return kind, json.JSONDecoder().raw_decode(text, at)[0]
    except ValueError:
        return None


_FIRSTS = [
    b'{"\xc3\xa9\xf0\x9f\x99\x82": ["\xc3\xbc", 1]}  {"b": 1}',  # characters before more content
    b'{\n  "trajectory": [{"a": "\xc3\xa9"}],\n  "history": []\n}',  # pretty-printed
    b'{\n  "trajectory": [{"a": "\xc3\xa9"}',  # cut
    b'[\n  {"a": "\xc3\xa9"},\n  {"b": 2}\n]',
    b'[ {"a": "\xc3\xa9"}, {"b"',  # an array whose first element is whole
    b"[ ]",
    b'{"a": NaN, "b": "\xc3\xa9"} {"c": 1}',  # orjson refuses NaN
    b'{"a": "\xff\xfe"}',  # invalid UTF-8: replaced
    b'{"a": 1}{"b": 2}',
    b'{"a": 1}]',
    b"   ",
    b'"text" 1',
]


def test_the_first_record_reads_as_the_standard_library_reads_it() -> None:
    """orjson reads the first record (tens of MB for a SWE-agent trajectory) where the standard
    library read it; both read the same value, whole or cut, and where orjson refuses (NaN,
    invalid UTF-8) the standard library still reads it."""
    from treeprep.formats._sniff import _parse_first

    for data in _FIRSTS:
        for eof in (True, False):
            assert _parse_first(data, eof) == _stdlib_first(data, eof), (data, eof)


def test_a_whole_file_is_read_by_orjson_alone(monkeypatch) -> None:
    """With the whole file read, what orjson reads (all but NaN and invalid UTF-8) is never
    parsed again by the standard library, which a slip in the cut after the first value (orjson
    counts characters, not bytes) would make it do."""
    from treeprep.formats import _sniff

    class Refuses:
        def raw_decode(self, *args: object) -> None:
            raise AssertionError("parsed by the standard library")

    want = {data: _sniff._parse_first(data, True) for data in _FIRSTS}
    monkeypatch.setattr(_sniff, "_decoder", Refuses())
    for data in _FIRSTS:
        if b"NaN" not in data and b"\xff" not in data and data.strip():
            assert _sniff._parse_first(data, True) == want[data], data
