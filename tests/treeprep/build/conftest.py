"""Fixtures of the build tests: small inputs written on the spot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest


def _write_calls(path: Path, groups: list[str]) -> str:
    """One chat call per group id in ``groups`` (a question and its answer), as JSONL."""
    with open(path, "wb") as f:
        for i, g in enumerate(groups):
            rec = {
                "group_id": g,
                "call_id": f"{g}-{i}",
                # the group in the text: files of other groups are not copies (deduplication)
                "messages": [{"role": "user", "content": f"question {i} of {g}"}],
                "completion": {"role": "assistant", "content": f"answer {i}"},
            }
            f.write(orjson.dumps(rec) + b"\n")
    return str(path)


@pytest.fixture
def write_calls() -> Callable[[Path, list[str]], str]:
    """Writes a JSONL file of one call per group id given; returns its path."""
    return _write_calls
