"""A call served by llama.cpp renders with the messages llama.cpp hands its chat template.

llama.cpp probes each template once (``common/jinja/caps.cpp``) and changes a request's messages
by what the template reads (``common/chat.cpp``): a template that takes no system role gets the
system message merged into the next one, a template that does not read object arguments gets
each call's arguments as the request's string, and one that does gets them parsed. The
references: the capabilities llama.cpp's own ``caps_get`` printed for these templates (a program
built from the llama.cpp that llama-cpp-python 0.3.36 bundles, recorded below), and
transformers' ``apply_chat_template`` given the messages as llama.cpp hands them, written out by
hand from its code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hf_reference import hf_tokenizer

from treeprep.errors import RenderError
from treeprep.render import Renderer
from treeprep.render.builtin import CHAT_TEMPLATE
from treeprep.render.gaps import NO_SYSTEM_PROMPT
from treeprep.render.llama_caps import LlamaCaps, llama_caps, merge_system
from treeprep.render.template import ChatTemplate
from treeprep.schemas import ChatCall

TOKENIZERS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers"

_END = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
#: a ChatML template that writes a call's arguments as they are, with no ``tojson``
RAW_ARGUMENTS = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% for tc in message.tool_calls or [] %}<call>{{ tc.function.name }} "
    "{{ tc.function.arguments }}</call>{% endfor %}{{ message.content }}<|im_end|>\n"
    "{% endfor %}" + _END
)
#: Gemma 2's way: a system message is refused
NO_SYSTEM = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}" + _END
)
#: a template that writes a reasoning block wherever the field is given, even empty
REASONING_DEFINED = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.reasoning_content is defined %}<think>{{ message.reasoning_content }}"
    "</think>{% endif %}{{ message.content }}<|im_end|>\n{% endfor %}" + _END
)

_EACH = "{% for m in messages %}"
_CALLS = _EACH + "{% for t in m.tool_calls or [] %}"
#: what llama.cpp's caps_get printed for each template (supports_system_role,
#: supports_object_arguments): llcaps/ (build.sh), a program of common/jinja built from the
#: llama.cpp that llama-cpp-python 0.3.36 bundles, on 2026-12-07
LLAMA_CPP_CAPS = [
    (CHAT_TEMPLATE, True, True),
    (RAW_ARGUMENTS, True, False),
    (NO_SYSTEM, False, False),
    (REASONING_DEFINED, True, False),
    (_EACH + "{{ m.content }}{% endfor %}", True, False),
    (_EACH + "{{ m.role }}{{ (m.tool_calls or []) | tojson }}{% endfor %}", False, True),
    # the system message is skipped; the arguments are read one by one
    (_CALLS + "{% for k, v in t.function.arguments.items() %}{{ k }}={{ v }}{% endfor %}"
     "{% endfor %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}", False, True),
    # written whole (str) they are not read; through the string filter they are
    (_CALLS + "{{ t.function.arguments }}{% endfor %}{{ m.content }}{% endfor %}", True, False),
    (_CALLS + "{{ t.function.arguments | string }}{% endfor %}{{ m.content }}{% endfor %}",
     True, True),
    (_EACH + "{{ (m.tool_calls or []) | string }}{{ m.content }}{% endfor %}", True, True),
    (_CALLS + "{{ t.function.arguments | upper }}{% endfor %}{{ m.content }}{% endfor %}",
     True, False),
    (_CALLS + "{{ [t.function.arguments] | join(',') }}{% endfor %}{{ m.content }}{% endfor %}",
     True, False),
    (_CALLS + "{{ 'x' ~ t.function.arguments }}{% endfor %}{{ m.content }}{% endfor %}",
     True, False),
    # a read that writes nothing is a read
    (_CALLS + "{% if t.function.arguments.arg %}y{% endif %}{% endfor %}{{ m.content }}"
     "{% endfor %}", True, True),
    (_CALLS + "{{ t.function.arguments.arg }}{% endfor %}{% if loop.first and m.role == "
     "'system' %}{% set s = m.content %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
     True, True),
    (_EACH + "{% if m.role != 'system' %}{{ m | string }}{% endif %}{% endfor %}", False, True),
    (_EACH + "{{ m.content }}{% for t in m.tool_calls or [] %}{% for v in "
     "t.function.arguments.values() %}{{ v }}{% endfor %}{% endfor %}{% endfor %}", True, True),
    # llama.cpp's engine fails a member call of get: nothing is read
    (_EACH + "{{ m.get('content') }}{% endfor %}", False, False),
    (_EACH + "{{ m.content }}{% for t in m.tool_calls or [] %}"
     "{{ t.function.arguments.get('arg') }}{% endfor %}{% endfor %}", True, False),
    ("{{ messages }}", False, False),
    ("{{ messages | string }}", True, True),
]  # fmt: skip


def _renderer(tmp_path: Path, template: str, server: str = "llama.cpp") -> Renderer:
    path = tmp_path / "t.jinja"
    path.write_text(template)
    r = Renderer.load(None, chat_template=path)
    r.set_server(server)
    return r


def _call(
    arguments: Any, *, wire: str | None = None, reasoning: str | None = None, system: bool = True
) -> ChatCall:
    call = {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": arguments}}
    head = [{"role": "system", "content": "be brief"}] if system else []
    return ChatCall(
        call_id="c",
        messages=[
            *head,
            {"role": "user", "content": "list it"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call],
                "reasoning_content": reasoning,
            },
            {"role": "tool", "content": "a.py", "tool_call_id": "c1"},
        ],  # fmt: skip
        completion={"role": "assistant", "content": "done"},
        arguments_json=wire,
        source_file="f.jsonl",
        source_line=1,
    )


def _reference(r: Renderer, msgs: list[dict[str, Any]]) -> list[int]:
    """apply_chat_template of ``msgs`` (llama.cpp's messages, written out) and the reply."""
    full = [*msgs, {"role": "assistant", "content": "done"}]
    return list(hf_tokenizer(r).apply_chat_template(full, tokenize=True, return_dict=False))


def _llama_messages(arguments: Any, system: str = "be brief", **history: Any) -> list[dict]:
    """The call of :func:`_call` as llama.cpp hands it to a template that takes a system role
    (``to_json_oaicompat``: the call's fields, ``content`` always, empty fields left out)."""
    call = {"type": "function", "function": {"name": "sh", "arguments": arguments}, "id": "c1"}
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "list it"},
        {"role": "assistant", "content": "", "tool_calls": [call], **history},
        {"role": "tool", "content": "a.py", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize(("template", "system_role", "object_arguments"), LLAMA_CPP_CAPS)
def test_caps_are_llama_cpps(template: str, system_role: bool, object_arguments: bool) -> None:
    assert llama_caps(ChatTemplate(template)) == LlamaCaps(system_role, object_arguments)


@pytest.mark.parametrize("name", ["qwen3", "qwen2_5", "gpt-oss"])
def test_the_real_templates_read_system_prompts_and_object_arguments(name: str) -> None:
    """llama.cpp's caps_get on the three real templates: both true."""
    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("../shared/data is absent")
    r = Renderer.load(str(folder), server="llama.cpp")
    want = LlamaCaps(system_role=True, object_arguments=True, gpt_oss=name == "gpt-oss")
    assert r._history.parts.caps == want


@pytest.mark.parametrize(
    ("arguments", "wire", "written"),
    [('{"cmd":"ls -la"}', None, '{"cmd":"ls -la"}'),  # the request's string, as it is
     ({"cmd": "ls", "n": 1.0}, None, '{"cmd":"ls","n":1.0}'),  # nlohmann's dump()
     ({"cmd": "ls"}, "python", '{"cmd": "ls"}')],  # as the agent wrote the request
)  # fmt: skip
def test_a_template_that_reads_no_object_arguments_gets_the_requests_string(
    tmp_path: Path, arguments: Any, wire: str | None, written: str
) -> None:
    r = _renderer(tmp_path, RAW_ARGUMENTS)
    seq = r.render(_call(arguments, wire=wire), group_id="g")
    assert list(seq.tokens) == _reference(r, _llama_messages(written))
    assert f"<call>sh {written}</call>" in r.decode(seq.tokens)
    # vLLM hands every template the object, which this one writes as Python's repr
    r = _renderer(tmp_path, RAW_ARGUMENTS, "vllm")
    assert "<call>sh {'cmd': 'ls" in r.decode(r.render(_call(arguments), group_id="g").tokens)


def test_a_template_that_reads_object_arguments_gets_any_json_parsed(tmp_path: Path) -> None:
    """llama.cpp parses every call's arguments for such a template (a list too), and fails a
    request whose arguments are not JSON: the call is rejected naming the call."""
    r = _renderer(tmp_path, CHAT_TEMPLATE)
    seq = r.render(_call('["a","b"]'), group_id="g")
    assert list(seq.tokens) == _reference(r, _llama_messages(["a", "b"]))
    assert '"arguments": ["a", "b"]}' in r.decode(seq.tokens)
    with pytest.raises(RenderError, match=r"messages\[2\] tool call 0 has arguments that are not"):
        r.render(_call("ls -la"), group_id="g")
    r.set_server("vllm")  # a string that holds no object stays the string there
    assert '"arguments": ["a","b"]}' in r.decode(r.render(_call('["a","b"]'), group_id="g").tokens)


def test_a_template_that_takes_no_system_role_gets_it_merged(tmp_path: Path) -> None:
    """workaround::system_message_not_supported: the system message goes before the next one's
    text, after a newline; the call keeps its system prompt (no gap is counted)."""
    r = _renderer(tmp_path, NO_SYSTEM)
    seq = r.render(_call('{"cmd":"ls"}'), group_id="g")
    merged = _llama_messages('{"cmd":"ls"}')[1:]
    merged[0] = {"role": "user", "content": "be brief\nlist it"}
    assert list(seq.tokens) == _reference(r, merged)
    assert NO_SYSTEM_PROMPT not in r.last_normalized
    seq = r.render(_call('{"cmd":"ls"}', system=False), group_id="h")  # nothing to merge
    assert list(seq.tokens) == _reference(r, _llama_messages('{"cmd":"ls"}')[1:])
    with pytest.raises(RenderError, match="System role not supported"):
        _renderer(tmp_path, NO_SYSTEM, "vllm").render(_call('{"cmd":"ls"}'), group_id="g")


def test_merge_system_refuses_parts_and_drops_a_lone_system_message() -> None:
    caps = LlamaCaps(system_role=False)
    system = {"role": "system", "content": "be brief"}
    assert merge_system([system], caps) == []
    parts = [{"type": "text", "text": "hi"}]
    with pytest.raises(RenderError, match="not a string"):
        merge_system([system, {"role": "user", "content": parts}], caps)
    assert merge_system([system], LlamaCaps(system_role=True)) == [system]


def test_empty_reasoning_is_left_out(tmp_path: Path) -> None:
    """to_json_oaicompat writes reasoning_content only when it is not empty; vLLM hands the
    template the empty string."""
    r = _renderer(tmp_path, REASONING_DEFINED)
    seq = r.render(_call('{"cmd":"ls"}', reasoning=""), group_id="g")
    assert list(seq.tokens) == _reference(r, _llama_messages('{"cmd":"ls"}'))
    assert "<think>" not in r.decode(seq.tokens)
    r = _renderer(tmp_path, REASONING_DEFINED, "vllm")
    assert "<think></think>" in r.decode(r.render(_call("{}", reasoning=""), group_id="g").tokens)


GPT_OSS = TOKENIZERS / "gpt-oss"


@pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="../shared/data is absent")
def test_gpt_oss_turns_of_reasoning_text_and_calls_lose_their_text() -> None:
    """llama.cpp's gpt-oss handler (common_chat_params_init_gpt_oss) hands the template a turn's
    reasoning as ``thinking`` and, where the turn calls tools, no text: the history turn that
    has all three renders as its reasoning and call (gpt-oss's template refuses text and
    thinking together); a completion keeps what the model said, which the template refuses."""
    from hf_reference import apply_at_fixed_date

    r = Renderer.load(str(GPT_OSS), server="llama.cpp")
    call = {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": {"cmd": "ls"}}}
    turn = {"role": "assistant", "content": "Let me look.", "reasoning_content": "List it.",
            "tool_calls": [call]}  # fmt: skip
    msgs = [{"role": "user", "content": "list it"}, turn,
            {"role": "tool", "content": "a.py", "tool_call_id": "c1"}]  # fmt: skip
    rec = ChatCall(call_id="c", messages=msgs, completion={"role": "assistant", "content": "Done."},
                   source_file="f", source_line=1)  # fmt: skip
    seq = r.render(rec, group_id="g")
    sent = {"role": "assistant", "thinking": "List it.", "tool_calls": [call]}
    want = apply_at_fixed_date(r, [msgs[0], sent, msgs[2]], tokenize=True, return_dict=False,
                               add_generation_prompt=True)  # fmt: skip
    (span,) = seq.loss_spans  # the final answer after the prompt the model saw (prompted.py)
    assert list(seq.tokens[: span[0]]) == list(want) and r.last_prompt_kept
    assert "List it." in r.decode(seq.tokens) and "Let me look." not in r.decode(seq.tokens)
    with pytest.raises(RenderError, match="Cannot pass both content and thinking"):
        r.render(ChatCall(call_id="d", messages=msgs[:1], completion=turn), group_id="g")


_IF_STRING = _EACH + "{% if m.content is string %}{{ m.content }}{% else %}"
#: what llama.cpp's caps_get printed for each template (supports_string_content,
#: supports_typed_content), from the same program
LLAMA_CPP_CONTENT = [
    (CHAT_TEMPLATE, True, False),
    (_IF_STRING + "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}",
     True, True),  # Qwen3.5's way: both
    (_EACH + "{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}", False, True),
    (_EACH + "{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}", False, True),
    (_EACH + "{% for p in m.content | selectattr('type', 'equalto', 'text') %}{{ p.text }}"
     "{% endfor %}{% endfor %}", False, True),
    (_EACH + "{{ m.content[0].text }}{% endfor %}", False, True),
    # tojson, a slice, map and first use no part as an array
    (_IF_STRING + "{{ m.content | tojson }}{% endif %}{% endfor %}", True, False),
    (_EACH + "{{ m.content[:3] }}{% endfor %}", True, False),
    (_IF_STRING + "{{ m.content | map(attribute='text') | join('') }}{% endif %}{% endfor %}",
     True, False),
    (_IF_STRING + "{{ (m.content | first).text }}{% endif %}{% endfor %}", True, False),
    (_EACH + "{{ m.content | length }}{{ m.content }}{% endfor %}", True, False),
    (_EACH + "{% if m.role != 'system' %}{{ m | string }}{% endif %}{% endfor %}", True, False),
]  # fmt: skip


@pytest.mark.parametrize(("template", "string", "typed"), LLAMA_CPP_CONTENT)
def test_content_caps_are_llama_cpps(template: str, string: bool, typed: bool) -> None:
    caps = llama_caps(ChatTemplate(template))
    assert (caps.string_content, caps.typed_content) == (string, typed)


#: a template with StepFun's tool prompt, which llama.cpp finds it by
STEPFUN = (
    "{% if tools %}You have access to the following functions in JSONSchema format{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>[{{ m.content }}]"
    "{% if m.reasoning_content is defined %}({{ m.reasoning_content }}){% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_stepfun_s_prompt_texts_are_trimmed(tmp_path: Path) -> None:
    """workaround::trim_all_content: each request message's text, each of its text parts
    (before they are joined) and its reasoning, trimmed of C's whitespace; a reasoning left
    empty is left out. The completion is what the model said: as it is."""
    r = _renderer(tmp_path, STEPFUN)
    assert r._history.parts.caps is not None and r._history.parts.caps.trims
    rec = ChatCall(
        call_id="c",
        messages=[
            {"role": "system", "content": " be brief\n"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "\tfirst \n"},
                    {"type": "text", "text": " second"},
                ],
            },
            {"role": "assistant", "content": "\nok \n", "reasoning_content": " \n"},
            {"role": "user", "content": " more\x0b"},
        ],  # fmt: skip
        completion={"role": "assistant", "content": " done \n"},
    )
    seq = r.render(rec, group_id="g")
    sent = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first\nsecond"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": " done \n"},
    ]
    assert list(seq.tokens) == list(
        hf_tokenizer(r).apply_chat_template(sent, tokenize=True, return_dict=False)
    )
    assert not _renderer(tmp_path, RAW_ARGUMENTS)._history.parts.caps.trims  # type: ignore[union-attr]
