"""The Qwen ports' prefix extension (treeprep.render.native_qwen): extending the render of any
prefix of a conversation gives exactly the whole render (or raises where it raises), on generated
agent sessions: tool runs, reasoning in fields and inline ``<think>``, new user queries, wrapped
tool responses, later system turns, tools or none. The ports themselves are compared with the
jinja templates in test_native.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.render.history import RenderedPrefixes
from treeprep.render.native import FALLBACK_ERRORS, PORTS, NativeTemplate, probe_conversations

QWEN = {p.name: p for p in PORTS.values() if p.name.startswith("qwen")}

_bits = st.sampled_from(
    ["a", "é 🙂", " ", "\n", "\n\n", "<think>", "</think>", "<tool_response>", "</tool_response>"]
)
text_st = st.lists(_bits, max_size=5).map("".join)
call_st = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["sh", "é"]), "arguments": st.sampled_from(["{}", {"a": 1}])}
        ),
    }
)


@st.composite
def turn_st(draw) -> list[dict[str, Any]]:
    """One step of a session: a user query (real or a wrapped tool response), a later system
    turn, an assistant turn (reasoning in a field, inline, both or none; tool calls or not) or a
    run of tool results."""
    kind = draw(st.sampled_from(["user", "wrapped", "system", "assistant", "assistant", "tools"]))
    if kind == "wrapped":
        return [{"role": "user", "content": f"<tool_response>{draw(text_st)}</tool_response>"}]
    if kind == "tools":
        n = draw(st.integers(1, 3))
        return [{"role": "tool", "content": draw(text_st)} for _ in range(n)]
    if kind != "assistant":
        return [{"role": kind, "content": draw(text_st)}]
    content = draw(text_st)
    if draw(st.booleans()):
        content = f"<think>{draw(text_st)}</think>{content}"
    m: dict[str, Any] = {"role": "assistant", "content": content}
    field = draw(st.sampled_from([None, None, "reasoning_content", "reasoning", "thinking"]))
    if field:
        m[field] = draw(text_st)
    if draw(st.booleans()):
        m["tool_calls"] = draw(st.lists(call_st, min_size=1, max_size=2))
    return [m]


@st.composite
def session_st(draw) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(text_st)})
    for turn in draw(st.lists(turn_st(), min_size=1, max_size=10)):
        msgs += turn
    if draw(st.integers(0, 9)) == 0:  # outside the domain: the extension raises as the port does
        draw(st.sampled_from(msgs))["content"] = None
    return msgs


tools_st = st.sampled_from(
    [None, [{"type": "function", "function": {"name": "sh", "parameters": {"é": 1}}}]]
)


def _render(port: NativeTemplate, msgs: list[dict[str, Any]], tools: Any) -> str | None:
    try:
        return port.render(msgs, tools, False)
    except FALLBACK_ERRORS:
        return None


def _assert_extends_at_every_split(
    port: NativeTemplate, msgs: list[dict[str, Any]], tools: Any
) -> None:
    assert port.extend is not None
    whole = _render(port, msgs, tools)
    for k in range(1, len(msgs)):
        head = _render(port, msgs[:k], tools)
        if head is None:
            continue
        if whole is None:
            with pytest.raises(FALLBACK_ERRORS):
                port.extend(head, msgs[:k], msgs, k, tools)
            continue
        assert port.extend(head, msgs[:k], msgs, k, tools) == whole, k
        # it extends (cuts the end and appends) rather than rendering whole
        assert port.extend("X" + head, msgs[:k], msgs, k, tools) == "X" + whole, k
    if whole is not None:
        assert port.render(msgs, tools, True) == whole + port.generation_prompt


@pytest.mark.parametrize("name", sorted(QWEN))
@given(msgs=session_st(), tools=tools_st)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_extend_equals_the_whole_render_at_every_split(
    name: str, msgs: list[dict[str, Any]], tools: Any
) -> None:
    _assert_extends_at_every_split(QWEN[name], msgs, tools)


@pytest.mark.parametrize("name", sorted(QWEN))
def test_extend_equals_the_whole_render_on_the_probes(name: str) -> None:
    for msgs, tools in probe_conversations():
        _assert_extends_at_every_split(QWEN[name], msgs, tools)


EXTENDING = {p.name: p for p in PORTS.values() if p.extend is not None}


def _assert_extends_from_every_shared_prefix(
    port: NativeTemplate, old: list[dict[str, Any]], other: list[dict[str, Any]], tools: Any
) -> None:
    """The render of ``old[:j] + other[j:]`` and of ``old[:j]`` (a conversation that leaves
    ``old`` after ``j`` messages, or stops there) from the render of ``old``, at every ``j``."""
    assert port.extend is not None
    kept = _render(port, old, tools)
    if kept is None:
        return
    for j in range(1, len(old) + 1):
        for msgs in (old[:j] + other[j:], old[:j]):
            whole = _render(port, msgs, tools)
            if whole is None:
                with pytest.raises(FALLBACK_ERRORS):
                    port.extend(kept, old, msgs, j, tools)
                continue
            assert port.extend(kept, old, msgs, j, tools) == whole, j
            # it cuts the end and appends rather than rendering whole
            assert port.extend("X" + kept, old, msgs, j, tools) == "X" + whole, j


@pytest.mark.parametrize("name", sorted(EXTENDING))
@given(old=session_st(), other=session_st(), tools=tools_st)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_extend_from_a_conversation_that_shares_a_prefix_equals_the_whole_render(
    name: str, old: list[dict[str, Any]], other: list[dict[str, Any]], tools: Any
) -> None:
    _assert_extends_from_every_shared_prefix(EXTENDING[name], old, other, tools)


@pytest.mark.parametrize("name", sorted(EXTENDING))
def test_extend_from_a_shared_prefix_on_the_probes(name: str) -> None:
    probes = probe_conversations()
    for (old, tools), (other, _) in zip(probes, [*probes[1:], probes[0]], strict=True):
        _assert_extends_from_every_shared_prefix(EXTENDING[name], old, other, tools)


def _agent_session(queries: int, steps: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for q in range(queries):
        msgs.append({"role": "user", "content": f"task {q}"})
        for s in range(steps):
            call = {"type": "function", "function": {"name": "sh", "arguments": {"s": s}}}
            msgs.append(
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": f"r{q}.{s}",
                    "tool_calls": [call],
                }
            )
            msgs += [{"role": "tool", "content": f"out {s}.{j}"} for j in range(1 + s % 2)]
        msgs.append({"role": "assistant", "content": f"done {q}", "reasoning_content": "ok"})
    return msgs


def test_qwen3_drops_the_reasoning_of_the_turns_before_a_new_query() -> None:
    """The case a cut at ``start - 1`` gets wrong: a new query after reasoning turns."""
    port = QWEN["qwen3"]
    msgs = _agent_session(3, 3)
    _assert_extends_at_every_split(port, msgs, None)
    second = next(i for i, m in enumerate(msgs) if m["content"] == "task 1")
    head = port.render(msgs[:second], None, False)
    assert "r0.2" in head
    assert "r0.2" not in port.extend(head, msgs[:second], msgs, second, None)


def test_extend_renders_whole_when_the_text_does_not_end_as_expected() -> None:
    port = QWEN["qwen3"]
    msgs = _agent_session(2, 2)
    head = port.render(msgs[:5], None, False)
    assert port.extend(head + "?", msgs[:5], msgs, 5, None) == port.render(msgs, None, False)


@pytest.mark.parametrize("name", sorted(QWEN))
def test_rendered_prefixes_equal_the_port_call_by_call(name: str) -> None:
    port = QWEN[name]
    cache = RenderedPrefixes(port)
    msgs = _agent_session(4, 3)
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {}}}]
    for i in range(1, len(msgs) + 1):
        for m, gen in ((msgs[: i - 1] or msgs[:1], True), (msgs[:i], False)):
            assert cache.render(m, tools, gen) == port.render(m, tools, gen)
