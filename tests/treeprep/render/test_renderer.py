"""The renderer with the built-in byte tokenizer and hand-built tokenizers (no shared data needed).

Exactness against transformers' ``apply_chat_template``, the cached piece path against whole-text
encoding, loss spans, rejects, the built-in tokenizer's round trip and its template.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_reference import hf_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.errors import RenderError, TokenizerError, TreeprepError
from treeprep.render import CachedEncoder, Renderer
from treeprep.render import builtin as bt
from treeprep.render.template import ChatTemplate
from treeprep.schemas import ChatCall, TokenizerIdentity, TokenRollout

ADDED = list(bt.SPECIAL_TOKENS + bt.MARKUP_TOKENS)


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer.load(None)


def _ref_ids(r: Renderer, msgs, tools=None, **kw) -> list[int]:
    return list(
        hf_tokenizer(r).apply_chat_template(
            msgs, tools=tools, tokenize=True, return_dict=False, **kw
        )
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def _call(messages, completion, **kw) -> ChatCall:
    kw.setdefault("call_id", "c1")
    kw.setdefault("source_file", "f.jsonl")
    kw.setdefault("source_line", 7)
    return ChatCall(messages=messages, completion=completion, **kw)


# ------------------------------------------------------------------------------------------------
# the built-in tokenizer
# ------------------------------------------------------------------------------------------------


def test_builtin_ids_are_bytes_and_added_tokens(r: Renderer) -> None:
    assert list(r.encode("Aé\n")) == [65, 0xC3, 0xA9, 10]
    assert list(r.encode("<|im_start|>x<|im_end|>")) == [257, 120, 258]
    assert list(r.encode("<think></think>")) == [263, 264]
    assert list(r.encode("")) == []
    assert r.identity.name == "builtin-bytes"
    assert r.identity.vocab_size == bt.VOCAB_SIZE == len(hf_tokenizer(r)) == 265
    assert r.identity.path is None
    assert r.identity.sha256 == bt.builtin_sha256()  # stable across constructions
    assert Renderer.load(None).identity == r.identity
    assert r.encoder.split_ok


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_builtin_round_trip_arbitrary_unicode(x: str) -> None:
    r = _builtin()
    ids = r.encode(x)
    assert r.decode(ids) == x
    assert np.array_equal(ids, r.encoder.encode_whole(x))


_BUILTIN: list[Renderer] = []


def _builtin() -> Renderer:
    if not _BUILTIN:
        _BUILTIN.append(Renderer.load(None))
    return _BUILTIN[0]


def _with_added(pieces: list[str], tokens: list[str]) -> st.SearchStrategy[str]:
    """Random text with added tokens (and near-misses of them) spliced in."""
    near = [t[:-1] for t in tokens] + [t[1:] for t in tokens] + ["<", ">", "|"]
    chunk = st.one_of(
        st.text(max_size=12),
        st.sampled_from(tokens),
        st.sampled_from(near),
        st.sampled_from(pieces),
    )
    return st.lists(chunk, max_size=14).map("".join)


WS = [" ", "  ", "\n", "\n\n", "\t", " \n ", "\u3000", "x", "word", "é", "🙂", "'s", "123"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_with_added(WS, ADDED))
def test_builtin_cached_path_equals_whole(x: str) -> None:
    r = _builtin()
    assert np.array_equal(r.encode(x), r.encoder.encode_whole(x))
    # twice: the second time every piece comes from the cache
    assert np.array_equal(r.encode(x), r.encoder.encode_whole(x))


def test_cache_hits_and_bound() -> None:
    from treeprep.render.builtin import build_backend

    enc = CachedEncoder(build_backend(), max_chars=100)
    text = "<|im_start|>user\nhello there<|im_end|>\n"
    a = enc.encode(text)
    assert enc.misses == 2 and enc.hits == 0  # "user\nhello there" and "\n"
    b = enc.encode(text)
    assert enc.misses == 2 and enc.hits == 2
    assert np.array_equal(a, b)
    long = "y" * 30  # over a quarter of the budget: encoded, not kept
    assert list(enc.encode(long)) == [ord("y")] * 30
    assert long not in enc._cache
    for i in range(40):
        enc.encode(f"<|im_end|>piece number {i:03d}")
    assert enc._cached_chars <= 100
    assert sum(len(k) for k in enc._cache) == enc._cached_chars


# ------------------------------------------------------------------------------------------------
# rendering chat calls with the built-in template
# ------------------------------------------------------------------------------------------------

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "List "}, {"type": "text", "text": "files"}],
    },
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "two calls at once",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "run", "arguments": '{"cmd": "ls"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "run", "arguments": {"cmd": "pwd"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "x.py"},
    {"role": "tool", "tool_call_id": "b", "content": "/w"},
]
COMPLETION = {"role": "assistant", "content": "x.py in /w", "reasoning_content": "done"}

EXPECTED_TEXT = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call the functions below. Their JSON "
    'schemas:\n<tools>\n{"type": "function", "function": {"name": "run", "description": "Run a '
    'shell command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}'
    '\n</tools>\n\nTo call one, write <tool_call>\n{"name": <name>, "arguments": <json>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nList \nfiles<|im_end|>\n"  # two text parts: joined as vLLM joins them
    "<|im_start|>assistant\n<think>\ntwo calls at once\n</think>\n\n"
    '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "run", "arguments": {"cmd": "pwd"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>tool\n<tool_response>\nx.py\n</tool_response><|im_end|>\n"
    "<|im_start|>tool\n<tool_response>\n/w\n</tool_response><|im_end|>\n"
)
EXPECTED_COMPLETION = "<think>\ndone\n</think>\n\nx.py in /w<|im_end|>\n"


def test_render_chat_with_tools_parallel_calls_parts_and_reasoning(r: Renderer) -> None:
    rec = _call(HISTORY, COMPLETION, tools=TOOLS, reward=1.0, advantage=-0.5, agent_id="sub-1")
    rec.source_format = "openai-chat"
    seq = r.render(rec, group_id="task-9", order=3)
    text = r.decode(seq.tokens)
    assert text == EXPECTED_TEXT + "<|im_start|>assistant\n" + EXPECTED_COMPLETION
    # exact ids against transformers on the normalized messages
    msgs, comp, tools = r.normalize(rec)
    assert msgs[1]["content"] == "List \nfiles"
    assert msgs[2]["content"] == ""
    assert msgs[2]["tool_calls"][1]["function"]["arguments"] == {"cmd": "pwd"}  # kept as given
    assert list(seq.tokens) == _ref_ids(r, [*msgs, comp], tools)
    # the loss span is exactly what follows the generation prompt
    prompt = _ref_ids(r, msgs, tools, add_generation_prompt=True)
    assert seq.loss_spans == [(len(prompt), len(seq.tokens))]
    (a, b) = seq.loss_spans[0]
    assert r.decode(seq.tokens[a:b]) == EXPECTED_COMPLETION
    assert seq.tokens.dtype == np.int32
    # metadata
    assert (seq.group_id, seq.order, seq.source, seq.source_format) == (
        "task-9",
        3,
        "f.jsonl:7",
        "openai-chat",
    )
    assert (seq.agent_id, seq.call_id, seq.reward, seq.advantage) == ("sub-1", "c1", 1.0, -0.5)
    assert seq.branch_reason is None and seq.logprobs is None


def test_builtin_template_is_prefix_stable_no_branch_hint(r: Renderer) -> None:
    msgs = [{"role": "user", "content": "go"}]
    prev = None
    for k in range(3):
        comp = {
            "role": "assistant",
            "content": f"step {k}",
            "reasoning_content": f"think {k}",
            "tool_calls": [{"id": f"t{k}", "function": {"name": "run", "arguments": "{}"}}],
        }
        seq = r.render(_call(msgs, comp, tools=TOOLS, call_id=f"c{k}"), group_id="g")
        assert seq.branch_reason is None
        if prev is not None:
            assert np.array_equal(seq.tokens[: len(prev)], prev)
        prev = seq.tokens
        msgs = [*msgs, comp, {"role": "tool", "tool_call_id": f"t{k}", "content": "ok"}]


def test_record_branch_reason_is_kept(r: Renderer) -> None:
    rec = _call([{"role": "user", "content": "hi"}], {"role": "assistant", "content": "yo"})
    rec.branch_reason = "retry"
    assert r.render(rec, group_id="g").branch_reason == "retry"


def test_non_text_part_is_rejected(r: Renderer) -> None:
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(RenderError, match=r"messages\[0\] content part 0 has type 'image_url'"):
        r.render(_call(msgs, {"role": "assistant", "content": "a cat"}), group_id="g")


def test_render_error_is_a_treeprep_error() -> None:
    assert issubclass(RenderError, TreeprepError)
    assert issubclass(TokenizerError, TreeprepError)
    assert RenderError("why").reason == "why"


# ------------------------------------------------------------------------------------------------
# hand-built templates: prefix violation, template failure
# ------------------------------------------------------------------------------------------------


def _custom(template: str) -> Renderer:
    ident = TokenizerIdentity(name="custom", sha256="0", chat_template_sha256="0", vocab_size=265)
    return Renderer(bt.build_backend(), ChatTemplate(template, {"eos_token": "<|im_end|>"}), ident)


# R1-style: the generation prompt opens a <think> block that the rendered completion does not have
R1_LIKE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def test_prefix_violation_is_rejected() -> None:
    r = _custom(R1_LIKE)
    rec = _call([{"role": "user", "content": "q"}], {"role": "assistant", "content": "a"})
    with pytest.raises(RenderError, match="is not a token prefix") as e:
        r.render(rec, group_id="g")
    # the first differing token is named: <think> (263) against the completion's "a" (97)
    assert "263 vs 97" in e.value.reason


def test_template_failure_is_a_render_error() -> None:
    r = _custom("{{ raise_exception('no tools here') }}")
    rec = _call([{"role": "user", "content": "q"}], {"role": "assistant", "content": "a"})
    with pytest.raises(RenderError, match="chat template failed.*no tools here"):
        r.render(rec, group_id="g")


# ------------------------------------------------------------------------------------------------
# token rollouts
# ------------------------------------------------------------------------------------------------


def test_token_rollout(r: Renderer) -> None:
    rec = TokenRollout(
        call_id="r1",
        prompt_token_ids=[1, 2, 3],
        generation_token_ids=[4, 264],
        generation_log_probs=[-0.5, -0.25],
        reward=1.0,
        advantage=0.5,
        source_file="roll.jsonl",
        source_line=2,
        source_format="tokens",
        agent_id="main",
    )
    seq = r.render(rec, group_id="g", order=5)
    assert list(seq.tokens) == [1, 2, 3, 4, 264]
    assert seq.loss_spans == [(3, 5)]
    assert seq.logprobs is not None and list(seq.logprobs) == [-0.5, -0.25]
    assert (seq.source, seq.reward, seq.advantage, seq.order) == ("roll.jsonl:2", 1.0, 0.5, 5)
    empty_gen = TokenRollout(call_id="r2", prompt_token_ids=[1], generation_token_ids=[])
    assert r.render(empty_gen, group_id="g").loss_spans == []


def test_token_rollout_outside_vocabulary_is_rejected(tmp_path) -> None:
    bt.build_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat_template.jinja").write_text(bt.CHAT_TEMPLATE)
    r = Renderer.load(tmp_path)  # a tokenizer folder: a bad id is one record's reject
    rec = TokenRollout(call_id="r1", prompt_token_ids=[1, 151644], generation_token_ids=[2])
    with pytest.raises(RenderError, match=r"prompt_token_ids\[1\] = 151644 is outside"):
        r.render(rec, group_id="g")


def test_token_rollout_without_tokenizer_fails_up_front(r: Renderer) -> None:
    """Issue 14 item 9: real rollouts built without --tokenizer stop the build with what to pass,
    instead of rejecting every record (ids within the built-in vocabulary still build)."""
    rec = TokenRollout(
        call_id="r1",
        prompt_token_ids=[1, 151644],
        generation_token_ids=[2],
        source_file="roll.jsonl",
        source_line=3,
    )
    with pytest.raises(TokenizerError, match=r"roll.jsonl:3: .*Pass --tokenizer") as e:
        r.render(rec, group_id="g")
    assert not isinstance(e.value, RenderError)


# ------------------------------------------------------------------------------------------------
# a tokenizer with lstrip / rstrip / single_word / normalized added tokens and a normalizer
# ------------------------------------------------------------------------------------------------


def _odd_backend():
    from tokenizers import AddedToken, normalizers

    tok = bt.build_backend()
    tok.normalizer = normalizers.NFKC()
    tok.add_special_tokens(
        [
            AddedToken("<mask>", special=True, lstrip=True, rstrip=True, normalized=False),
            AddedToken("[L]", special=True, lstrip=True, normalized=False),
        ]
    )
    tok.add_tokens(
        [
            AddedToken("ony", single_word=True, normalized=False),
            AddedToken("ﬁle", normalized=True),  # NFKC turns it into "file": matched inside pieces
            AddedToken("[R]", rstrip=True, normalized=False),
        ]
    )
    return tok


ODD = ["<mask>", "[L]", "ony", "ﬁle", "file", "[R]", "<|im_end|>"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_with_added(WS + ["Tony", "ony.", " ony ", "\u00a0", "\u2003"], ODD))
def test_general_split_equals_whole(x: str) -> None:
    enc = _odd_encoder()
    assert enc.split_ok
    assert np.array_equal(enc.encode(x), enc.encode_whole(x))
    assert np.array_equal(enc.encode(x), enc.encode_whole(x))


_ODD: list[CachedEncoder] = []


def _odd_encoder() -> CachedEncoder:
    if not _ODD:
        _ODD.append(CachedEncoder(_odd_backend()))
    return _ODD[0]


def test_single_word_next_to_a_character_newer_than_pythons_unicode_tables() -> None:
    """U+13440 is unassigned in Python 3.11's Unicode 14 tables and a mark (a word character) in
    the tokenizer's: whether "ony" is a single word there is not ours to decide, so the text is
    encoded whole (hypothesis found the split and the whole encoding differing)."""
    enc = _odd_encoder()
    for x in ("\U00013440ony", "ony\U00013440", "a \U00013440ony b"):
        assert np.array_equal(enc.encode(x), enc.encode_whole(x))


def test_general_split_examples() -> None:
    enc = _odd_encoder()
    assert enc.split("a  <mask>  b") == ["a", "  <mask>  ", "b"]
    assert enc.split("Tony ony") == ["Tony ", "ony", ""]  # single_word: not inside a word
    assert enc.split("x [L] [R] y") == ["x", " [L]", " ", "[R] ", "y"]


def test_probe_switches_off_the_cut_when_pieces_depend_on_position() -> None:
    """Metaspace with prepend_scheme="first" adds "▁" only at the very start of the text: pieces
    after an added token are not encoded as they would be alone, so the cut must be refused."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"▁": 0, "a": 1, "▁a": 2, "b": 3, "▁b": 4, "[unk]": 5}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[unk]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    enc = CachedEncoder(tok)
    text = "a<s>b"
    differs = not np.array_equal(
        np.concatenate([enc.encode_whole("a"), [6], enc.encode_whole("b")]), enc.encode_whole(text)
    )
    assert differs, "this tokenizer should encode a piece differently after an added token"
    assert not enc.probe(["x<s>a b", "a<s>b"])
    assert np.array_equal(enc.encode(text), enc.encode_whole(text))


def _nested_encoder() -> CachedEncoder:
    """Byte-level BPE with added tokens that are prefixes of each other ("<|x|>" and "<|x|>yz"):
    a text that ends in "<|x|>" may continue into the longer token."""
    from tokenizers import AddedToken

    from treeprep.render.builtin import build_backend

    tok = build_backend()
    tok.add_tokens(
        [AddedToken(t, normalized=False) for t in ("<|x|>", "<|x|>yz", "<|x|>yzzzzzzzzzzzz", "q")]
    )
    enc = CachedEncoder(tok, max_chars=400)  # small: evictions happen between the texts
    assert enc._simple
    return enc


NESTED = ["<|x|>", "<|x|>yz", "<|x|>yzzzzzzzzzzzz", "<|im_start|>", "<|im_end|>", "q"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=_with_added(WS + ["y", "z", "zz"], NESTED),
    edits=st.lists(
        st.tuples(st.integers(0, 400), _with_added(["y", "z", "yz", " "], NESTED)), max_size=6
    ),
)
def test_reusing_the_previous_cut_equals_whole(base: str, edits: list[tuple[int, str]]) -> None:
    """Texts that share prefixes with the one before (cut at any point, continued with anything,
    tokens split across the cut) encode exactly like whole texts."""
    enc = _nested_encoder()
    text = base
    for cut, tail in edits + [(10**6, "")]:
        ids = enc.encode(text)
        assert np.array_equal(ids, enc.encode_whole(text)), text
        assert not ids.flags.writeable
        text = text[:cut] + tail
    # a text that ends in a token, continued into a longer token (and back)
    for text in ["a<|x|>", "a<|x|>yz", "a<|x|>yzzzzzzzzzzzz b", "a<|x|>yzzzzzzzzzzz", "a<|x|>y"]:
        assert np.array_equal(enc.encode(text), enc.encode_whole(text)), text
    # the reuse really happens: the shared prefix up to the last safe token is not split again
    enc = CachedEncoder(enc.backend)
    long = "<|im_start|>" + "word " * 50 + "<|im_end|>" + "a shared tail of text"
    enc.encode(long + "a")
    assert (enc.misses, enc.hits) == (2, 0)
    enc.encode(long + "b c")
    assert (enc.misses, enc.hits) == (3, 0)  # "word ..." was not looked up again
    enc._prev = None
    enc.encode(long + "b c")
    assert (enc.misses, enc.hits) == (3, 2)  # without the previous cut it is


def test_the_reused_cut_never_changes_a_returned_array() -> None:
    """The previous text's ids and cut live in buffers that the next call writes in place after
    the kept prefix (growing by doubling); the arrays returned are views of the ids buffer, and
    the kept prefix is often shorter than what was returned before (full, then prompt, then
    previous turn). A session's texts in the renderer's order, with unrelated texts and cuts
    anywhere (inside a token too) between, each encode like the whole text, and every array
    returned is still what it was when returned."""
    import random

    from treeprep.render.builtin import build_backend

    enc = CachedEncoder(build_backend(), max_chars=2000)  # small: evictions during the session
    assert enc._simple
    rng = random.Random(7)
    words = ["word", "x", "é", "🙂", " ", "\n", "<think>", "</think>", "<|im_end|>", "123"]

    def body(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    returned: list[tuple[np.ndarray, np.ndarray]] = []
    capacity = []

    def check(text: str) -> None:
        ids = enc.encode(text)
        assert np.array_equal(ids, enc.encode_whole(text)), text
        assert not ids.flags.writeable
        returned.append((ids, ids.copy()))
        capacity.append(len(enc._ids))

    hist = f"<|im_start|>system\n{body(30)}<|im_end|>\n"
    for i in range(120):
        prev = hist
        hist += f"<|im_start|>user\n{body(8)}<|im_end|>\n"
        prompt = hist + "<|im_start|>assistant\n"
        full = prompt + f"{body(10)}<|im_end|>\n"
        for text in (full, prompt, prev):
            check(text)
        if i % 7 == 0:
            check(f"<|im_start|>user\n{body(5)}<|im_end|>")  # unrelated: nothing kept
        if i % 5 == 0:
            check(full[: rng.randrange(len(full))])  # shorter: cut anywhere
        hist = full + f"<|im_start|>tool\n{body(25)}<|im_end|>\n"
    # the buffers grew (from 1024 ids and 64 cuts) while the texts were reused
    assert max(capacity) > 8 * 1024 and len(enc._cut_chars) > 256
    for ids, at_return in returned:
        assert np.array_equal(ids, at_return)


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------


def test_load_errors(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="no such directory"):
        Renderer.load(str(tmp_path / "missing"))
    with pytest.raises(TokenizerError, match="with tokenizer.json"):
        Renderer.load(str(tmp_path))
    # a real tokenizer.json but no chat template
    bt.build_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast"}'
    )
    with pytest.raises(TokenizerError, match="no chat template"):
        Renderer.load(str(tmp_path))


def test_load_folder_identity(tmp_path) -> None:
    import json

    bt.build_backend().save(str(tmp_path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": bt.CHAT_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    a = Renderer.load(str(tmp_path))
    assert a.identity.path == str(tmp_path)
    assert a.identity.name == tmp_path.name
    assert a.identity.vocab_size == 265
    assert a.identity.chat_template_sha256 == Renderer.load(None).identity.chat_template_sha256
    # same ids as the built-in renderer on a chat call
    rec = _call(HISTORY, COMPLETION, tools=TOOLS)
    assert np.array_equal(
        a.render(rec, group_id="g").tokens, Renderer.load(None).render(rec, group_id="g").tokens
    )
    # another template, another identity
    cfg["chat_template"] = R1_LIKE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    b = Renderer.load(str(tmp_path))
    assert b.identity.sha256 != a.identity.sha256
    assert b.identity.chat_template_sha256 != a.identity.chat_template_sha256


def test_fast_sandbox_keeps_the_sandbox_rules() -> None:
    """The fast attribute path gives what the sandbox gives; unsafe lookups still fail."""
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from treeprep.render.template import RenderLimits, _environment

    fast = _environment(RenderLimits())
    slow = ImmutableSandboxedEnvironment()
    m = {"content": "a|b ", "items": [1, 2], "tools": [3]}
    for expr in (
        "{{ m.content.split('|')[1] }}",
        "{{ m.content.rstrip() }}",
        "{{ m['content'] }}",
        "{{ m.tools | length }}",
        "{{ m.items is callable }}",  # a dict method wins over the key, as in jinja
        "{{ m.missing is defined }}",
        "{{ m.__class__ }}",
        "{{ m.content.__class__ }}",
        "{{ m.content.format.__globals__ }}",
        "{% for x in m.tools %}{{ loop.index }}{{ loop.last }}{{ loop.length }}{% endfor %}",
        "{% for x in m.tools %}{{ loop.__class__ }}{{ loop._iterator }}{% endfor %}",
    ):
        assert fast.from_string(expr).render(m=m) == slow.from_string(expr).render(m=m), expr
    for unsafe in ("{{ m.tools.append(1) }}", "{{ m.tools.clear() }}"):
        with pytest.raises(SecurityError):
            slow.from_string(unsafe).render(m=m)
        with pytest.raises(SecurityError):
            fast.from_string(unsafe).render(m=m)


def test_regression_eviction_never_drops_a_piece_the_current_text_hit() -> None:
    """A 1 GB bench build crashed with KeyError: new pieces pushed the cache over its bound and the
    eviction dropped an old piece that the same text had just hit, before it was gathered."""
    from treeprep.render.builtin import build_backend

    enc = CachedEncoder(build_backend(), max_chars=64)
    assert enc._simple
    old = "shared old"  # short enough to be kept (a quarter of the budget), inserted first
    enc.encode(f"<|im_start|>{old}<|im_end|>")
    # the old piece again (a hit), then enough new text to force an eviction in the same call
    text = f"<|im_start|>{old}<|im_end|>" + "".join(
        f"<|im_start|>new piece {i:02d}<|im_end|>" for i in range(5)
    )
    enc._prev = None  # no reuse of the previous cut: every piece is looked up
    assert np.array_equal(enc.encode(text), enc.encode_whole(text))
    assert enc._cached_chars <= 64
    # the general (non-simple) path has the same rule
    enc._simple = False
    enc.encode(f"<|im_start|>{old}<|im_end|>")
    assert np.array_equal(
        enc.encode(text + "<|im_start|>more<|im_end|>"),
        enc.encode_whole(text + "<|im_start|>more<|im_end|>"),
    )
