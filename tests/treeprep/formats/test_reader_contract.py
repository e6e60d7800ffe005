"""The readers' contract with ``make_call`` (:func:`treeprep.formats._fields.make_call`): a reader
never changes a message dict, nor anything inside it, after it has handed it over.

``make_call`` knows a message dict it was handed for the last call by its identity and reuses the
Message it made of it then, without looking at it again; a reader that changed the dict in between
would have the new call trained on the old message. Every file of ``sample_data/`` is read by the
format that detects it, with ``make_call`` wrapped where the readers import it: each call's
messages are written down when handed over, and once the file is read each list must still read
so. The last test shows that the check catches a reader that breaks the contract.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import treeprep.formats._fields as fields_module
from treeprep.errors import InputError
from treeprep.formats import ReadOptions, detect_format, forget_shared_messages, formats
from treeprep.io.compressed import read_head
from treeprep.io.jsonparse import json_key
from treeprep.schemas import ChatCall

SAMPLES = Path(__file__).resolve().parents[3] / "sample_data"

#: the options each sample is read with: as given, and with a system prompt and tools added
#: (readers put the system message before the history each call)
OPTIONS = [
    ReadOptions(),
    ReadOptions(
        system_prompt="be brief",
        tools=[{"type": "function", "function": {"name": "sh", "parameters": {}}}],
    ),
]


def _text(value: Any) -> bytes:
    """An exact record of ``value`` (``1``, ``1.0`` and ``true`` differ): its JSON text, or its
    repr when it is not plain JSON."""
    return json_key(value) or repr(value).encode()


class _Handed:
    """``make_call`` wrapped: each call's messages (the list as handed over) with their text."""

    def __init__(self, make_call: Callable[..., Any]) -> None:
        self.make_call = make_call
        self.calls: list[tuple[str, list[Any], bytes]] = []

    def __call__(self, fields: dict[str, Any], **kw: Any) -> Any:
        msgs = fields.get("messages")
        self.calls.append((str(fields.get("call_id")), msgs, _text(msgs)))
        return self.make_call(fields, **kw)

    def changed(self) -> list[str]:
        """The calls whose messages no longer read as they did when handed over."""
        return [cid for cid, msgs, text in self.calls if _text(msgs) != text]


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> _Handed:
    """``make_call`` wrapped in every reader that imported it, and in its own module."""
    formats()  # import every reader first
    wrapped = _Handed(fields_module.make_call)
    for name, mod in list(sys.modules.items()):
        if name.startswith("treeprep.formats") and getattr(mod, "make_call", None) is (
            wrapped.make_call
        ):
            monkeypatch.setattr(mod, "make_call", wrapped)
    return wrapped


def _samples() -> Iterator[tuple[str, Path]]:
    for p in sorted(SAMPLES.rglob("*")):
        spec = detect_format(str(p), read_head(str(p))) if p.is_file() else None
        if spec is not None:
            yield spec.name, p


def _read(name: str, path: Path, opts: ReadOptions) -> list[Any]:
    forget_shared_messages()
    try:
        return list(formats()[name].read(str(path), opts))
    except InputError:  # a file a format refuses as a whole (Aider's chat history)
        return []


def test_every_reader_leaves_the_messages_it_handed_over_as_they_were(handed: _Handed) -> None:
    read: set[str] = set()
    n_calls = 0
    broken: list[str] = []
    for name, path in _samples():
        read.add(name)
        for opts in OPTIONS:
            _read(name, path, opts)
            n_calls += len(handed.calls)
            broken += [f"{path.relative_to(SAMPLES)}: {cid}" for cid in handed.changed()]
            handed.calls.clear()
    assert n_calls > 100 and broken == []
    # every reader that calls make_call was run on a sample (a new one is, once it has a sample)
    callers = {
        spec.name
        for spec in formats().values()
        if getattr(sys.modules[spec.read.__module__], "make_call", None) is handed
    }
    assert callers and callers <= read, sorted(callers - read)


def test_the_check_catches_a_reader_that_changes_a_dict_it_handed_over(handed: _Handed) -> None:
    """A reader that keeps its history's dicts and rewrites one after the call that carried it:
    the check names that call, and ``make_call`` would indeed train the next call on the old
    message (it knows the dict by identity, as the contract allows)."""

    def reader() -> Iterator[Any]:
        history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        reply = {"role": "assistant", "content": "ok"}
        yield fields_module.make_call(
            {"call_id": "c0", "messages": list(history), "completion": reply},
            file="f",
            line=1,
            fmt="fake",
        )
        history[0]["content"] = "hello"  # breaks the contract
        history += [reply, {"role": "user", "content": "more"}]
        yield fields_module.make_call(
            {"call_id": "c1", "messages": list(history), "completion": reply},
            file="f",
            line=2,
            fmt="fake",
        )

    forget_shared_messages()
    first, second = list(reader())
    assert handed.changed() == ["c0"]
    assert isinstance(first, ChatCall) and isinstance(second, ChatCall)
    assert second.messages[0] is first.messages[0] and second.messages[0].content == "hi"
