"""formats._fields: the one OpenAI tool-call conversion, the one walk over an assistant's
content blocks, the builders adapters share, and make_call's messages shared between calls."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

import treeprep.io.jsonparse as jsonparse
from treeprep.errors import RecordError
from treeprep.formats._fields import (
    BlockNames,
    assistant_blocks,
    chat_tool_call,
    expect,
    file_stem,
    forget_shared_messages,
    make_call,
    openai_tool_calls,
    system_message,
)
from treeprep.schemas import ChatCall


def test_openai_tool_calls_both_forms_keep_arguments_as_given() -> None:
    got = openai_tool_calls(
        [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p": 1}'}},
            {"id": "c2", "function": {"name": "cat", "arguments": {"f": "a"}}},
            {"id": "c3", "function": {"name": "pwd", "arguments": None}},
            {"id": "c4", "name": "find_order", "arguments": {"order_id": "#W1"}, "requestor": "x"},
            {"name": "search", "parameters": {"q": "x"}},
            {"name": "noargs"},
        ],
        "m.tool_calls",
    )
    assert got == [
        chat_tool_call("c1", "ls", '{"p": 1}'),
        chat_tool_call("c2", "cat", {"f": "a"}),
        chat_tool_call("c3", "pwd", ""),
        chat_tool_call("c4", "find_order", {"order_id": "#W1"}),
        chat_tool_call(None, "search", {"q": "x"}),
        chat_tool_call(None, "noargs", {}),
    ]
    assert got[0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "ls", "arguments": '{"p": 1}'},
    }
    assert openai_tool_calls(None, "m.tool_calls") == []


@pytest.mark.parametrize(
    "calls,reason",
    [
        ("x", "m.tool_calls: expected an array, got string"),
        ([5], "m.tool_calls[0]: expected an object, got int"),
        ([{"function": "x"}], "m.tool_calls[0].function: expected an object, got string"),
        ([{"function": {}}], "m.tool_calls[0].function.name: expected a string, got null"),
        (
            [{"function": {"name": "a", "arguments": 3}}],
            "m.tool_calls[0].function.arguments: expected a JSON string or an object, got int",
        ),
        (
            [{"type": "custom", "function": {"name": "a"}}],
            "m.tool_calls[0].type: expected 'function', got 'custom'",
        ),
        ([{"arguments": {}}], "m.tool_calls[0].name: expected a string, got null"),
        (
            [{"name": "a", "arguments": [1]}],
            "m.tool_calls[0].arguments: expected a JSON string or an object, got array",
        ),
        ([{"id": 7, "name": "a"}], "m.tool_calls[0].id: expected a string, got int"),
    ],
)
def test_openai_tool_calls_name_the_field_that_does_not_fit(calls: object, reason: str) -> None:
    with pytest.raises(RecordError) as ei:
        openai_tool_calls(calls, "m.tool_calls")
    assert str(ei.value) == reason


def test_file_stem_and_system_message() -> None:
    assert file_stem("runs/a.traj.json.gz", (".gz", ".json", ".traj")) == "a"
    assert system_message("be brief") == [{"role": "system", "content": "be brief"}]
    assert system_message(None) == [] and system_message("") == []


#: a format's spellings, read strictly
STRICT = BlockNames(text="text", thinking="thinking", thinking_field="thinking", tool_call="call")
#: another format's spellings, read leniently
LENIENT = replace(
    STRICT, thinking="reasoning", thinking_field="text", text_required=False, others="skip"
)


def _call(b: dict[str, Any], where: str) -> dict[str, Any]:
    return chat_tool_call(expect(b.get("id"), f"{where}.id", str), "ls", {})


def test_assistant_blocks_sort_texts_reasoning_and_calls_each_in_order() -> None:
    blocks = [
        (0, {"type": "thinking", "thinking": "a"}),
        (1, {"type": "text", "text": "x"}),
        (2, {"type": "call", "id": "c1"}),
        (3, {"type": "text", "text": "y"}),
        (4, {"type": "thinking", "thinking": "b"}),
        (5, {"type": "call", "id": "c2"}),
    ]
    assert assistant_blocks(blocks, "m.content", STRICT, _call) == (
        ["x", "y"],
        ["a", "b"],
        [chat_tool_call("c1", "ls", {}), chat_tool_call("c2", "ls", {})],
    )


def test_lenient_blocks_read_a_missing_text_as_empty_and_skip_other_types() -> None:
    blocks = [
        (0, {"type": "text"}),
        (1, {"type": "image"}),
        (2, {"type": "reasoning", "text": None}),
        (3, {"type": "thinking", "thinking": "not this format's reasoning"}),
    ]
    assert assistant_blocks(blocks, "m", LENIENT, _call) == ([""], [""], [])


@pytest.mark.parametrize(
    "names,blocks,reason",
    [
        (STRICT, [(0, {"type": "text"})], "m.parts[0].text: expected a string, got null"),
        (
            STRICT,
            [(2, {"type": "thinking", "thinking": 3})],
            "m.parts[2].thinking: expected a string, got int",
        ),
        (
            STRICT,
            [(1, {"type": "image"})],
            "m.parts[1].type: expected text, thinking or call, got 'image'",
        ),
        (STRICT, [(0, {})], "m.parts[0].type: expected text, thinking or call, got None"),
        (
            LENIENT,
            [(4, {"type": "reasoning", "text": 1})],
            "m.parts[4].text: expected a string, got int",
        ),
        # the blocks are checked in order: a call's field before a later block's text
        (
            LENIENT,
            [(0, {"type": "call"}), (1, {"type": "text", "text": 1})],
            "m.parts[0].id: expected a string, got null",
        ),
    ],
)
def test_assistant_blocks_name_the_block_that_does_not_fit(
    names: BlockNames, blocks: list[tuple[int, dict[str, Any]]], reason: str
) -> None:
    with pytest.raises(RecordError) as ei:
        assistant_blocks(blocks, "m.parts", names, _call)
    assert str(ei.value) == reason


# --------------------------------------------------------------------------------------------
# make_call: the messages a call shares with the last one
# --------------------------------------------------------------------------------------------


def _history(n: int) -> list[dict[str, Any]]:
    """A system message, then ``n`` user turns each answered by a tool call and its result."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(n):
        out += [
            {"role": "user", "content": f"task {i}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [chat_tool_call(f"c{i}", "sh", {"n": i})],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "done"},
        ]
    return out


def _validated(msgs: list[dict[str, Any]], cid: str = "c") -> ChatCall:
    fields = {"call_id": cid, "messages": msgs, "completion": {"role": "assistant", "content": "k"}}
    call = make_call(fields, file="f", line=1, fmt="t")
    assert isinstance(call, ChatCall)
    assert call == ChatCall.model_validate(fields)  # what validating it whole gives
    return call


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value make_call writes as JSON, from a fresh start."""
    out: list[Any] = []
    real = jsonparse.json_key
    monkeypatch.setattr(jsonparse, "json_key", lambda v: out.append(v) or real(v))
    forget_shared_messages()
    return out


def test_the_last_calls_dicts_are_known_by_identity_and_only_new_ones_written(
    written: list[Any],
) -> None:
    msgs = _history(3)
    first = _validated(msgs[:4])
    assert [id(v) for v in written] == [id(m) for m in msgs[:4]]
    written.clear()
    second = _validated(msgs[:7])
    assert [id(v) for v in written] == [id(m) for m in msgs[4:7]]  # not the whole prompt
    assert all(map(lambda a, b: a is b, second.messages[:4], first.messages))
    assert second.messages[4] is not first.messages[0]


def test_fresh_dicts_with_the_same_json_share_the_last_calls_objects(written: list[Any]) -> None:
    msgs = _history(3)
    first = _validated(msgs[:4])
    again = copy.deepcopy(msgs[:7])
    written.clear()
    second = _validated(again)
    assert [id(v) for v in written] == [id(m) for m in again]  # each written, one by one
    assert all(map(lambda a, b: a is b, second.messages[:4], first.messages))


@pytest.mark.parametrize("n", [1.0, True])
def test_equal_values_of_another_json_type_are_another_input(n: object) -> None:
    """``1``, ``1.0`` and ``true`` are equal in Python and differ in JSON: a message that was
    ``{"n": 1}`` and is now ``{"n": 1.0}`` is validated again, keeping its type."""
    forget_shared_messages()
    msgs = _history(2)
    first = _validated(msgs)
    other = copy.deepcopy(msgs)
    other[5]["tool_calls"][0]["function"]["arguments"] = {"n": n}
    assert other == msgs
    second = _validated(other)
    assert all(map(lambda a, b: a is b, second.messages[:5], first.messages))
    assert second.messages[5] is not first.messages[5]
    assert type(second.messages[5].tool_calls[0].function.arguments["n"]) is type(n)


def test_a_prompt_that_leaves_the_last_shares_the_messages_up_to_where_it_leaves(
    written: list[Any],
) -> None:
    """A prompt shorter than the last, or one that differs in one message (Aider's files after
    the history, SWE-agent's elided output, a retry), shares the last call's objects up to the
    first message that is another input, and validates the rest, even those that are the last
    call's dicts."""
    msgs = _history(3)
    first = _validated(msgs[:7])
    shorter = _validated(msgs[:4])
    assert all(map(lambda a, b: a is b, shorter.messages, first.messages[:4]))
    longer = _validated(msgs[:7])
    assert all(map(lambda a, b: a is b, longer.messages[:4], shorter.messages))
    assert not any(map(lambda a, b: a is b, longer.messages[4:], first.messages[4:]))
    branch = [*msgs[:4], {"role": "user", "content": "again"}, *msgs[5:7]]
    written.clear()
    forked = _validated(branch)
    assert [id(v) for v in written] == [id(branch[4])]  # the other dicts known by identity
    assert all(map(lambda a, b: a is b, forked.messages[:4], longer.messages))
    assert not any(map(lambda a, b: a is b, forked.messages[4:], longer.messages[4:]))
    assert forked.messages[4].content == "again"


def test_a_prompt_that_is_not_plain_json_is_validated_whole_and_not_kept() -> None:
    class Text(str):
        pass

    forget_shared_messages()
    msgs = _history(2)
    first = _validated(msgs[:4])
    odd = [*msgs[:4], {"role": "user", "content": Text("a str subclass is not plain JSON")}]
    whole = _validated(odd)
    assert not any(map(lambda a, b: a is b, whole.messages, first.messages))
    after = _validated(msgs[:7])  # goes on from the last prompt kept: the one before
    assert all(map(lambda a, b: a is b, after.messages[:4], first.messages))


def test_a_new_file_shares_nothing_with_the_last() -> None:
    forget_shared_messages()
    msgs = _history(2)
    first = _validated(msgs[:4])
    forget_shared_messages()
    second = _validated(msgs[:7])
    assert not any(map(lambda a, b: a is b, second.messages, first.messages))
