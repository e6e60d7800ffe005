"""A session's shared history, normalized once and rendered once (treeprep.render.history):
every text and dict equals the whole computation, call by call, branches and changes included."""

from __future__ import annotations

import json
from typing import Any

import pytest

from treeprep.formats._fields import make_call
from treeprep.render import Renderer
from treeprep.render.history import NormalizedHistory, RenderedPrefixes
from treeprep.render.messages import template_messages
from treeprep.render.native import (
    PORTS,
    NativeTemplate,
    extend_builtin_chatml,
    probe_conversations,
    render_builtin_chatml,
)
from treeprep.schemas import ChatCall, Message

BUILTIN = next(p for p in PORTS.values() if p.name == "builtin_chatml")


@pytest.mark.parametrize("k", range(len(probe_conversations())))
def test_extend_equals_the_whole_render_at_every_split(k: int) -> None:
    msgs, tools = probe_conversations()[k]
    for start in range(1, len(msgs) + 1):
        head = render_builtin_chatml(msgs[:start], tools, False)
        assert extend_builtin_chatml(
            head, msgs[:start], msgs, start, tools
        ) == render_builtin_chatml(msgs, tools, False)
        for gen in (False, True):
            assert render_builtin_chatml(msgs, tools, False) + (
                BUILTIN.generation_prompt if gen else ""
            ) == render_builtin_chatml(msgs, tools, gen)


def _session(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"task {i}"})
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "sh", "arguments": {"n": i}},
        }
        msgs.append({"role": "assistant", "content": f"step {i}", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"})
    return msgs


def test_rendered_prefixes_equal_the_port_call_by_call() -> None:
    """Growing calls, a branch (a rewritten earlier message), other tools, the same tools as
    an equal but new list, and a value that only compares equal (1 == True) are all rendered
    as the port renders them whole."""
    cache = RenderedPrefixes(BUILTIN)
    msgs = _session(6)
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {"n": 1}}}]
    asks: list[tuple[list[dict[str, Any]], Any, bool]] = []
    for i in range(2, len(msgs) + 1):
        asks += [(msgs[:i], tools, False), (msgs[: i - 1], tools, True)]
    branch = [*msgs[:4], {"role": "user", "content": "again"}, *msgs[5:]]
    asks += [
        (branch, tools, False),
        (msgs, None, False),
        (msgs, json.loads(json.dumps(tools)), True),
    ]
    asks.append(
        (msgs, [{"type": "function", "function": {"name": "sh", "parameters": {"n": True}}}], False)
    )
    for m, t, gen in asks:
        assert cache.render(m, t, gen) == render_builtin_chatml(m, t, gen)


def test_rendered_prefixes_know_a_message_by_identity_not_equality() -> None:
    cache = RenderedPrefixes(BUILTIN)
    msgs = _session(3)
    cache.render(msgs, None, False)
    other = [dict(m) for m in msgs]
    other[2] = {**other[2], "tool_calls": [{"function": {"name": "sh", "arguments": {"n": True}}}]}
    assert cache.render(other, None, False) == render_builtin_chatml(other, None, False)
    assert '"n": true' in cache.render(other, None, False)


def _leaving_sessions(n: int) -> dict[str, list[list[dict[str, Any]]]]:
    """Prompts that leave the one before after the shared history: Aider's (the chat's files and
    Aider's acknowledgement after the history, before the user's words), SWE-agent's (the
    oldest output still shown is elided in each call) and a retry's (back two turns)."""
    msgs = _session(n)
    files = [
        [
            {"role": "user", "content": f"app.py after {i} edits"},
            {"role": "assistant", "content": "Ok"},
        ]
        for i in range(n)
    ]
    aider = [[*msgs[: 3 * i + 1], *files[i], msgs[3 * i + 1]] for i in range(n)]
    elided, history = [], list(msgs)
    for i in range(1, n):
        if i > 2:
            old = history[3 * (i - 3) + 3]
            history[3 * (i - 3) + 3] = {**old, "content": "(output elided)"}
        elided.append(list(history[: 3 * i + 2]))
    retry = [msgs[:10], msgs[:12], msgs[:7], [*msgs[:4], {"role": "user", "content": "again"}]]
    return {"aider": aider, "elided": elided, "retry": retry}


@pytest.mark.parametrize("kind", ["aider", "elided", "retry"])
@pytest.mark.parametrize("name", sorted({p.name for p in PORTS.values() if p.extend}))
def test_prompts_that_leave_the_last_extend_from_what_they_share(kind: str, name: str) -> None:
    """Each prompt renders as the port renders it whole, and only the first is rendered whole:
    the others cut the kept text where they leave it and append the rest."""
    port = next(p for p in PORTS.values() if p.name == name)
    whole: list[int] = []

    def counted(msgs: list[dict[str, Any]], tools: Any, gen: bool) -> str:
        whole.append(len(msgs))
        return port.render(msgs, tools, gen)

    cache = RenderedPrefixes(NativeTemplate(name, counted, port.extend, port.generation_prompt))
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {"n": 1}}}]
    for msgs in _leaving_sessions(8)[kind]:
        for gen in (True, False):
            assert cache.render(msgs, tools, gen) == port.render(msgs, tools, gen)
    assert len(whole) == 1


def _calls(msgs: list[dict[str, Any]]) -> list[ChatCall]:
    out = []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            fields = {"call_id": f"c{i}", "messages": msgs[:i], "completion": m}
            call = make_call(fields, file="f", line=i, fmt="t")
            assert isinstance(call, ChatCall)
            assert call == ChatCall.model_validate(fields)
            out.append(call)
    return out


def test_make_call_shares_the_history_objects_and_validates_like_pydantic() -> None:
    calls = _calls(_session(4))
    assert calls[1].messages[0] is calls[0].messages[0]
    assert calls[3].messages[4] is calls[1].messages[4]


def test_make_call_rejects_as_before() -> None:
    msgs = _session(2)
    _calls(msgs)
    bad = [*msgs, {"role": "tool", "tool_call_id": "nobody", "content": "x"}]
    got = make_call(
        {"call_id": "x", "messages": bad, "completion": msgs[2]}, file="f", line=9, fmt="t"
    )
    assert not isinstance(got, ChatCall)
    assert "messages[7] is a tool result for tool_call_id 'nobody'" in got.reason
    wrong = [*msgs, {"role": "robot", "content": "x"}]
    got = make_call(
        {"call_id": "y", "messages": wrong, "completion": msgs[2]}, file="f", line=9, fmt="t"
    )
    assert not isinstance(got, ChatCall) and got.reason.startswith("invalid call: messages.7.role")


def test_normalized_history_equals_template_messages() -> None:
    history = NormalizedHistory()
    calls = _calls(_session(5))
    think = Message(role="assistant", content="<think>\nhm\n</think>\n\nok")
    forked = calls[2].model_copy(update={"messages": [*calls[2].messages[:3], think]})
    for rec in [*calls, forked, calls[4], calls[4]]:
        got = template_messages(rec, history.parts, normalized=history.messages)
        assert got == template_messages(rec, history.parts)


def test_a_session_renders_as_each_call_rendered_alone() -> None:
    r = Renderer.load(None)
    calls = _calls(_session(12))
    together = [r.render(c, group_id="g") for c in calls]
    for c, seq in zip(calls, together, strict=True):
        alone = Renderer.load(None).render(c.model_copy(deep=True), group_id="g")
        assert seq.tokens.tolist() == alone.tokens.tolist()
        assert seq.loss_spans == alone.loss_spans and seq.branch_reason == alone.branch_reason


def test_has_system_follows_each_prompt_and_refuses_other_lists() -> None:
    from treeprep.render.gaps import prompt_gaps

    def msg(role: str, text: str) -> Message:
        extra = {"tool_call_id": "t"} if role == "tool" else {}
        return Message.model_validate({"role": role, "content": text, **extra})

    history = NormalizedHistory()
    base = [msg("user", "a"), msg("assistant", "b")]
    c = msg("user", "c")
    prompts = [
        base,
        [*base, c],  # shares the history: no system role yet
        [*base, c, msg("system", "d")],  # shares it, and one is appended later
        [*base, msg("user", "e")],  # leaves it before the system message
        [msg("system", "s"), *base],  # a new history that opens with one
        base,  # back to none: the system message is not in this prompt
    ]
    for prompt in prompts:
        msgs = history.messages(prompt)
        want = any(m["role"] in ("system", "developer") for m in msgs)
        assert history.has_system(msgs) is want
        comp = {"role": "assistant", "content": "ok"}
        assert prompt_gaps(msgs, comp, None, has_system=history.has_system(msgs)) == (
            prompt_gaps(msgs, comp, None)
        )
    assert history.has_system(list(msgs)) is None  # a copy: not the list it returned
    msgs.append({"role": "system", "content": "late"})
    assert history.has_system(msgs) is None  # changed since
