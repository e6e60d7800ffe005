"""The server's part in a call's render (treeprep/render/server_side.py): the effort and the
template kwargs, by vLLM's rules where it decides them (0.34: ``DisabledThinkingEffortResolver``,
``map_reasoning_effort``, ``with_defaults``), on two small templates."""

from __future__ import annotations

from typing import Any

from treeprep.modes import Server
from treeprep.render.server_side import ServerSide
from treeprep.render.template import ChatTemplate
from treeprep.schemas import ChatCall

#: takes an effort it does not know for ``max`` (as GLM-5.3's does, per vLLM's resolver)
EFFORT = ChatTemplate(
    "{% set e = reasoning_effort if reasoning_effort in ['low', 'medium', 'high'] else 'max' %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}[{{ e }}|{{ mode }}]"
)
#: tells ``none`` from every effort (thinking off)
THINKING = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}[{{ enable_thinking }}]")


def _call(**kw: Any) -> ChatCall:
    return ChatCall(call_id="c", messages=[{"role": "user", "content": "Hi"}],
                    completion={"role": "assistant", "content": "Yo"}, **kw)  # fmt: skip


def test_thinking_turned_off_is_probed_once_per_server_and_settings() -> None:
    """vLLM sends ``none`` where the template tells it from every effort, else ``low``; the
    effort map rewrites the probe's efforts and its answer; new settings probe again."""
    side = ServerSide(EFFORT)
    side.set_server(Server.vllm, harmony=False)
    off = _call(thinking_disabled=True, reasoning_effort="high")
    assert side.effort(off) == "low"  # none renders as max, as xhigh does
    side.set_settings(None, {"low": "medium"})
    assert side.effort(off) == "medium"
    assert side.effort(_call(reasoning_effort="low")) == "medium"
    side = ServerSide(THINKING)
    side.set_server(Server.vllm, harmony=False)
    assert side.effort(off) == "none"
    side.set_settings({"enable_thinking": True})  # under the enable_thinking none implies
    assert side.effort(off) == "none"
    side.set_settings(None, {"none": "low"})  # none renders as low: low
    assert side.effort(off) == "low"


def test_harmony_and_other_servers() -> None:
    """Harmony states the effort itself (no kwargs; thinking off is ``low``); SGLang's and
    llama.cpp's calls keep the request's effort, and their endpoints merge no inline system."""
    side = ServerSide(EFFORT)
    assert side.kwargs(_call(), None) == {}  # no server set
    side.set_server(Server.vllm, harmony=True)
    assert side.effort(_call(thinking_disabled=True)) == "low"
    assert side.kwargs(_call(reasoning_effort="high"), "high") == {}
    for server in (Server.sglang, Server.llama_cpp):
        side.set_server(server, harmony=False)
        assert side.effort(_call(thinking_disabled=True, reasoning_effort="high")) == "high"
        assert side.merges_inline_system is False
    side.set_settings({"mode": "fast"})
    assert side.kwargs(_call(chat_template_kwargs={"mode": "slow"}), None) == {"mode": "slow"}
    assert side.kwargs(_call(), "low") == {"reasoning_effort": "low", "mode": "fast"}


def test_a_server_started_with_a_disabled_thinking_effort_sends_it() -> None:
    """``--anthropic-disabled-thinking-effort`` other than ``auto``: sent as it is, not probed
    (Harmony too), then through the effort map."""
    side = ServerSide(THINKING)
    side.set_server(Server.vllm, harmony=False)
    off = _call(thinking_disabled=True)
    side.set_settings(None, None, "high")
    assert side.effort(off) == "high"  # the probe would say none
    side.set_settings(None, {"high": "max"}, "high")
    assert side.effort(off) == "max"
    side.set_server(Server.vllm, harmony=True)
    side.set_settings(None, None, "medium")
    assert side.effort(off) == "medium"


#: opts in to thinking: off unless ``enable_thinking`` is given and true
OPT_IN = ChatTemplate(
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}{% if enable_thinking %}<think>{% endif %}>{% endif %}"
)


def test_llama_cpp_seeds_enable_thinking_as_its_server_does() -> None:
    """llama.cpp gives the template ``enable_thinking`` true where it supports thinking (its
    probe: a user message renders otherwise with false than with true), unless the request's
    kwargs or the server's set it, or its effort is ``none``; a template for which true renders
    as absent (one that reads no ``enable_thinking``, or Qwen3's ``is false`` test) gets
    nothing, so that the native ports, which take no kwargs, still render it."""
    side = ServerSide(OPT_IN)
    side.set_server(Server.llama_cpp, harmony=False)
    assert side.llama_cpp_thinking is True
    assert side.kwargs(_call(), None) == {"enable_thinking": True}
    assert side.kwargs(_call(), "none") == {"enable_thinking": False}
    off = _call(chat_template_kwargs={"enable_thinking": False})
    assert side.kwargs(off, None) == {"enable_thinking": False}
    side.set_settings({"enable_thinking": False})  # --reasoning off, or --chat-template-kwargs
    assert side.kwargs(_call(), "high") == {"enable_thinking": False}
    side.set_server(Server.vllm, harmony=False)
    side.set_settings(None)
    assert side.kwargs(_call(), None) == {}  # vLLM gives it only for an effort
    same = ServerSide(EFFORT)  # reads no enable_thinking
    same.set_server(Server.llama_cpp, harmony=False)
    assert same.llama_cpp_thinking is None and same.kwargs(_call(), None) == {}
