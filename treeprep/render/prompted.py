"""A completion rendered after the generation prompt the model saw, where the template rewrites
the history for it.

A call trains ``apply_chat_template(messages + [completion])``, split where the generation
prompt ``apply_chat_template(messages, add_generation_prompt=True)`` ends; the prompt must be a
token prefix of it. gpt-oss's template breaks that for one kind of call: an assistant turn with
tool calls keeps its analysis (reasoning) in the prompt only while no final answer follows it, so
when the completion *is* a final answer (an agent's closing reply after its tool turns), the full
render drops the analysis of every earlier tool turn and the generation prompt is no longer its
prefix. The model, though, wrote that answer after the generation prompt, analysis included
(what a server renders for it), and the template renders the answer itself the same either way.

So such a call is rendered as the generation prompt followed by the completion's own text cut
from the full render: :func:`completion_after_prompt`. The cut is found, not guessed: the full
render and the render with an empty final answer in its place share the rewritten history and
then the assistant header that the generation prompt ends with; the completion's text is what
follows that header in the full render. Nothing is made up: both pieces are the template's own
output, and the renderer then checks as for any call that the result starts with the
generation prompt's tokens and that the loss span holds every word and tool call of the
completion. Where the pieces cannot be found (another kind of mismatch), the call stays rejected
with the prefix error. The renderer flags the calls rendered this way (``last_prompt_kept``),
and the build reports them as curation ``history-kept``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np

from treeprep.errors import RenderError
from treeprep.sequence import is_prefix

#: ``render_text(messages, tools, add_generation_prompt=..., now=..., where=...)``
RenderText = Callable[..., str]


def completion_after_prompt(
    render_text: RenderText,
    encode: Callable[[str], np.ndarray],
    msgs: list[dict],
    comp: dict,
    tools: list[dict] | None,
    *,
    prompt: tuple[str, np.ndarray],
    full_text: str,
    now: datetime | None,
    where: str,
) -> tuple[str, np.ndarray] | None:
    """The generation prompt followed by the completion's text as the full render writes it, as
    text and token ids that start with the prompt's ``prompt = (text, ids)``; or None when the
    mismatch is not a history rewritten for a final answer (module docstring)."""
    prompt_text, prompt_ids = prompt
    if comp.get("role") != "assistant" or comp.get("tool_calls"):
        return None
    history = render_text(msgs, tools, now=now, where=where)
    if not prompt_text.startswith(history) or len(prompt_text) == len(history):
        return None
    header = prompt_text[len(history) :]  # what the generation prompt appends: the header
    stub: dict[str, Any] = {"role": "assistant", "content": ""}
    try:
        stub_text = render_text([*msgs, stub], tools, now=now, where=where)
    except RenderError:
        return None
    common = _common_prefix(full_text, stub_text)
    cut = full_text.rfind(header, 0, common)
    if cut < 0 or not stub_text.startswith(header, cut):
        return None
    body = full_text[cut + len(header) :]
    text = prompt_text + body
    ids = encode(text)
    n_p = len(prompt_ids)
    if not body or len(ids) <= n_p or not is_prefix(prompt_ids, ids):
        return None
    return text, ids


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
