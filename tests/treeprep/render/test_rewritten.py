"""The ``reasoning-dropped`` test of a call against its previous turn (:class:`PreviousTurns`)."""

from __future__ import annotations

import numpy as np

from treeprep.render.rewritten import PreviousTurns

USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}
AGAIN = {"role": "user", "content": "more"}


def _ids(*xs: int) -> np.ndarray:
    return np.asarray(xs, np.int32)


def test_no_assistant_message_no_previous_turn() -> None:
    turns = PreviousTurns()
    assert not turns.rewritten([USER], None, None, _ids(1, 2), lambda m: _ids(9), look_up=True)


def test_the_previous_turn_as_remembered_or_rendered() -> None:
    turns = PreviousTurns()
    rendered: list[list[dict]] = []

    def render(msgs: list[dict]) -> np.ndarray:
        rendered.append(msgs)
        return _ids(1, 2, 3)

    full = _ids(1, 2, 3, 4, 5)
    # nothing remembered: the previous turn [USER, REPLY] is rendered, and is a prefix
    assert not turns.rewritten([USER, REPLY, AGAIN], None, None, full, render, look_up=True)
    assert rendered == [[USER, REPLY]]
    # remembered (a jinja render of the last call): looked up, not rendered
    turns.remember([USER, REPLY], None, None, _ids(1, 7))
    assert turns.rewritten([USER, REPLY, AGAIN], None, None, full, render, look_up=True)
    assert len(rendered) == 1
    # a native port does not look up: rendered again, a prefix
    assert not turns.rewritten([USER, REPLY, AGAIN], None, None, full, render, look_up=False)
    assert len(rendered) == 2
    # other tools are another fingerprint
    tools = [{"type": "function", "function": {"name": "ls"}}]
    assert not turns.rewritten([USER, REPLY, AGAIN], tools, None, full, render, look_up=True)


def test_a_history_that_does_not_render_gives_no_hint() -> None:
    turns = PreviousTurns()
    assert not turns.rewritten([USER, REPLY, AGAIN], None, None, _ids(1), lambda m: None,
                               look_up=True)  # fmt: skip


def test_only_the_last_few_are_remembered() -> None:
    turns = PreviousTurns(size=2)
    for k in range(3):
        turns.remember([USER, {"role": "assistant", "content": str(k)}], None, None, _ids(k))
    never = [USER, {"role": "assistant", "content": "0"}, AGAIN]
    # the first was forgotten: rendered (a prefix) instead of the remembered 0
    assert not turns.rewritten(never, None, None, _ids(5, 6), lambda m: _ids(5), look_up=True)
    kept = [USER, {"role": "assistant", "content": "2"}, AGAIN]
    assert turns.rewritten(kept, None, None, _ids(5, 6), lambda m: _ids(5), look_up=True)
