"""Native chat-template ports against the jinja templates, character for character.

The reference is always transformers' ``apply_chat_template(..., tokenize=False)``. Conversations
come from hypothesis (the corners of each template: reasoning in and out of the content, ``<think>``
and ``<tool_response>`` inside text, leading and trailing newlines, parallel tool calls with string
and object arguments, consecutive tool results, later system turns, unicode) and from the real logs
through the format adapters. Then the Renderer's wiring: the port is chosen by template hash, is
verified at load, falls back to jinja outside its domain, and a broken port stops the build with an
error naming the record. The Qwen templates need ``../shared/data`` (skipped when absent); the
built-in template is always tested.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_reference import hf_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import NativeTemplateMismatch, RenderError, TreeprepError
from treeprep.formats import detect_format
from treeprep.formats.base import ReadOptions
from treeprep.io.compressed import read_head
from treeprep.render import Renderer
from treeprep.render import builtin as bt
from treeprep.render.native import FALLBACK_ERRORS, PORTS, find_port
from treeprep.render.template import ChatTemplate
from treeprep.schemas import ChatCall
from treeprep.schemas.tokenizer import sha256_text as _sha256_text

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
TOKENIZERS = DATA / "tokenizers"
LOGS = DATA / "logs"
HAVE_DATA = (TOKENIZERS / "qwen3" / "tokenizer.json").is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="../shared/data is absent")
SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"

TEMPLATES = ["builtin", "qwen3", "qwen2_5", "qwen3_instruct_2507"]
_RENDERERS: dict[str, Renderer] = {}


def _renderer(name: str, tmp_root: Path) -> Renderer:
    """A renderer per template; the Instruct-2507 config pairs with Qwen3's tokenizer.json (linked
    into a temporary folder, never copied into the project)."""
    if name not in _RENDERERS:
        if name == "builtin":
            _RENDERERS[name] = Renderer.load(None)
        elif name == "qwen3_instruct_2507":
            folder = tmp_root / "qwen3-instruct-2507"
            folder.mkdir(exist_ok=True)
            cfg = TOKENIZERS / "qwen3-4b-instruct-2507-config-from-openhands"
            for src in (TOKENIZERS / "qwen3" / "tokenizer.json", cfg / "tokenizer_config.json"):
                dst = folder / src.name
                if not dst.exists():
                    os.symlink(src.resolve(), dst)
            _RENDERERS[name] = Renderer.load(str(folder))
        else:
            _RENDERERS[name] = Renderer.load(str(TOKENIZERS / name))
    return _RENDERERS[name]


@pytest.fixture(
    scope="module",
    params=[
        "builtin",
        pytest.param("qwen3", marks=needs_data),
        pytest.param("qwen2_5", marks=needs_data),
        pytest.param("qwen3_instruct_2507", marks=needs_data),
    ],
)
def r(request, tmp_path_factory) -> Renderer:
    return _renderer(request.param, tmp_path_factory.mktemp("tok"))


def _api(r: Renderer, msgs: list[dict], tools: list[dict] | None, gen: bool) -> str:
    out = hf_tokenizer(r).apply_chat_template(
        msgs, tools=tools, tokenize=False, add_generation_prompt=gen
    )
    assert isinstance(out, str)
    return out


def _port(r: Renderer):
    port = find_port(_sha256_text(r.template.source))
    assert port is not None
    return port


def _assert_same(r: Renderer, msgs: list[dict], tools: list[dict] | None, gen: bool) -> None:
    port = _port(r)
    try:
        ref = _api(r, msgs, tools, gen)
    except Exception:  # the template refuses the conversation: the port must not render it
        with pytest.raises(FALLBACK_ERRORS):
            port.render(msgs, tools, gen)
        return
    got = port.render(msgs, tools, gen)
    if got != ref:
        i = next((k for k in range(min(len(got), len(ref))) if got[k] != ref[k]), None)
        raise AssertionError(
            f"{port.name}: differs at {i}:\nport: {got[max(0, (i or 0) - 80) :][:200]!r}\n"
            f"ref:  {ref[max(0, (i or 0) - 80) :][:200]!r}"
        )


# ------------------------------------------------------------------------------------------------
# selection by hash
# ------------------------------------------------------------------------------------------------


def test_ports_are_keyed_by_the_exact_template_text() -> None:
    assert PORTS[_sha256_text(bt.CHAT_TEMPLATE)].name == "builtin_chatml"
    assert find_port(_sha256_text(bt.CHAT_TEMPLATE + " ")) is None
    if HAVE_DATA:
        names = {
            "qwen3": "qwen3",
            "qwen2_5": "qwen2_5",
            "qwen3-4b-instruct-2507-config-from-openhands": "qwen3_instruct_2507",
        }
        for folder, name in names.items():
            cfg = json.loads((TOKENIZERS / folder / "tokenizer_config.json").read_text())
            port = find_port(_sha256_text(cfg["chat_template"]))
            assert port is not None and port.name == name


def test_renderer_uses_the_port_after_verifying_it(r: Renderer) -> None:
    assert r.native_template == _port(r).name
    # through the prefix cache (treeprep.render.history.RenderedPrefixes) of that port
    assert r._native.__self__.port is _port(r)  # type: ignore[union-attr]


def test_a_template_one_byte_off_gets_no_port() -> None:
    template = ChatTemplate(
        bt.CHAT_TEMPLATE.replace("<tools>", "<tools> ", 1), bt.SPECIAL_TOKENS_MAP
    )
    base = Renderer.load(None)
    r2 = Renderer(bt.build_backend(), template, base.identity, native_templates=True)
    assert r2.native_template is None
    msgs = [{"role": "user", "content": "x"}]
    assert r2.render_text(msgs, [{"a": 1}]) == _api(r2, msgs, [{"a": 1}], False)
    assert r2.native_renders == 0


def test_a_port_that_disagrees_on_the_probes_is_not_used(monkeypatch) -> None:
    from treeprep.render import native as nt

    sha = _sha256_text(bt.CHAT_TEMPLATE)
    bad = nt.NativeTemplate("bad", lambda m, t, g: nt.render_builtin_chatml(m, t, g) + "\n")
    monkeypatch.setitem(nt.PORTS, sha, bad)
    r2 = Renderer.load(None)
    assert r2.native_template is None and r2._native is None


def test_native_templates_false_uses_jinja() -> None:
    r2 = Renderer.load(None, native_templates=False)
    assert r2.native_template is None
    r2.render_text([{"role": "user", "content": "x"}], None)
    assert r2.native_renders == 0


# ------------------------------------------------------------------------------------------------
# hypothesis: generated conversations
# ------------------------------------------------------------------------------------------------

FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
    "<tool_call>",
    "<|im_end|>",
    "\n",
    "\n\n",
    " ",
    "é",
    "混合",
    "🙂",
    "ok",
    '{"a": 1}',
    "\\",
    '"',
]
_body = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=6)
#: text with the whitespace at its ends that the templates strip or keep
text_st = st.tuples(
    st.sampled_from(["", "", "\n", "\n\n", " "]), _body, st.sampled_from(["", "", "\n", " \n"])
).map(lambda t: t[0] + "".join(t[1]) + t[2])
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | text_st,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text_st, kids, max_size=3),
    max_leaves=6,
)
args_st = st.one_of(
    st.dictionaries(text_st, json_value, max_size=3),
    st.dictionaries(text_st, json_value, max_size=3).map(lambda d: json.dumps(d)),
    text_st,
)


@st.composite
def tool_call_st(draw) -> dict[str, Any]:
    tc: dict[str, Any] = {
        "type": "function",
        "function": {"name": draw(text_st), "arguments": draw(args_st)},
    }
    if draw(st.booleans()):
        tc = {"id": draw(st.text(max_size=4)), **tc}
    return tc


@st.composite
def message_st(draw) -> dict[str, Any]:
    kind = draw(st.sampled_from(["user", "wrapped", "assistant", "assistant", "tool", "system"]))
    if kind == "wrapped":  # a tool result sent as a user turn (Qwen3's last-query search skips it)
        return {"role": "user", "content": "<tool_response>" + draw(text_st) + "</tool_response>"}
    m: dict[str, Any] = {"role": kind, "content": draw(text_st)}
    if kind == "assistant":
        if draw(st.booleans()):
            m["tool_calls"] = draw(st.lists(tool_call_st(), min_size=1, max_size=3))
        if draw(st.booleans()):
            m["reasoning_content"] = draw(text_st)
    if kind == "tool":
        if draw(st.booleans()):
            m["tool_call_id"] = draw(st.text(max_size=4))
        if draw(st.booleans()):
            m["name"] = draw(text_st)
    return m


tools_st = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {
                        "name": text_st,
                        "description": text_st,
                        "parameters": st.dictionaries(text_st, json_value, max_size=2),
                    }
                ),
            }
        ),
        min_size=1,
        max_size=2,
    ),
)


@st.composite
def conversation_st(draw) -> list[dict[str, Any]]:
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(text_st)})
    msgs += draw(st.lists(message_st(), min_size=0 if msgs else 1, max_size=9))
    return msgs


@given(msgs=conversation_st(), tools=tools_st, gen=st.booleans())
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_port_equals_template_on_generated_conversations(
    r: Renderer, msgs: list[dict], tools: list[dict] | None, gen: bool
) -> None:
    _assert_same(r, msgs, tools, gen)


def test_port_equals_template_on_hand_picked_corners(r: Renderer) -> None:
    tc = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    cases: list[list[dict[str, Any]]] = [
        # the last assistant turn after the last user query, no reasoning: an empty think block
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\na\n"}],
        # reasoning only in the content, several </think>
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nr1</think>\n\nx</think>y"},
        ],
        # an empty reasoning_content wins over reasoning in the content
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>r</think>a", "reasoning_content": ""},
            {"role": "user", "content": "<tool_response>t</tool_response>"},
            {"role": "assistant", "content": "b", "reasoning_content": "\n r \n"},
        ],
        # reasoning_content under transformers' other names
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "thinking": "th"},
            {"role": "assistant", "content": "b", "reasoning": "re"},
        ],
        # tool calls without text, parallel, object and string arguments; tool results in a row
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tc, {"function": {"name": "g", "arguments": {"é": "ü"}}}],
            },
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "x", "tool_calls": [tc]},
            {"role": "tool", "content": "3"},
        ],
        # a tool result first, a system turn later, no user query at all
        [
            {"role": "tool", "content": "t"},
            {"role": "system", "content": "s"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"},
        ],
        # a tool call whose "function" key is missing (the call itself holds name/arguments)
        [{"role": "assistant", "content": "", "tool_calls": [{"name": "n", "arguments": "{}"}]}],
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": '<é> "q" \\'}}]
    for msgs in cases:
        for t in (None, tools):
            for gen in (False, True):
                _assert_same(r, msgs, t, gen)


# ------------------------------------------------------------------------------------------------
# real logs through the format adapters
# ------------------------------------------------------------------------------------------------

REAL_LOGS = [
    "openhands/tests/fixtures/llm_data/*/*.json",
    "tau2-bench/*.json",
    "claude-code/short.jsonl",
    "claude-code/tool_heavy.jsonl",
    "claude-code/subagent.jsonl",
    "swe-agent/function_calling_simple.traj",
    "mini-swe-agent/pr854__*.traj.json",
    "openai-responses/conversational_tool_use_simulation__example_rollouts.jsonl",
]
PER_FILE = 12


def _real_calls() -> list[ChatCall]:
    calls: list[ChatCall] = []
    for pattern in REAL_LOGS:
        for path in sorted(glob.glob(str(LOGS / pattern))):
            spec = detect_format(path, read_head(path))
            assert spec is not None, path
            items = spec.read(path, ReadOptions())
            recs = (x for x in items if isinstance(x, ChatCall))
            calls += itertools.islice(recs, PER_FILE)
    return calls


@needs_data
def test_port_equals_template_on_real_logs(r: Renderer) -> None:
    calls = _real_calls()
    assert len(calls) > 50
    seen_reasoning = seen_parallel = 0
    for rec in calls:
        try:
            msgs, comp, tools = r.normalize(rec)
        except RenderError:
            continue  # a non-text part: not renderable by any text template
        seen_reasoning += any("reasoning_content" in m for m in [*msgs, comp])
        seen_parallel += any(len(m.get("tool_calls", ())) > 1 for m in [*msgs, comp])
        _assert_same(r, [*msgs, comp], tools, False)
        _assert_same(r, msgs, tools, True)
    assert seen_parallel > 0


# ------------------------------------------------------------------------------------------------
# the renderer's run-time cross-check and fallback
# ------------------------------------------------------------------------------------------------


def _chat(i: int) -> ChatCall:
    return ChatCall(
        call_id=f"c{i}",
        messages=[{"role": "user", "content": f"q{i}"}],
        completion={"role": "assistant", "content": "a"},
        source_file="logs/x.jsonl",
        source_line=i + 1,
    )


def _break_on(r: Renderer, bad: set[int]) -> list[int]:
    """Replace the port with one that is wrong on the listed render numbers."""
    good = r._native
    assert good is not None
    n = [0]

    def broken(msgs, tools, gen):
        k = n[0]
        n[0] += 1
        return good(msgs, tools, gen) + ("!" if k in bad else "")

    r._native = broken
    return n


def test_a_broken_port_is_caught_and_names_the_record() -> None:
    r2 = Renderer.load(None)
    _break_on(r2, {0})
    with pytest.raises(NativeTemplateMismatch) as e:
        r2.render(_chat(6), group_id="g")
    msg = str(e.value)
    assert "logs/x.jsonl:7" in msg and "builtin_chatml" in msg
    assert "--no-native-templates" in msg and "bug" in msg
    assert isinstance(e.value, TreeprepError) and not isinstance(e.value, RenderError)


def test_cross_check_schedule_is_deterministic() -> None:
    msgs = [{"role": "user", "content": "q"}]
    r2 = Renderer.load(None)
    _break_on(r2, {16, 63, 65})  # after the first 16 and not a multiple of 64: not compared
    texts = [r2.render_text(msgs, None, where=f"f:{k}") for k in range(70)]
    assert r2.native_renders == 70 and sum(t.endswith("!") for t in texts) == 3
    r3 = Renderer.load(None)
    _break_on(r3, {64})  # the 65th render (k = 64) is compared
    for k in range(64):
        r3.render_text(msgs, None, where=f"f:{k}")
    with pytest.raises(NativeTemplateMismatch, match="f:64"):
        r3.render_text(msgs, None, where="f:64")
    r4 = Renderer.load(None)
    _break_on(r4, {15})  # the first 16 are all compared
    with pytest.raises(NativeTemplateMismatch, match="f:15"):
        for k in range(16):
            r4.render_text(msgs, None, where=f"f:{k}")


def test_port_rendering_where_the_template_fails_is_a_mismatch() -> None:
    r2 = Renderer.load(None)
    r2._native = lambda msgs, tools, gen: "text"
    msgs: list[dict] = []
    with pytest.raises(NativeTemplateMismatch, match="the template fails"):
        r2.render_text(msgs, None, where="f:1")


def test_outside_the_domain_the_template_decides() -> None:
    r2 = Renderer.load(None)
    assert r2.native_template == "builtin_chatml"
    # a non-string content: the port refuses (join), jinja renders or fails as it would
    msgs = [{"role": "user", "content": ["a"]}, {"role": "assistant", "content": 5}]
    with pytest.raises(RenderError):
        r2.render_text(msgs, None)
    msgs2 = [{"role": "tool", "content": None}]
    with pytest.raises(FALLBACK_ERRORS):
        _port(r2).render(msgs2, None, False)
    try:
        ref: str | None = _api(r2, msgs2, None, False)
    except Exception:
        ref = None
    if ref is None:
        with pytest.raises(RenderError):
            r2.render_text(msgs2, None)
    else:
        assert r2.render_text(msgs2, None) == ref
    assert r2.native_renders == 0


def test_native_and_jinja_give_the_same_sequences(r: Renderer) -> None:
    jinja = Renderer.load(r.identity.path, native_templates=False)
    assert jinja.native_template is None
    tc = {"id": "t1", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
    ]
    for i in range(5):
        comp = {"role": "assistant", "content": f"step {i}", "tool_calls": [tc]}
        if i % 2:
            comp["reasoning_content"] = f"think {i}"
        rec = ChatCall(call_id=f"c{i}", messages=history, completion=comp, source_line=i + 1)
        a = r.render(rec, group_id="g")
        b = jinja.render(rec, group_id="g")
        assert np.array_equal(a.tokens, b.tokens)
        assert a.loss_spans == b.loss_spans and a.branch_reason == b.branch_reason
        history = [*history, comp, {"role": "tool", "tool_call_id": "t1", "content": f"out {i}"}]
    assert r.native_renders > 0


def test_build_with_and_without_ports_gives_the_same_bytes(tmp_path: Path) -> None:
    inputs = [str(SAMPLE / "openai_chat.jsonl")]
    a = build(BuildConfig(inputs=inputs, out=str(tmp_path / "a")))
    b = build(
        BuildConfig(
            inputs=inputs, out=str(tmp_path / "b"), file=FileOptions(native_templates=False)
        )
    )
    assert a.counts == b.counts and a.counts.records_in_trees > 0
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]


def test_cli_flag_no_native_templates(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from treeprep.cli.app import app

    res = CliRunner().invoke(
        app,
        ["build", str(SAMPLE / "openai_chat.jsonl"), "-o", str(tmp_path / "o"), "--json"]
        + ["--no-native-templates"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["records_in_trees"] > 0


def test_tool_schema_memo_tells_apart_what_json_dumps_does() -> None:
    from treeprep.render.native_qwen import _tojson, _tool_json

    class Key(str):
        pass

    values = [
        {"a": float("nan")},
        {"a": None},
        {"a": float("inf")},
        {"a": 1.0},
        {"a": 1},
        {"a": True},
        {"a": "x"},
        {"a": Key("x")},
        {"a": [1, 2]},
        {"a": (1, 2)},
        {"b": 1, "a": 2},
        {"a": 2, "b": 1},
        {"é": "ü\n"},
        {1: "int key"},
        {"a": 10**30},
    ]
    for _ in range(2):  # the second round is served from the memo
        for v in values:
            assert _tool_json(v) == _tojson(v), v
