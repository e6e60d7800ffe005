"""Where vLLM's Harmony render writes a message's recipient: the two libraries' header layouts.

openai-harmony (to 0.0.8, which vLLM used to 0.30) writes the recipient after the author, and a
call's content type after its channel::

    <|start|>assistant to=functions.f<|channel|>commentary json<|message|>
    <|start|>functions.f to=assistant<|channel|>commentary<|message|>

oss-harmony (0.0.10 on, which vLLM requires from 0.31) writes it after the channel, and the
content type after ``<|constrain|>``::

    <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>
    <|start|>functions.f<|channel|>commentary to=assistant<|message|>

vLLM from 0.31 (``harmony_utils._use_legacy_tool_call_headers``, read in the 0.31 and 0.34
releases) rewrites the assistant's call headers back to the first layout ("GPT-OSS can echo the
latter as a malformed header with the recipient in both positions") and leaves a tool result's
header as oss-harmony writes it. So a prompt vLLM renders holds its calls in the first layout
whichever library it had, and its tool results in that library's layout:
:class:`Headers` rewrites the installed library's ids into those of the library vLLM had
(``--harmony``, :class:`~treeprep.modes.Harmony`), header by header, each rewritten header's
text tokenized on its own between the special tokens, as both libraries tokenize it.
"""

from __future__ import annotations

from typing import Any

from treeprep.modes import Harmony

__all__ = ["Headers", "installed_layout"]

_TO = " to="
#: header texts whose ids are kept
_KEEP = 4096


def installed_layout(encoding: Any) -> Harmony:
    """The library whose layout the installed ``openai_harmony`` module writes (both packages
    install a module of that name): where it puts a tool result's recipient."""
    import openai_harmony as oh

    author = oh.Author.new(oh.Role.TOOL, "functions.f")
    msg = oh.Message.from_author_and_content(author, "").with_channel("commentary")
    text = encoding.decode_utf8(encoding.render(msg.with_recipient("assistant")))
    return Harmony.openai if text.startswith(f"<|start|>functions.f{_TO}assistant") else Harmony.oss


class Headers:
    """Rewrites ids rendered by the installed library (``installed``) into the headers vLLM's
    render with library ``target`` gives: the assistant's calls in the first layout (vLLM's own
    rewrite), tool results in ``target``'s."""

    def __init__(self, encoding: Any, installed: Harmony, target: Harmony) -> None:
        self._enc = encoding
        self.installed, self.target = installed, target
        self._start, self._channel, self._constrain, self._message = (
            encoding.encode(t, allowed_special="all")[0]
            for t in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
        )
        #: header texts -> their ids
        self._pieces: dict[str, list[int]] = {}

    @property
    def needed(self) -> bool:
        """Whether any header can need a rewrite (calls: oss-harmony installed; tool results:
        the installed library is not ``target``)."""
        return self.installed is Harmony.oss or self.installed is not self.target

    def fix(self, ids: list[int]) -> list[int]:
        """``ids`` with every header that has a recipient in the layout vLLM gave it."""
        if not self.needed or self._start not in ids:
            return list(ids)
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            if ids[i] != self._start:
                out.append(ids[i])
                i += 1
                continue
            try:
                end = ids.index(self._message, i + 1)
            except ValueError:
                out.extend(ids[i:])
                break
            out.extend(self._header(ids[i : end + 1]))
            i = end + 1
        return out

    def _header(self, header: list[int]) -> list[int]:
        """One header, ``<|start|>`` to ``<|message|>``, in vLLM's layout."""
        if self._channel not in header:
            return header
        at = header.index(self._channel)
        con = header.index(self._constrain) if self._constrain in header[at:] else None
        author = self._enc.decode_utf8(header[1:at])
        channel = self._enc.decode_utf8(header[at + 1 : con if con is not None else -1])
        if author.split(_TO, 1)[0] == "assistant":
            # vLLM's rewrite: an oss-harmony call header (recipient after the channel, then a
            # space and <|constrain|> with the content type) in the first layout
            if author != "assistant" or con is None or _TO not in channel or channel[-1] != " ":
                return header
            name, recipient = channel[:-1].split(_TO, 1)
            ctype = self._enc.decode_utf8(header[con + 1 : -1])
            if not (name and recipient and ctype):
                return header
            return self._write(f"assistant{_TO}{recipient}", f"{name} {ctype}")
        if con is not None or self.installed is self.target:
            return header  # vLLM's tool results have no content type; or already in its layout
        if _TO in author:  # openai-harmony's tool result
            author, recipient = author.split(_TO, 1)
            name = channel
        elif _TO in channel:  # oss-harmony's
            name, recipient = channel.split(_TO, 1)
        else:
            return header
        if self.target is Harmony.openai:
            return self._write(f"{author}{_TO}{recipient}", name)
        return self._write(author, f"{name}{_TO}{recipient}")

    def _write(self, author: str, channel: str) -> list[int]:
        return [self._start, *self._encode(author), self._channel, *self._encode(channel),
                self._message]  # fmt: skip

    def _encode(self, text: str) -> list[int]:
        """Harmony's ids of a header's text (a session repeats a few; encoding builds a regex of
        every special token each time)."""
        ids = self._pieces.get(text)
        if ids is None:
            if len(self._pieces) >= _KEEP:
                self._pieces.clear()
            ids = self._pieces[text] = list(self._enc.encode(text))
        return ids
