"""ChatCall's check that every tool result answers an earlier call, across the calls of a
session that share their history's Message objects (checked once, not per call)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import ChatCall, Message


def _call(messages: list[Message]) -> ChatCall:
    completion = {"role": "assistant", "content": "done"}
    return ChatCall.model_validate({"call_id": "c", "messages": messages, "completion": completion})


def _asks(call_id: str) -> Message:
    tc = {"id": call_id, "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    return Message.model_validate({"role": "assistant", "content": "", "tool_calls": [tc]})


def _answers(call_id: str) -> Message:
    return Message.model_validate({"role": "tool", "tool_call_id": call_id, "content": "ok"})


def test_a_failed_call_leaves_no_ids_for_the_next_call_sharing_its_history() -> None:
    history = [Message.model_validate({"role": "user", "content": "hi"}), _asks("a"), _answers("a")]
    _call(history)
    with pytest.raises(ValidationError, match="'c' but no earlier assistant"):
        _call([*history, _asks("b"), _answers("c")])  # makes call b, answers an unknown c
    # b was made only by the failed call: a later call of the same history cannot answer it
    with pytest.raises(ValidationError, match="'b' but no earlier assistant"):
        _call([*history, _answers("b")])
    _call([*history, _asks("b"), _answers("b")])


def test_shared_history_is_checked_like_a_fresh_one() -> None:
    history = [Message.model_validate({"role": "user", "content": "hi"}), _asks("a")]
    _call([*history, _answers("a")])
    with pytest.raises(ValidationError, match="'x' but no earlier assistant"):
        _call([*history, _answers("a"), _answers("x")])
    fresh = [Message.model_validate(m.model_dump()) for m in history]
    with pytest.raises(ValidationError, match="'x' but no earlier assistant"):
        _call([*fresh, _answers("x")])


def test_a_call_that_leaves_the_last_keeps_only_the_ids_made_before_it_leaves() -> None:
    """A prompt that shares the first messages of the last one and then goes on differently
    (Aider's files after the history, an elided output, a retry) knows only the calls its
    shared messages made, not those made after it left the last prompt."""
    user = Message.model_validate({"role": "user", "content": "hi"})
    history = [user, _asks("a"), _answers("a"), _asks("b"), _answers("b")]
    _call(history)
    retry = [*history[:3], Message.model_validate({"role": "user", "content": "again"})]
    _call([*retry, _asks("c"), _answers("c")])
    with pytest.raises(ValidationError, match="'b' but no earlier assistant"):
        _call([*retry, _answers("b")])  # b was made only after this prompt leaves the first
    with pytest.raises(ValidationError, match="'c' but no earlier assistant"):
        _call([*history[:3], _answers("c")])
    _call([*history[:3], _answers("a")])
    _call([*history, _asks("d"), _answers("b"), _answers("d")])
