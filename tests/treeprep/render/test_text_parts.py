"""A prompt message of several text parts renders as the inference server handed it to the template.

The reference for the tokens is transformers' ``apply_chat_template`` on the messages the server
would pass it: vLLM joins a message's text parts with a newline and SGLang with a space for a
template that takes strings (vllm ``entrypoints/chat_utils.py``, sglang
``srt/parser/jinja_template_utils.py``); both pass the parts as a list to a template that loops
over them. Templates here are written for the test; the real Qwen and gpt-oss ones are read from
``../shared/data`` where it is present.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_reference import hf_tokenizer

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import RenderError
from treeprep.modes import Server
from treeprep.render import Renderer
from treeprep.render.builtin import CHAT_TEMPLATE
from treeprep.render.text_parts import TextParts, content_format, text_parts
from treeprep.schemas import ChatCall

TOKENIZERS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers"

#: a ChatML template that loops over a message's content parts where they are a list
LOOPS_OVER_PARTS = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Qwen3.5's shape: the parts are read by a macro that loops over its argument ``content``
MACRO_OVER_CONTENT = (
    "{% macro text(content) %}{% if content is string %}{{ content }}{% else %}"
    "{% for item in content %}{{ item.text }}{% endfor %}{% endif %}{% endmacro %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ text(message.content) }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _call(user_parts: list[str], reply: str | list[str] = "ok") -> ChatCall:
    completion = reply if isinstance(reply, str) else [{"type": "text", "text": t} for t in reply]
    return ChatCall(
        call_id="c",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": t} for t in user_parts]},
        ],
        completion={"role": "assistant", "content": completion},
        source_file="f.jsonl",
        source_line=1,
    )


def _reference(r: Renderer, user_content: object, reply: str) -> list[int]:
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": user_content},
        {"role": "assistant", "content": reply},
    ]
    out = hf_tokenizer(r).apply_chat_template(msgs, tokenize=True, return_dict=False)
    return list(out)


@pytest.mark.parametrize(("server", "sep"), [("vllm", "\n"), ("sglang", " ")])
def test_parts_join_as_the_server_joins_them_for_a_string_template(server: str, sep: str) -> None:
    r = Renderer.load(None)
    r.set_server(server)
    seq = r.render(_call(["<reminder>", "fix the bug"]), group_id="g")
    assert list(seq.tokens) == _reference(r, f"<reminder>{sep}fix the bug", "ok")
    assert f"text-parts:{server}" in r.last_normalized


def test_a_message_of_one_part_is_its_text_and_is_not_counted() -> None:
    r = Renderer.load(None)
    seq = r.render(_call(["fix the bug"]), group_id="g")
    assert list(seq.tokens) == _reference(r, "fix the bug", "ok")
    assert not any(k.startswith("text-parts") for k in r.last_normalized)


def test_a_completion_of_several_parts_is_one_reply() -> None:
    r = Renderer.load(None)
    seq = r.render(_call(["hi"], reply=["Hello", ", world"]), group_id="g")
    assert list(seq.tokens) == _reference(r, "hi", "Hello, world")


@pytest.mark.parametrize("template", [LOOPS_OVER_PARTS, MACRO_OVER_CONTENT])
def test_a_template_that_loops_over_parts_gets_the_list_on_vllm(
    tmp_path: Path, template: str
) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(template)
    r = Renderer.load(None, chat_template=path)
    r.set_server("vllm")
    assert r._history.parts.as_list
    seq = r.render(_call(["<reminder>", "fix the bug"]), group_id="g")
    parts = [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "fix the bug"}]
    assert list(seq.tokens) == _reference(r, parts, "ok")  # the template's own join: nothing


def test_content_format_follows_each_servers_detection() -> None:
    vllm, sglang = Server.vllm, Server.sglang
    assert content_format(vllm, LOOPS_OVER_PARTS) == "openai"
    assert content_format(sglang, LOOPS_OVER_PARTS) == "openai"
    # vLLM follows names assigned from messages and bare `content` loops; SGLang does neither
    alias = "{% set ms = messages[1:] %}{% for x in ms %}{% for p in x['content'] %}{% endfor %}"
    assert content_format(vllm, alias + "{% endfor %}") == "openai"
    assert content_format(sglang, alias + "{% endfor %}") == "string"
    assert content_format(vllm, MACRO_OVER_CONTENT) == "openai"
    assert content_format(sglang, MACRO_OVER_CONTENT) == "string"
    # through a filter
    filt = (
        "{% for m in messages %}{% for p in m.content|selectattr('type') %}{% endfor %}{% endfor %}"
    )
    assert content_format(vllm, filt) == "openai"
    # SGLang's shortcut: a template that mentions images takes lists
    assert content_format(sglang, "{# image #}{{ messages[0].content }}") == "openai"
    assert content_format(vllm, "{# image #}{{ messages[0].content }}") == "string"
    # a loop over another field is no loop over the parts; a broken template takes strings
    other = "{% for m in messages %}{% for c in m.tool_calls %}{% endfor %}{% endfor %}"
    assert content_format(vllm, other) == "string"
    assert content_format(vllm, "{% for %}") == "string"
    assert not text_parts("vllm", CHAT_TEMPLATE).as_list  # the built-in template takes strings


@pytest.mark.parametrize("name", ["qwen3", "qwen2_5", "gpt-oss"])
def test_the_real_templates_take_strings_on_both_servers(name: str) -> None:
    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("../shared/data is absent")
    source = Renderer.load(str(folder)).template.source
    assert content_format(Server.vllm, source) == "string"
    assert content_format(Server.sglang, source) == "string"


def _write_log(path: Path) -> None:
    rec = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "completion": {"role": "assistant", "content": "ok"},
    }
    path.write_text(json.dumps(rec) + "\n")


def test_a_build_counts_the_calls_and_renders_again_for_another_server(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    _write_log(log)
    out = tmp_path / "out"
    for server in ("vllm", "sglang"):  # the same OUT: the second build may not reuse the first's
        cfg = BuildConfig(inputs=[str(log)], out=str(out), file=FileOptions(server=server))
        manifest = build(cfg)
        assert {k: n for k, n in manifest.normalized.items() if "parts" in k} == {
            f"text-parts:{server}": 1
        }
    assert manifest.counts.records_rejected == 0


#: a template that renders only parts: a string's characters have no ``text`` (llama.cpp's probe)
PARTS_ONLY = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% for part in message.content %}{{ part.text }}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    ("template", "as_list", "wrap"),
    [(CHAT_TEMPLATE, False, False), (LOOPS_OVER_PARTS, True, False),
     (MACRO_OVER_CONTENT, True, False), (PARTS_ONLY, True, True)],
)  # fmt: skip
def test_llama_cpp_joins_only_for_a_template_of_strings_only(
    tmp_path: Path, template: str, as_list: bool, wrap: bool
) -> None:
    """llama.cpp's content probe (caps.cpp; what its caps_get printed for these four: string
    and typed content true/false, true/true, true/true, false/true): a template that takes only
    strings gets the parts joined with a newline; one that takes both (Qwen3.5's) gets each
    content as the request gives it, the parts as the list (vLLM hands it so too); one that
    takes only parts gets every content as parts."""
    path = tmp_path / "t.jinja"
    path.write_text(template)
    r = Renderer.load(None, chat_template=path)
    r.set_server("llama.cpp")
    assert (r._history.parts.as_list, r._history.parts.wrap) == (as_list, wrap)
    seq = r.render(_call(["<reminder>", "fix the bug"]), group_id="g")
    parts = [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "fix the bug"}]
    if as_list:

        def part(text: str) -> object:
            return [{"type": "text", "text": text}] if wrap else text

        msgs = [
            {"role": "system", "content": part("be brief")},
            {"role": "user", "content": parts},
            {"role": "assistant", "content": part("ok")},
        ]
        ref = hf_tokenizer(r).apply_chat_template(msgs, tokenize=True, return_dict=False)
        want = list(ref)
    else:
        want = _reference(r, "<reminder>\nfix the bug", "ok")
    assert list(seq.tokens) == want
    assert "text-parts:llama.cpp" in r.last_normalized


def test_a_template_of_parts_only_gets_strings_as_parts_on_vllm_not_on_sglang(
    tmp_path: Path,
) -> None:
    """Where vLLM hands a template the parts, it hands a string content as one part too; SGLang
    hands strings through, which a template of parts only renders as nothing: the call is
    refused rather than trained on an empty turn."""
    path = tmp_path / "t.jinja"
    path.write_text(PARTS_ONLY)
    r = Renderer.load(None, chat_template=path)
    r.set_server("vllm")
    seq = r.render(_call(["a", "b"]), group_id="g")
    assert "be brief" in r.decode(seq.tokens) and r.decode(seq.tokens).endswith("ok<|im_end|>\n")
    r.set_server("sglang")
    with pytest.raises(RenderError):  # its reply renders as nothing
        r.render(_call(["a", "b"]), group_id="g")


def test_vllm_renders_harmony_templates_with_openai_harmony() -> None:
    """vLLM renders gpt-oss with openai_harmony, not its chat template, and openai_harmony
    writes a message's text parts one after another (harmony_utils.parse_chat_input_to_harmony_
    message: one TextContent per part): nothing between them there; llama.cpp, which renders
    the template, joins them with a newline."""
    harmony = "{% for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{% endfor %}"
    assert text_parts("vllm", harmony) == TextParts(Server.vllm, "", as_list=False, harmony=True)
    folder = TOKENIZERS / "gpt-oss"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("../shared/data is absent")
    r = Renderer.load(str(folder))
    assert r._history.parts.sep == ""
    r.set_server("llama.cpp")
    assert r._history.parts.sep == "\n"


@pytest.mark.parametrize(("version", "joined"), [((0, 5, 23), True), ((0, 5, 10), False)])
def test_sglang_joins_a_tool_message_s_parts_with_a_space_from_0_5_11(
    tmp_path: Path, version: tuple[int, int, int], joined: bool
) -> None:
    """SGLang 0.5.11 on (``normalize_tool_content``) joins a tool message's text parts with a
    space even for a template that takes lists; before, the list went to the template."""
    path = tmp_path / "t.jinja"
    path.write_text(LOOPS_OVER_PARTS)
    r = Renderer.load(None, chat_template=path)
    r.set_server("sglang", sglang=version)
    assert r._history.parts.as_list
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    call = ChatCall(
        call_id="c",
        messages=[{"role": "user", "content": "go"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "t1", "type": "function",
                                   "function": {"name": "ls", "arguments": {}}}]},
                  {"role": "tool", "tool_call_id": "t1", "content": parts},
                  {"role": "user", "content": parts}],
        completion={"role": "assistant", "content": "ok"},
    )  # fmt: skip
    msgs, _, _ = r.normalize(call)
    assert msgs[2]["content"] == ("a b" if joined else parts)
    assert msgs[3]["content"] == parts  # other messages keep the template's own rule
