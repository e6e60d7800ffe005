"""gpt-oss as vLLM renders it: with Harmony (``openai_harmony``), not with the chat template.

Why
---
vLLM serves gpt-oss without its chat template: ``entrypoints/openai/chat_completion`` builds the
prompt with ``openai_harmony`` from the request's messages
(``entrypoints/openai/parser/harmony_utils.py``, read at its late-2026 source). The two texts
agree on most of a conversation, not on all of it:

- a tool result: the template writes ``message.content|tojson`` (``"a.py"``, quoted, its
  newlines escaped); Harmony writes the text as it is;
- a tool call's arguments: the template writes ``arguments|tojson`` of the object (re-serialized:
  ``", "`` and ``": "`` between items); Harmony writes the request's string as it is, which is
  what the model generated;
- an assistant turn with text, reasoning and a tool call: the template refuses it; Harmony writes
  the text to the commentary channel, the reasoning to the analysis channel, then the call;
- parallel tool calls: the template writes the first; Harmony writes every one.

So ``--server vllm`` (the default) renders a Harmony template's calls here, the way vLLM does,
and ``--server llama.cpp`` or ``sglang`` renders them with the template.

What vLLM does, and so what this module does
--------------------------------------------
- A leading system or developer message is taken out; its text parts, joined with nothing
  between, are the instructions. The prompt opens with Harmony's system message (its model
  identity, knowledge cutoff, the conversation's date, the request's reasoning effort where the
  log records one, else medium; vLLM refuses any but low, medium and high) and, when there
  are instructions or tools, a developer message with both (the tools as function tools).
- An assistant message with tool calls: its text (commentary channel), its reasoning (analysis),
  then each call (commentary, to ``functions.<name>``, content type ``json``, the arguments as
  logged). A tool result: from ``functions.<name>`` (the name of the call its ``tool_call_id``
  names, ``""`` when none does) to the assistant, commentary channel. Another assistant message:
  its reasoning (analysis), then its text (final channel) when the text is not empty. A later
  system or developer message: a developer message with its text as instructions. Any other
  message: its role and text.
- The analysis messages before the last final message are dropped, and
  ``render_conversation_for_completion`` renders the rest, ending with ``<|start|>assistant``.
- The headers of messages with a recipient (calls and tool results) are written as vLLM writes
  them with the Harmony library it had: oss-harmony from vLLM 0.31, openai-harmony before
  (``--harmony``; :mod:`treeprep.render.harmony_headers`). Both are the ``openai_harmony``
  module; the one installed renders, and its headers are rewritten where they differ.

A trained completion (what the model said, which vLLM parsed into reasoning, text and a call) is
rendered in the order the model writes it: its reasoning, then its text (commentary channel
before a call, final channel otherwise) and its calls; it follows the generation prompt, so the
prompt is always a prefix, and a final answer ends with ``<|return|>``, as Harmony's training
render ends it. A render without a generation prompt whose last message is the assistant's is
that message's call (the history before it as the prompt); the renderer renders a previous turn
so.

The vocabulary
--------------
Harmony tokenizes with o200k (``o200k_harmony``), which ``openai_harmony`` downloads. No build
downloads: the vocabulary is written from the tokenizer's own ``tokenizer.json`` (its byte-level
tokens below id 199,998, in tiktoken's file format) and used only when its sha256 is o200k_base's
(:data:`O200K_SHA256`), so a tokenizer of another vocabulary is refused rather than rendered
with ids vLLM would not use. The text Harmony renders is then tokenized by the build's tokenizer,
as every render is; the renderer compares those ids with Harmony's own on the cross-check
schedule (:mod:`treeprep.crosscheck`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from treeprep.errors import RenderError, TokenizerError
from treeprep.io.jsonparse import json_key
from treeprep.modes import Harmony
from treeprep.render.builtin import bytes_to_unicode
from treeprep.render.dates import DEFAULT_DATE
from treeprep.render.harmony_headers import Headers, installed_layout
from treeprep.render.messages import tool_arguments, wire_arguments
from treeprep.render.response import differences
from treeprep.render.template import REASONING_FIELDS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["O200K_SHA256", "HarmonyChat", "HarmonyParser", "load_harmony"]

#: sha256 of tiktoken's ``o200k_base.tiktoken``, the vocabulary Harmony's encoding is built on
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
#: o200k_base's ordinary tokens are ids 0..199,997; the special tokens follow
_ORDINARY = 199_998
#: Harmony's special tokens the renderer's text relies on (checked to be the tokenizer's too)
_SPECIALS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
_GENERATION_PROMPT = "<|start|>assistant"
#: the reasoning efforts vLLM hands Harmony (``REASONING_EFFORT``): ReasoningEffort's members
_EFFORTS = {"low": "LOW", "medium": "MEDIUM", "high": "HIGH"}
#: message texts and heads kept (a session's history is rendered once)
_KEEP_MESSAGES, _KEEP_HEADS = 16_384, 64
_LOCK = threading.Lock()
_T = TypeVar("_T")


def _o200k_file(backend: Tokenizer) -> bytes:
    """The tokenizer's ordinary tokens as tiktoken's vocabulary file (base64 bytes, rank)."""
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    vocab = backend.get_vocab(with_added_tokens=False)
    lines = []
    for token, rank in sorted(vocab.items(), key=lambda kv: kv[1]):
        if rank >= _ORDINARY:
            continue
        try:
            raw = bytes(to_byte[c] for c in token)
        except KeyError:
            return b""  # not a byte-level vocabulary
        lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    return ("\n".join(lines) + "\n").encode()


#: Harmony's encodings loaded in this process, by the sha256 of their tokenizer
_LOADED: dict[str, Any] = {}


def load_harmony(
    backend: Tokenizer, name: str, key: str, library: Harmony | str = Harmony.oss
) -> HarmonyChat:
    """The Harmony renderer for the tokenizer ``backend`` (named ``name`` in errors, ``key`` its
    identity's sha256: the encoding is loaded once per process), rendering as vLLM did with
    ``library``; :class:`TokenizerError` when ``openai_harmony`` is missing or the vocabulary is
    not o200k."""
    if key not in _LOADED:
        _LOADED[key] = _load(backend, name)
    return HarmonyChat(_LOADED[key], library)


def _load(backend: Tokenizer, name: str) -> Any:
    try:
        import openai_harmony as oh
    except ImportError as e:
        raise TokenizerError(
            f"the chat template of tokenizer {name!r} is gpt-oss's (Harmony), which vLLM renders "
            "with openai_harmony, not with the template; openai_harmony is not installed "
            "(pip install oss-harmony), or build with --server llama.cpp or sglang to render "
            "with the template"
        ) from e
    data = _o200k_file(backend)
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise TokenizerError(
            f"the chat template of tokenizer {name!r} is gpt-oss's (Harmony), which vLLM renders "
            "with openai_harmony's o200k vocabulary, and this tokenizer's vocabulary is not o200k: "
            "vLLM's prompt ids would not be this tokenizer's; build with --server llama.cpp or "
            "sglang to render with the template"
        )
    with _LOCK, tempfile.TemporaryDirectory(prefix="treeprep-o200k-") as folder:
        with open(os.path.join(folder, "o200k_base.tiktoken"), "wb") as f:
            f.write(data)
        old = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = folder
        try:
            encoding = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
        finally:
            if old is None:
                del os.environ["TIKTOKEN_ENCODINGS_BASE"]
            else:
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = old
    for special in _SPECIALS:
        theirs = encoding.encode(special, allowed_special="all")
        if [backend.token_to_id(special)] != theirs:
            raise TokenizerError(
                f"tokenizer {name!r}: {special} is id {backend.token_to_id(special)}, "
                f"Harmony's is {theirs}; this is not gpt-oss's tokenizer"
            )
    return encoding


class HarmonyChat:
    """Renders template dicts (:func:`~treeprep.render.messages.template_messages`) as vLLM
    renders a gpt-oss request (the module docstring).

    Message by message: Harmony writes each message on its own (but the system message, which
    says where the developer message's tools are called), so the text of a request is its head
    (the system and developer messages, rendered together) and its messages' texts, less the
    analysis that comes before the last final answer, and each message's text is rendered once,
    when first seen (a session's calls send the same history dicts again:
    :class:`~.history.NormalizedHistory`).
    :meth:`reference_ids` is Harmony's render of the whole request, which the renderer compares
    texts and ids with on the cross-check schedule (:meth:`differs`)."""

    def __init__(self, encoding: Any, library: Harmony | str = Harmony.oss) -> None:
        import openai_harmony as oh

        self._oh = oh
        self._enc = self.encoding = encoding
        #: vLLM's headers of the library it rendered with (``--harmony``)
        target = Harmony.of(library, "harmony")
        self._headers = Headers(encoding, installed_layout(encoding), target)
        #: vLLM renders a request whole after its own analysis drop, without Harmony's
        self._whole = oh.RenderConversationConfig(auto_drop_analysis=False)
        self._prompt_tail = encoding.encode(_GENERATION_PROMPT, allowed_special="all")
        self._end, self._return = (
            encoding.encode(t, allowed_special="all")[0] for t in ("<|end|>", "<|return|>")
        )
        #: id of a template dict -> (the dict, the tool name it was rendered with, its texts:
        #: (text, :func:`_mark`) per Harmony message)
        self._texts: dict[int, tuple[dict[str, Any], str, list[tuple[str, _Mark]]]] = {}
        #: (instructions, tools' JSON, date) -> the text of the system and developer messages
        self._heads: dict[tuple[Any, ...], str] = {}

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        now: datetime | None = None,
        effort: str | None = None,
    ) -> str:
        """The text vLLM's Harmony render gives (see the module docstring) at the date ``now``
        and the request's reasoning ``effort`` (None: Harmony's default, medium); a message
        Harmony cannot take is a :class:`RenderError`."""
        head, last = _split(messages, add_generation_prompt)
        oh = self._oh
        try:
            text = self._prompt_text(head, tools, _day(now), effort)
            if last is not None or add_generation_prompt:
                text += _GENERATION_PROMPT
            if last is not None:
                text += self._enc.decode_utf8(self._completion_ids(last))
        except (oh.HarmonyError, ValueError, TypeError) as e:
            raise RenderError(f"Harmony (vLLM's gpt-oss render) refuses the call: {e}") from e
        return text

    def reference_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        now: datetime | None = None,
        effort: str | None = None,
    ) -> list[int]:
        """Harmony's ids of the request as vLLM renders it whole
        (``render_conversation_for_completion``), the completion's after them."""
        head, last = _split(messages, add_generation_prompt)
        oh = self._oh
        convo = oh.Conversation.from_messages(self.prompt_messages(head, tools, _day(now), effort))
        ids = self._enc.render_conversation_for_completion(
            convo, oh.Role.ASSISTANT, config=self._whole
        )
        ids = self._headers.fix(ids)
        if last is not None:
            return ids + self._completion_ids(last)
        return ids if add_generation_prompt else ids[: len(ids) - len(self._prompt_tail)]

    def differs(self, text: str, ids: list[int], reference: list[int], name: str) -> str | None:
        """None when ``text`` (a render) is Harmony's text of its request, whose ids are
        ``reference`` (:meth:`reference_ids`), and ``ids``, the build's tokenizer's of ``text``,
        are those; else the reason (a bug here, or not gpt-oss's tokenizer ``name``)."""
        if self._enc.decode_utf8(reference) != text:
            return (
                "the text rendered message by message differs from Harmony's render of the "
                "whole request: a bug in treeprep.render.harmony"
            )
        if ids == reference:
            return None
        at = next((i for i, (a, b) in enumerate(zip(ids, reference, strict=False)) if a != b), -1)
        return (
            f"tokenizer {name!r} tokenizes the text Harmony rendered differently from Harmony "
            f"(first at token {at if at >= 0 else min(len(ids), len(reference))}; "
            f"{len(ids)} against {len(reference)} tokens). vLLM prompts gpt-oss with Harmony's "
            "ids, so this build cannot reproduce them: a bug in treeprep.render.harmony, or a "
            "tokenizer that is not gpt-oss's; build with --server llama.cpp to render with the "
            "chat template"
        )

    # -- message by message ----------------------------------------------------------------------

    def _prompt_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        day: str,
        effort: str | None,
    ) -> str:
        rest, instructions = _instructions(messages)
        key = (instructions, json_key(tools), day, effort)
        head = self._heads.get(key) if key[1] is not None else None
        if head is None:
            # whole: the system message says where the developer message's tools are called
            head_msgs = self._head(instructions, tools, day, effort)
            convo = self._oh.Conversation.from_messages(head_msgs)
            ids = self._enc.render_conversation_for_completion(
                convo, self._oh.Role.ASSISTANT, config=self._whole
            )
            head = self._enc.decode_utf8(ids[: len(ids) - len(self._prompt_tail)])
            if len(self._heads) >= _KEEP_HEADS:
                self._heads.clear()
            self._heads[key] = head
        names = _tool_names(rest)
        parts: list[tuple[str, _Mark]] = []
        for m in rest:
            parts += self._texts_of(m, names)
        kept = _drop_analysis(parts, [mark for _, mark in parts])
        return head + "".join(text for text, _ in kept)

    def _texts_of(self, m: dict[str, Any], names: dict[Any, Any]) -> list[tuple[str, _Mark]]:
        name = names.get(m.get("tool_call_id", "")) or "" if m.get("role") == "tool" else ""
        kept = self._texts.get(id(m))
        if kept is not None and kept[0] is m and kept[1] == name:
            return kept[2]
        texts = [(self._message_text(h), _mark(h)) for h in self._request_message(m, names)]
        if len(self._texts) >= _KEEP_MESSAGES:
            self._texts.clear()
        self._texts[id(m)] = (m, name, texts)
        return texts

    def _message_text(self, message: Any) -> str:
        return str(self._enc.decode_utf8(self._headers.fix(self._enc.render(message))))

    # -- vLLM's request to Harmony ---------------------------------------------------------------

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        day: str,
        effort: str | None = None,
    ) -> list[Any]:
        """The Harmony messages vLLM makes of a chat request's messages and tools."""
        rest, instructions = _instructions(messages)
        out = self._head(instructions, tools, day, effort)
        names = _tool_names(rest)
        for m in rest:
            out.extend(self._request_message(m, names))
        return _drop_analysis(out, [_mark(m) for m in out])

    def _head(
        self,
        instructions: str | None,
        tools: list[dict[str, Any]] | None,
        day: str,
        effort: str | None,
    ) -> list[Any]:
        """The system message, and the developer message when there are instructions or tools."""
        oh = self._oh
        system = oh.SystemContent.new().with_conversation_start_date(day)
        if effort is not None:
            level = _EFFORTS.get(effort)
            if level is None:
                raise RenderError(
                    f"the request's reasoning effort {effort!r} is not one Harmony has (low, "
                    "medium, high): vLLM refuses such a gpt-oss request"
                )
            system = system.with_reasoning_effort(getattr(oh.ReasoningEffort, level))
        out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
        functions = _function_tools(oh, tools)
        if instructions or tools:
            dev = oh.DeveloperContent.new()
            if instructions is not None:
                dev = dev.with_instructions(instructions)
            if functions:
                dev = dev.with_function_tools(functions)
            out.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, dev))
        return out

    def _request_message(self, m: dict[str, Any], names: dict[Any, Any]) -> list[Any]:
        oh = self._oh
        role, calls = m.get("role"), m.get("tool_calls") or []
        reasoning = _reasoning(m)
        text = _text(m.get("content")) or ""
        if role == "assistant" and calls:
            out = [self._assistant(text, "commentary")] if text else []
            if reasoning:
                out.append(self._assistant(reasoning, "analysis"))
            return out + [self._call(tc) for tc in calls]
        if role == "tool":
            name = names.get(m.get("tool_call_id", "")) or ""
            author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
            msg = oh.Message.from_author_and_content(author, text)
            return [msg.with_channel("commentary").with_recipient("assistant")]
        if role == "assistant":
            out = [self._assistant(reasoning, "analysis")] if reasoning else []
            return out + ([self._assistant(text, "final")] if text else [])
        if role in ("system", "developer"):
            dev = oh.DeveloperContent.new().with_instructions(text)
            return [oh.Message.from_role_and_content(oh.Role.DEVELOPER, dev)]
        try:
            harmony_role = oh.Role(role)
        except ValueError as e:
            raise RenderError(f"Harmony has no role {role!r}") from e
        return [oh.Message.from_role_and_content(harmony_role, text)]

    def _assistant(self, text: str, channel: str) -> Any:
        oh = self._oh
        return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel(channel)

    def _call(self, tc: dict[str, Any]) -> Any:
        fn = tc.get("function") or {}
        msg = self._assistant(wire_arguments(fn.get("arguments"), None), "commentary")
        return msg.with_recipient(f"functions.{fn.get('name', '')}").with_content_type("json")

    # -- the model's completion --------------------------------------------------------------------

    def _completion_ids(self, m: dict[str, Any]) -> list[int]:
        """The completion's messages in the order the model writes them, after the generation
        prompt; a final answer ends with ``<|return|>``."""
        text, reasoning, calls = _text(m.get("content")) or "", _reasoning(m), m.get("tool_calls")
        msgs = [self._assistant(reasoning, "analysis")] if reasoning else []
        if calls:
            msgs += [self._assistant(text, "commentary")] if text else []
            msgs += [self._call(tc) for tc in calls]
        else:
            msgs.append(self._assistant(text, "final"))
        ids: list[int] = []
        for msg in msgs:
            ids += self._headers.fix(self._enc.render(msg))
        tail = self._prompt_tail
        if ids[: len(tail)] != tail:
            raise RenderError("Harmony rendered an assistant message that does not open the turn")
        ids = ids[len(tail) :]
        if not calls and ids and ids[-1] == self._end:
            ids[-1] = self._return
        return ids


class HarmonyParser:
    """gpt-oss's response parser as vLLM runs it: Harmony parses the completion's tokens into
    messages, and vLLM makes them a chat message (``parse_chat_output`` and its ``openai`` tool
    parser): the analysis texts joined with ``"\\n"`` are the reasoning, the final and preamble
    (commentary without a recipient) texts joined so are the text, and each commentary message
    to ``functions.<name>`` is a call of that name with its text as arguments (as an object
    where it is one; ``text``, the string itself, is compared exactly). Same interface as
    :class:`~treeprep.render.response.ResponseParser`."""

    def __init__(self, encoding: Any) -> None:
        import openai_harmony as oh

        self._oh, self._enc = oh, encoding
        self.name = f"{_version()}, as vLLM reads gpt-oss"

    @property
    def sha256(self) -> str:
        """What a build's work is keyed by: the parser's name and version."""
        return hashlib.sha256(self.name.encode()).hexdigest()

    def parse(self, text: str) -> dict[str, Any]:
        """The chat message vLLM makes of the completion ``text`` (after the generation
        prompt)."""
        ids = self._enc.encode(text, allowed_special="all")
        msgs = self._enc.parse_messages_from_completion_tokens(ids, self._oh.Role.ASSISTANT)
        reasoning, texts, calls = [], [], []
        for m in msgs:
            body = "".join(c.text for c in m.content if getattr(c, "text", None) is not None)
            recipient = m.recipient or ""
            if m.channel == "analysis":
                reasoning.append(body)
            elif m.channel == "final" or (m.channel == "commentary" and not recipient):
                texts.append(body)
            elif recipient.startswith("functions."):
                name = recipient.removeprefix("functions.")
                fn = {"name": name, "arguments": tool_arguments(body), "text": body}
                calls.append({"type": "function", "function": fn})
        out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if reasoning:
            out["reasoning_content"] = "\n".join(reasoning)
        if calls:
            out["tool_calls"] = calls
        return out

    def check(self, completion: dict[str, Any], prefix: str, text: str) -> str | None:
        """None when ``text`` reads back as ``completion``; else what differs (``prefix``, the
        prompt, is not read: Harmony parses from the generation prompt on)."""
        try:
            parsed = self.parse(text)
        except (self._oh.HarmonyError, ValueError) as e:
            return f"Harmony's parser fails on it ({type(e).__name__}: {e})"
        return differences(completion, parsed) or _call_texts(completion, parsed)


def _call_texts(logged: dict[str, Any], parsed: dict[str, Any]) -> str | None:
    """The calls' arguments read back as the very strings the request held."""
    pairs = zip(logged.get("tool_calls") or (), parsed.get("tool_calls") or (), strict=True)
    for i, (tc, pc) in enumerate(pairs, 1):
        want, got = wire_arguments(tc["function"].get("arguments"), None), pc["function"]["text"]
        if got != want:
            return f"tool call {i} reads back with arguments {got!r}, not {want!r}"
    return None


def _version() -> str:
    """The installed package that provides ``openai_harmony``, and its version."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("oss-harmony", "openai-harmony"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "openai_harmony (version unknown)"


def _split(
    messages: list[dict[str, Any]], add_generation_prompt: bool
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(the prompt, the completion): a render without a generation prompt that ends with the
    assistant's message is that message's call."""
    if not add_generation_prompt and messages and messages[-1].get("role") == "assistant":
        return messages[:-1], messages[-1]
    return messages, None


def _day(now: datetime | None) -> str:
    return (now or DEFAULT_DATE).strftime("%Y-%m-%d")


def _instructions(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """(the messages after a leading system or developer message, its text: the instructions)."""
    if messages and messages[0].get("role") in ("system", "developer"):
        return messages[1:], _text(messages[0].get("content"))
    return messages, None


def _tool_names(messages: list[dict[str, Any]]) -> dict[Any, Any]:
    """Each tool call's id -> its name, over the request (what a tool result is authored by)."""
    return {
        tc.get("id"): (tc.get("function") or {}).get("name")
        for m in messages
        for tc in m.get("tool_calls") or ()
    }


#: what the analysis drop reads of a Harmony message: its channel, and whether the assistant
#: wrote it
_Mark = tuple[str | None, bool]


def _mark(message: Any) -> _Mark:
    return message.channel, message.author.role == "assistant"


def _drop_analysis(items: list[_T], marks: list[_Mark]) -> list[_T]:
    """vLLM's ``auto_drop_analysis_messages``: the items whose message (``marks``: each one's
    :func:`_mark`) is on the analysis channel before the assistant's last final one dropped;
    the items are the messages, or their texts (:meth:`HarmonyChat._prompt_text`)."""
    last = -1
    for i, (channel, assistant) in enumerate(marks):
        if channel == "final" and assistant:
            last = i
    return [x for i, (x, (channel, _)) in enumerate(zip(items, marks, strict=True))
            if not (i < last and channel == "analysis")]  # fmt: skip


def _text(content: Any) -> str | None:
    """A content's text, its text parts joined with nothing between (vLLM's
    ``flatten_input_text_content``)."""
    if content is None or isinstance(content, str):
        return content
    texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "".join(texts) if texts else None


def _reasoning(m: dict[str, Any]) -> str | None:
    return next((m[k] for k in REASONING_FIELDS if m.get(k)), None)


def _function_tools(oh: Any, tools: list[dict[str, Any]] | None) -> list[Any]:
    """The request's function tools as Harmony's tool descriptions (vLLM passes its built-in
    tool types over and refuses any other)."""
    out = []
    for t in tools or ():
        kind = t.get("type", "function")
        if kind in ("web_search_preview", "code_interpreter", "container"):
            continue
        fn = t.get("function")
        if kind != "function" or not isinstance(fn, dict):
            raise RenderError(f"vLLM's Harmony render takes function tools, not {kind!r}")
        out.append(
            oh.ToolDescription.new(
                name=fn.get("name"),
                description=fn.get("description") or "",
                parameters=fn.get("parameters"),
            )
        )
    return out
