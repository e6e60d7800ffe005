"""A call's trained span: the full render split where the generation prompt ends.

A call trains ``apply_chat_template(messages + [completion])`` after the generation prompt
``apply_chat_template(messages, add_generation_prompt=True)``, which must be a token prefix of
it; where the template rewrites the history for the completion, the completion is cut from the
full render and put after the prompt the model saw (:mod:`treeprep.render.prompted`). Anything
else is a :class:`~treeprep.errors.RenderError` naming where the two differ.

A completion that opens with an inline ``<think>`` block (a format with no reasoning field) has
two forms: the text as logged, and the block made its reasoning
(:func:`~treeprep.render.messages.split_inline_think`). The log does not say which the model
emitted: a model served without a reasoning parser writes the block in its text, and a client
that gets the reasoning in a field of its own writes it back as such a block (gptme wraps
``reasoning_content`` as ``<think>\n...\n</think>\n\n``). :func:`completion_span` picks by the
template's own reasoning: where the template writes ``<think>`` (Qwen3's, DeepSeek's, the
built-in ChatML), the model's reasoning is such a block, and the text as logged is tried first,
taken where the template prints it as it is; where the template has another channel for
reasoning (gpt-oss's analysis), a ``<think>`` block can only be a client's wrapping of it, and the
split form is tried first, taken where its reasoning shows. The other form is the fallback (so
Qwen2.5's template, which shows no reasoning field, prints the text as logged); what the span
must show is then checked by the renderer (:meth:`~treeprep.render.renderer.Renderer.render`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from treeprep.errors import RenderError
from treeprep.render.coverage import completion_coverage, inline_think_missing
from treeprep.render.messages import THINK_OPEN, split_inline_think
from treeprep.render.prompted import RenderText, completion_after_prompt
from treeprep.sequence import is_prefix

__all__ = ["TrainedSpan", "completion_span", "trained_span"]


@dataclass(frozen=True)
class TrainedSpan:
    """A call's full render and where its loss span starts."""

    full_text: str
    full_ids: np.ndarray
    #: tokens of the generation prompt (the loss span is ``full_ids[n_prompt:]``)
    n_prompt: int
    #: the generation prompt's text, and the loss span's
    head_text: str
    text: str
    #: the completion was cut from the full render after the prompt the model saw
    kept: bool


def trained_span(
    render_text: RenderText,
    encode: Callable[[str], np.ndarray],
    decode: Callable[[np.ndarray], str],
    msgs: list[dict],
    comp: dict,
    tools: list[dict] | None,
    *,
    prompt: Callable[[], tuple[str, np.ndarray]],
    now: datetime | None,
    where: str,
) -> TrainedSpan:
    """The trained span of ``comp`` after ``msgs``, whose generation prompt renders to
    ``prompt() = (text, ids)`` (asked for after the full render: an incremental renderer extends
    the prompt from it); :class:`RenderError` where the prompt is not a token prefix of the full
    render (and no rewritten history explains it) or the completion renders to no tokens."""
    full_text = render_text([*msgs, comp], tools, now=now, where=where)
    full_ids = encode(full_text)
    prompt_text, prompt_ids = prompt()
    kept = None
    if not is_prefix(prompt_ids, full_ids):
        kept = completion_after_prompt(render_text, encode, msgs, comp, tools,
                                       prompt=(prompt_text, prompt_ids), full_text=full_text,
                                       now=now, where=where)  # fmt: skip
        if kept is None:
            raise RenderError(
                "the generation prompt apply_chat_template(messages, add_generation_prompt="
                "True) is not a token prefix of apply_chat_template(messages + [completion]) "
                f"({_first_difference(prompt_ids, full_ids)})"
            )
        full_text, full_ids = kept
    n_p = len(prompt_ids)
    if n_p == len(full_ids):
        raise RenderError("the completion renders to no tokens after the generation prompt")
    if full_text.startswith(prompt_text):
        head_text, text = prompt_text, full_text[len(prompt_text) :]
    else:
        head_text, text = decode(full_ids[:n_p]), decode(full_ids[n_p:])
    return TrainedSpan(full_text, full_ids, n_p, head_text, text, kept is not None)


def completion_span(
    span: Callable[[dict], TrainedSpan], comp: dict, template: str
) -> tuple[TrainedSpan, tuple[dict, ...]]:
    """The trained span of ``comp`` (``span``: :func:`trained_span` of a form), and the forms of
    it, the one the span renders first, by whether the chat template ``template`` (its source)
    writes reasoning as an inline ``<think>`` block (module docstring)."""
    split = split_inline_think(comp)
    if split is comp:
        return span(comp), (comp,)
    forms = (comp, split) if THINK_OPEN in template else (split, comp)
    try:
        first = span(forms[0])
    except RenderError:
        first = None
    if first is not None and _shows(forms[0], first.text, split=forms[0] is split):
        return first, forms
    return span(forms[1]), (forms[1], forms[0])


def _shows(form: dict, text: str, *, split: bool) -> bool:
    """Whether ``text`` shows the form as it is: the text as logged verbatim; the split form's
    text and reasoning."""
    if split:
        return completion_coverage(form, text)[0] is None and not inline_think_missing(form, text)
    return completion_coverage(form, text) == (None, False)


def _first_difference(prompt: np.ndarray, full: np.ndarray) -> str:
    m = min(len(prompt), len(full))
    diff = np.nonzero(prompt[:m] != full[:m])[0]
    if len(diff):
        i = int(diff[0])
        return f"they differ at token {i}: {int(prompt[i])} vs {int(full[i])}"
    return f"the prompt has {len(prompt)} tokens, the full sequence {len(full)}"
