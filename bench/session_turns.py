"""bench/session_turns: the turns every generated session of ``bench/session_writers.py`` is made
of: an assistant message with one tool call and its result, a user message every tenth turn,
words drawn from a fixed list with a seeded generator (the same session for the same seed)."""

from __future__ import annotations

import random

WORDS = (
    "the a of to and in is for on with that this file function return value error test import "
    "class def self none true false list dict string path line number result output input config "
    "update check run build install module package version python agent tool call response"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def turns(n: int, seed: int) -> list[tuple[str | None, str, str, str]]:
    """``n`` turns: (user text or None, assistant text, tool command, tool output)."""
    rng = random.Random(seed)
    return [
        (
            _text(rng, 20) if i % 10 == 0 else None,
            _text(rng, 15),
            f"cat file_{i}.py",
            "\n".join(_text(rng, 10) for _ in range(4)),
        )
        for i in range(n)
    ]
