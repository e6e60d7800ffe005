"""The piece cache: encode rendered text like the tokenizer does, tokenizing unique text once.

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
(:mod:`treeprep.render.native`) costing a few microseconds per message instead of jinja's tens.

The cut follows the ``tokenizers`` rules: only added tokens with ``normalized=False`` are cut (the
others are matched after normalization, inside the piece, by the backend itself), matches are
leftmost-longest, ``single_word`` matches that touch a word are skipped, ``lstrip``/``rstrip``
tokens absorb the whitespace beside them, and special tokens are not cut when the tokenizer encodes
them as text (``split_special_tokens``). Because a pre-tokenizer could still look at a piece's
position in the whole text (Metaspace's ``prepend_scheme="first"``), :meth:`Renderer.load` checks
the cut on probe texts and falls back to whole-text encoding (exact, just slower) if they disagree.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: default size of the piece cache (characters of cached text; ids cost 4 bytes per token on top)
DEFAULT_CACHE_CHARS = 16 << 20

_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _is_word_char(c: str) -> bool:
    r"""The Rust regex crate's \w: Alphabetic, marks, decimal numbers, connector punctuation. A
    character Python's Unicode tables do not assign (``Cn``) may be assigned in the tokenizer's
    newer tables (U+13440 is a mark since Unicode 15), so it cannot be classified here: the split
    is refused and the backend encodes the whole text."""
    import unicodedata

    cat = unicodedata.category(c)
    if cat == "Cn":
        raise _SplitUnsafe
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
        #: the last text :meth:`_encode_simple` encoded (None: no cut to reuse); its ids and cut
        #: (the character and id end of each added token) live in growable buffers
        self._prev: str | None = None
        self._ids: np.ndarray
        self._shared: int
        self._cut_chars: np.ndarray
        self._cut_ids: np.ndarray
        self._n_cuts: int
        self._reset_cut()
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
        if self._prev is not None:
            limit = _common_prefix(text, self._prev) - self._max_token_len
            if limit > 0:
                cut_chars = self._cut_chars[: self._n_cuts]
                keep = int(np.searchsorted(cut_chars, limit, side="right"))  # tokens kept
                if keep:
                    start = int(cut_chars[keep - 1])
                    n_ids = int(self._cut_ids[keep - 1])
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
        n = self._keep_cut(text, start, keep, n_ids, pieces, arrs)
        ids = self._ids[:n]  # a view: later calls never write the ids it shows (_place_ids)
        ids.flags.writeable = False
        return ids

    def _keep_cut(
        self,
        text: str,
        start: int,
        keep: int,
        n_ids: int,
        pieces: list[str],
        arrs: list[np.ndarray],
    ) -> int:
        """Make ``text`` the previous text: its ids after the kept ``n_ids`` placed in the ids
        buffer (:meth:`_place_ids`), its cut after the ``keep`` kept tokens written in place;
        returns its number of ids.

        The ids and cut live in growable buffers (capacity doubling) rather than fresh arrays:
        building each call's whole-history arrays anew cost O(whole text) of freshly faulted
        memory per call (a line profile of a 1600-turn build: 460 us of a call's ids
        concatenate), where writing the new pieces in place costs O(new text). The cut keeps only
        what the reuse needs: the character end and the id end of each added token (the odd
        pieces), contiguous so that :func:`numpy.searchsorted` needs no strided copy."""
        self._prev = None  # the buffers are inconsistent until the end (an exception: no reuse)
        id_ends = np.cumsum(np.fromiter(map(len, arrs), dtype=np.int64, count=len(arrs)))
        n = self._place_ids(n_ids, np.concatenate(arrs))
        m = len(pieces) // 2  # the added tokens of the new text
        self._cut_chars = _reserve(self._cut_chars, keep, keep + m)
        self._cut_ids = _reserve(self._cut_ids, keep, keep + m)
        ends = np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)))
        np.add(ends[1::2], start, out=self._cut_chars[keep : keep + m])
        np.add(id_ends[1::2], n_ids, out=self._cut_ids[keep : keep + m])
        self._n_cuts = keep + m
        self._prev = text
        return n

    def _place_ids(self, n_ids: int, new: np.ndarray) -> int:
        """Put ``new`` after the kept ``n_ids`` ids of the buffer; returns the ids' length.

        The arrays returned are views of the buffer, and callers keep them (a Sequence's tokens),
        so ``buffer[:_shared]`` never changes. A returned copy instead would cost a fresh
        allocation of the whole history per call, as slow as the concatenate it replaces (a
        1600-turn Pi build: 1.1 ms per copy against 0.6 ms). The next texts of a session usually
        agree with what was returned there (the prompt's ids are a prefix of the full
        sequence's, the previous turn's too, and the next full sequence extends both): such ids
        are compared, not written. Only a text that disagrees with a returned array starts a new
        buffer (one copy of the kept ids); the old one lives on in the arrays that show it (an
        array pins at most twice the ids of the longest text its buffer held, where copies would
        hold each text's ids once per array)."""
        n = n_ids + len(new)
        w = max(n_ids, min(n, self._shared))  # ids [n_ids, w) are shared: compare, not write
        if w > n_ids and not np.array_equal(self._ids[n_ids:w], new[: w - n_ids]):
            buf = np.empty(max(2 * n, 1024), dtype=np.int32)
            buf[:n_ids] = self._ids[:n_ids]
            self._ids, self._shared, w = buf, 0, n_ids
        grown = _reserve(self._ids, w, n)
        if grown is not self._ids:
            self._ids, self._shared = grown, 0
        self._ids[w:n] = new[w - n_ids :]
        self._shared = max(self._shared, n)
        return n

    def _reset_cut(self) -> None:
        self._prev = None
        self._ids = np.empty(1024, dtype=np.int32)
        self._shared = 0  # ids [0, _shared) of the buffer are in arrays already returned
        self._cut_chars = np.empty(64, dtype=np.int64)
        self._cut_ids = np.empty(64, dtype=np.int64)
        self._n_cuts = 0

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
        self._reset_cut()
        self._cached_chars = 0
        self.hits = self.misses = self.chars_encoded = 0


class _SplitUnsafe(Exception):
    pass


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_IDS.flags.writeable = False


def _reserve(buf: np.ndarray, keep: int, size: int) -> np.ndarray:
    """``buf`` if it holds ``size`` items, else a buffer of at least double its capacity that
    starts with ``buf[:keep]`` (doubling: texts growing by small steps reallocate O(log) times)."""
    if size <= len(buf):
        return buf
    out = np.empty(max(size, 2 * len(buf)), dtype=buf.dtype)
    out[:keep] = buf[:keep]
    return out


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


def probe_texts(added: Iterable[str]) -> list[str]:
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
