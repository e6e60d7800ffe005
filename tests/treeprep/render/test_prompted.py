"""A final answer after tool turns, for gpt-oss: trained after the generation prompt the model saw
(issue 27 item 6; :mod:`treeprep.render.prompted`).

gpt-oss's template keeps a tool turn's analysis while no final answer follows it, so rendering
``messages + [final answer]`` drops the analysis that the generation prompt shows: the prompt is
not a prefix, and such calls were rejected even with ``--reasoning-merge``. Each call here is
compared with transformers' ``apply_chat_template`` (the reference) of the merged messages: the
sequence is the reference's generation prompt followed by the completion exactly as the
reference's full render ends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hf_reference import apply_at_fixed_date, arg_tools, hf_tokenizer

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.build.curate import merge_reasoning
from treeprep.errors import RenderError
from treeprep.modes import ReasoningMerge
from treeprep.render import Renderer
from treeprep.schemas import ChatCall

GPT_OSS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers" / "gpt-oss"
needs_data = pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="no shared data")

TOOLS = arg_tools("Bash", "Read")


def _claude_turn(i: int, tool: str, arg: str) -> dict:
    """A Claude-style turn: thinking, text and a tool call in one assistant message."""
    return {
        "role": "assistant",
        "content": f"Let me run step {i}.",
        "reasoning_content": f"Step {i} needs {tool}.",
        "tool_calls": [
            {
                "id": f"toolu_{i}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"arg": arg})},
            }
        ],
    }


def _claude_session() -> list[dict]:
    msgs: list[dict] = [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "Why does test_dates fail?"},
    ]
    for i, (tool, arg) in enumerate([("Read", "dates.py"), ("Bash", "pytest -x")]):
        msgs.append(_claude_turn(i, tool, arg))
        msgs.append({"role": "tool", "tool_call_id": f"toolu_{i}", "content": f"output {i}"})
    return msgs


FINAL = {
    "role": "assistant",
    "content": "The leap-year rule ignores centuries; fixed in dates.py.",
    "reasoning_content": "Both outputs agree: 1900 is wrong.",
}


def _merged(how: ReasoningMerge, final: dict = FINAL) -> ChatCall:
    call = ChatCall.model_validate(
        {"call_id": "c", "messages": _claude_session(), "tools": TOOLS, "completion": final}
    )
    assert merge_reasoning(call, how)
    return call


def _reference(r: Renderer, call: ChatCall, *, gen: bool, final: bool) -> str:
    """apply_chat_template of the merged messages (gpt-oss's field names), at the fixed date."""

    def hf(m: Any) -> dict:
        d = m.model_dump(exclude_none=True)
        if "reasoning_content" in d:
            d["thinking"] = d.pop("reasoning_content")
        d.setdefault("content", "")
        return d

    msgs = [hf(m) for m in call.messages] + ([hf(call.completion)] if final else [])
    text = apply_at_fixed_date(r, msgs, tools=TOOLS, tokenize=False, add_generation_prompt=gen)
    return str(text)


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer.load(GPT_OSS, server="llama.cpp")


@needs_data
@pytest.mark.parametrize("how", [ReasoningMerge.drop, ReasoningMerge.fold])
@pytest.mark.parametrize("thinking", [True, False])
def test_final_answer_after_claude_turns_is_trained_after_its_prompt(
    r: Renderer, how: ReasoningMerge, thinking: bool
) -> None:
    final = FINAL if thinking else {**FINAL, "reasoning_content": None}
    call = _merged(how, final)
    prompt = _reference(r, call, gen=True, final=False)
    full = _reference(r, call, gen=False, final=True)
    assert not full.startswith(prompt)  # the reference's own render drops the tool turns' analysis
    analysis = "" if not thinking else f"<|channel|>analysis<|message|>{final['reasoning_content']}"
    tail = (
        f"{analysis}<|end|><|start|>assistant" if thinking else ""
    ) + f"<|channel|>final<|message|>{final['content']}<|return|>"
    assert full.endswith("<|start|>assistant" + tail)  # the completion as the template writes it
    seq = r.render(call, group_id="g")
    tok = hf_tokenizer(r)
    assert seq.tokens.tolist() == tok(prompt + tail, add_special_tokens=False)["input_ids"]
    n_p = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert seq.loss_spans == [(n_p, len(seq.tokens))]
    assert r.decode(seq.tokens[n_p:]) == tail
    assert r.last_prompt_kept


@needs_data
def test_unmerged_claude_turns_render_as_llama_cpp_sends_them(r: Renderer) -> None:
    """Without --reasoning-merge, llama.cpp's gpt-oss handler sends each Claude turn as its
    reasoning and call, its text left out (render/llama_caps.py): the prompt is the reference's
    of those messages. SGLang hands the template the turns as they are: the template's own
    error stands, and nothing is rendered after the prompt for a call whose history does not
    render."""
    call = ChatCall.model_validate(
        {"call_id": "c", "messages": _claude_session(), "tools": TOOLS, "completion": FINAL}
    )
    sent = call.model_copy(deep=True)
    for m in sent.messages:
        if m.tool_calls:
            m.content = None
    seq = r.render(call, group_id="g")
    prompt = _reference(r, sent, gen=True, final=False)
    assert r.decode(seq.tokens[: seq.loss_spans[0][0]]) == prompt
    assert "Let me run step" not in prompt and "Step 1 needs Bash." in prompt
    with pytest.raises(RenderError, match="Cannot pass both content and thinking"):
        Renderer.load(GPT_OSS, server="sglang").render(call, group_id="g")


def test_a_header_the_full_render_lacks_stays_rejected(tmp_path: Path) -> None:
    """A generation prompt that opens a think block the full render never writes: not a history
    rewritten for a final answer, so the prefix error stands."""
    tpl = tmp_path / "t.jinja"
    tpl.write_text(
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|><think>{% endif %}"
    )
    r = Renderer.load(None, chat_template=tpl)
    call = ChatCall.model_validate(
        {"call_id": "c", "messages": [{"role": "user", "content": "q"}], "completion": FINAL}
    )
    with pytest.raises(RenderError, match="is not a token prefix"):
        r.render(call, group_id="g")
    assert not r.last_prompt_kept


@needs_data
def test_build_counts_the_calls_kept_after_their_prompt(tmp_path: Path) -> None:
    """Two tool calls and the final answer of one Claude-style session, built for gpt-oss: off
    rejects all three (the template's error), fold trains all three and counts the final answer
    as ``history-kept``; the counts reconcile."""
    msgs = _claude_session()
    recs = [
        {"group_id": "s", "call_id": "s-0", "messages": msgs[:2], "tools": TOOLS,
         "completion": msgs[2]},
        {"group_id": "s", "call_id": "s-1", "messages": msgs[:4], "tools": TOOLS,
         "completion": msgs[4]},
        {"group_id": "s", "call_id": "s-2", "messages": msgs, "tools": TOOLS, "completion": FINAL},
    ]  # fmt: skip
    src = tmp_path / "claude.jsonl"
    src.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in recs))
    m = build(
        BuildConfig(inputs=[str(src)], out=str(tmp_path / "fold"), tokenizer=str(GPT_OSS),
                    file=FileOptions(reasoning_merge="fold", server="llama.cpp"))
    )  # fmt: skip
    assert m.counts.records_in_trees == 3 and m.counts.records_rejected == 0
    assert m.curation == {"history-kept": 1, "reasoning-merge:fold": 3}
    assert m.counts.trees == 1
