"""The built-in byte-level tokenizer: what ``treeprep build`` uses when no ``--tokenizer`` is given.

It exists so that the bundled sample data builds, and the whole pipeline is testable, with nothing
downloaded. It is deliberately trivial and fully reversible:

- ids ``0..255`` are the 256 byte values (id == byte), so any UTF-8 text round-trips exactly and a
  token id can be read off a hex dump;
- ids from 256 on are added tokens: the ChatML control tokens (``<|endoftext|>``, ``<|im_start|>``,
  ``<|im_end|>``, special) and the markup tokens a tool-calling template writes (``<tool_call>``,
  ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``, added but
  not special, exactly as in the Qwen tokenizers). None strips whitespace or is normalized, so text
  between them tokenizes independently (the renderer's segment cache relies on that, and checks it).

It is built in code with ``tokenizers`` (a BPE model over the byte-level alphabet with no merges,
a byte-level pre-tokenizer without the GPT-2 split regex, a byte-level decoder) and rendered with
its ChatML chat template by the same jinja path as a Hugging Face tokenizer folder
(:mod:`treeprep.render.template`). Construction takes a few milliseconds. The tests wrap it in
transformers' ``PreTrainedTokenizerFast`` (:func:`load_builtin`) as the reference.

The chat template renders a system prompt, the tool schemas (one JSON object per line inside
``<tools>``), tool calls (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, parallel calls
one after another), tool results (a ``tool`` turn wrapping ``<tool_response>``) and reasoning
(``<think>...</think>`` before the content). Unlike Qwen3 it never drops reasoning from history,
so a conversation rendered with it is prefix-stable: call k's sequence is a token prefix of call
k+1's.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from treeprep.schemas.tokenizer import BUILTIN_NAME

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: the name its manifests record (defined with the tokenizer identity, which the trainer reads)
NAME = BUILTIN_NAME
#: bump when the vocabulary or the template changes (it is part of the identity hash)
VERSION = 1

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
#: the named special tokens a template sees (as transformers passes them)
SPECIAL_TOKENS_MAP: dict[str, str] = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
#: 256 byte tokens + the added tokens above
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)

CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call the functions below. Their JSON schemas:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nTo call one, write <tool_call>\\n' }}
    {{- '{\"name\": <name>, \"arguments\": <json>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if message.reasoning_content %}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
        {%- endif %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if message.content or not loop.first %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>tool\\n<tool_response>\\n' + message.content }}
        {{- '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def builtin_sha256() -> str:
    """Identity hash of the built-in tokenizer: its vocabulary layout and its template."""
    spec = {
        "name": NAME,
        "version": VERSION,
        "bytes": 256,
        "special": list(SPECIAL_TOKENS),
        "markup": list(MARKUP_TOKENS),
        "chat_template": CHAT_TEMPLATE,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def build_backend():
    """The ``tokenizers.Tokenizer``: 256 byte tokens (id == byte value) plus the added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins of GPT-2's byte-level scheme
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    flags = {"lstrip": False, "rstrip": False, "single_word": False, "normalized": False}
    tok.add_special_tokens([AddedToken(t, special=True, **flags) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, **flags) for t in MARKUP_TOKENS])
    return tok


def load_builtin() -> PreTrainedTokenizerFast:
    """The built-in tokenizer wrapped for transformers, the reference the tests compare the
    renderer with (``apply_chat_template`` works on it); rendering itself never loads it."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_backend(),
        chat_template=CHAT_TEMPLATE,
        **SPECIAL_TOKENS_MAP,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
