"""formats._fields: the one OpenAI tool-call conversion, and the builders adapters share."""

from __future__ import annotations

import pytest

from treeprep.errors import RecordError
from treeprep.formats._fields import chat_tool_call, file_stem, openai_tool_calls, system_message


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
