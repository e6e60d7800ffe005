"""Reading an Anthropic request's content blocks: what the Messages endpoints of vLLM
(:mod:`treeprep.formats.anthropic`) and llama.cpp (:mod:`treeprep.formats._anthropic_llama`)
read alike, before each converts them its own way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._fields import block_text, expect, opt_list, type_name

#: what a message's ``content`` may be
BLOCKS = "a string or a list of content blocks"
#: how Claude Code's per-request attribution block in ``system`` begins (:func:`is_billing`)
BILLING_HEADER = "x-anthropic-billing-header"


def is_billing(block: Any) -> bool:
    """Whether a system block is Claude Code's attribution line
    (``x-anthropic-billing-header: cc_version=...; cch=<per-request hash>;``), which vLLM's
    Messages endpoint leaves out of the prompt (``_convert_system_message``, 0.31 to 0.34;
    Anthropic reads it off for billing): kept, it would also split every call's prompt from the
    next. llama.cpp keeps it, its hash pinned instead."""
    text = block.get("text") if isinstance(block, dict) else None
    return isinstance(text, str) and text.startswith(BILLING_HEADER)


def text_of(blocks: Any, where: str, sep: str = "") -> str:
    """The text of a string or of the ``text`` blocks of a list, joined by ``sep`` (null: no
    text); another value is a RecordError naming ``where``.

    >>> text_of([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text"}], "c", "|")
    'a|'
    """
    if blocks is None:
        return ""
    if isinstance(expect(blocks, where, str, list, what=BLOCKS), str):
        return blocks  # type: ignore[no-any-return]
    return sep.join(
        block_text(b, "text", f"{where}[{i}]", required=False)
        for i, b in enumerate(blocks)
        if isinstance(b, dict) and b.get("type") == "text"
    )


def request_turns(req: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(where, role, turn)`` of each of the request's ``messages``; a role no endpoint takes
    (not ``user``, ``assistant`` or ``system``) is a RecordError naming the turn."""
    for i, m in enumerate(opt_list(req.get("messages"), "request.messages")):
        where = f"request.messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            shown = repr(role) if isinstance(role, str | None) else type_name(role)
            raise RecordError(f"{where}: role {shown}, expected 'user', 'assistant' or 'system'")
        yield where, role, m
