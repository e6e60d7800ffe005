"""A request's chat-template kwargs and reasoning effort reach the template as the server hands
them over (treeprep.render.template_kwargs), checked against transformers' apply_chat_template
given the same kwargs; the reader takes them from the logged request."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import orjson
import pytest
from hf_reference import apply_at_fixed_date

from treeprep.formats import ReadOptions, get_format
from treeprep.render import Renderer
from treeprep.schemas import ChatCall

TOKENIZERS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers"
QWEN3, GPT_OSS = TOKENIZERS / "qwen3", TOKENIZERS / "gpt-oss"
needs_data = pytest.mark.skipif(not (QWEN3 / "tokenizer.json").is_file(), reason="no shared data")

HI = [{"role": "user", "content": "Hi"}]
REPLY = {"role": "assistant", "content": "Hello."}


def _call(**kw: Any) -> ChatCall:
    return ChatCall(call_id="c", messages=HI, completion=REPLY, source_file="f", source_line=1,
                    **kw)  # fmt: skip


def _prompt(r: Renderer, call: ChatCall) -> str:
    seq = r.render(call, group_id="g")
    return r.decode(seq.tokens[: seq.loss_spans[-1][0]])


@pytest.fixture(scope="module")
def qwen3() -> Renderer:
    if not (QWEN3 / "tokenizer.json").is_file():
        pytest.skip("no shared data")
    return Renderer.load(QWEN3)


def test_a_request_s_kwargs_turn_qwen3_s_thinking_off(qwen3: Renderer) -> None:
    """``chat_template_kwargs: {"enable_thinking": false}``: the prompt is the template's with
    thinking off (an empty think block opens the answer), on every server."""
    off = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True,
                              enable_thinking=False)  # fmt: skip
    on = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True)
    assert off != on
    for server in ("vllm", "sglang", "llama.cpp"):
        qwen3.set_server(server)
        assert _prompt(qwen3, _call(chat_template_kwargs={"enable_thinking": False})) == off
        assert _prompt(qwen3, _call()) == on
    qwen3.set_server("vllm")


def test_vllm_turns_thinking_off_for_effort_none(qwen3: Renderer) -> None:
    """vLLM sets ``enable_thinking = effort != "none"`` unless the kwargs set it; so does SGLang
    (0.5.23, ``normalize_reasoning_inputs``, with ``thinking`` too), and llama.cpp turns
    thinking off for ``none`` unless the kwargs set it."""
    off = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True,
                              enable_thinking=False)  # fmt: skip
    on = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True)
    assert _prompt(qwen3, _call(reasoning_effort="none")) == off
    assert _prompt(qwen3, _call(reasoning_effort="low")) == on
    kept = _call(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert _prompt(qwen3, kept) == on
    try:
        for server in ("sglang", "llama.cpp"):
            qwen3.set_server(server)
            # llama.cpp's seeded enable_thinking=true renders as none: the native port renders
            assert qwen3.server_side.llama_cpp_thinking is None
            assert _prompt(qwen3, _call(reasoning_effort="none")) == off
            assert _prompt(qwen3, _call(reasoning_effort="low")) == on
            assert _prompt(qwen3, kept) == on
    finally:
        qwen3.set_server("vllm")


def test_kwargs_the_template_does_not_read_or_the_renderer_sets_are_left(qwen3: Renderer) -> None:
    """As vLLM keeps only the names the template reads: the rest change nothing, and the call
    is rendered by the native port as one without kwargs is (a kwarg it reads needs jinja)."""
    on = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True)
    odd = {"add_generation_prompt": False, "messages": [], "strftime_now": 1, "unknown": 2}
    assert qwen3.native_template is not None
    before = qwen3.native_renders
    assert _prompt(qwen3, _call(chat_template_kwargs=odd)) == on
    assert qwen3.native_renders > before


@needs_data
def test_gpt_oss_s_template_states_the_effort_on_llama_cpp() -> None:
    """gpt-oss rendered with its template (llama.cpp, SGLang): the template's
    ``Reasoning: {{ reasoning_effort }}`` shows the request's effort, as given to
    apply_chat_template."""
    r = Renderer.load(GPT_OSS, server="llama.cpp")
    want = apply_at_fixed_date(r, HI, tokenize=False, add_generation_prompt=True,
                               reasoning_effort="high")  # fmt: skip
    assert "Reasoning: high" in want
    assert _prompt(r, _call(reasoning_effort="high")) == want
    assert "Reasoning: medium" in _prompt(r, _call())


def test_the_reader_takes_them_from_the_request(tmp_path: Path) -> None:
    """A logged request's ``chat_template_kwargs``, at the top, in ``request``, or in the OpenAI
    SDK's ``extra_body``."""
    kw = {"enable_thinking": False}
    resp = {"choices": [{"message": REPLY}]}
    rows = [
        {"messages": HI, "completion": REPLY, "chat_template_kwargs": kw},
        {"request": {"messages": HI, "chat_template_kwargs": kw}, "response": resp},
        {"request": {"messages": HI, "extra_body": {"chat_template_kwargs": kw,
                                                    "reasoning_effort": "low"}},
         "response": resp},
        {"messages": HI, "completion": REPLY},
    ]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in rows))
    calls = list(get_format("openai-chat").read(str(path), ReadOptions()))
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.chat_template_kwargs for c in calls] == [kw, kw, kw, None]  # type: ignore[union-attr]
    assert calls[2].reasoning_effort == "low"  # type: ignore[union-attr]


@needs_data
def test_a_session_with_kwargs_renders_incrementally_and_exactly() -> None:
    """Calls with a kwarg the template reads skip the native ports but still render
    incrementally (a renderer per kwargs, probed with them): each prompt of a growing gpt-oss
    session on llama.cpp is apply_chat_template's with the effort."""
    r = Renderer.load(GPT_OSS, server="llama.cpp")
    msgs: list[dict] = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        msgs.append({"role": "user", "content": f"Question {i}?"})
        call = ChatCall(call_id=f"c{i}", messages=list(msgs), completion=REPLY, source_file="f",
                        source_line=i + 1, reasoning_effort="high")  # fmt: skip
        want = apply_at_fixed_date(r, msgs, tokenize=False, add_generation_prompt=True,
                                   reasoning_effort="high")  # fmt: skip
        assert _prompt(r, call) == want, i
        msgs.append({"role": "assistant", "content": f"Answer {i}."})
    (inc,) = r._kw_incremental.values()
    assert inc is not None and inc.incremental > 0


def test_a_dataset_row_s_kwargs_go_to_each_of_its_calls(tmp_path: Path) -> None:
    """TRL's ``chat_template_kwargs`` column: every call of the row renders with them."""
    row = {"messages": [*HI, REPLY, {"role": "user", "content": "Again"}, REPLY],
           "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_bytes(orjson.dumps(row) + b"\n")
    calls = list(get_format("chat-messages").read(str(path), ReadOptions()))
    assert len(calls) == 2
    assert all(c.chat_template_kwargs == {"enable_thinking": False} for c in calls)  # type: ignore[union-attr]


def test_kwargs_that_are_not_an_object_are_a_reject_naming_the_field(tmp_path: Path) -> None:
    """A server refuses a request whose ``chat_template_kwargs`` is not an object: such a call
    is rejected with the field's path, not rendered without them."""
    from treeprep.schemas import Reject

    rows = [
        {"request": {"messages": HI, "extra_body": {"chat_template_kwargs": "off"}},
         "response": {"choices": [{"message": REPLY}]}},
        {"messages": [*HI, REPLY], "chat_template_kwargs": [1]},
    ]  # fmt: skip
    for fmt, row, where in zip(("openai-chat", "chat-messages"), rows,
                               ("request.extra_body.chat_template_kwargs", "chat_template_kwargs"),
                               strict=True):  # fmt: skip
        path = tmp_path / f"{fmt}.jsonl"
        path.write_bytes(orjson.dumps(row) + b"\n")
        (item,) = list(get_format(fmt).read(str(path), ReadOptions()))
        assert isinstance(item, Reject) and item.line == 1
        assert f"{where}: expected an object" in item.reason


def test_thinking_turned_off_the_anthropic_way_is_the_effort_vllm_probes_for(
    qwen3: Renderer,
) -> None:
    """vLLM's Messages endpoint sends ``none`` for ``thinking: disabled`` where the template
    tells ``none`` from every effort (Qwen3: thinking off, over the request's own effort), and
    ``low`` where Harmony renders gpt-oss (it refuses ``none``); other servers' Messages
    endpoints are not read, so their render is the call's own."""
    off = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True,
                              enable_thinking=False)  # fmt: skip
    on = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True)
    assert _prompt(qwen3, _call(thinking_disabled=True)) == off
    assert _prompt(qwen3, _call(thinking_disabled=True, reasoning_effort="high")) == off
    qwen3.set_server("sglang")
    assert _prompt(qwen3, _call(thinking_disabled=True)) == on
    qwen3.set_server("vllm")
    if importlib.util.find_spec("openai_harmony") is not None:
        oss = Renderer.load(GPT_OSS, server="vllm")
        assert "Reasoning: low" in _prompt(oss, _call(thinking_disabled=True))
        assert "Reasoning: high" in _prompt(oss, _call(reasoning_effort="high"))


def _vllm_probe_fails(source: str) -> bool:
    """The reference: the template rendered as vLLM 0.34's ``_detect_merge_inline_system``
    renders it, in jinja's own sandbox (trim_blocks, lstrip_blocks, loopcontrols)."""
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    messages = [{"role": r, "content": "t"} for r in ("system", "user") * 2]
    try:
        env.from_string(source).render(messages=messages, add_generation_prompt=False)
    except Exception:
        return True
    return False


@needs_data
@pytest.mark.parametrize("tokenizer", [QWEN3, TOKENIZERS / "qwen2_5", GPT_OSS])
def test_the_inline_system_probe_answers_as_vllm_s(tokenizer: Path) -> None:
    """Qwen3's and Qwen2.5's templates take a system message after the first; gpt-oss's fails
    in that sandbox (it calls ``strftime_now``, a transformers helper), so vLLM merges there."""
    from treeprep.render.template_kwargs import merges_inline_system, sglang_inline_system

    source = Renderer.load(tokenizer).template.source
    assert merges_inline_system(source) == _vllm_probe_fails(source)
    assert merges_inline_system(source) == (tokenizer == GPT_OSS)
    r = Renderer.load(tokenizer, server="sglang")
    # SGLang's probe (0.5.23, detect_inline_system_support): the sentinel must show
    assert r.server_side.merges_inline_system is not _sglang_probe_shows(source)
    assert sglang_inline_system(source) is (tokenizer != GPT_OSS)


def _sglang_probe_shows(source: str) -> bool:
    """The reference: SGLang 0.5.23's ``detect_inline_system_support``, in jinja's own
    sandbox (trim_blocks, lstrip_blocks, loopcontrols): the second system message shows."""
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    turns = (("system", "t"), ("user", "t"), ("system", "SENTINEL"), ("user", "t"))
    messages = [{"role": r, "content": c} for r, c in turns]
    try:
        return "SENTINEL" in env.from_string(source).render(
            messages=messages, add_generation_prompt=False
        )
    except Exception:
        return False


def test_a_server_s_default_kwargs_are_rendered_under_the_request_s(qwen3: Renderer) -> None:
    """vLLM started with ``--default-chat-template-kwargs '{"enable_thinking": false}'``
    renders a request without kwargs with thinking off; the request's own kwargs win, and so
    does the ``enable_thinking`` vLLM derives from a request's effort (``build_chat_params``,
    then ``with_defaults``), but a request's null leaves the default (``merge_kwargs``)."""
    off = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True,
                              enable_thinking=False)  # fmt: skip
    on = apply_at_fixed_date(qwen3, HI, tokenize=False, add_generation_prompt=True)
    assert off != on
    qwen3.server_side.set_settings({"enable_thinking": False})
    try:
        assert _prompt(qwen3, _call()) == off
        assert _prompt(qwen3, _call(chat_template_kwargs={"enable_thinking": True})) == on
        assert _prompt(qwen3, _call(reasoning_effort="high")) == on
        assert _prompt(qwen3, _call(chat_template_kwargs={"enable_thinking": None})) == off
    finally:
        qwen3.server_side.set_settings(None)
    assert _prompt(qwen3, _call()) == on


@needs_data
def test_vllm_s_effort_map_rewrites_the_effort_harmony_states() -> None:
    """``--reasoning-effort-map`` rewrites a request's effort before Harmony states it (vLLM's
    ``_make_request_with_harmony`` maps it too), and the effort vLLM's Messages endpoint
    sends for thinking turned off."""
    if importlib.util.find_spec("openai_harmony") is None:
        pytest.skip("openai_harmony is absent")
    oss = Renderer.load(GPT_OSS, server="vllm")
    oss.server_side.set_settings(None, {"high": "medium", "low": "high"})
    assert "Reasoning: medium" in _prompt(oss, _call(reasoning_effort="high"))
    assert "Reasoning: medium" in _prompt(oss, _call(reasoning_effort="medium"))
    assert "Reasoning: high" in _prompt(oss, _call(thinking_disabled=True))


@pytest.mark.parametrize(
    ("server", "kwargs", "effort", "want"),
    [
        # vLLM: the effort and enable_thinking over the request's kwargs, all over the defaults
        ("vllm", None, "high", {"reasoning_effort": "high", "enable_thinking": True,
                                "mode": "fast", "style": "long"}),
        ("vllm", {"mode": "auto", "style": None}, None, {"mode": "fast", "style": "long"}),
        # SGLang: defaults fill what the kwargs leave unset; a default effort wins in the
        # template over the request's own (its kwargs are spread over the effort)
        ("sglang", {"style": None}, "low", {"reasoning_effort": "high", "thinking": True,
                                           "enable_thinking": True, "mode": "fast",
                                           "style": None}),
        ("sglang", {"reasoning_effort": "medium"}, None, {"reasoning_effort": "high",
                                                           "mode": "fast", "style": "long"}),
        # llama.cpp: the kwargs over the defaults, the request's effort over both; none is
        # not forwarded and turns thinking off unless the kwargs set it
        ("llama.cpp", {"style": None}, "low", {"reasoning_effort": "low", "mode": "fast",
                                               "style": None}),
        ("llama.cpp", {"enable_thinking": True}, "none", {"enable_thinking": True,
                                                           "mode": "fast", "style": "long"}),
    ],
)  # fmt: skip
def test_each_server_merges_the_request_s_kwargs_with_its_defaults(
    server: str, kwargs: dict[str, Any] | None, effort: str | None, want: dict[str, Any]
) -> None:
    """Written out from the servers' code: vLLM 0.34 ``build_chat_params`` then
    ``with_defaults``; SGLang 0.5.23 ``normalize_reasoning_inputs``,
    ``_convert_to_internal_request``, ``_process_messages``, ``_apply_jinja_template``;
    llama.cpp ``oaicompat_chat_params_parse``."""
    from treeprep.modes import Server
    from treeprep.render.template_kwargs import template_kwargs

    names = ("reasoning_effort", "enable_thinking", "thinking", "mode", "style")
    source = "".join("{{ " + n + " }}" for n in names)
    defaults = {"mode": "fast", "style": "long"}
    if server == "sglang":
        defaults["reasoning_effort"] = "high"
    got = template_kwargs(source, Server(server), kwargs, effort, defaults)
    assert got == want


#: Llama 3.1's way of stating the date (its default when no date is given), and an effort read
#: as llama.cpp's ``reasoning_strength``
DATED = (
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "<|system|>Today Date: {{ date_string }} ({{ datetime | default('-') }}) "
    "{{ reasoning_strength | default('-') }}\n{% for m in messages %}<|{{ m.role }}|>"
    "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize(
    ("server", "request_kwargs", "shown"),
    [("vllm", {}, "26 Jul 2024 (-) -"),
     ("llama.cpp", {}, "08 Dec 2026 (Dec 08 2026) high"),
     ("llama.cpp", {"date_string": "01 Jan 2000"}, "01 Jan 2000 (Dec 08 2026) high")],
)  # fmt: skip
def test_llama_cpp_gives_the_template_the_date_and_the_effort_as_strength(
    tmp_path: Path, server: str, request_kwargs: dict, shown: str
) -> None:
    """llama.cpp's common_chat_extra_context gives every render the server's date (here the
    call's), under the request's kwargs, and caps_apply_reasoning_effort the effort as
    ``reasoning_strength`` too; vLLM gives neither, so Llama 3's template prints its default."""
    from hf_reference import hf_tokenizer

    path = tmp_path / "t.jinja"
    path.write_text(DATED)
    r = Renderer.load(None, chat_template=path, server=server)
    call = _call(timestamp="2026-12-08T09:30:00Z", reasoning_effort="high",
                 chat_template_kwargs=request_kwargs or None)  # fmt: skip
    assert _prompt(r, call).startswith(f"<|system|>Today Date: {shown}\n")
    kw = {"date_string": shown[:11], "datetime": "Dec 08 2026", "reasoning_strength": "high"}
    want = hf_tokenizer(r).apply_chat_template(
        HI, tokenize=False, add_generation_prompt=True, **(kw if server != "vllm" else {})
    )
    assert _prompt(r, call) == want
