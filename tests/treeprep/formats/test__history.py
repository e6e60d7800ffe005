"""ConvertedHistory (treeprep.formats._history): converting what a history gained equals
converting it whole, call after call, and the messages it kept are the very same dicts."""

from __future__ import annotations

import random

import pytest

from treeprep.errors import RecordError
from treeprep.formats._history import Converted, ConvertedHistory
from treeprep.schemas.records import shared_prefix


def _merge_runs(entries: list[str], start: int) -> Converted:
    """Runs of ``a`` entries merge into one message (a turn that may go on); ``!`` is bad."""
    out: list[dict] = []
    run = 0
    for i, e in enumerate(entries, start):
        if e == "!":
            raise RecordError(f"history[{i}]: bad entry")
        if e == "a":
            run += 1
            if run > 1:
                out[-1] = {"role": "assistant", "content": out[-1]["content"] + "a"}
                continue
            out.append({"role": "assistant", "content": "a"})
        else:
            run = 0
            out.append({"role": "user", "content": e})
    return Converted(out, run, 1 if run else 0)


def _texts(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


@pytest.mark.parametrize("seed", range(20))
def test_updates_equal_whole_conversions(seed):
    rng = random.Random(seed)
    h = ConvertedHistory(_merge_runs)
    history: list[str] = []
    for _ in range(60):
        r = rng.random()
        if r < 0.1 and history:
            history.insert(rng.randrange(len(history)), "u")  # went in before the end
        elif r < 0.15:
            history = ["u", "a"]  # replaced (a compaction)
        else:
            history.append(rng.choice("aau"))
        got = _texts(h.update(history))
        assert got == _texts(_merge_runs(history, 0).messages)
        assert h.roles["user"] == sum(role == "user" for role, _ in got)


def test_kept_messages_are_the_same_dicts_and_the_open_turn_is_made_again():
    h = ConvertedHistory(_merge_runs)
    history = ["u", "a", "u", "a"]
    first = list(h.update(history))
    history += ["a", "u"]
    second = h.update(history)
    assert all(a is b for a, b in zip(first[:3], second, strict=False))
    assert first[3] is not second[3] and second[3]["content"] == "aa"


def test_a_converter_that_raises_leaves_the_history_as_it_was():
    calls = []

    def convert(entries: list[str], start: int) -> Converted:
        calls.append((list(entries), start))
        return _merge_runs(entries, start)

    h = ConvertedHistory(convert)
    history = ["u", "a", "u"]
    kept = list(h.update(history))
    history += ["!", "u"]
    with pytest.raises(RecordError, match=r"history\[3\]: bad entry"):
        h.update(history)
    assert h.messages == kept and h.entries == ["u", "a", "u"]
    with pytest.raises(RecordError, match=r"history\[3\]"):  # and again, from where it was
        h.update(history)
    assert calls[-1] == (["!", "u"], 3)


def _one_each(entries: list[tuple[int, str]], start: int) -> Converted:
    """One message of each entry, from it alone; ``!`` is bad."""
    for i, (_, e) in enumerate(entries, start):
        if e == "!":
            raise RecordError(f"history[{i}]: bad entry")
    return Converted(
        [{"role": "user" if e == "u" else "assistant", "content": e} for _, e in entries]
    )


@pytest.mark.parametrize("seed", range(20))
def test_per_entry_keeps_the_messages_of_the_entries_a_history_shares(seed):
    """A history that leaves the converted one (cut, then grown by other entries) keeps the
    messages of the entries both begin with, the same dicts, and converts the rest as whole."""
    rng = random.Random(seed)
    h = ConvertedHistory(_one_each, per_entry=True)
    history: list[tuple[int, str]] = []
    for k in range(80):
        if rng.random() < 0.3:
            history = history[: rng.randrange(len(history) + 1)]
        history = history + [(k, rng.choice("uaa!" if rng.random() < 0.05 else "uaa"))]
        kept, before = list(h.entries), list(h.messages)
        try:
            got = _texts(h.update(history))
        except RecordError:
            assert h.entries == kept[: shared_prefix(history, kept)]
            continue
        assert got == _texts(_one_each(history, 0).messages)
        n = shared_prefix(history, kept)
        assert all(a is b for a, b in zip(before[:n], h.messages, strict=False))
        assert h.roles["user"] == sum(role == "user" for role, _ in got)


def test_per_entry_refuses_a_converter_that_is_not():
    h = ConvertedHistory(lambda entries, start: Converted([]), per_entry=True)
    with pytest.raises(ValueError, match="one closed message of each entry"):
        h.update(["u"])
