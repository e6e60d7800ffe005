"""Goose: what the agent saw before each turn, kept as the turns go on (``goose._Seen``), is what
the walk over every earlier turn gives (the rule each call used to apply afresh), through random
sessions of agent-visible, hidden and agent-only (compaction summary) turns."""

from __future__ import annotations

import random

import pytest

from treeprep.formats import goose


class _Turn:
    def __init__(self, visible: bool, agent_only: bool) -> None:
        self.agent_visible, self.agent_only = visible, agent_only


def _walk(turns: list[list[_Turn]], chats: list[list[dict]], t: int) -> tuple[int, list[dict]]:
    hidden_before = max((k for k in range(t) if turns[k][0].agent_only), default=0)
    seen = [
        m for k in range(t) for m in chats[k] if turns[k][0].agent_visible or k >= hidden_before
    ]
    return hidden_before, seen


@pytest.mark.parametrize("seed", range(20))
def test_seen_turns_equal_the_walk_over_every_earlier_turn(seed):
    rng = random.Random(seed)
    turns: list[list[_Turn]] = []
    chats: list[list[dict]] = []
    seen = goose._Seen(turns, chats)  # type: ignore[arg-type]
    for t in range(80):
        r = rng.random()
        turn = _Turn(visible=r > 0.3, agent_only=0.9 < r)
        turns.append([turn])
        if rng.random() < 0.5:  # an assistant turn: a call whose prompt is what was seen
            h, got = seen.before(t)
            want_h, want = _walk(turns, chats, t)
            assert h == want_h and [id(m) for m in got] == [id(m) for m in want]
        chats.append([{"role": "user", "content": f"{t}.{j}"} for j in range(rng.randint(0, 2))])
