"""gpt-oss on vLLM: rendered with Harmony, as vLLM renders it, and read back with Harmony's parser.

The references are code we did not write: transformers' ``apply_chat_template`` with gpt-oss's
own template (the text Harmony and the template agree on), openai_harmony's parser (what the
trained tokens say), and, for what only vLLM does, vLLM's request conversion
(``entrypoints/openai/parser/harmony_utils.py``), spelled out here as the expected text.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hf_reference import apply_at_fixed_date, arg_tools, hf_tokenizer

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import NativeTemplateMismatch, RenderError, TokenizerError
from treeprep.render import Renderer, harmony
from treeprep.schemas import ChatCall

pytest.importorskip("openai_harmony")

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
GPT_OSS = DATA / "tokenizers" / "gpt-oss"
pytestmark = pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="no shared data")

TOOLS = arg_tools("bash", "read_file")


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer.load(GPT_OSS)  # --server vllm --harmony oss-harmony, the defaults


@pytest.fixture(scope="module")
def r_openai() -> Renderer:
    return Renderer.load(GPT_OSS, harmony="openai-harmony")  # vLLM 0.30 and before


def _oss(text: str) -> str:
    """``text`` with each tool result's header as oss-harmony writes it (vLLM from 0.31): the
    recipient after the channel (the template and openai-harmony write it after the author)."""
    header = r"<\|start\|>(functions\.[^<]*?) to=assistant<\|channel\|>commentary<\|message\|>"
    return re.sub(header, r"<|start|>\1<|channel|>commentary to=assistant<|message|>", text)


def _template(r: Renderer, msgs: list[dict], tools: Any, gen: bool, **kw: Any) -> str:
    """gpt-oss's own template through transformers, at the renderer's fixed date, with the tool
    results unquoted (the one thing Harmony writes otherwise in these sessions)."""
    text = apply_at_fixed_date(
        r, msgs, tools=tools, tokenize=False, add_generation_prompt=gen, **kw
    )
    result = r"(to=assistant<\|channel\|>commentary<\|message\|>)(\".*?\")(?=<\|end\|>)"
    return re.sub(result, lambda m: m[1] + json.loads(m[2]), text, flags=re.S)


def _session(system: str | None, n: int) -> list[dict]:
    """Tool turns with reasoning, a final answer with reasoning after the second, then more."""
    msgs = [{"role": "system", "content": system}] if system is not None else []
    msgs.append({"role": "user", "content": "Fix the failing test."})
    for i in range(n):
        call = {"name": "bash", "arguments": json.dumps({"arg": f"ls {i}"})}
        msgs += [
            {"role": "assistant", "content": "", "thinking": f"look {i}",
             "tool_calls": [{"id": f"c{i}", "type": "function", "function": call}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f'file_{i}.py\n"ok"'},
        ]  # fmt: skip
        if i == 1:
            msgs += [
                {"role": "assistant", "content": "Step done.", "thinking": "wrap up"},
                {"role": "user", "content": "Go on."},
            ]
    return msgs


@pytest.mark.parametrize("library", ["oss-harmony", "openai-harmony"])
@pytest.mark.parametrize("system", [None, "You are a coding agent."])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_prompts_are_the_template_s_text_but_for_tool_results(
    r: Renderer, r_openai: Renderer, library: str, system: str | None, tools: Any
) -> None:
    """Every prompt of a session (system, tools, reasoning dropped once a final answer follows):
    the template's text with the tool results as they are, their headers as the library vLLM had
    writes them; and Harmony's ids are the tokenizer's. The one other difference: Harmony ends
    the instructions of a developer message without tools with no blank line."""
    r = r if library == "oss-harmony" else r_openai
    msgs = _session(system, 4)
    first_result = next(i for i, m in enumerate(msgs) if m["role"] == "tool")
    hf = hf_tokenizer(r)
    for k in range(1, len(msgs) + 1):
        ours = r.render_text(msgs[:k], tools, add_generation_prompt=True)
        ref = _template(r, msgs[:k], tools, True)
        if system and not tools:
            ref = ref.replace(f"{system}\n\n<|end|>", f"{system}<|end|>", 1)
        assert ours == (_oss(ref) if library == "oss-harmony" else ref), k
        assert r.harmony is not None
        assert r.harmony.reference_ids(msgs[:k], tools, True) == hf(ours)["input_ids"]
        assert '"ok"' in ours or k <= first_result  # a result as it is, not '\\"ok\\"'


def test_a_completion_follows_its_prompt(r: Renderer) -> None:
    """A tool call renders as the template renders it (the tool result before it as vLLM from
    0.31 writes it); a final answer after tool turns follows the
    prompt the model saw (with the turns' analysis, which the template's whole render drops) and
    ends with <|return|>, as the template ends it."""
    msgs = _session(None, 2)
    call_at = 3  # messages[3] is the second tool call
    full = r.render_text(msgs[: call_at + 1], TOOLS)
    assert full == _oss(_template(r, msgs[: call_at + 1], TOOLS, False))
    final_at = 5
    prompt = r.render_text(msgs[:final_at], TOOLS, add_generation_prompt=True)
    full = r.render_text(msgs[: final_at + 1], TOOLS)
    tail = "<|channel|>analysis<|message|>wrap up<|end|>"
    tail += "<|start|>assistant<|channel|>final<|message|>Step done.<|return|>"
    assert full == prompt + tail
    assert _template(r, msgs[: final_at + 1], TOOLS, False).endswith(tail)
    assert "look 1" in prompt and "look 1" not in _template(r, msgs[: final_at + 1], TOOLS, False)


def test_what_vllm_sends_where_the_template_cannot(r: Renderer, r_openai: Renderer) -> None:
    """vLLM's conversion where the template refuses or differs: a turn's text (commentary) and
    reasoning (analysis) before its calls, every parallel call with its arguments as logged, a
    result named by its call's id (an unknown id: ``functions.``), a later system message as a
    developer message, the instructions without a blank line. The calls' headers are the first
    layout with either library (vLLM 0.31's rewrite); the results' are oss-harmony's (vLLM from
    0.31) or openai-harmony's (before)."""
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "R1", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p":"é"}'}},
            {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": '{"f": 1}'}},
        ]},
        {"role": "tool", "tool_call_id": "c2", "content": "x"},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "zz", "content": "?"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "U2"},
    ]  # fmt: skip
    head = _template(r, msgs[:1], None, False).replace("S\n\n<|end|>", "S<|end|>")
    want = head + (
        "<|start|>user<|message|>U<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>R1<|end|>"
        '<|start|>assistant to=functions.ls<|channel|>commentary json<|message|>{"p":"é"}<|call|>'
        '<|start|>assistant to=functions.cat<|channel|>commentary json<|message|>{"f": 1}<|call|>'
        "<|start|>functions.cat<|channel|>commentary to=assistant<|message|>x<|end|>"
        "<|start|>functions.ls<|channel|>commentary to=assistant<|message|>a.py\nb.py<|end|>"
        "<|start|>functions.<|channel|>commentary to=assistant<|message|>?<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        "<|start|>user<|message|>U2<|end|><|start|>assistant"
    )
    assert r.render_text(msgs, None, add_generation_prompt=True) == want
    old = re.sub(r"(functions\.\w*)<\|channel\|>commentary to=assistant<",
                 r"\1 to=assistant<|channel|>commentary<", want)  # fmt: skip
    assert old.count(" to=assistant<|channel|>commentary<|message|>") == 3
    assert r_openai.render_text(msgs, None, add_generation_prompt=True) == old


def _call(messages: list[dict], completion: dict, **kw: Any) -> ChatCall:
    return ChatCall(call_id="c", messages=messages, completion=completion, tools=TOOLS,
                    source_file="f.jsonl", source_line=1, **kw)  # fmt: skip


def test_the_request_s_reasoning_effort_is_stated(r: Renderer) -> None:
    """A call whose log records its reasoning effort: the system message states it, as the
    template does given ``reasoning_effort``; one Harmony has not ("minimal") is rejected, as
    vLLM refuses the request."""
    hi = [{"role": "user", "content": "Hi"}]
    seq = r.render(_call(hi, REPLY, reasoning_effort="high"), group_id="g")
    a, _ = seq.loss_spans[-1]
    assert r.decode(seq.tokens[:a]) == _template(r, hi, TOOLS, True, reasoning_effort="high")
    assert "Reasoning: high" in r.decode(seq.tokens)
    assert "Reasoning: medium" in r.decode(r.render(_call(hi, REPLY), group_id="g").tokens)
    with pytest.raises(RenderError, match="reasoning effort 'minimal' is not one Harmony has"):
        r.render(_call(hi, REPLY, reasoning_effort="minimal"), group_id="g")


REPLY = {"role": "assistant", "content": "Hello."}


def _parsed(r: Renderer, seq: Any) -> list[dict]:
    """openai_harmony's own parse of the trained tokens."""
    import openai_harmony as oh

    assert r.harmony is not None
    a, b = seq.loss_spans[-1]
    enc = r.harmony.encoding
    msgs = enc.parse_messages_from_completion_tokens(seq.tokens[a:b].tolist(), oh.Role.ASSISTANT)
    return [m.to_dict() for m in msgs]


def test_a_completion_is_trained_as_the_model_writes_it_and_reads_back(r: Renderer) -> None:
    """Reasoning, a preamble and two calls (arguments as logged, compact JSON): trained in the
    model's order and read back by Harmony as they were logged; the call is counted as read back."""
    comp = {"role": "assistant", "content": "Checking.", "reasoning_content": "hm", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"arg":"ls"}'}},
        {"id": "b", "type": "function", "function": {"name": "bash", "arguments": '{"arg":"pwd"}'}},
    ]}  # fmt: skip
    seq = r.render(_call([{"role": "user", "content": "Where am I?"}], comp), group_id="g")
    got = [(m["channel"], m.get("recipient"), m["content"][0]["text"]) for m in _parsed(r, seq)]
    assert got == [
        ("analysis", None, "hm"),
        ("commentary", None, "Checking."),
        ("commentary", "functions.bash", '{"arg":"ls"}'),
        ("commentary", "functions.bash", '{"arg":"pwd"}'),
    ]
    assert "round-trip" in r.last_normalized
    assert r.response_parser is not None and r.response_parser.name.startswith("oss-harmony")


def test_a_completion_that_does_not_read_back_is_named() -> None:
    """Harmony's parser against a logged call: a re-serialized argument string, a lost reasoning
    and a lost preamble are each a difference (what the build rejects with)."""
    r = Renderer.load(GPT_OSS)
    assert r.harmony is not None
    parser = harmony.HarmonyParser(r.harmony.encoding)
    call = {"function": {"name": "bash", "arguments": '{"arg":"ls"}'}}
    logged = {"role": "assistant", "content": "Checking.", "reasoning_content": "hm",
              "tool_calls": [call]}  # fmt: skip
    good = ("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary"
            "<|message|>Checking.<|end|><|start|>assistant to=functions.bash<|channel|>commentary"
            ' json<|message|>{"arg":"ls"}<|call|>')  # fmt: skip
    assert parser.check(logged, "", good) is None
    spaced = good.replace('{"arg":"ls"}', '{"arg": "ls"}')
    assert "reads back with arguments" in (parser.check(logged, "", spaced) or "")
    no_pre = good.replace("<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>", "")
    assert "its text reads back as" in (parser.check(logged, "", no_pre) or "")
    other = good.replace("<|message|>hm<", "<|message|>other<")
    assert "its reasoning reads back as" in (parser.check(logged, "", other) or "")


def test_the_ids_are_checked_against_harmony_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderer's text (message by message) and its ids are compared with Harmony's render
    of the whole request: where they differ, the build stops with the reason rather than train
    ids vLLM would not have used."""
    r = Renderer.load(GPT_OSS)
    h = r.harmony
    assert h is not None
    real = h.reference_ids
    hi = [{"role": "user", "content": "hi"}]
    ids = real(hi, None, True)
    assert r.encode(r.render_text(hi, None, add_generation_prompt=True)).tolist() == ids
    assert h.differs(h.render(hi, None, True), [*ids, 0], ids, "t") is not None
    monkeypatch.setattr(h, "reference_ids", lambda *a: [*real(*a)[:-1], ids[-2]])
    with pytest.raises(NativeTemplateMismatch, match="differs from Harmony's render of the whole"):
        r.render_text(hi, None, add_generation_prompt=True)


def test_another_vocabulary_or_no_harmony_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss's template on Qwen3's vocabulary: vLLM's ids would be o200k's, so --server vllm
    refuses it by name (llama.cpp renders the template); without openai_harmony, the error says
    what to install."""
    template = GPT_OSS / "chat_template.jinja"
    qwen3 = DATA / "tokenizers" / "qwen3"
    with pytest.raises(TokenizerError, match="not o200k"):
        Renderer.load(qwen3, chat_template=template)
    assert Renderer.load(qwen3, chat_template=template, server="llama.cpp").harmony is None
    monkeypatch.setattr(harmony, "_LOADED", {})
    monkeypatch.setitem(sys.modules, "openai_harmony", None)
    with pytest.raises(TokenizerError, match="pip install oss-harmony"):
        Renderer.load(GPT_OSS)


def test_harmony_refuses_a_role_it_has_not(r: Renderer) -> None:
    with pytest.raises(RenderError, match="Harmony has no role 'function'"):
        r.render_text([{"role": "function", "content": "x"}], None, add_generation_prompt=True)


def test_real_claude_code_logs_build_for_gpt_oss_on_vllm(tmp_path: Path) -> None:
    """Two real Claude Code logs (text, reasoning and parallel calls in one turn), built for
    gpt-oss: rendered with the template (llama.cpp), calls are refused; as vLLM renders them,
    every call is trained and every completion reads back through Harmony's parser."""
    logs = DATA / "logs" / "claude-code"
    inputs = [str(logs / "tool_heavy.jsonl"), str(logs / "subagent.jsonl")]
    m = build(BuildConfig(inputs=inputs, out=str(tmp_path / "v"), tokenizer=str(GPT_OSS)))
    assert m.counts.records_rejected == 0 and m.counts.records_in_trees == 16
    assert m.normalized["round-trip"] == m.counts.records_in_trees
    assert m.response_parser and m.response_parser.startswith("oss-harmony")
    llama = FileOptions(server="llama.cpp", reasoning_merge="fold")
    t = build(BuildConfig(inputs=inputs, out=str(tmp_path / "t"), tokenizer=str(GPT_OSS),
                          file=llama))  # fmt: skip
    assert t.counts.records_rejected > 0 and "gptoss_template" in (t.response_parser or "")


@pytest.mark.parametrize(
    ("wire", "written"),
    [("python", '{"p": "\\u00e9", "n": 1}'), ("javascript", '{"p":"é","n":1}'),
     (None, '{"p": "é", "n": 1}')],
)  # fmt: skip
def test_arguments_logged_as_an_object_are_written_as_the_request_wrote_them(
    r: Renderer, wire: str | None, written: str
) -> None:
    """Harmony writes the request's argument string: for a call logged as an object (Claude
    Code's ``tool_use`` input) that is the string the agent or the endpoint made of it (vLLM's
    Messages endpoint: ``json.dumps``), in the history and in the trained call alike, which
    reads back as it."""
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "bash", "arguments": {"p": "é", "n": 1}},
    }
    history = [{"role": "user", "content": "Go"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "t1", "content": "ok"}]  # fmt: skip
    comp = {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "t2"}]}
    seq = r.render(_call(history, comp, arguments_json=wire), group_id="g")
    a, _ = seq.loss_spans[-1]
    prompt, span = r.decode(seq.tokens[:a]), r.decode(seq.tokens[a:])
    assert f"json<|message|>{written}<|call|>" in prompt
    assert span.endswith(f"json<|message|>{written}<|call|>")
    assert "round-trip" in r.last_normalized
