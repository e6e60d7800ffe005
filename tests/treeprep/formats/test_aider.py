"""Aider's logs (issue 27 item 9): the ``--llm-history-file`` log read, the chat history refused.

The logs in ``sample_data/aider/`` (dot-files, as Aider names them) and below are written by hand
from the format as Aider's source writes it (``TO LLM`` and ``LLM RESPONSE`` headers with the time,
``-------`` before each message, every line behind its role in capitals; cache-marked messages as
``type``/``text``/``cache_control`` lines). ``EXPECTED`` is the message lists those lines stand
for, written out separately: the apply_chat_template reference is built from it, never from the
adapter's output.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import InputError
from treeprep.formats import detect_format, get_format
from treeprep.formats.aider import CHAT_NAME, NAME
from treeprep.formats.base import ReadOptions
from treeprep.io.inputs import discover_inputs
from treeprep.io.lines import MAX_RECORD_BYTES, set_max_record_bytes
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data" / "aider"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
TAG = "thinking-content-7bbeb8e1441453ad999a0bbba8a46d4b"

#: one session of two requests; the second carries the first's exchange and a cache-marked
#: repo map, and its reply streamed reasoning first
LOG = (SAMPLES / ".aider.llm.history").read_text(encoding="utf-8")
CHAT_MD = (SAMPLES / ".aider.chat.history.md").read_text(encoding="utf-8")

_SYSTEM = {
    "role": "system",
    "content": "Act as an expert software developer.\n\nAlways use best practices.",
}
_ASK = {"role": "user", "content": "Add a --verbose flag to cli.py"}
_REPLY_1 = "\n".join(
    [
        "cli.py",
        "```python",
        "<<<<<<< SEARCH",
        '    parser.add_argument("--quiet")',
        "=======",
        '    parser.add_argument("--quiet")',
        '    parser.add_argument("--verbose", action="store_true")',
        ">>>>>>> REPLACE",
        "```",
    ]
)
#: (messages, completion) of each call of LOG
EXPECTED: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([_SYSTEM, _ASK], {"role": "assistant", "content": _REPLY_1}),
    (
        [
            _SYSTEM,
            # the part's text keeps its final newline: part texts are not split into lines
            {
                "role": "user",
                "content": "Here are summaries of some files present in my git repository:\n"
                "cli.py:\n  def main(): ...\n",
            },
            _ASK,
            {"role": "assistant", "content": "Added the flag."},
            {"role": "user", "content": "Now print the config when it is set."},
        ],
        {
            "role": "assistant",
            "content": "Print it after `parse_args()`.",
            "reasoning_content": "The flag is parsed; print after parsing.",
        },
    ),
]


def _write(tmp_path: Path, text: str, name: str = ".aider.llm.history") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _read(p: Path) -> list[Any]:
    return list(get_format(NAME).read(str(p), ReadOptions()))


def _as_expected(c: ChatCall) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return (
        [m.model_dump(exclude_none=True) for m in c.messages],
        c.completion.model_dump(exclude_none=True),
    )


def test_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    for name in (".aider.llm.history", "session.log", "llm.txt"):
        p = _write(tmp_path, LOG, name)
        spec = detect_format(str(p), p.read_bytes())
        assert spec is not None and spec.name == NAME
    md = _write(tmp_path, CHAT_MD, ".aider.chat.history.md")
    spec = detect_format(str(md), md.read_bytes())
    assert spec is not None and spec.name == CHAT_NAME
    other = _write(tmp_path, "# Notes\n\nTO LLM 2025-03-01T10:00:00\n", "notes.md")
    assert detect_format(str(other), other.read_bytes()) is None
    sample = ROOT / "sample_data" / "tokens.jsonl"
    assert detect_format(str(sample), sample.read_bytes()[:65536]).name not in (NAME, CHAT_NAME)


def test_requests_and_replies_become_calls(tmp_path: Path) -> None:
    calls = _read(_write(tmp_path, LOG))
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [_as_expected(c) for c in calls] == EXPECTED
    assert [c.timestamp for c in calls] == ["2025-03-01T10:00:00", "2025-03-01T10:02:30"]
    assert [c.source_line for c in calls] == [1, 18]
    assert len({c.call_id for c in calls}) == 2 and calls[0].group_id is None  # grouped by file
    p = calls[0].provenance
    assert (p.exact_messages, p.reconstructed, p.exact_tokens) == (False, False, False)


def test_a_log_written_on_windows_reads_the_same(tmp_path: Path) -> None:
    p = tmp_path / "win.history"
    p.write_bytes(LOG.replace("\n", "\r\n").encode())
    assert [_as_expected(c) for c in _read(p)] == EXPECTED


def test_chat_history_is_refused_with_the_way_out(tmp_path: Path) -> None:
    md = _write(tmp_path, CHAT_MD, ".aider.chat.history.md")
    with pytest.raises(InputError) as e:
        list(get_format(CHAT_NAME).read(str(md), ReadOptions()))
    assert e.value.line == 2 and "--llm-history-file" in e.value.reason
    assert "system prompt, repo map and file contents" in e.value.reason


_REQ = "TO LLM 2025-03-01T11:00:00\n-------\nUSER hi\n"
_RESP = "LLM RESPONSE 2025-03-01T11:00:05\nASSISTANT hello\n"
_GOOD = _REQ + _RESP  # lines 1-5


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("junk\n" + _GOOD, 1, "expected a 'TO LLM <time>' line"),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\n-------\nUSER a\nuser b\n" + _RESP, 9, "'USER '"),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\n-------\n\n-------\nUSER a\n" + _RESP, 8, "empty"),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\n-------\n-------\nUSER a\n" + _RESP, 7, "no lines"),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\nUSER a\n" + _RESP, 7, "expected '-------'"),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\n-------\nTOOL x\n" + _RESP, 8, "SYSTEM, USER"),
        (
            _GOOD + "TO LLM 2025-03-01T11:01:00\n-------\nUSER type: text\nUSER text: see\n"
            "USER type: image_url\nUSER Image_url URL: data:image/png;base64,AAAA\n" + _RESP,
            11,
            "image",
        ),
        (_GOOD + "TO LLM 2025-03-01T11:01:00\n\n" + _RESP, 6, "no messages"),
        (_REQ + _GOOD, 1, "the next request starts at line 4"),
        (_GOOD + _RESP, 6, "with no 'TO LLM' before it"),
        (_GOOD + _REQ, 6, "the log ends"),
        (_GOOD + _REQ + "LLM RESPONSE 2025-03-01T11:00:05\n\n", 9, "the reply is empty"),
        (
            _GOOD
            + _REQ
            + f"LLM RESPONSE 2025-03-01T11:00:05\nASSISTANT <{TAG}>\nASSISTANT \nASSISTANT I s\n",
            9,
            "never ends",
        ),
        (_GOOD + _REQ + "LLM RESPONSE 2025-03-01T11:00:05\nhello\n", 10, "'ASSISTANT '"),
    ],
)
def test_malformed_blocks_are_rejects_naming_the_line(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    items = _read(_write(tmp_path, text))
    rejects = [x for x in items if isinstance(x, Reject)]
    assert [(r.line, r.format) for r in rejects] == [(line, NAME)], rejects
    assert reason in rejects[0].reason and rejects[0].file.endswith(".aider.llm.history")
    calls = [x for x in items if isinstance(x, ChatCall)]
    assert [c.messages[-1].content for c in calls] == ["hi"]  # the good call is still read


def test_bad_bytes_and_blocks_over_the_limit_are_rejects(tmp_path: Path) -> None:
    p = tmp_path / "bytes.history"
    p.write_bytes(_GOOD.encode() + _REQ.replace("hi", "h\xe9").encode("latin-1") + _RESP.encode())
    (good, bad) = _read(p)
    assert isinstance(good, ChatCall) and isinstance(bad, Reject)
    assert bad.line == 8 and "not UTF-8" in bad.reason
    big = _write(tmp_path, _GOOD + _REQ.replace("hi", "x" * 3000) + _RESP, "big.history")
    set_max_record_bytes(1000)
    try:
        items = _read(big)
    finally:
        set_max_record_bytes(MAX_RECORD_BYTES)
    assert isinstance(items[0], ChatCall) and isinstance(items[1], Reject)
    assert items[1].line == 6 and "--max-record-mb" in items[1].reason and len(items) == 2


def test_a_compressed_log_reads_the_same(tmp_path: Path) -> None:
    p = tmp_path / ".aider.llm.history.gz"
    p.write_bytes(gzip.compress(LOG.encode()))
    assert [_as_expected(c) for c in _read(p)] == EXPECTED


def test_any_cut_or_shuffled_log_gives_calls_or_rejects(tmp_path: Path) -> None:
    """Dropped, repeated and moved lines: records and rejects only, one per block pairing."""
    rng = random.Random(27)
    lines = LOG.splitlines(keepends=True)
    for k in range(60):
        cut = list(lines)
        for _ in range(3):
            i = rng.randrange(len(cut))
            op = rng.randrange(3)
            if op == 0:
                del cut[i]
            elif op == 1:
                cut.insert(i, cut[i])
            else:
                cut.insert(rng.randrange(len(cut)), cut.pop(i))
        items = _read(_write(tmp_path, "".join(cut), f"m{k}.history"))
        assert items and all(isinstance(x, ChatCall | Reject) for x in items)
        for x in items:
            if isinstance(x, Reject):
                assert x.line >= 1 and x.reason and not x.reason.startswith("internal")
            else:
                assert x.completion.content.strip()  # never an empty reply


def test_dot_file_named_on_the_command_line_is_built(tmp_path: Path) -> None:
    logs = tmp_path / "repo"
    logs.mkdir()
    bad_tail = _REQ  # a request the log ends in: one reject
    p = _write(logs, LOG + bad_tail)
    _write(logs, CHAT_MD, ".aider.chat.history.md")
    with pytest.raises(InputError, match=r"folder holds only hidden files \(\.aider\.chat"):
        discover_inputs([str(logs)])  # hidden files are skipped inside folders, and named
    found = discover_inputs([str(p)]).files
    assert [(f.name, f.explicit) for f in found] == [(".aider.llm.history", True)]

    out = tmp_path / "out"
    md = logs / ".aider.chat.history.md"
    m = build(BuildConfig(inputs=[str(p), str(md)], out=str(out)))
    c = m.counts
    assert (c.records_read, c.records_in_trees, c.records_rejected) == (4, 2, 2)
    assert c.records_read == c.records_in_trees + c.records_rejected + c.records_filtered
    assert c.trees == 1  # the two calls of the session share one tree
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted((r["file"], r["line"], r["format"]) for r in rejects) == [
        (".aider.chat.history.md", 2, CHAT_NAME),
        (".aider.llm.history", LOG.count("\n") + 1, NAME),
    ]


@needs_qwen
def test_calls_match_apply_chat_template_qwen3(tmp_path: Path) -> None:
    from transformers import AutoTokenizer  # the reference only; rendering never imports it

    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = AutoTokenizer.from_pretrained(str(QWEN3), local_files_only=True)
    calls = _read(_write(tmp_path, LOG))
    assert len(calls) == len(EXPECTED) == 2
    for call, (messages, completion) in zip(calls, EXPECTED, strict=True):
        seq = r.render(call, group_id="g")
        kw = {"tokenize": True, "return_dict": False}
        full = list(hf.apply_chat_template([*messages, completion], **kw))
        prompt = list(hf.apply_chat_template(messages, add_generation_prompt=True, **kw))
        assert list(seq.tokens) == full
        assert seq.loss_spans[0][0] == len(prompt) and seq.loss_spans[-1][1] == len(full)
