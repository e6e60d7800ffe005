"""Aider: each request converts only the messages it does not share with the one before.

A request logs the whole message list again: the history, then the files and the reminder that
the next request sends after more history. The reader finds the messages a request shares with
the one before by comparing bytes and hands them to ``ConvertedHistory`` as the same objects,
which keeps their messages. The reference is every request cut and converted afresh (nothing
shared: ``_Prompts._kept`` 0, and ``ConvertedHistory``'s identity checks fail). Every call and
reject must come out the same either way, on our sample and on random logs holding what a
request can do: grow, drop the files and the reminder, rewind (``/undo``, ``/clear``), be sent
again with more lines in its last message (the reminder put after the user's words), hold a
bad message (no lines, an empty text, a line without its role, an image, bytes that are not
UTF-8) that every request after it holds too, and cache-marked parts that end at once, span
separator lines, or are not ended until a later message's ``cache_control`` line; written with
CRLF line ends or not, read in reads of a few bytes (lines and headers cut across reads) or
whole, with blocks over the per-record limit.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from treeprep.formats import aider
from treeprep.formats.base import ReadOptions
from treeprep.io import lines
from treeprep.io.lines import MAX_RECORD_BYTES, set_max_record_bytes
from treeprep.schemas import ChatCall

ROOT = Path(__file__).resolve().parents[3]
SEP = "-------"
TAG = "thinking-content-7bbeb8e1441453ad999a0bbba8a46d4b"


def _message(rng: random.Random, role: str, k: int, bad: float) -> list[str]:
    """A message's lines (with its separator); with chance ``bad`` one that Aider could not
    have logged or that this reader rejects (``\\udcff`` is written as the byte 0xff)."""
    if rng.random() < bad:
        return rng.choice(
            [
                [SEP],  # no lines
                [SEP, ""],  # an empty text: logged without its role
                [SEP, f"{role} text {k}", "no role here"],
                [SEP, f"{role} see", f"{role} Image_url URL: data:image/png;base64,AAAA"],
                [SEP, f"{role} caf\udcff {k}"],
            ]
        )
    if rng.random() < 0.1:
        return _cached(rng, role, k)
    lines = [f"{role} {rng.choice(('run', 'fix', 'test', ''))} {k} {j}" for j in range(3)]
    return [SEP, *lines[: rng.randrange(1, 4)]] + [role] * (rng.random() < 0.2)


def _cached(rng: random.Random, role: str, k: int) -> list[str]:
    """A cache-marked text part: ended at once, spanning separator lines, or not ended (a later
    message's last line may end it), or with a ``cache_control`` line that is not its last."""
    mark = f"{role} cache_control: {{'type': 'ephemeral'}}"
    head = [SEP, f"{role} type: text", f"{role} text: summaries {k}"]
    shape = rng.randrange(5)
    if shape == 0:
        return [*head, "cli.py:", "  def main(): ...", "", mark]
    if shape == 1:
        return [*head, SEP, "TO LLM not a header", SEP, mark]
    if shape == 2:
        return head  # not ended here
    if shape == 3:
        return [*head, mark, f"{role} more"]
    return [SEP, mark]  # ends a part left open before it, if any


def _log(seed: int, turns: int, bad: float = 0.1) -> bytes:
    rng = random.Random(seed)
    system = [SEP, "SYSTEM Act as an expert software developer.", "SYSTEM ", "SYSTEM Be brief."]
    repo = [SEP, "USER type: text", "USER text: Here are summaries:", "cli.py:", "",
            "USER cache_control: {'type': 'ephemeral'}"]  # fmt: skip
    history: list[list[str]] = []
    lines = ["", "junk"][: rng.randrange(3)]  # before the first header
    for t in range(turns):
        r = rng.random()
        if r < 0.05:
            history = []  # /clear
        elif r < 0.12:
            del history[-rng.randrange(1, 4) :]  # /undo
        ask = _message(rng, "USER", t, bad)
        files = [[SEP, "USER I added these files:", f"USER file_{t}.py"], [SEP, "ASSISTANT Ok."]]
        sent = [system, *[repo] * (rng.random() < 0.8), *history]
        sent += [*files * (rng.random() < 0.5), ask, *[[SEP, "SYSTEM Reply in diffs."]] * (t % 2)]
        stamp = f"2025-03-01T10:{t // 60 % 60:02d}:{t % 60:02d}"
        lines += [f"TO LLM {stamp}", *(x for m in sent for x in m)]
        said = [f"ASSISTANT done {t}", "ASSISTANT ", f"ASSISTANT file_{t}.py"]
        think = [f"<{TAG}>", "", "hm", "", f"</{TAG}>", ""] * (rng.random() < 0.2)
        think = [f"ASSISTANT {x}" for x in think]
        if rng.random() < 0.95:
            lines += [f"LLM RESPONSE {stamp}", *think, *said]
        if rng.random() < 0.15:  # sent again, Aider's reminder put after the user's words
            lines += [f"TO LLM {stamp}", *(x for m in sent for x in m), "USER ", "USER In diffs."]
            lines += [f"LLM RESPONSE {stamp}", *said]
        history += [ask, [SEP, *said]]
    end = rng.choice(("\n", "\r\n"))
    text = "\ufeff" * (rng.random() < 0.1) + end.join(lines) + end * (rng.random() < 0.9)
    return text.encode("utf-8", "surrogateescape")


def _read(read_converted, path: Path, *, whole: bool) -> list[str]:
    with pytest.MonkeyPatch.context() as m:
        if whole:
            m.setattr(aider._Prompts, "_kept", lambda self, data: 0)
        return read_converted(aider.read, path, whole=whole)


def test_the_sample_converts_as_whole_conversions_do(read_converted):
    path = ROOT / "sample_data" / "aider" / ".aider.llm.history"
    got = _read(read_converted, path, whole=False)
    assert got == _read(read_converted, path, whole=True) and len(got) == 2


@pytest.mark.parametrize("seed", range(40))
def test_random_logs_convert_as_whole_conversions_do(seed, tmp_path, read_converted, monkeypatch):
    path = tmp_path / ".aider.llm.history"
    bad = 0.1 if seed % 2 else 0.0  # many rejected requests, or none but for the limit
    path.write_bytes(_log(seed, 30, bad))
    monkeypatch.setattr(lines, "BLOCK", random.Random(seed).choice((1, 5, 64, 1 << 20)))
    set_max_record_bytes(random.Random(seed).choice((MAX_RECORD_BYTES, 2000)))
    try:
        got = _read(read_converted, path, whole=False)
        assert got == _read(read_converted, path, whole=True)
    finally:
        set_max_record_bytes(MAX_RECORD_BYTES)
    assert bad or sum('"messages"' in x for x in got) > 10  # calls, not only rejects


@pytest.mark.parametrize("seed", range(6))
def test_reads_of_any_size_cut_the_same_blocks(seed, tmp_path, monkeypatch):
    """Lines and headers cut across reads, lines over the limit held as their length only: the
    items are those of reading the log whole."""
    path = tmp_path / ".aider.llm.history"
    path.write_bytes(_log(seed, 12, 0.05))
    limit = (MAX_RECORD_BYTES, 300)[seed % 2]
    set_max_record_bytes(limit)
    try:
        whole = [x.model_dump_json() for x in aider.read(str(path), ReadOptions())]
        for size in (1, 2, 7, 64):
            monkeypatch.setattr(lines, "BLOCK", size)
            got = [x.model_dump_json() for x in aider.read(str(path), ReadOptions())]
            assert got == whole, size
    finally:
        set_max_record_bytes(MAX_RECORD_BYTES)


def test_a_long_log_converts_each_message_about_once(tmp_path, monkeypatch):
    """300 requests: the messages converted are a few per request, where converting each
    request afresh converts about 300 x 600 / 2."""
    rng = random.Random(0)
    lines, history = [], [["SYSTEM Act as an expert software developer."]]
    for t in range(300):
        ask = [f"USER step {t} {rng.random()}"]
        sent = [*history, ["USER I added these files:"], ["ASSISTANT Ok."], ask]
        lines += [f"TO LLM 2025-03-01T10:00:{t % 60:02d}", *(x for m in sent for x in [SEP, *m])]
        lines += ["LLM RESPONSE 2025-03-01T10:00:00", f"ASSISTANT done {t}"]
        history += [ask, [f"ASSISTANT done {t}"]]
    path = tmp_path / ".aider.llm.history"
    path.write_text("\n".join(lines) + "\n")
    seen = {"messages": 0}
    real = aider._plain

    def counted(*args):
        seen["messages"] += 1
        return real(*args)

    monkeypatch.setattr(aider, "_plain", counted)
    calls = [c for c in aider.read(str(path), ReadOptions()) if isinstance(c, ChatCall)]
    assert len(calls) == 300
    assert seen["messages"] < 6 * 300, seen
