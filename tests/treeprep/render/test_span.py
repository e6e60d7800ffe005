"""A call's trained span: the full render split where apply_chat_template's generation prompt
ends, with the reference being transformers' ``apply_chat_template`` for both renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_reference import hf_tokenizer

from treeprep.errors import RenderError
from treeprep.render import Renderer
from treeprep.render.span import trained_span
from treeprep.schemas import ChatCall

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
REPLY = {"role": "assistant", "content": "hello"}


def _span(r: Renderer, msgs: list[dict[str, Any]], comp: dict[str, Any]) -> Any:
    def prompt() -> tuple[str, np.ndarray]:
        text = r.render_text(msgs, None, add_generation_prompt=True)
        return text, r.encode(text)

    return trained_span(r.render_text, r.encode, r.decode, msgs, comp, None, prompt=prompt,
                        now=None, where="f:1")  # fmt: skip


def test_the_span_starts_where_the_generation_prompt_ends() -> None:
    r = Renderer.load(None)
    span = _span(r, MSGS, REPLY)
    hf = hf_tokenizer(r)
    full = list(hf.apply_chat_template([*MSGS, REPLY], tokenize=True, return_dict=False))
    head = hf.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)  # fmt: skip
    assert span.full_ids.tolist() == full and span.n_prompt == len(head)
    assert span.text == "hello<|im_end|>\n" and span.head_text.endswith("<|im_start|>assistant\n")
    assert not span.kept


def _renderer(tmp_path: Path, template: str) -> Renderer:
    path = tmp_path / "t.jinja"
    path.write_text(template)
    return Renderer.load(None, chat_template=path)


def test_a_prompt_that_is_not_a_prefix_is_refused(tmp_path: Path) -> None:
    """A template whose generation prompt the full render does not start with (here it numbers
    the turns from the end) is refused, naming the first token where they part."""
    r = _renderer(tmp_path, "{% for m in messages %}{{ messages|length - loop.index }}:"
                            "{{ m.content }};{% endfor %}{% if add_generation_prompt %}>"
                            "{% endif %}")  # fmt: skip
    with pytest.raises(RenderError, match="is not a token prefix .* differ at token 0"):
        _span(r, MSGS, REPLY)


def test_a_completion_that_renders_to_nothing_is_refused(tmp_path: Path) -> None:
    r = _renderer(tmp_path, "{% for m in messages %}{% if m.role != 'assistant' %}"
                            "{{ m.content }};{% endif %}{% endfor %}")  # fmt: skip
    with pytest.raises(RenderError, match="renders to no tokens"):
        _span(r, MSGS, REPLY)


#: a template with a reasoning channel of its own, which prints a reply's text as it is
CHANNEL = (
    "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}[reason]"
    "{{ m.reasoning_content }}[/reason]{% endif %}{{ m.content }};{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
#: the same, its reasoning written as an inline block
THINK = CHANNEL.replace("[reason]", "<think>").replace("[/reason]", "</think>")
BLOCK = {"role": "assistant", "content": "<think>plan</think>done"}


@pytest.mark.parametrize(
    ("template", "trained"),
    [(THINK, "<think>plan</think>done;"),  # the model's own form: the text as logged
     (CHANNEL, "[reason]plan[/reason]done;")],  # a client's wrapping of the channel: split
)  # fmt: skip
def test_an_inline_block_renders_in_the_templates_own_form(
    tmp_path: Path, template: str, trained: str
) -> None:
    """Where the template writes its reasoning as a ``<think>`` block, the reply is trained as
    logged; where it has a channel of its own (gpt-oss's analysis), the block can only be a
    client's wrapping of that channel (gptme's), and the block is made the reasoning."""
    r = _renderer(tmp_path, template)
    seq = r.render(ChatCall(call_id="c", messages=MSGS, completion=BLOCK), group_id="g")
    assert r.decode(seq.tokens[seq.loss_spans[0][0] :]) == trained
    assert ("inline-think" in r.last_normalized) is (template == CHANNEL)
