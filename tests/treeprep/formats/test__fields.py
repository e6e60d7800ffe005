"""formats._fields: the one OpenAI tool-call conversion, the one walk over an assistant's
content blocks, and the builders adapters share."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from treeprep.errors import RecordError
from treeprep.formats._fields import (
    BlockNames,
    assistant_blocks,
    chat_tool_call,
    expect,
    file_stem,
    openai_tool_calls,
    system_message,
)


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
