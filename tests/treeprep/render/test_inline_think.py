"""Issue 27 item 5: inline <think> becomes reasoning, whitespace-normalized coverage, empty
replies, and LLaMA-Factory v1 ``{type, value}`` parts (reasoning and tool calls) mapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeprep.formats import ReadOptions, get_format
from treeprep.render.coverage import EMPTY_REPLY, completion_coverage
from treeprep.render.gaps import GAP_KINDS
from treeprep.render.messages import split_inline_think
from treeprep.schemas import ChatCall

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen3 = pytest.mark.skipif(
    not (QWEN3 / "tokenizer.json").is_file(), reason="../shared/data is absent"
)

INLINE = "<think>\nAdd the two numbers.\n</think>\n\n\nThe answer is 4.\n\n"


def test_split_inline_think() -> None:
    d = split_inline_think({"role": "assistant", "content": INLINE})
    assert d == {
        "role": "assistant",
        "content": "The answer is 4.\n\n",
        "reasoning_content": "Add the two numbers.",
    }
    kept = [
        {"role": "user", "content": INLINE},  # not the model's text
        {"role": "assistant", "content": INLINE, "reasoning_content": "R"},  # has its field
        {"role": "assistant", "content": "Hi <think>x</think> there"},  # words before the block
        {"role": "assistant", "content": "<think>a</think> b <think>c</think>"},  # two blocks
    ]
    assert [split_inline_think(m) for m in kept] == kept


def test_coverage_modulo_whitespace() -> None:
    comp = {"role": "assistant", "content": "<think>plan</think>\n\n\nStep one.\n\nStep two.\n"}
    span = "<think>\nplan\n</think>\n\nStep one.\nStep two.<|im_end|>"
    assert completion_coverage(comp, span) == (None, True)
    assert completion_coverage(comp, "<think>\nplan\n</think>\n\nStep one.<|im_end|>") == (
        "the completion's text does not appear",
        False,
    )
    assert completion_coverage({"role": "assistant", "content": "Step one."}, span) == (None, False)
    empty = {"role": "assistant", "content": "", "reasoning_content": ""}
    assert completion_coverage(empty, "<think>\n\n</think>\n\n<|im_end|>") == (EMPTY_REPLY, False)
    shown = {"role": "assistant", "content": "", "reasoning_content": "plan"}
    assert completion_coverage(shown, span) == (None, False)


def _call(messages: list[dict], completion: dict) -> ChatCall:
    return ChatCall(
        group_id="g",
        call_id="c",
        messages=messages,  # type: ignore[arg-type]
        completion=completion,  # type: ignore[arg-type]
        source_file="f",
        source_line=1,
        source_format="openai-chat",
    )


@needs_qwen3
def test_inline_think_renders_as_qwen3_does() -> None:
    from transformers import AutoTokenizer  # the reference only

    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = AutoTokenizer.from_pretrained(str(QWEN3), local_files_only=True)
    msgs = [{"role": "user", "content": "2+2?"}]
    comp = {"role": "assistant", "content": INLINE}
    seq = r.render(_call(msgs, comp), group_id="g")
    # what the build counts: the inline block made reasoning, the completion read back by the parser
    kinds = set(r.last_normalized) - set(GAP_KINDS)  # the prompt's gaps: render/gaps.py
    assert kinds == {"inline-think", "round-trip"}
    full = hf.apply_chat_template([*msgs, comp], tokenize=True, return_dict=False)
    prompt = hf.apply_chat_template(
        msgs, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert list(seq.tokens) == list(full)
    assert seq.loss_spans == [(len(prompt), len(full))]


LF = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "value": "What is 2+2?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "value": "Use the calculator."},
                {
                    "type": "tool_call",
                    "value": json.dumps({"name": "calc", "arguments": {"e": "2+2"}}),
                },
            ],
        },
        {"role": "tool", "content": [{"type": "text", "value": "4"}]},
        {
            "role": "assistant",
            "content": [{"type": "reasoning", "value": "Done."}, {"type": "text", "value": "4"}],
        },
    ]
}


def _lf_calls(tmp_path: Path) -> list[ChatCall]:
    p = tmp_path / "lf_v1.jsonl"
    p.write_text(json.dumps(LF) + "\n")
    items = list(get_format("chat-messages").read(str(p), ReadOptions()))
    assert all(isinstance(x, ChatCall) for x in items), items
    return items  # type: ignore[return-value]


def test_llamafactory_v1_parts_are_mapped(tmp_path: Path) -> None:
    c0, c1 = _lf_calls(tmp_path)
    assert c0.completion.reasoning_content == "Use the calculator."
    assert c0.completion.tool_calls is not None
    assert c0.completion.tool_calls[0].function.name == "calc"
    assert c0.completion.tool_calls[0].function.arguments == {"e": "2+2"}
    assert c1.completion.text() == "4" and c1.completion.reasoning_content == "Done."
    assert c1.messages[-1].role == "tool" and c1.messages[-1].text() == "4"


@needs_qwen3
def test_llamafactory_v1_parts_match_apply_chat_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer  # the reference only

    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = AutoTokenizer.from_pretrained(str(QWEN3), local_files_only=True)
    for call in _lf_calls(tmp_path):
        msgs, comp, tools = r.normalize(call)
        seq = r.render(call, group_id="g")
        full = hf.apply_chat_template([*msgs, comp], tools=tools, tokenize=True, return_dict=False)
        prompt = hf.apply_chat_template(
            msgs, tools=tools, tokenize=True, return_dict=False, add_generation_prompt=True
        )
        assert list(seq.tokens) == list(full)
        assert seq.loss_spans == [(len(prompt), len(full))]
        # found verbatim, and read back
        assert set(r.last_normalized) - set(GAP_KINDS) == {"round-trip"}


QWEN25 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen2_5"


@pytest.mark.skipif(not (QWEN25 / "tokenizer.json").is_file(), reason="../shared/data is absent")
@pytest.mark.parametrize("tokenizer", [QWEN25, QWEN3], ids=["qwen2_5", "qwen3"])
def test_a_prompt_s_inline_think_reaches_the_template_as_sent(tokenizer: Path) -> None:
    """An earlier reply sent back with its ``<think>`` block in the content reaches the template
    as the server hands it, the content as it is: Qwen2.5's template prints it whole, Qwen3's
    splits it itself. Made reasoning here, Qwen2.5's prompt lost the block."""
    from transformers import AutoTokenizer  # the reference only

    from treeprep.render import Renderer

    r = Renderer.load(str(tokenizer))
    hf = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": INLINE},
            {"role": "user", "content": "And 3+3?"}]  # fmt: skip
    comp = {"role": "assistant", "content": "6"}
    seq = r.render(_call(msgs, comp), group_id="g")
    full = hf.apply_chat_template([*msgs, comp], tokenize=True, return_dict=False)
    assert list(seq.tokens) == list(full)


@pytest.mark.skipif(not (QWEN25 / "tokenizer.json").is_file(), reason="../shared/data is absent")
def test_a_completion_s_inline_think_trains_as_the_model_wrote_it() -> None:
    """The model wrote the block in its text: a template that prints the text (Qwen2.5's) trains
    it as written, apply_chat_template's tokens of the completion as logged; Qwen3's splits it
    itself, with its own newlines, and the split form renders (counted ``inline-think``)."""
    from transformers import AutoTokenizer  # the reference only

    from treeprep.render import Renderer

    msgs = [{"role": "user", "content": "2+2?"}]
    comp = {"role": "assistant", "content": INLINE}
    r = Renderer.load(str(QWEN25))
    seq = r.render(_call(msgs, comp), group_id="g")
    hf = AutoTokenizer.from_pretrained(str(QWEN25), local_files_only=True)
    assert list(seq.tokens) == list(hf.apply_chat_template([*msgs, comp], tokenize=True,
                                                           return_dict=False))  # fmt: skip
    assert INLINE.strip() in r.decode(seq.tokens[seq.loss_spans[0][0] :])
    assert "inline-think" not in r.last_normalized
    r = Renderer.load(str(QWEN3))
    seq = r.render(_call(msgs, comp), group_id="g")
    assert "Add the two numbers." in r.decode(seq.tokens[seq.loss_spans[0][0] :])
    assert "inline-think" in r.last_normalized


#: a template that cuts a reply's <think> block out of its text and shows no reasoning field
DROPS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_completion_s_inline_think_that_the_template_does_not_show_is_rejected(
    tmp_path: Path,
) -> None:
    """Neither as written nor made its reasoning does the block show: rejected (the template
    writes no ``<think>``, so the split form is tried first, then the text as logged, whose
    reasoning is missing from the span)."""
    from treeprep.errors import RenderError
    from treeprep.render import Renderer

    path = tmp_path / "t.jinja"
    path.write_text(DROPS_THINK)
    r = Renderer.load(None, chat_template=path)
    comp = {"role": "assistant", "content": INLINE}
    with pytest.raises(RenderError, match="the completion's text does not appear"):
        r.render(_call([{"role": "user", "content": "2+2?"}], comp), group_id="g")


GPT_OSS = ROOT / ".." / "shared" / "data" / "tokenizers" / "gpt-oss"


@pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="../shared/data is absent")
@pytest.mark.parametrize("server", ["vllm", "llama.cpp"])
def test_a_think_block_for_gpt_oss_is_its_analysis(server: str) -> None:
    """gpt-oss writes its reasoning in the analysis channel and never a ``<think>`` block: a
    block in a logged reply is a client's wrapping of that channel (gptme's), trained as the
    analysis, on Harmony (vLLM) as on the template (llama.cpp)."""
    from treeprep.render import Renderer

    r = Renderer.load(str(GPT_OSS), server=server)
    comp = {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"}
    seq = r.render(_call([{"role": "user", "content": "2+2?"}], comp), group_id="g")
    assert r.decode(seq.tokens[seq.loss_spans[0][0] :]) == (
        "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final"
        "<|message|>4<|return|>"
    )
