"""Exact tokens against transformers on the real Qwen3 and Qwen2.5 tokenizers and real agent logs.

The reference is always transformers itself: ``apply_chat_template(..., tokenize=True)`` on messages
that this test normalizes on its own from the raw JSON (text parts joined, ``None`` content as
``""``, arguments as logged). Skipped when ``../shared/data`` is absent.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pytest
from hf_reference import hf_convention, hf_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.errors import RenderError
from treeprep.render import Renderer
from treeprep.schemas import ChatCall

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
TOKENIZERS = DATA / "tokenizers"
LLM_DATA = DATA / "logs" / "openhands" / "tests" / "fixtures" / "llm_data"
TAU2 = DATA / "logs" / "tau2-bench"

pytestmark = pytest.mark.skipif(
    not (TOKENIZERS / "qwen3" / "tokenizer.json").is_file(), reason="../shared/data is absent"
)

_RENDERERS: dict[str, Renderer] = {}


def _renderer(name: str) -> Renderer:
    if name not in _RENDERERS:
        _RENDERERS[name] = Renderer.load(str(TOKENIZERS / name))
    return _RENDERERS[name]


@pytest.fixture(params=["qwen3", "qwen2_5"])
def r(request) -> Renderer:
    return _renderer(request.param)


# ------------------------------------------------------------------------------------------------
# the test's own normalization of raw OpenAI-style messages, and the transformers reference
# ------------------------------------------------------------------------------------------------


def _text(content, sep: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return sep.join(p.get("text") or "" for p in content if p.get("type") == "text")


def _ref_message(m: dict, sep: str = "\n") -> dict:
    """The message as the reference renders it. A prompt message's text parts are joined as
    vLLM's chat_utils joins them for a template that takes strings (``"\n"``, the build's
    default ``--server vllm``); a completion's (``sep=""``) as the model streamed them."""
    d = {"role": m["role"], "content": _text(m.get("content"), sep)}
    if m.get("tool_calls"):
        d["tool_calls"] = []
        for tc in m["tool_calls"]:
            fn = tc.get("function") or tc
            out = {
                "type": "function",
                "function": {"name": fn["name"], "arguments": fn["arguments"]},
            }
            if tc.get("id") is not None:
                out = {"id": tc["id"], **out}
            d["tool_calls"].append(out)
    for k in ("tool_call_id", "name", "reasoning_content"):
        if m.get(k) is not None:
            d[k] = m[k]
    return d


def _record_message(m: dict) -> dict:
    """The same raw message as a ChatCall accepts it (known fields only)."""
    d = {k: m[k] for k in ("role", "tool_call_id", "name", "reasoning_content") if m.get(k)}
    c = m.get("content")
    d["content"] = (
        [{"type": p["type"], "text": p.get("text")} for p in c] if isinstance(c, list) else c
    )
    if m.get("tool_calls"):
        d["tool_calls"] = [
            {
                "id": tc.get("id"),
                "function": {
                    "name": (tc.get("function") or tc)["name"],
                    "arguments": (tc.get("function") or tc)["arguments"],
                },
            }
            for tc in m["tool_calls"]
        ]
    return d


def _ids(r: Renderer, msgs, tools=None, **kw) -> list[int]:
    out = hf_tokenizer(r).apply_chat_template(
        hf_convention(msgs), tools=tools, tokenize=True, return_dict=False, **kw
    )
    return list(out)


def _check_exact(r: Renderer, raw_msgs: list[dict], raw_comp: dict, tools) -> None:
    rec = ChatCall(
        call_id="c",
        messages=[_record_message(m) for m in raw_msgs],
        completion=_record_message(raw_comp),
        tools=tools,
        source_file="x",
        source_line=1,
    )
    seq = r.render(rec, group_id="g")
    msgs = [_ref_message(m) for m in raw_msgs]
    comp = _ref_message(raw_comp, sep="")
    full = _ids(r, [*msgs, comp], tools)
    prompt = _ids(r, msgs, tools, add_generation_prompt=True)
    assert list(seq.tokens) == full
    assert seq.loss_spans == [(len(prompt), len(full))]
    assert full[: len(prompt)] == prompt
    # the cached path against whole-text tokenization of the same rendered text
    text = hf_tokenizer(r).apply_chat_template(
        hf_convention([*msgs, comp]), tools=tools, tokenize=False
    )
    assert list(r.encoder.encode_whole(text)) == full
    assert list(r.encode(text)) == full


def _llm_logs() -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(LLM_DATA / "*" / "*.json")))


# ------------------------------------------------------------------------------------------------
# real logs
# ------------------------------------------------------------------------------------------------


def test_openhands_llm_logs_exact(r: Renderer) -> None:
    files = _llm_logs()
    assert len(files) >= 10
    for f in files:
        d = json.loads(f.read_text())
        _check_exact(r, d["messages"], d["response"]["choices"][0]["message"], d.get("tools"))


def test_openhands_message_lists_exact(r: Renderer) -> None:
    """The two whole conversations, one call per assistant turn (content parts, tool calls)."""
    for name in ("fncall-llm-message.json", "nonfncall-llm-message.json"):
        conv = json.loads((LLM_DATA / name).read_text())
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
        assert turns
        for i in turns:
            _check_exact(r, conv[:i], conv[i], None)


@pytest.mark.skipif(not TAU2.is_dir(), reason="no tau2-bench logs")
def test_tau2_conversations_exact(r: Renderer) -> None:
    """tau2: tool calls with object arguments, parallel calls; agent turns of two simulations."""
    f = sorted(TAU2.glob("*.json"))[0]
    d = json.loads(f.read_text())
    policy = d["info"]["environment_info"].get("policy") or ""
    n = 0
    for sim in d["simulations"][:2]:
        conv = [{"role": "system", "content": policy}]
        for m in sim["messages"]:
            if m["role"] == "assistant" and len(conv) > 1:
                _check_exact(r, conv, m, None)
                n += 1
            if m["role"] == "tool":
                m = {"role": "tool", "tool_call_id": m["id"], "content": m["content"]}
            conv.append(m)
    assert n > 5


# ------------------------------------------------------------------------------------------------
# hand-made conversations: parallel tool calls, content parts, reasoning
# ------------------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file <tool_call> inside text",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]


def _conversation() -> list[dict]:
    return [
        {
            "role": "system",
            "content": [{"type": "text", "text": "You fix "}, {"type": "text", "text": "bugs."}],
        },
        {"role": "user", "content": "Fix <think>it</think> please\n\n  with  spaces "},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should look first.\n",
            "tool_calls": [
                {"id": "1", "function": {"name": "bash", "arguments": '{"cmd": "ls -la"}'}},
                {"id": "2", "function": {"name": "read", "arguments": {"path": "a.py"}}},
                {"id": "3", "function": {"name": "read", "arguments": '{"path": "b.py"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "2", "content": "print('a')  # é 漢字 🙂"},
        {"role": "tool", "tool_call_id": "3", "content": "<|im_end|> is in this file"},
        {"role": "assistant", "content": "Both files look fine.", "reasoning_content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "Now run the tests."}]},
    ]


def test_parallel_tool_calls_parts_reasoning_exact(r: Renderer) -> None:
    conv = _conversation()
    comp = {
        "role": "assistant",
        "content": "Running.",
        "reasoning_content": "Tests next.",
        "tool_calls": [{"id": "4", "function": {"name": "bash", "arguments": '{"cmd": "pytest"}'}}],
    }
    _check_exact(r, conv, comp, TOOLS)
    _check_exact(r, conv[:2], conv[2], TOOLS)
    _check_exact(r, conv[:6], conv[6], None)


def test_qwen3_reasoning_follows_the_template() -> None:
    """Qwen3 keeps reasoning only after the last user query; nothing is added or cut."""
    r = _renderer("qwen3")
    conv = _conversation()
    comp = {"role": "assistant", "content": "Done.", "reasoning_content": "FINAL-THOUGHT"}
    rec = ChatCall(
        call_id="c",
        messages=[_record_message(m) for m in conv],
        completion=_record_message(comp),
        tools=TOOLS,
    )
    text = r.decode(r.render(rec, group_id="g").tokens)
    assert "I should look first." not in text  # before the last user query: dropped
    assert "FINAL-THOUGHT" in text  # the completion's own reasoning: kept
    # with the last user turn removed, the earlier reasoning is after the last query: kept
    rec2 = ChatCall(
        call_id="c",
        messages=[_record_message(m) for m in conv[:7]],
        completion=_record_message(comp),
        tools=TOOLS,
    )
    assert "I should look first." in r.decode(r.render(rec2, group_id="g").tokens)


# ------------------------------------------------------------------------------------------------
# the branch hint
# ------------------------------------------------------------------------------------------------


def _three_calls() -> list[ChatCall]:
    sys_ = {"role": "system", "content": "sys"}
    u1 = {"role": "user", "content": "first question"}
    a1 = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "think one",
        "tool_calls": [{"id": "t1", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}],
    }
    t1 = {"role": "tool", "tool_call_id": "t1", "content": "file.txt"}
    a2 = {"role": "assistant", "content": "There is file.txt.", "reasoning_content": "think two"}
    u2 = {"role": "user", "content": "second question"}
    a3 = {"role": "assistant", "content": "Answer.", "reasoning_content": "think three"}
    convs = [([sys_, u1], a1), ([sys_, u1, a1, t1], a2), ([sys_, u1, a1, t1, a2, u2], a3)]
    return [
        ChatCall(call_id=f"c{k}", messages=m, completion=c, tools=TOOLS)
        for k, (m, c) in enumerate(convs)
    ]


def test_branch_hint_reasoning_dropped_qwen3() -> None:
    r = _renderer("qwen3")
    seqs = [r.render(c, group_id="g", order=k) for k, c in enumerate(_three_calls())]
    # call 1 continues call 0 (reasoning after the last user query is kept): a prefix, no hint
    assert np.array_equal(seqs[1].tokens[: len(seqs[0].tokens)], seqs[0].tokens)
    assert seqs[0].branch_reason is None and seqs[1].branch_reason is None
    # call 2 comes after a new user query: Qwen3 drops the earlier reasoning from history
    assert not np.array_equal(seqs[2].tokens[: len(seqs[1].tokens)], seqs[1].tokens)
    assert seqs[2].branch_reason == "reasoning-dropped"
    assert "think two" not in r.decode(seqs[2].tokens)
    # the same without the cache of recent renders (calls arriving out of order)
    r._turns.clear()
    assert r.render(_three_calls()[2], group_id="g").branch_reason == "reasoning-dropped"
    # a reason the adapter gave wins
    c = _three_calls()[2]
    c.branch_reason = "compaction"
    assert r.render(c, group_id="g").branch_reason == "compaction"


def test_branch_hint_empty_think_block_qwen3() -> None:
    """No reasoning at all: Qwen3 still renders the last completion with an empty think block that
    its copy in the next call's history does not have."""
    r = _renderer("qwen3")
    calls = _three_calls()[:2]
    for c in calls:
        for m in [*c.messages, c.completion]:
            m.reasoning_content = None
    s0, s1 = (r.render(c, group_id="g") for c in calls)
    assert "<think>\n\n</think>\n\n" in r.decode(s0.tokens[s0.loss_spans[0][0] :])
    assert s1.branch_reason == "reasoning-dropped"


def test_branch_hint_none_for_prefix_stable_qwen2_5() -> None:
    r = _renderer("qwen2_5")
    seqs = [r.render(c, group_id="g") for c in _three_calls()]
    assert [s.branch_reason for s in seqs] == [None, None, None]
    for a, b in zip(seqs, seqs[1:], strict=False):
        assert np.array_equal(b.tokens[: len(a.tokens)], a.tokens)


# ------------------------------------------------------------------------------------------------
# prefix violation on a real tokenizer
# ------------------------------------------------------------------------------------------------


def test_prefix_violation_qwen2_5_leading_newline() -> None:
    """The generation prompt ends in "assistant\\n"; a completion starting with "\\n" makes BPE
    merge "\\n\\n" into one token, so the prompt is a text prefix but not a token prefix."""
    r = _renderer("qwen2_5")
    msgs = [{"role": "user", "content": "hi"}]
    comp = {"role": "assistant", "content": "\nhello"}
    full = _ids(r, [*msgs, comp])
    prompt = _ids(r, msgs, add_generation_prompt=True)
    assert full[: len(prompt)] != prompt  # transformers agrees: not a token prefix
    rec = ChatCall(call_id="c", messages=msgs, completion=comp)
    with pytest.raises(RenderError, match="not a token prefix"):
        r.render(rec, group_id="g")


# ------------------------------------------------------------------------------------------------
# the cached path against whole tokenization, random text with added tokens spliced in
# ------------------------------------------------------------------------------------------------

QWEN_ADDED = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|fim_prefix|>",
]
PIECES = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "x",
    " word",
    "é",
    "e\u0301",
    "Å",
    "🙂",
    "'s",
    "123",
]


def _spliced() -> st.SearchStrategy[str]:
    near = [t[:-1] for t in QWEN_ADDED] + [t[1:] for t in QWEN_ADDED] + ["<", "|>"]
    chunk = st.one_of(
        st.text(max_size=10),
        st.sampled_from(QWEN_ADDED),
        st.sampled_from(near),
        st.sampled_from(PIECES),
    )
    return st.lists(chunk, max_size=12).map("".join)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_spliced(), st.sampled_from(["qwen3", "qwen2_5"]))
def test_cached_equals_whole_random(x: str, name: str) -> None:
    r = _renderer(name)
    whole = r.encoder.encode_whole(x)
    assert np.array_equal(r.encode(x), whole)
    assert np.array_equal(r.encode(x), whole)  # second time from the cache
    ref = hf_tokenizer(r)(x, add_special_tokens=False)["input_ids"]
    assert list(whole) == list(ref)


def test_probe_keeps_the_cut_on_qwen(r: Renderer) -> None:
    assert r.encoder.split_ok
    assert r.identity.vocab_size == len(hf_tokenizer(r))
    assert r.identity.path is not None and r.identity.path.endswith(r.identity.name)
