"""Fixtures of the format tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import _history
from treeprep.formats._fields import forget_shared_messages
from treeprep.formats.base import ReadOptions

Reader = Callable[[str, ReadOptions], Iterable[Any]]


@pytest.fixture
def read_converted(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """``read(reader, path, whole=...)``: a reader's items as JSON. ``whole=True`` makes every
    call convert its history afresh (``ConvertedHistory``'s identity checks fail): the reference
    that converting only what a history gained must equal."""

    def read(reader: Reader, path: Path, *, whole: bool) -> list[str]:
        forget_shared_messages()
        with monkeypatch.context() as m:
            if whole:
                m.setattr(_history, "starts_with", lambda items, head: False)
                m.setattr(_history, "shared_prefix", lambda items, head: 0)
            return [i.model_dump_json() for i in reader(str(path), ReadOptions())]

    return read
