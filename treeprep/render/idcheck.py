"""Logged token ids checked against the logged text, before any of them is trained.

A log that records token ids (ATIF ``metrics.completion_token_ids``, ``tokens`` records, NeMo-Gym
items) is trained on those ids exactly: nothing is rendered. When the same log also records what
the generation said (:class:`~treeprep.formats.base.TextRollout`), the generation ids are decoded
with the build's tokenizer and the call is rejected when the decoded text lacks the logged
message text or one of its tool-call names: placeholder ids, or real ids of another tokenizer
(ATIF records ``agent.model_name``), would otherwise be trained as noise.

What is compared, and why so loosely: the decoded generation holds the model's whole output in
its native syntax (a ``<think>`` block, ``<tool_call>`` JSON, special tokens), the logged text
only the message. So the check is containment, with every whitespace run removed on both sides
(logs strip or re-wrap the text; a wrong tokenizer scrambles the words, not only the spaces);
tool calls are checked by name only, because the arguments are logged re-serialized. A record
with nothing to compare (no text, no tool call) passes.

Per file, a build where most calls fail stops instead of rejecting them one by one: once
:data:`MIN_CHECKED` calls of one file were checked and more than half of them failed, the
tokenizer is almost surely not the one that produced the ids, and
:class:`~treeprep.errors.TokenizerError` says so. The decision is per file (deterministic: it
depends on the file and the tokenizer only, so a resumed build decides the same); a file with
a few bad calls keeps its good ones and rejects the rest. ``--no-check-ids`` keeps the old
behaviour (ids trained unchecked) for logs whose text is known not to be the ids' text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from treeprep.errors import RenderError, TokenizerError

__all__ = ["MIN_CHECKED", "MISMATCH", "IdCheck", "missing_from"]

#: the reject reason's start (the rest says what the decoded text lacks)
MISMATCH = "the logged ids do not decode to the logged text: wrong --tokenizer?"
#: calls of one file checked before most of them failing stops the build
MIN_CHECKED = 8


def _squeeze(text: str) -> str:
    return "".join(text.split())


def missing_from(decoded: str, text: str, tool_names: Sequence[str]) -> str | None:
    """What of the logged ``text`` and ``tool_names`` the ``decoded`` generation lacks, or None.

    >>> missing_from("<think>\\nok</think>\\n\\nHello  world<|im_end|>", "Hello world", [])
    >>> missing_from("Bonjour", "Hello", [])
    'the message text'
    >>> missing_from('<tool_call>{"name": "ls"}</tool_call>', "", ["ls", "cat"])
    'a tool-call name (cat)'
    """
    if text.strip() and _squeeze(text) not in _squeeze(decoded):
        return "the message text"
    for name in tool_names:
        if name not in decoded:
            return f"a tool-call name ({name})"
    return None


class IdCheck:
    """The check of one renderer: rejects a call whose ids do not decode to its text, and stops
    once most calls of a file fail (see the module docstring)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], tokenizer: str) -> None:
        self.decode = decode
        self.tokenizer = tokenizer
        #: file -> (calls checked, calls failed)
        self.tally: dict[str, tuple[int, int]] = {}

    def check(self, ids: Sequence[int], text: str, tool_names: Sequence[str], file: str) -> None:
        """Raise :class:`RenderError` (the call's reject) when ``ids`` lack ``text`` or a tool
        name, :class:`TokenizerError` when that makes most of ``file``'s checked calls fail."""
        if not text.strip() and not tool_names:
            return  # nothing logged to compare
        lacks = missing_from(self.decode(ids), text, tool_names)
        checked, failed = self.tally.get(file, (0, 0))
        checked, failed = checked + 1, failed + (lacks is not None)
        self.tally[file] = (checked, failed)
        if lacks is None:
            return
        if checked >= MIN_CHECKED and 2 * failed > checked:
            raise TokenizerError(
                f"{file}: {failed} of {checked} calls with logged token ids do not decode to their "
                f"logged text with tokenizer {self.tokenizer!r}: {MISMATCH} Build with the "
                "tokenizer that produced the ids (--tokenizer), or with --no-check-ids to train "
                "the ids unchecked."
            )
        what = lacks.split(" (")[0]  # one reason per kind, so rejects group by it
        raise RenderError(
            f"{MISMATCH} (the decoded generation lacks {what}; --no-check-ids trains it unchecked)"
        )
