"""How a message of several text parts reaches the chat template: the inference server's rule.

An OpenAI-style request may give a message's content as a list of parts
(``[{"type": "text", "text": ...}, ...]``): agents send their reminders, attachments and the
user's words as separate parts, and an Anthropic-style request's text blocks become such parts on
a server's Messages endpoint. A chat template written for string content (Qwen3's, Qwen2.5's,
gpt-oss's) cannot take a list, so the server flattens it first, and each server does it its own
way. The tokens the model saw are the server's, so the build renders as the server did
(``--server``, :class:`~treeprep.modes.Server`):

- **vLLM** (``vllm/entrypoints/chat_utils.py``, content format ``auto``): joins the text parts
  with ``"\\n"``, unless the template loops over a message's content itself, in which case the
  list goes to the template as it is. The loop it looks for: ``for x in m.content`` (or
  ``m['content']``, through filters, tests and slices) where ``m`` is the loop variable of a loop
  over ``messages`` (or a name assigned from it), or ``for x in content`` (Qwen3.5's
  ``render_content`` macro; vLLM #42660).
- **SGLang** (``sglang/srt/parser/jinja_template_utils.py``): joins them with ``" "``, unless
  the template mentions ``image``, ``audio``, ``video`` or ``vision`` anywhere, or loops over
  ``message.content``, ``msg.content`` or ``m.content``; then the list goes to the template,
  but a tool message's text parts, which 0.5.11 and later join with ``" "`` all the same
  (``entrypoints/openai/serving_chat.py``: ``normalize_tool_content``; ``--sglang-version``).
- **llama.cpp** (``common/chat.cpp``, by its probes of the template, ``common/jinja/caps.cpp``:
  :mod:`treeprep.render.llama_caps`): joins them with ``"\\n"`` (none before a part while the
  text so far is empty) for a template that takes string content and not a list of parts; a
  template that takes only parts gets every content as parts, strings too; one that takes both
  (Qwen3.5's) or neither gets each as the request gives it, parts as the list.

A template that fails to parse is taken as one for strings (the servers do so). TensorRT-LLM joins
with ``"\\n"`` too: a build of its logs uses ``--server vllm``. vLLM renders gpt-oss without its
chat template, with ``openai_harmony`` (``entrypoints/openai/parser/harmony_utils.py``), which
writes a message's text parts one after another: for a Harmony template (one that writes
``<|start|>`` and ``<|channel|>``) its rule is to join them with nothing between, and the
renderer renders such calls with Harmony too (:mod:`treeprep.render.harmony`).

What the renderer does with it (:func:`~treeprep.render.messages.normalize_message`): a prompt
message logged as several parts is flattened by the rule, or given to the template as its text
parts where the rule says the list goes through; there, a string content goes to the template as
one text part, as vLLM and llama.cpp hand it (SGLang hands strings through as they are;
:attr:`~treeprep.render.template.ChatTemplate.wrap_strings`). A completion is one reply the model
wrote: its parts are joined with nothing between them, as it streamed them. The build counts the
calls whose prompt had a message flattened (``text-parts:<server>``, :func:`flattened_kind`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import dropwhile
from typing import Any

import jinja2
import jinja2.nodes

from treeprep.modes import Server
from treeprep.render.llama_caps import LlamaCaps, llama_caps
from treeprep.render.server_tools import SGLANG_NEWEST, Version
from treeprep.render.template import ChatTemplate, template_ast

__all__ = [
    "TEXT_PARTS",
    "TextParts",
    "content_format",
    "flattened_kind",
    "template_parts",
    "text_parts",
]

#: the first SGLang version that joins a tool message's text parts (``normalize_tool_content``)
_SGLANG_TOOL_JOIN = (0, 5, 11)
#: SGLang's shortcut: a template mentioning any of these takes the parts as a list
_SGLANG_MEDIA_WORDS = ("image", "audio", "video", "vision")
#: the loop variables SGLang's detection takes for a message
_SGLANG_MESSAGE_NAMES = ("message", "msg", "m")
#: what each server puts between the text parts of a message it flattens
_SEPARATOR = {Server.vllm: "\n", Server.sglang: " ", Server.llama_cpp: "\n"}
#: what a Harmony (gpt-oss) template writes, which vLLM renders with openai_harmony instead
_HARMONY_TAGS = ("<|start|>", "<|channel|>")


@dataclass(frozen=True)
class TextParts:
    """How a prompt message of several text parts becomes the template's content: the parts
    joined by ``sep``, or (``as_list``) the list of text parts as the template's own loop reads
    it, with every string content handed over as one part too where ``wrap``."""

    server: Server
    sep: str
    as_list: bool
    #: a string content goes to the template as one text part too (vLLM and llama.cpp do so
    #: where they hand the template parts; SGLang hands strings through)
    wrap: bool = False
    #: the server renders with openai_harmony, not the template (vLLM, gpt-oss), and so does the
    #: renderer (:mod:`treeprep.render.harmony`)
    harmony: bool = False
    #: what a tool message's text parts are joined with whatever the rule for other messages
    #: (SGLang 0.5.11 on: a space, ``normalize_tool_content``); None: the rule above
    tool_sep: str | None = None
    #: llama.cpp's findings for the template, by which it changes a request's messages besides
    #: their parts (:mod:`treeprep.render.llama_caps`); None on the other servers, or not probed
    caps: LlamaCaps | None = None

    def content(self, texts: list[str]) -> str | list[dict[str, str]]:
        """The content the template gets for a message of these text parts.

        >>> TextParts(Server.vllm, "\\n", as_list=False).content(["a", "b"])
        'a\\nb'
        >>> TextParts(Server.sglang, " ", as_list=True).content(["a", "b"])
        [{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}]
        >>> TextParts(Server.llama_cpp, "\\n", as_list=False).content(["", "a", "", "b"])
        'a\\n\\nb'
        """
        if self.as_list:
            return [{"type": "text", "text": t} for t in texts]
        if self.server is Server.llama_cpp:
            # a newline goes before a part once there is text (common_chat_msg's
            # to_json_oaicompat): the empty parts before the first text add none
            texts = list(dropwhile(lambda t: not t, texts))
        return self.sep.join(texts)


#: the rule of a template that takes strings, on vLLM (the default before a template is known)
VLLM_STRINGS = TextParts(Server.vllm, _SEPARATOR[Server.vllm], as_list=False)


def text_parts(
    server: Server | str,
    template: str,
    sglang: Version = SGLANG_NEWEST,
    caps: LlamaCaps | None = None,
) -> TextParts:
    """The rule ``server`` applies to messages of several text parts for this chat template
    (``sglang``: the SGLang version, which joins a tool message's parts with a space from 0.5.11
    on, whatever the template's format; ``caps``: llama.cpp's findings for the template,
    :mod:`~treeprep.render.llama_caps`, without which llama.cpp is taken to join, and by which
    it changes the messages besides their parts).

    >>> text_parts("sglang", "{{ messages[0].content }}")
    TextParts(server='sglang', sep=' ', as_list=False, wrap=False, harmony=False, tool_sep=' ',
    caps=None)
    """
    server = Server.of(server, "server")
    if server is Server.vllm and all(tag in template for tag in _HARMONY_TAGS):
        return TextParts(server, "", as_list=False, harmony=True)  # openai_harmony renders
    if server is Server.llama_cpp:
        strings = caps is None or caps.string_content
        typed = caps is not None and caps.typed_content
        as_list = not (strings and not typed)  # only strings: joined; else as the request says
        wrap = typed and not strings
        return TextParts(server, _SEPARATOR[server], as_list, wrap, caps=caps)
    as_list = content_format(server, template) == "openai"
    if server is Server.sglang:
        tool_sep = _SEPARATOR[server] if sglang >= _SGLANG_TOOL_JOIN else None
        return TextParts(server, _SEPARATOR[server], as_list, tool_sep=tool_sep)
    return TextParts(server, _SEPARATOR[server], as_list, as_list)


def template_parts(
    server: Server | str, template: ChatTemplate, sglang: Version = SGLANG_NEWEST
) -> TextParts:
    """:func:`text_parts` for a compiled chat template, probed as llama.cpp probes it
    (:func:`~treeprep.render.llama_caps.llama_caps`) where ``server`` is llama.cpp."""
    server = Server.of(server, "server")
    caps = llama_caps(template) if server is Server.llama_cpp else None
    return text_parts(server, template.source, sglang, caps)


#: the prefix of :func:`flattened_kind`'s kinds
TEXT_PARTS = "text-parts:"


def flattened_kind(server: Server) -> str:
    """The normalized kind the build counts a call by whose prompt had a message of several text
    parts, for ``server``.

    >>> flattened_kind(Server.vllm)
    'text-parts:vllm'
    """
    return f"{TEXT_PARTS}{server}"


@lru_cache(maxsize=16)
def content_format(server: Server, template: str) -> str:
    """``"openai"`` when ``server`` (vLLM or SGLang, which look at the template's source) hands
    this template a message's parts as a list, else ``"string"`` (the parts joined).

    >>> loop = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}"
    >>> content_format(Server.vllm, loop), content_format(Server.vllm, "{{ messages }}")
    ('openai', 'string')
    """
    if server is Server.sglang and any(w in template for w in _SGLANG_MEDIA_WORDS):
        return "openai"
    ast = template_ast(template)
    if ast is None:
        return "string"
    loops = list(ast.find_all(jinja2.nodes.For))
    if server is Server.sglang:
        found = any(_reads(f.iter, n, "content") for f in loops for n in _SGLANG_MESSAGE_NAMES)
    else:
        found = _vllm_loops_over_content(ast, loops)
    return "openai" if found else "string"


def _vllm_loops_over_content(ast: jinja2.nodes.Template, loops: list[jinja2.nodes.For]) -> bool:
    """vLLM's test: a loop over a message's content, or over a name ``content``."""
    lists = _aliases(ast, "messages")
    message_names = {
        f.target.name
        for f in loops
        if isinstance(f.target, jinja2.nodes.Name) and any(_reads(f.iter, n) for n in lists)
    }
    return any(
        (isinstance(f.iter, jinja2.nodes.Name) and f.iter.name == "content")
        or any(_reads(f.iter, n, "content") for n in message_names)
        for f in loops
    )


def _aliases(ast: jinja2.nodes.Template, name: str) -> set[str]:
    """``name`` and the names assigned from it (``{% set msgs = messages[1:] %}``), transitively."""
    names, grew = {name}, True
    assigns = [
        a for a in ast.find_all(jinja2.nodes.Assign) if isinstance(a.target, jinja2.nodes.Name)
    ]
    while grew:
        grew = False
        for a in assigns:
            target = a.target.name  # type: ignore[attr-defined]
            if target not in names and any(_reads(a.node, n) for n in names):
                names.add(target)
                grew = True
    return names


def _reads(node: Any, name: str, key: str | None = None) -> bool:
    """Whether ``node`` is the variable ``name`` (or its item ``key``: ``name.key`` or
    ``name['key']``), seen through filters, tests and slices."""
    while True:
        if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
            node = node.node
        elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
            node = node.node
        else:
            break
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.name == name
    if isinstance(node, jinja2.nodes.Getattr):
        return _reads_name(node.node, name) and node.attr == key
    if isinstance(node, jinja2.nodes.Getitem):
        arg = node.arg
        return (
            _reads_name(node.node, name)
            and isinstance(arg, jinja2.nodes.Const)
            and arg.value == key
        )
    return False


def _reads_name(node: Any, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.name == name
