"""Rendering: a canonical record (chat call or token rollout) becomes a token :class:`Sequence`.

Contract (exactness first)
--------------------------
For a :class:`~treeprep.schemas.ChatCall` the messages are normalized (text parts joined into one
string, ``content: null`` made ``""``, tool-call arguments kept exactly as logged,
``reasoning_content`` passed through, unset fields dropped), and then

- ``tokens == tokenizer.apply_chat_template(messages + [completion], tools=tools, tokenize=True)``,
- the loss span is exactly the tokens after
  ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``; where that prompt is
  not a token prefix of the full sequence the call is rejected (:class:`RenderError`) with that
  reason.

The renderer never invents, strips or "fixes" text: what the template does to earlier reasoning
(Qwen3 keeps it only after the last user query) is what ends up in the tokens. It only *notices* it:
when the record has no ``branch_reason`` and the previous turn of the same conversation (the
history up to its last assistant message, rendered as that call's own training sequence) is not a
token prefix of this call, the template rewrote history (dropped reasoning, or rendered the last
completion differently in history, like Qwen3's empty ``<think>\\n\\n</think>\\n\\n`` block), and
the sequence gets ``branch_reason = "reasoning-dropped"`` so the trie can say why it branches there.

A :class:`~treeprep.schemas.TokenRollout` is taken as is: prompt ids + generation ids, the loss
span over the generation, the sampler's log-probs passed through. Ids outside the vocabulary are
rejected.

Why it is fast: tokenize unique text once
-----------------------------------------
An agent session re-sends its whole history with every call, so naive per-call tokenization costs
``tokens_linear`` (quadratic in the session length). Here the template is rendered to text
(``tokenize=False``) and the text is cut at the tokenizer's added tokens (``<|im_start|>``,
``<tool_call>``, ``<think>``...). Hugging Face ``tokenizers`` itself does exactly this cut first and
then normalizes, pre-tokenizes and BPE-encodes every piece between added tokens independently, so
encoding each piece on its own and concatenating gives the same ids as encoding the whole text. The
ids of each piece are kept in a bounded cache keyed by the piece's string (oldest pieces evicted
first): a message that recurs in every later call is BPE-encoded once. What remains per call is
linear, C-speed work (one regex split, a set difference, dictionary look-ups and a
``numpy.concatenate``) plus the template render, which for known templates is a native Python port
(:mod:`treeprep.native_templates`) costing a few microseconds per message instead of jinja's tens.

The cut follows the ``tokenizers`` rules: only added tokens with ``normalized=False`` are cut (the
others are matched after normalization, inside the piece, by the backend itself), matches are
leftmost-longest, ``single_word`` matches that touch a word are skipped, ``lstrip``/``rstrip``
tokens absorb the whitespace beside them, and special tokens are not cut when the tokenizer encodes
them as text (``split_special_tokens``). Because a pre-tokenizer could still look at a piece's
position in the whole text (Metaspace's ``prepend_scheme="first"``), :meth:`Renderer.load` checks
the cut on probe texts and falls back to whole-text encoding (exact, just slower) if they disagree.

Trade-offs: the template is still rendered once per call and once more for the generation prompt,
so that cost grows with the context, not with unique text. With a native port
(:mod:`treeprep.native_templates`, used only after it matched ``apply_chat_template`` on probe
conversations, and compared with jinja on the first 16 renders and every 64th after, which costs
about half of the port's own time) that is about a microsecond per message, and the third render
needed by the branch hint (the previous turn) is simply done again. With jinja it is tens of
microseconds per message, and the third render is skipped when the previous call's sequence is
still in a small cache keyed by a hash of its messages, the common case when a session's calls are
read in order.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from collections.abc import Sequence as _Seq
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from treeprep.errors import TreeprepError
from treeprep.native_templates import FALLBACK_ERRORS, find_port
from treeprep.schemas import ChatCall, Message, TokenizerIdentity, TokenRollout
from treeprep.sequence import Sequence

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CachedEncoder",
    "NativeTemplateMismatch",
    "RenderError",
    "Renderer",
    "TokenizerError",
    "normalize_message",
]

#: files whose bytes make up a tokenizer's identity (those present in the folder)
TOKENIZER_FILES: tuple[str, ...] = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
)
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
#: default size of the piece cache (characters of cached text; ids cost 4 bytes per token on top)
DEFAULT_CACHE_CHARS = 16 << 20
#: the native port's renders compared with the jinja template: the first ones, then every n-th
CHECK_FIRST = 16
CHECK_EVERY = 64
_TEMPLATE_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
)


class RenderError(TreeprepError):
    """A call that cannot be rendered into a training sequence; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TokenizerError(TreeprepError):
    """A tokenizer folder that cannot be loaded (missing files, no chat template)."""


class NativeTemplateMismatch(TreeprepError):
    """A native template port rendered a record differently from the jinja template: a bug in the
    port (:mod:`treeprep.native_templates`), never a bad record, so the build stops."""


# --------------------------------------------------------------------------------------------------
# The cached encoder
# --------------------------------------------------------------------------------------------------

# Unicode White_Space (what the Rust regex crate's \s matches), for lstrip/rstrip added tokens.
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _is_word_char(c: str) -> bool:
    # The Rust regex crate's \w: Alphabetic, marks, decimal numbers, connector punctuation.
    import unicodedata

    cat = unicodedata.category(c)
    return c.isalpha() or cat[0] == "M" or cat in ("Nd", "Pc", "Nl")


@dataclass(frozen=True, slots=True)
class _Added:
    content: str
    id: int
    special: bool
    lstrip: bool
    rstrip: bool
    single_word: bool


class CachedEncoder:
    """Encodes text like ``backend.encode(text, add_special_tokens=False)``, reusing the ids of
    pieces it has seen (see the module docstring).

    ``max_chars`` bounds the cache (characters of cached text); pieces longer than a quarter of it
    are encoded but not kept. ``hits``, ``misses`` and ``chars_encoded`` count the work done.
    """

    def __init__(self, backend: Tokenizer, *, max_chars: int = DEFAULT_CACHE_CHARS) -> None:
        self.backend = backend
        self.max_chars = max_chars
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cached_chars = 0
        self.hits = 0
        self.misses = 0
        self.chars_encoded = 0
        split_special = bool(backend.encode_special_tokens)
        added = []
        for tid, tok in backend.get_added_tokens_decoder().items():
            if tok.normalized or not tok.content:
                continue  # matched by the backend inside a piece, after normalization
            added.append(
                _Added(tok.content, int(tid), tok.special, tok.lstrip, tok.rstrip, tok.single_word)
            )
        self._by_content = {a.content: a for a in added}
        # With split_special_tokens the backend still finds special tokens (so they shadow
        # overlapping matches) but encodes them as text: such a match is not a cut.
        self._skip = frozenset(a.content for a in added if a.special and split_special)
        self._simple = not self._skip and not any(
            a.lstrip or a.rstrip or a.single_word for a in added
        )
        self._token_ids = {
            a.content: np.array([a.id], dtype=np.int32)
            for a in added
            if a.content not in self._skip
        }
        # the fast path's one dictionary: the added tokens and every cached piece (in the simple
        # cut a text piece never equals a token, so they cannot collide)
        self._lookup: dict[str, np.ndarray] = {**self._token_ids, "": _EMPTY_IDS}
        self._max_token_len = max((len(a.content) for a in added), default=0)
        #: the last text :meth:`_encode_simple` encoded: (text, piece char ends, piece token
        #: ends, ids)
        self._prev: tuple[str, np.ndarray, np.ndarray, np.ndarray] | None = None
        if added:
            # Python's leftmost-first alternation with longer strings first is leftmost-longest.
            alts = sorted((a.content for a in added), key=lambda s: (-len(s), s))
            self._pattern: re.Pattern[str] | None = re.compile(
                "(" + "|".join(re.escape(s) for s in alts) + ")"
            )
        else:
            self._pattern = None
        #: False when the probe showed that pieces do not tokenize independently
        self.split_ok = True

    # -- the cut ---------------------------------------------------------------------------------

    def split(self, text: str) -> list[str]:
        """Alternating pieces: ``[text, token, text, token, ..., text]`` (odd items are added
        tokens, even items the text between them, possibly empty)."""
        if self._pattern is None:
            return [text]
        if self._simple:
            return self._pattern.split(text)
        return self._split_general(text)

    def _split_general(self, text: str) -> list[str]:
        assert self._pattern is not None
        out: list[str] = []
        start_offset = 0
        n = len(text)
        for m in self._pattern.finditer(text):
            start, stop = m.start(), m.end()
            tok = self._by_content[m.group(0)]
            if tok.content in self._skip:
                continue
            if tok.single_word:
                start_space = start == 0 or not _is_word_char(text[start - 1])
                stop_space = stop == n or not _is_word_char(text[stop])
                if not (start_space and stop_space):
                    continue
            if start < start_offset:
                raise _SplitUnsafe  # overlaps the previous token's rstrip: let the backend decide
            if tok.lstrip:
                new_start = start
                while new_start > 0 and text[new_start - 1] in _WHITE_SPACE:
                    new_start -= 1
                start = max(new_start, start_offset)
            if tok.rstrip:
                while stop < n and text[stop] in _WHITE_SPACE:
                    stop += 1
            out.append(text[start_offset:start])
            # the token's piece may carry absorbed whitespace: store it under its exact text
            out.append(text[start:stop])
            self._token_ids.setdefault(text[start:stop], np.array([tok.id], dtype=np.int32))
            start_offset = stop
        out.append(text[start_offset:])
        return out

    # -- encoding --------------------------------------------------------------------------------

    def encode_whole(self, text: str) -> np.ndarray:
        """The reference: the backend on the whole text (no cache)."""
        self.chars_encoded += len(text)
        return np.asarray(
            self.backend.encode(text, add_special_tokens=False).ids, dtype=np.int32
        ).reshape(-1)

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` (int32), equal to :meth:`encode_whole`, reusing cached pieces."""
        if not self.split_ok:
            return self.encode_whole(text)
        if self._simple:
            return self._encode_simple(text)
        try:
            pieces = self.split(text)
        except _SplitUnsafe:
            return self.encode_whole(text)
        cache = self._cache
        missing = {p: None for p in pieces[::2] if p and p not in cache}
        fresh = self._encode_missing(list(missing)) if missing else {}
        token_ids = self._token_ids
        parts: list[np.ndarray] = []
        for i, p in enumerate(pieces):
            if i & 1:
                parts.append(token_ids[p])
            elif p:
                ids = fresh.get(p)
                if ids is None:
                    ids = cache[p]
                    cache.move_to_end(p)
                    self.hits += 1
                parts.append(ids)
        self._evict()  # only now: a piece this text hit must not be evicted before it is gathered
        if not parts:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def _encode_simple(self, text: str) -> np.ndarray:
        """:meth:`encode` for the simple cut (no lstrip/rstrip/single_word/skipped tokens).

        Two things make it cheap. The per-piece work is in C: one set difference finds the new
        pieces, one list comprehension over a single dictionary gathers the ids (hits are not moved
        to the end of the eviction order: the cache evicts the oldest pieces, and a popular piece
        evicted that way is encoded again once). And the previous text's cut is reused: agent
        calls arrive as (full, prompt, next full, ...), each sharing almost all of its text with
        the one before, so only the text after the shared prefix is split and looked up. The cut
        is reused up to the end of an added token that ends at least the longest added token's
        length before the shared prefix ends: every match decision before that point looked only
        at shared characters, so splitting the whole text would cut there too.
        """
        assert self._pattern is not None
        start = keep = n_ids = 0
        prev = self._prev
        if prev is not None:
            p_text, p_ends, p_toks, p_ids = prev
            limit = _common_prefix(text, p_text) - self._max_token_len
            if limit > 0:
                j = int(np.searchsorted(p_ends[1::2], limit, side="right")) - 1
                if j >= 0:  # keep pieces 0 .. 2j+1 (the (j+1)-th token ends the kept prefix)
                    keep = 2 * j + 2
                    start = int(p_ends[keep - 1])
                    n_ids = int(p_toks[keep - 1])
        pieces = self._pattern.split(text[start:] if start else text)
        lookup = self._lookup
        new = set(pieces).difference(lookup)
        transient: list[str] = []
        if new:
            order = [q for q in dict.fromkeys(pieces) if q in new]  # deterministic order
            fresh = self._encode_missing(order)
            for q in order:
                if q not in lookup:  # too long to keep: only for this text
                    lookup[q] = fresh[q]
                    transient.append(q)
        self.hits += (len(pieces) + 1) // 2 - pieces[::2].count("") - len(new)
        arrs = [lookup[q] for q in pieces]
        for q in transient:
            del lookup[q]
        self._evict()  # only now: a piece this text hit must not be evicted before it is gathered
        # bookkeeping for the next text: cumulative character and token ends of every piece
        ends = np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)))
        toks = np.cumsum(np.fromiter(map(len, arrs), dtype=np.int64, count=len(arrs)))
        if keep:
            assert prev is not None
            ends = np.concatenate([prev[1][:keep], ends + start])
            toks = np.concatenate([prev[2][:keep], toks + n_ids])
            ids = np.concatenate([prev[3][:n_ids], *arrs])
        else:
            ids = np.concatenate(arrs)
        ids.flags.writeable = False  # kept for the next call: callers get a read-only array
        self._prev = (text, ends, toks, ids)
        return ids

    def _encode_missing(self, texts: list[str]) -> dict[str, np.ndarray]:
        encs = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        self.misses += len(texts)
        keep_max = self.max_chars // 4
        fresh: dict[str, np.ndarray] = {}
        for t, e in zip(texts, encs, strict=True):
            ids = np.asarray(e.ids, dtype=np.int32).reshape(-1)
            fresh[t] = ids
            self.chars_encoded += len(t)
            if len(t) <= keep_max:
                self._cache[t] = ids
                self._lookup[t] = ids
                self._cached_chars += len(t)
        return fresh

    def _evict(self) -> None:
        """Drop the oldest pieces until the cache holds at most ``max_chars`` characters."""
        while self._cached_chars > self.max_chars and self._cache:
            old, _ = self._cache.popitem(last=False)
            del self._lookup[old]
            self._cached_chars -= len(old)

    def probe(self, texts: Iterable[str]) -> bool:
        """Check that the cut path equals whole-text encoding on ``texts``; if not, switch the cut
        off (every later :meth:`encode` encodes whole). Returns whether the cut is used."""
        for t in texts:
            if not np.array_equal(self.encode(t), self.encode_whole(t)):
                self.split_ok = False
                break
        self.clear()
        return self.split_ok

    def clear(self) -> None:
        self._cache.clear()
        self._lookup = {**self._token_ids, "": _EMPTY_IDS}
        self._prev = None
        self._cached_chars = 0
        self.hits = self.misses = self.chars_encoded = 0


class _SplitUnsafe(Exception):
    pass


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_IDS.flags.writeable = False


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, with C-speed comparisons (a
    bisection whose compared slices halve each step: O(n) characters copied in all)."""
    if len(b) <= len(a) and a.startswith(b):
        return len(b)
    if len(a) < len(b) and b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; they differ before hi
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def _probe_texts(added: Iterable[str]) -> list[str]:
    """Texts that would expose a tokenizer whose pieces do not encode independently."""
    toks = sorted(added)
    body = [
        "Hello world",
        " leading space",
        "\n\nnew lines\n",
        "x",
        "  two  spaces ",
        "Ünïcödé 混合 text 🙂",
        "123 456",
        "'s it's",
    ]
    out = []
    for i, t in enumerate(toks[:64]):
        a, b = body[i % len(body)], body[(i + 3) % len(body)]
        out.append(f"{a}{t}{b}{t}{t}{a}")
        out.append(f"{t}{b}")
    out.append("".join(toks[:64]) + " tail")
    out.append(" ".join(body))
    return out


def _probe_conversations() -> list[tuple[list[dict], list[dict] | None]]:
    """Conversations that exercise a template: system, tools, parallel calls, reasoning, results."""
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run <b>it</b> é",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    conv: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "run", "arguments": "{}"}},
                {"id": "2", "type": "function", "function": {"name": "run", "arguments": {"a": 1}}},
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "ok"},
        {"role": "tool", "tool_call_id": "2", "name": "run", "content": "ok"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "fine"},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Sure."},
    ]
    # the corners a template port must get right: reasoning inside the content, a wrapped tool
    # response as a user turn (Qwen3's last-query search), a later system turn, no system at all,
    # consecutive tool results at the end, content with leading/trailing newlines, an assistant
    # turn with tool calls and text, and a turn that is neither reasoning nor text
    corners: list[dict[str, Any]] = [
        {"role": "user", "content": "  Hi \n"},
        {"role": "assistant", "content": "<think>\n  a \n</think>\n\nOk\n"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
        {"role": "system", "content": "Later."},
        {
            "role": "assistant",
            "content": "\nCalling.",
            "tool_calls": [
                {"type": "function", "function": {"name": "run", "arguments": {"é": [1, 2.5]}}}
            ],
        },
        {"role": "tool", "content": "<think>r</think>"},
        {"role": "assistant", "content": "", "reasoning_content": ""},
        {"role": "user", "content": "ü 🙂"},
        {"role": "assistant", "content": "x</think>y", "reasoning_content": "\nr\n"},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    return [
        (conv, tools),
        (conv, None),
        (conv[1:3], tools),
        (conv[1:2], None),
        (corners, tools),
        (corners, None),
        (corners[:2], None),
        (corners[:3], tools),
        (corners[:5], None),
    ]


# --------------------------------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------------------------------


def normalize_message(m: Message, where: str = "message") -> dict[str, Any]:
    """A message as the chat template sees it.

    Text parts are joined into one string (nothing between them), ``None`` content becomes ``""``,
    tool-call arguments are kept exactly as logged (a JSON string or an object),
    ``reasoning_content``, ``tool_call_id`` and ``name`` pass through when set. A non-text part (an
    image) cannot be rendered by a text-only template: :class:`RenderError`.
    """
    if m.content is None:
        content = ""
    elif isinstance(m.content, str):
        content = m.content
    else:
        texts = []
        for j, p in enumerate(m.content):
            if p.type not in TEXT_PART_TYPES:
                raise RenderError(
                    f"{where} content part {j} has type {p.type!r}; only text parts can be rendered"
                )
            texts.append(p.text or "")
        content = "".join(texts)
    d: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:
        d["tool_calls"] = [
            {
                **({"id": tc.id} if tc.id is not None else {}),
                "type": tc.type,
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    if m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
    return d


# --------------------------------------------------------------------------------------------------
# The renderer
# --------------------------------------------------------------------------------------------------


class Renderer:
    """Turns records into token sequences with one tokenizer and its chat template.

    Build it with :meth:`load`. It keeps per-process caches (the piece cache, the last few rendered
    calls), so use one per worker process.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        identity: TokenizerIdentity,
        *,
        cache_chars: int = DEFAULT_CACHE_CHARS,
        probe: bool = True,
        native_templates: bool = True,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(
                f"{identity.name}: not a fast tokenizer (tokenizer.json is needed for rendering)"
            )
        self.tokenizer = tokenizer
        self.identity = identity
        self.vocab_size = identity.vocab_size
        # apply_chat_template(tokenize=True) sets this on the backend before encoding; so do we.
        backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.encoder = CachedEncoder(backend, max_chars=cache_chars)
        if probe:
            self.encoder.probe(_probe_texts(self.encoder._by_content))
        # recent full renders: fingerprint of (messages, tools) -> ids
        self._recent: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._recent_max = 8
        #: the name of the native template port in use (None: jinja renders every call)
        self.native_template: str | None = None
        self._native: Callable[[list[dict], list[dict] | None, bool], str] | None = None
        #: renders done by the port so far (the cross-check schedule counts them)
        self.native_renders = 0
        self._direct: Callable[[list[dict], list[dict] | None, bool], str] | None = None
        self._direct = self._make_direct()
        if native_templates:
            self._native = self._make_native()

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        tokenizer_dir: str | os.PathLike[str] | None,
        *,
        cache_chars: int = DEFAULT_CACHE_CHARS,
        native_templates: bool = True,
    ) -> Renderer:
        """A renderer for a Hugging Face tokenizer folder, or the built-in byte tokenizer (None).

        The folder needs ``tokenizer.json`` and a chat template (``chat_template`` in
        ``tokenizer_config.json`` or a ``chat_template.jinja``). Only local files are read.
        ``native_templates=False`` renders every call with jinja even when the template has a
        verified Python port (:mod:`treeprep.native_templates`).
        """
        tok: Any
        if tokenizer_dir is None:
            from treeprep import builtin_tokenizer as bt

            tok = bt.load_builtin()
            ident = TokenizerIdentity(
                name=bt.NAME,
                sha256=bt.builtin_sha256(),
                chat_template_sha256=_sha256_text(bt.CHAT_TEMPLATE),
                vocab_size=bt.VOCAB_SIZE,
                path=None,
            )
            return cls(tok, ident, cache_chars=cache_chars, native_templates=native_templates)

        folder = Path(tokenizer_dir)
        if not folder.is_dir():
            raise TokenizerError(f"{tokenizer_dir}: not a tokenizer folder (no such directory)")
        if not (folder / "tokenizer.json").is_file():
            raise TokenizerError(
                f"{tokenizer_dir}: expected a Hugging Face tokenizer folder with tokenizer.json"
            )
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TokenizerError(f"{tokenizer_dir}: cannot load the tokenizer: {e}") from e
        template = tok.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        if not isinstance(template, str) or not template:
            raise TokenizerError(
                f"{tokenizer_dir}: the tokenizer has no chat template (expected chat_template in "
                "tokenizer_config.json or a chat_template.jinja file)"
            )
        ident = TokenizerIdentity(
            name=folder.resolve().name,
            sha256=_folder_sha256(folder, template),
            chat_template_sha256=_sha256_text(template),
            vocab_size=len(tok),
            path=str(tokenizer_dir),
        )
        return cls(tok, ident, cache_chars=cache_chars, native_templates=native_templates)

    # -- text and ids ----------------------------------------------------------------------------

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = False,
        api: bool = False,
        where: str = "",
    ) -> str:
        """``apply_chat_template(messages, tools=tools, tokenize=False, ...)``; errors become
        :class:`RenderError`.

        Uses the verified native port when there is one (checked against the template on a
        deterministic sample of renders; :class:`NativeTemplateMismatch` names ``where``, the
        record's ``file:line``, if they differ), else the verified direct template call; ``api``
        forces the public ``apply_chat_template``.
        """
        if self._native is not None and not api:
            try:
                text = self._native(messages, tools, add_generation_prompt)
            except FALLBACK_ERRORS:
                pass  # outside the port's domain: the template decides (and names any error)
            else:
                k = self.native_renders
                self.native_renders = k + 1
                if k < CHECK_FIRST or k % CHECK_EVERY == 0:
                    self._check_native(text, messages, tools, add_generation_prompt, where)
                return text
        return self._render_jinja(messages, tools, add_generation_prompt, api=api)

    def _check_native(
        self,
        text: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        where: str,
    ) -> None:
        try:
            ref = self._render_jinja(messages, tools, add_generation_prompt)
        except RenderError as e:
            ref_err: str | None = e.reason
        else:
            if ref == text:
                return
            ref_err = None
        what = (
            f"the template fails ({ref_err})"
            if ref_err is not None
            else f"they differ at character {_first_char_difference(text, ref)}"
        )
        raise NativeTemplateMismatch(
            f"{where or 'a record'}: the native port {self.native_template!r} of the chat template "
            f"of tokenizer {self.identity.name!r} renders this record differently from the jinja "
            f"template (add_generation_prompt={add_generation_prompt}; {what}). This is a bug in "
            "treeprep.native_templates, not in the record; build with --no-native-templates "
            "(Renderer.load(..., native_templates=False)) to render with jinja only."
        )

    def _render_jinja(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        *,
        api: bool = False,
    ) -> str:
        from jinja2 import TemplateError

        try:
            if self._direct is not None and not api:
                return self._direct(messages, tools, add_generation_prompt)
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,  # type: ignore[arg-type]
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except (TemplateError, *_TEMPLATE_ERRORS) as e:  # type: ignore[misc]
            raise RenderError(f"the chat template failed: {type(e).__name__}: {e}") from e
        assert isinstance(text, str)
        return text

    def _make_direct(self) -> Callable[[list[dict], list[dict] | None, bool], str] | None:
        """The compiled template called directly, without ``apply_chat_template``'s per-call
        preprocessing (a deep copy of every message into plain data, which ours already are).

        It is what ``apply_chat_template`` does for one conversation of plain dicts: drop ``None``
        fields (ours have none), alias ``reasoning_content`` as ``thinking``, pass the special
        tokens map as template variables. It is used only if it renders the probe conversations
        exactly as ``apply_chat_template`` does; otherwise (another transformers version, a
        template dict) every render goes through the public API.
        """
        try:
            from transformers.utils.chat_template_utils import (
                _alias_reasoning_fields,
                _cached_compile_jinja_template,
            )
        except ImportError:
            return None
        template = self.tokenizer.chat_template
        if not isinstance(template, str):
            return None
        try:
            # a private copy (not the lru-cached one apply_chat_template uses), so that giving its
            # environment the fast attribute lookup below never touches the reference path
            compiled = _cached_compile_jinja_template(template)
            env = compiled.environment
            env.__class__ = _fast_sandbox_class(type(env))
        except Exception:  # any failure means: use the public API
            return None
        kwargs = dict(self.tokenizer.special_tokens_map)

        def direct(messages: list[dict], tools: list[dict] | None, gen: bool) -> str:
            return compiled.render(
                messages=_alias_reasoning_fields(messages),
                tools=tools,
                documents=None,
                add_generation_prompt=gen,
                **kwargs,
            )

        for msgs, tools in _probe_conversations():
            for gen in (False, True):
                try:
                    same = direct(msgs, tools, gen) == self.render_text(
                        msgs, tools, add_generation_prompt=gen, api=True
                    )
                except Exception:  # a template that fails here fails in the API too
                    same = False
                if not same:
                    return None
        return direct

    def _make_native(self) -> Callable[[list[dict], list[dict] | None, bool], str] | None:
        """The template's native port, if it has one that renders the probe conversations exactly
        like ``apply_chat_template``; otherwise None (jinja renders everything)."""
        template = self.tokenizer.chat_template
        if not isinstance(template, str):
            return None
        port = find_port(_sha256_text(template))
        if port is None:
            return None
        for msgs, tools in _probe_conversations():
            for gen in (False, True):
                try:
                    ref = self._render_jinja(msgs, tools, gen, api=True)
                except RenderError:
                    continue  # the template refuses it: the port falls back to it at run time
                try:
                    same = port.render(msgs, tools, gen) == ref
                except FALLBACK_ERRORS:
                    same = False
                if not same:
                    return None
        self.native_template = port.name
        return port.render

    def encode(self, text: str) -> np.ndarray:
        """Token ids of rendered text (int32), through the piece cache."""
        return self.encoder.encode(text)

    def decode(self, ids: _Seq[int] | np.ndarray) -> str:
        """Text of ``ids`` (special tokens kept), for previews."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    # -- records ---------------------------------------------------------------------------------

    def normalize(self, rec: ChatCall) -> tuple[list[dict], dict, list[dict] | None]:
        """(messages, completion, tools) as passed to the chat template."""
        msgs = [normalize_message(m, f"messages[{i}]") for i, m in enumerate(rec.messages)]
        comp = normalize_message(rec.completion, "completion")
        return msgs, comp, (rec.tools or None)

    def render(self, rec: ChatCall | TokenRollout, *, group_id: str, order: int = 0) -> Sequence:
        """One record as a :class:`Sequence`; :class:`RenderError` if it is unusable."""
        if isinstance(rec, TokenRollout):
            return self._render_rollout(rec, group_id=group_id, order=order)
        return self._render_chat(rec, group_id=group_id, order=order)

    def _render_rollout(self, rec: TokenRollout, *, group_id: str, order: int) -> Sequence:
        prompt = np.asarray(rec.prompt_token_ids, dtype=np.int64)
        gen = np.asarray(rec.generation_token_ids, dtype=np.int64)
        for name, arr in (("prompt_token_ids", prompt), ("generation_token_ids", gen)):
            if arr.size and int(arr.max()) >= self.vocab_size:
                pos = int(np.argmax(arr >= self.vocab_size))
                raise RenderError(
                    f"{name}[{pos}] = {int(arr[pos])} is outside the vocabulary of tokenizer "
                    f"{self.identity.name!r} ({self.vocab_size} ids); build with the tokenizer "
                    "that produced these ids (--tokenizer)"
                )
        tokens = np.concatenate([prompt, gen]).astype(np.int32)
        n_p, n = len(prompt), len(tokens)
        spans = [(n_p, n)] if n > n_p else []
        lp = rec.generation_log_probs
        return Sequence(
            group_id=group_id,
            tokens=tokens,
            loss_spans=spans,
            logprobs=None if lp is None else np.asarray(lp, dtype=np.float32),
            reward=rec.reward,
            advantage=rec.advantage,
            agent_id=rec.agent_id,
            call_id=rec.call_id,
            source=f"{rec.source_file}:{rec.source_line}",
            source_format=rec.source_format,
            branch_reason=rec.branch_reason,
            order=order,
        )

    def _render_chat(self, rec: ChatCall, *, group_id: str, order: int) -> Sequence:
        if not rec.messages:
            raise RenderError("the call has no prompt messages")
        msgs, comp, tools = self.normalize(rec)
        full_msgs = [*msgs, comp]
        where = f"{rec.source_file}:{rec.source_line}"
        full_ids = self.encode(self.render_text(full_msgs, tools, where=where))
        prompt_ids = self.encode(
            self.render_text(msgs, tools, add_generation_prompt=True, where=where)
        )
        n_p, n = len(prompt_ids), len(full_ids)
        if n_p > n or not np.array_equal(full_ids[:n_p], prompt_ids):
            raise RenderError(
                "the generation prompt apply_chat_template(messages, add_generation_prompt=True) "
                "is not a token prefix of apply_chat_template(messages + [completion]) "
                f"({_first_difference(prompt_ids, full_ids)})"
            )
        if n_p == n:
            raise RenderError("the completion renders to no tokens after the generation prompt")
        branch = rec.branch_reason
        if branch is None and self._history_rewritten(msgs, tools, full_ids, where):
            branch = "reasoning-dropped"
        if self._native is None:
            self._remember(self._fingerprint(full_msgs, tools), full_ids)
        return Sequence(
            group_id=group_id,
            tokens=full_ids,
            loss_spans=[(n_p, n)],
            logprobs=None,
            reward=rec.reward,
            advantage=rec.advantage,
            agent_id=rec.agent_id,
            call_id=rec.call_id,
            source=f"{rec.source_file}:{rec.source_line}",
            source_format=rec.source_format,
            branch_reason=branch,
            order=order,
        )

    # -- the branch hint -------------------------------------------------------------------------

    def _history_rewritten(
        self, msgs: list[dict], tools: list[dict] | None, full_ids: np.ndarray, where: str = ""
    ) -> bool:
        """Is the previous turn (history up to its last assistant message, rendered as that call's
        training sequence) not a token prefix of this call's sequence?

        With a native port the previous turn is simply rendered and encoded again (tens of
        microseconds: the encoder reuses the cut of the texts before it); with jinja, its ids are
        looked up among the last few calls' sequences by a hash of their messages first.
        """
        last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] == "assistant"), -1)
        if last < 0:
            return False
        prev_msgs = msgs[: last + 1]
        prev_ids = None
        if self._native is None:
            prev_ids = self._recent.get(self._fingerprint(prev_msgs, tools))
        if prev_ids is None:
            try:
                prev_ids = self.encode(self.render_text(prev_msgs, tools, where=where))
            except RenderError:
                return False  # the history alone does not render: no hint to give
        k = len(prev_ids)
        return k > len(full_ids) or not np.array_equal(full_ids[:k], prev_ids)

    @staticmethod
    def _fingerprint(msgs: list[dict], tools: list[dict] | None) -> bytes:
        blob = orjson.dumps([msgs, tools], option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(blob, digest_size=16).digest()

    def _remember(self, key: bytes, ids: np.ndarray) -> None:
        self._recent[key] = ids
        self._recent.move_to_end(key)
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)


_FAST_SANDBOXES: dict[type, type] = {}


def _fast_sandbox_class(base: type) -> type:
    """``base`` (transformers' immutable jinja sandbox) with a fast path for ``message.content``.

    Chat templates spend most of their time in the sandbox's attribute lookup, which for a plain
    ``dict`` first tries a Python attribute, checks it against the sandbox rules, then falls back to
    the item. For a ``dict`` whose key is not also a ``dict`` attribute name the result is always
    the item, a plain data value, so it is returned at once. A public ``str`` method other than
    ``format``/``format_map`` is what the sandbox would return too. Everything else (other types,
    private names, missing keys) goes through the sandbox unchanged.
    """
    cls = _FAST_SANDBOXES.get(base)
    if cls is not None:
        return cls
    dict_attrs = frozenset(dir(dict))
    # str methods the sandbox allows and returns as they are (it wraps format and format_map)
    str_attrs = frozenset(a for a in dir(str) if not a.startswith("_")) - {"format", "format_map"}

    def getattr_(self, obj, attribute):  # type: ignore[no-untyped-def]
        t = type(obj)
        if t is dict and attribute not in dict_attrs:
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        elif t is str and attribute in str_attrs:
            return getattr(obj, attribute)
        return base.getattr(self, obj, attribute)

    def getitem(self, obj, argument):  # type: ignore[no-untyped-def]
        if type(obj) is dict and type(argument) is str:
            try:
                return obj[argument]
            except KeyError:
                pass
        return base.getitem(self, obj, argument)

    cls = type(f"Fast{base.__name__}", (base,), {"getattr": getattr_, "getitem": getitem})
    _FAST_SANDBOXES[base] = cls
    return cls


def _first_char_difference(a: str, b: str) -> int:
    m = min(len(a), len(b))
    return next((i for i in range(m) if a[i] != b[i]), m)


def _first_difference(prompt: np.ndarray, full: np.ndarray) -> str:
    m = min(len(prompt), len(full))
    diff = np.nonzero(prompt[:m] != full[:m])[0]
    if len(diff):
        i = int(diff[0])
        return f"they differ at token {i}: {int(prompt[i])} vs {int(full[i])}"
    return f"the prompt has {len(prompt)} tokens, the full sequence {len(full)}"


def _sha256_text(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def _folder_sha256(folder: Path, template: str) -> str:
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = folder / name
        if p.is_file():
            data = p.read_bytes()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
    h.update(b"chat_template\0")
    h.update(template.encode("utf-8"))
    return h.hexdigest()
