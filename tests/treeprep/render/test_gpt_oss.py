"""A template without a native port (gpt-oss), the completion check, start-up without transformers,
and incremental rendering (issue 14 items 5, 11, 12).

gpt-oss's official template renders only the first of parallel tool calls, prints the date, and
scans the rest of the conversation for every assistant turn. Everything here is compared with
transformers' ``apply_chat_template`` (the reference), never with our own renderer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_reference import apply_at_fixed_date, arg_tools, hf_convention, hf_tokenizer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from treeprep.crosscheck import CrossCheck
from treeprep.errors import RenderError
from treeprep.render import Renderer
from treeprep.render.coverage import EMPTY_REPLY, completion_loss
from treeprep.render.incremental import IncrementalRenderer, probe_sessions
from treeprep.render.template import ChatTemplate
from treeprep.render.tokenizer import load_folder
from treeprep.schemas import ChatCall

TOKENIZERS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers"
GPT_OSS = TOKENIZERS / "gpt-oss"
needs_data = pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="no shared data")
FOLDERS = ["gpt-oss", "qwen3", "qwen2_5"]


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer.load(GPT_OSS, server="llama.cpp")


def _hf_ids(r: Renderer, msgs: list[dict], tools: Any = None, **kw: Any) -> list[int]:
    # the reference's strftime_now reads the clock; ours reports the fixed date
    return list(apply_at_fixed_date(r, msgs, tools=tools, tokenize=True, return_dict=False, **kw))


def _session(n: int, *, content: bool = True) -> tuple[list[dict], list[dict]]:
    tools = arg_tools("bash", "read_file")
    msgs: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(n):
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {i}." if content and i % 3 else "",
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"arg": f"ls {i}"})},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"file_{i}.py\nok"})
    return msgs, tools


# ------------------------------------------------------------------------------------------------
# item 11: tokenizers + jinja, no transformers
# ------------------------------------------------------------------------------------------------


def test_loading_a_tokenizer_does_not_import_transformers() -> None:
    folder = GPT_OSS if GPT_OSS.is_dir() else None
    code = (
        "import sys, time; t = time.perf_counter(); from treeprep.render import Renderer; "
        f"r = Renderer.load({str(folder)!r} if {folder is not None} else None); "
        "r.render_text([{'role': 'user', 'content': 'x'}], None); "
        "assert 'transformers' not in sys.modules, 'transformers was imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@needs_data
@pytest.mark.parametrize("name", FOLDERS)
def test_folder_loader_matches_transformers(name: str) -> None:
    folder = load_folder(TOKENIZERS / name)
    r = Renderer.load(TOKENIZERS / name)
    tok = hf_tokenizer(r)
    assert folder.vocab_size == len(tok)
    assert folder.chat_template == tok.chat_template
    assert folder.special_tokens == tok.special_tokens_map
    text = "Hello <|im_start|>wörld 🙂 <|endoftext|>\n\n  x<|start|>user<|message|>y"
    assert list(r.encode(text)) == tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------------------
# gpt-oss renders exactly like apply_chat_template (with a fixed date)
# ------------------------------------------------------------------------------------------------


@needs_data
def test_gpt_oss_matches_apply_chat_template(r: Renderer) -> None:
    assert r.native_template is None  # no port: jinja, incrementally
    msgs, tools = _session(4)
    for k in range(2, len(msgs) + 1):
        for gen in (False, True):
            head = hf_convention(msgs[:k])  # the chat form the renderer gives the template
            ours = r.encode(r.render_text(head, tools, add_generation_prompt=gen))
            assert list(ours) == _hf_ids(r, msgs[:k], tools, add_generation_prompt=gen)


@needs_data
def test_gpt_oss_parallel_calls_are_rejected(r: Renderer) -> None:
    """Item 5: the template renders only the first of parallel calls: the call is rejected."""
    msgs, tools = _session(1)
    comp = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "p1", "function": {"name": "bash", "arguments": '{"arg": "ls"}'}},
            {"id": "p2", "function": {"name": "read_file", "arguments": '{"arg": "a.py"}'}},
        ],
    }
    rec = ChatCall(call_id="c", messages=msgs, tools=tools, completion=comp)
    with pytest.raises(RenderError, match=r"tool call 2 of 2 \('read_file'\) does not appear"):
        r.render(rec, group_id="g")
    one = {**comp, "tool_calls": comp["tool_calls"][:1]}
    seq = r.render(ChatCall(call_id="c", messages=msgs, tools=tools, completion=one), group_id="g")
    assert list(seq.tokens) == _hf_ids(r, [*msgs, one], tools)


# ------------------------------------------------------------------------------------------------
# item 5 with templates like DeepSeek-V3's and Llama 3's, and --chat-template as the fix
# ------------------------------------------------------------------------------------------------

# tool calls only when content is null (DeepSeek-V3's rule; our messages carry "" for null)
DEEPSEEK_LIKE = (
    "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' and m.tool_calls "
    "and m.content is none %}{% for t in m.tool_calls %}<call>{{ t.function.name }}"
    "{{ t.function.arguments }}</call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# ignores tool calls (Llama 3's template)
LLAMA_LIKE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
KEEPS_CALLS = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for t in m.tool_calls or [] %}"
    "<call>{{ t.function.name }} {{ t.function.arguments | tojson }}</call>{% endfor %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CALL = {"id": "1", "function": {"name": "run", "arguments": '{"cmd": "ls -l"}'}}


@pytest.mark.parametrize("source", [DEEPSEEK_LIKE, LLAMA_LIKE])
def test_templates_that_drop_tool_calls_reject_the_call(tmp_path: Path, source: str) -> None:
    tpl = tmp_path / "t.jinja"
    tpl.write_text(source)
    r = Renderer.load(None, chat_template=tpl)
    comp = {"role": "assistant", "content": "Listing.", "tool_calls": [CALL]}
    rec = ChatCall(call_id="c", messages=[{"role": "user", "content": "q"}], completion=comp)
    with pytest.raises(RenderError, match=r"tool call 1 of 1 \('run'\) does not appear"):
        r.render(rec, group_id="g")
    tpl.write_text(KEEPS_CALLS)  # the user's fix: a template that keeps them
    seq = Renderer.load(None, chat_template=tpl).render(rec, group_id="g")
    assert seq.loss_spans and seq.loss_spans[0][1] == len(seq.tokens)


def test_completion_loss_cases() -> None:
    comp = {"role": "assistant", "content": "  Hi.\n", "tool_calls": [CALL]}
    assert (
        completion_loss(comp, 'Hi.<tool_call>{"name": "run", "arguments": {"cmd": "ls -l"}}')
        is None
    )
    assert completion_loss(comp, 'Hi. run {"cmd": "ls -l"}') is None
    assert completion_loss(comp, 'Hi. run "{\\"cmd\\": \\"ls -l\\"}"') is None  # tojson of str
    assert completion_loss(comp, "Hi. run<parameter=cmd>ls -l</parameter>") is None
    assert "text" in (completion_loss(comp, 'run {"cmd": "ls -l"}') or "")
    assert "arguments of tool call 1" in (completion_loss(comp, 'Hi. run {"cmd": "pwd"}') or "")
    assert completion_loss({"role": "assistant", "content": ""}, "") == EMPTY_REPLY  # issue 27


# ------------------------------------------------------------------------------------------------
# item 12: incremental rendering
# ------------------------------------------------------------------------------------------------


@needs_data
def test_incremental_equals_whole_on_a_session(r: Renderer) -> None:
    assert r.incremental is not None and r.incremental.enabled
    whole = Renderer.load(GPT_OSS, native_templates=False, server="llama.cpp")
    assert whole.incremental is None
    msgs, tools = _session(30)
    r.incremental.clear()
    before = r.incremental.incremental
    for k in range(2, len(msgs), 2):  # one call per turn: history, then the completion
        # the step's text as its reasoning, where gpt-oss's template writes it (and its response
        # parser reads it back from): a text beside tool calls does not round-trip
        comp = {**msgs[k], "content": "", "reasoning_content": msgs[k]["content"]}
        rec = ChatCall(
            call_id=f"c{k}", messages=msgs[:k], tools=tools, completion=comp, source_line=k
        )
        a, b = r.render(rec, group_id="g"), whole.render(rec, group_id="g")
        assert np.array_equal(a.tokens, b.tokens) and a.loss_spans == b.loss_spans
    assert r.incremental.incremental - before > 20  # the fast path did the work


@needs_data
def test_calls_minutes_apart_render_incrementally_and_print_their_own_day(r: Renderer) -> None:
    """gpt-oss prints the date (``strftime_now("%Y-%m-%d")``): the calls of a session, minutes
    apart, render from the call before (its text is cached under the day it prints, not the
    call's time), and each prints its own day, across midnight too."""
    assert r.incremental is not None
    whole = Renderer.load(GPT_OSS, native_templates=False, server="llama.cpp")
    msgs, tools = _session(30)
    r.incremental.clear()
    before = r.incremental.incremental
    for k in range(2, len(msgs), 2):
        comp = {**msgs[k], "content": "", "reasoning_content": msgs[k]["content"]}
        stamp = (datetime(2025, 3, 1, 23, 35, 5) + timedelta(minutes=k)).isoformat() + "Z"
        rec = ChatCall(call_id=f"c{k}", messages=msgs[:k], tools=tools, completion=comp,
                       source_line=k, timestamp=stamp)  # fmt: skip
        a, b = r.render(rec, group_id="g"), whole.render(rec, group_id="g")
        assert np.array_equal(a.tokens, b.tokens) and a.loss_spans == b.loss_spans
        assert f"Current date: {stamp[:10]}" in r.decode(a.tokens)
    assert r.incremental.incremental - before > 20  # keyed by the call's time: none


@needs_data
def test_incremental_falls_back_when_an_append_rewrites_history(r: Renderer) -> None:
    """gpt-oss drops the analysis of earlier tool-call turns once a final answer follows: the
    append is not prefix-stable, the window sees it, and the result is the whole render."""
    msgs, tools = _session(12)
    assert r.incremental is not None
    for k in range(2, len(msgs) + 1):
        r.render_text(msgs[:k], tools)
    final = [*msgs, {"role": "assistant", "content": "All done."}]
    ref = r.template.render(final, tools, False)
    assert r.render_text(final, tools) == ref


def test_a_template_that_fools_the_window_is_never_incremental() -> None:
    """A template that prints a mark only past 24 messages renders the small window without it:
    the window checks cannot see that, the probe sessions do, and the template is rendered whole."""
    src = (
        "{% for m in messages %}{{ m.content }};{% endfor %}"
        "{% if messages|length > 24 %}!{% endif %}"
    )
    t = ChatTemplate(src)
    inc = IncrementalRenderer(lambda m, tl, g, n: t.render(m, tl, g, now=n))
    assert not inc.verify(probe_sessions())
    stable = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    inc2 = IncrementalRenderer(lambda m, tl, g, n: stable.render(m, tl, g, now=n))
    assert inc2.verify(probe_sessions())


def test_window_checks_refuse_a_length_dependent_template() -> None:
    """Every message depends on the length: no append is prefix-stable, every render is whole."""
    t = ChatTemplate("{% for m in messages %}{{ messages | length }}:{{ m.content }};{% endfor %}")
    inc = IncrementalRenderer(lambda m, tl, g, n: t.render(m, tl, g, now=n))
    msgs, _ = probe_sessions()[0]
    for k in range(1, len(msgs) + 1):
        assert inc.render(msgs[:k], None, False) == t.render(msgs[:k], None, False)
    assert inc.incremental == 0 and inc.fallbacks > 0


_TURN = st.sampled_from(["call", "call-text", "call-think", "calls-2", "final", "user"])


def _random_session(turns: list[str]) -> list[dict]:
    msgs: list[dict] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    for i, t in enumerate(turns):
        if t == "user":
            msgs.append({"role": "user", "content": f"more {i}"})
            continue
        if t == "final":
            msgs.append({"role": "assistant", "content": f"answer {i}"})
            continue
        n = 2 if t == "calls-2" else 1
        m: dict = {
            "role": "assistant",
            "content": f"text {i}" if t == "call-text" else "",
            "tool_calls": [
                {"id": f"{i}.{k}", "function": {"name": "bash", "arguments": f'{{"arg": "{i}"}}'}}
                for k in range(n)
            ],
        }
        if t == "call-think":
            m["reasoning_content"] = f"think {i}"
        msgs.append(m)
        msgs += [
            {"role": "tool", "tool_call_id": f"{i}.{k}", "content": f"out {i}"} for k in range(n)
        ]
    return msgs


def _sources() -> list[str]:
    from treeprep.render import builtin as bt

    out = [bt.CHAT_TEMPLATE]
    if (GPT_OSS / "chat_template.jinja").is_file():
        out.append((GPT_OSS / "chat_template.jinja").read_text())
    return out


# a text call that a final answer follows, then a text call that none does yet, outside the
# window's tail when a final answer is appended (which drops its text in gpt-oss)
FINAL_DROPS_TEXT_OUTSIDE_WINDOW = [
    *["call-text", "final", "call-text", "call", "call", "call", "final"],
]
FINAL_DROPS_TEXT_AFTER_USER = [
    *["call"] * 8,
    *["call-text", "final", "user", "call-text", "call", "call", "final"],
]
FINAL_DROPS_TEXT_AFTER_CALLS = [
    *["call"] * 7,
    *["call-text", "final", "calls-2", "call", "call-text", "call", "call", "final"],
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(_TURN, min_size=1, max_size=24), which=st.integers(0, 1))
@example(turns=FINAL_DROPS_TEXT_OUTSIDE_WINDOW, which=1)
@example(turns=FINAL_DROPS_TEXT_AFTER_USER, which=1)
@example(turns=FINAL_DROPS_TEXT_AFTER_CALLS, which=1)
def test_incremental_equals_whole_on_random_sessions(turns: list[str], which: int) -> None:
    """Item 12: whatever the session's shape, every incremental render equals the whole render
    (prefix-stable appends use the window, others fall back)."""
    sources = _sources()
    t = ChatTemplate(sources[which % len(sources)])
    inc = IncrementalRenderer(lambda m, tl, g, n: t.render(m, tl, g, now=n))
    msgs = _random_session(turns)
    for k in range(2, len(msgs) + 1):
        for gen in (False, True):
            try:
                ref = t.render(msgs[:k], None, gen)
            except RenderError:
                continue
            assert inc.render(msgs[:k], None, gen) == ref


_LEAVE = st.sampled_from(["append", "elide", "retry", "files"])


def _leaving_calls(msgs: list[dict], moves: list[str]) -> list[list[dict]]:
    """Conversations that go on from the one before (``append``: two more messages of
    ``msgs``) or leave it after a shared start: an old tool output elided as the next turn is
    appended (SWE-agent), the last turn asked again (a retry), the files and their
    acknowledgement put before the last turn (Aider). Shared messages are the same dicts."""
    out: list[list[dict]] = []
    cur, k = msgs[:2], 2
    for move in moves:
        if move == "elide":
            tools = [
                j for j, m in enumerate(cur) if m["role"] == "tool" and "(" not in m["content"]
            ]
            if len(tools) > 3:
                cur = list(cur)
                cur[tools[-4]] = {**cur[tools[-4]], "content": "(old output omitted)"}
        if move == "retry" and len(cur) > 3:
            cur = [*cur[:-2], {"role": "user", "content": f"again {len(out)}"}]
        elif move == "files" and len(cur) > 3:
            files = [{"role": "user", "content": f"files {len(out)}"},
                     {"role": "assistant", "content": "Ok."}]  # fmt: skip
            cur = [*cur[:-1], *files, cur[-1]]
        else:
            cur, k = [*cur, *msgs[k : k + 2]], k + 2
        out.append(cur)
    return out


def _leaving_sources() -> list[str]:
    out = _sources()
    qwen3 = TOKENIZERS / "qwen3" / "tokenizer_config.json"
    if qwen3.is_file():
        out.append(json.loads(qwen3.read_text())["chat_template"])
    out.append("{% for m in messages %}{{ messages | length }}:{{ m.content }};{% endfor %}")
    # each turn prints its index: the window renders the tails apart from the history
    out.append("{% for m in messages %}{{ loop.index }}:{{ m.content }};{% endfor %}")
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(_TURN, min_size=8, max_size=24),
    moves=st.lists(_LEAVE, min_size=4, max_size=30),
    which=st.integers(0, 4),
)
def test_conversations_that_leave_the_last_render_as_whole(
    turns: list[str], moves: list[str], which: int
) -> None:
    """A call that leaves a recent one after a shared start is rendered from its text (the old
    tail cut, the new one appended, each as the window renders it) exactly as whole, on the
    built-in, gpt-oss and Qwen3 templates, one whose every turn reads the length and one whose
    turns print their index (the window checks alone, without the probe sessions' verdict)."""
    sources = _leaving_sources()
    t = ChatTemplate(sources[which % len(sources)])
    inc = IncrementalRenderer(lambda m, tl, g, n: t.render(m, tl, g, now=n))
    for msgs in _leaving_calls(_random_session(turns), moves):
        for gen in (False, True):
            try:
                ref = t.render(msgs, None, gen)
            except RenderError:
                continue
            assert inc.render(msgs, None, gen) == ref


@needs_data
def test_swe_agent_calls_that_elide_an_old_output_render_from_the_last(r: Renderer) -> None:
    """SWE-agent elides the oldest output still shown in each call: with gpt-oss, every call
    after the first few renders from the one before (none found it: each rendered whole)."""
    assert r.incremental is not None and r.incremental.leaving
    msgs, tools = _session(40)
    calls = _leaving_calls(msgs, ["append"] * 4 + ["elide"] * 30)
    r.incremental.clear()
    before = r.incremental.incremental
    for m in calls:
        for gen in (False, True):
            assert r.render_text(m, tools, add_generation_prompt=gen) == r.template.render(
                m, tools, gen
            )
    assert r.incremental.incremental - before > 40


@needs_data
@pytest.mark.parametrize(
    "turns",
    [FINAL_DROPS_TEXT_OUTSIDE_WINDOW, FINAL_DROPS_TEXT_AFTER_USER, FINAL_DROPS_TEXT_AFTER_CALLS],
)
def test_incremental_sees_a_final_answer_drop_the_text_of_a_call_outside_the_window(
    turns: list[str],
) -> None:
    """The bug: the window held only the first tool call with text, which a final answer already
    followed; a final answer appended later drops the text of a later such call outside the
    window's tail, the window did not change, and the history's old text was kept. The window
    now holds the last look-alike too, sees the rewrite and renders whole. Checked with the
    run-time comparison off (as on most renders of a build), so the window alone must be right."""
    t = ChatTemplate((GPT_OSS / "chat_template.jinja").read_text())
    inc = IncrementalRenderer(lambda m, tl, g, n: t.render(m, tl, g, now=n))
    inc.cross_check = CrossCheck(first=0, every=1 << 30)
    msgs = _random_session(turns)
    for k in range(2, len(msgs) + 1):
        fallbacks = inc.fallbacks
        for gen in (False, True):
            assert inc.render(msgs[:k], None, gen) == t.render(msgs[:k], None, gen), (k, gen)
        if k == len(msgs):  # the final answer rewrites the history: the window must see it
            assert inc.fallbacks > fallbacks
    assert inc.incremental > 0  # the fast path did render the rest


@needs_data
def test_build_renders_of_the_bug_session_match_whole_renders() -> None:
    """The same session through Renderer.render (what a build does, prompt and full sequence
    per call), with the real tokenizer and the run-time comparison off: every call gives the
    tokens, or the rejection, of rendering it whole. The last call is a final answer, which makes
    the template drop the text of the calls since the user's question: its prompt is not a prefix
    of apply_chat_template(messages + [answer]). The bug kept the old text in that full render
    (wrong tokens). It was then rejected; now (issue 27 item 6, treeprep.render.prompted) it is
    trained after the reference's generation prompt, the answer as the reference's full render
    ends."""
    fast = Renderer.load(GPT_OSS, server="llama.cpp")
    whole = Renderer.load(GPT_OSS, native_templates=False, server="llama.cpp")
    assert fast.incremental is not None and fast.incremental.enabled
    fast.incremental.cross_check = CrossCheck(first=0, every=1 << 30)

    def render(r: Renderer, rec: ChatCall) -> tuple[list[int], list] | str:
        try:
            seq = r.render(rec, group_id="g")
        except RenderError as e:
            return str(e)
        return seq.tokens.tolist(), seq.loss_spans

    msgs = _random_session(FINAL_DROPS_TEXT_AFTER_USER)
    got = []
    for k in range(2, len(msgs)):
        if msgs[k]["role"] != "assistant":
            continue
        rec = ChatCall(call_id=f"c{k}", messages=msgs[:k], completion=msgs[k], source_line=k)
        got.append(render(fast, rec))
        assert got[-1] == render(whole, rec), k
    k = len(msgs) - 1
    assert msgs[k]["role"] == "assistant" and "tool_calls" not in msgs[k]
    prompt, full = _hf_ids(fast, msgs[:k], add_generation_prompt=True), _hf_ids(fast, msgs)
    assert full[: len(prompt)] != prompt
    tail = f"<|channel|>final<|message|>{msgs[k]['content']}<|return|>"
    assert fast.decode(full).endswith("<|start|>assistant" + tail)
    tokens, spans = got[-1]
    assert tokens[: len(prompt)] == prompt and fast.decode(tokens[len(prompt) :]) == tail
    assert spans == [(len(prompt), len(tokens))]
    assert fast.incremental.incremental > 0
