"""The tools a server hands the chat template (treeprep/render/server_tools.py): each server's
models' dump of the request's tools, written out here from their code (vLLM 0.34's
``FunctionDefinition``/``ChatCompletionToolsParam``, llama.cpp's
``common_chat_tools_parse_oaicompat``/``common_chat_tools_to_json_oaicompat``, SGLang's
``Function``/``Tool``/``ToolCall`` in the wheels 0.5.8 to 0.5.23, whose 0.5.23 dump was also
run), and a render against transformers' ``apply_chat_template`` given that dump."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.errors import RenderError, TreeprepError
from treeprep.modes import Server
from treeprep.render import Renderer
from treeprep.render.server_tools import parse_sglang_version, template_tools
from treeprep.schemas import ChatCall

QWEN3 = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers" / "qwen3"

PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}}
#: a request's tool as clients write them: its own key order, no description, a key no server
#: model knows, and ``strict``
ASKED = {"function": {"parameters": PARAMS, "name": "read", "strict": True, "x-cache": 1},
         "type": "function"}  # fmt: skip
#: a tool that defers its loading (vLLM's and SGLang's models hand it down to the function)
GREP = {"name": "grep", "description": "Search.", "parameters": PARAMS}
DEFERRED = {"type": "function", "defer_loading": True, "function": GREP}


def test_vllm_writes_its_model_s_fields_in_its_order() -> None:
    assert template_tools([ASKED, DEFERRED], Server.vllm) == [
        {"type": "function", "function": {"name": "read", "description": None,
                                          "parameters": PARAMS, "strict": True}},
        {"type": "function", "function": {"name": "grep", "description": "Search.",
                                          "parameters": PARAMS, "defer_loading": True},
         "defer_loading": True},
    ]  # fmt: skip


def test_llama_cpp_writes_name_description_and_parameters() -> None:
    bare = {"type": "function", "function": {"name": "ls"}}
    assert template_tools([ASKED, bare], Server.llama_cpp) == [
        {"type": "function", "function": {"name": "read", "description": "", "parameters": PARAMS}},
        {"type": "function", "function": {"name": "ls", "description": "", "parameters": {}}},
    ]


@pytest.mark.parametrize(
    ("version", "want"),
    [
        # up to 0.5.8: item.function.model_dump(), strict false unless set
        ("0.5.8", [
            {"description": None, "name": "read", "parameters": PARAMS, "strict": True},
            {"description": "Search.", "name": "grep", "parameters": PARAMS, "strict": False},
        ]),
        # 0.5.9, 0.5.10: item.model_dump()
        ("0.5.10", [
            {"type": "function", "function": {"description": None, "name": "read",
                                              "parameters": PARAMS, "strict": True}},
            {"type": "function", "function": {"description": "Search.", "name": "grep",
                                              "parameters": PARAMS, "strict": False}},
        ]),
        # 0.5.11 to 0.5.22: the tool's defer_loading, null where unset
        ("0.5.22", [
            {"type": "function", "function": {"description": None, "name": "read",
                                              "parameters": PARAMS, "strict": True},
             "defer_loading": None},
            {"type": "function", "function": {"description": "Search.", "name": "grep",
                                              "parameters": PARAMS, "strict": False,
                                              "defer_loading": True},
             "defer_loading": True},
        ]),
        # 0.5.23: the request's key order, then the fields it lacked
        ("0.5.23", [
            {"type": "function", "function": {"parameters": PARAMS, "name": "read",
                                              "strict": True, "description": None},
             "defer_loading": None},
            {"type": "function", "function": {"name": "grep", "description": "Search.",
                                              "parameters": PARAMS, "defer_loading": True},
             "defer_loading": True},
        ]),
    ],
)  # fmt: skip
def test_sglang_writes_its_model_s_dump_of_each_version(version: str, want: list[Any]) -> None:
    got = template_tools([ASKED, DEFERRED], Server.sglang, parse_sglang_version(version))
    assert got == want
    assert [json.dumps(t) for t in got] == [json.dumps(t) for t in want]  # the order too


def test_a_flag_the_models_refuse_and_a_bad_version_are_named() -> None:
    bad = {"type": "function", "function": {"name": "f", "strict": "maybe"}}
    with pytest.raises(RenderError, match=r"strict: expected a boolean, got 'maybe'"):
        template_tools([bad], Server.vllm)
    with pytest.raises(TreeprepError, match="expected a version such as 0.5.23, got '0.5'"):
        parse_sglang_version("0.5")


def _render(server: Server, tok: Any) -> str:
    r = Renderer.load(str(QWEN3))
    r.set_server(server)
    call = ChatCall(
        call_id="c",
        messages=[{"role": "user", "content": "Read a."}],
        tools=[ASKED],
        completion={"role": "assistant", "content": "",
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "read", "arguments": {"path": "a"}}}]},
    )  # fmt: skip
    seq = r.render(call, group_id="g")
    return str(tok.decode(seq.tokens.tolist()))


@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
@pytest.mark.parametrize("server", [Server.vllm, Server.sglang, Server.llama_cpp])
def test_qwen3_prints_the_server_s_tools(server: Server) -> None:
    """The prompt is transformers' ``apply_chat_template`` given the server's dump, so Qwen3's
    ``tool | tojson`` prints the models' fields (on SGLang, ``"defer_loading": null`` too)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN3))
    got = _render(server, tok)
    tools = template_tools([ASKED], server)
    messages = [{"role": "user", "content": "Read a."}]
    want = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert got.startswith(want)
    assert ('"defer_loading": null' in got) is (server is Server.sglang)
    assert '"x-cache"' not in got


def test_sglang_writes_each_tool_call_with_a_null_index() -> None:
    """SGLang's ``ToolCall`` model writes a message's tool calls as ``{"id", "index": null,
    "type", "function"}``: in the history and in the completion the template renders."""
    call = {"type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}
    rec = ChatCall(
        call_id="c",
        messages=[{"role": "user", "content": "Read a."},
                  {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", **call}]},
                  {"role": "tool", "tool_call_id": "t1", "content": "x"}],
        completion={"role": "assistant", "content": "", "tool_calls": [call]},
    )  # fmt: skip
    r = Renderer.load(None)
    for server, want in ((Server.sglang, True), (Server.vllm, False)):
        r.set_server(server)
        msgs, comp, _ = r.normalize(rec)
        sent, made = msgs[1]["tool_calls"][0], comp["tool_calls"][0]
        assert list(sent) == (
            ["id", "index", "type", "function"] if want else ["id", "type", "function"]
        )
        assert (list(made)[:2] == ["id", "index"] and made["id"] is None) is want


def test_a_build_renders_the_tools_of_its_sglang_version(tmp_path: Path) -> None:
    """``--sglang-version`` reaches the build's renderer: 0.5.8 prints each tool's function
    alone, 0.5.23 the tool with its ``defer_loading``."""
    from treeprep.build import BuildConfig, FileOptions, build
    from treeprep.show import load_tree

    log = tmp_path / "calls.jsonl"
    rec = {"messages": [{"role": "user", "content": "Read a."}], "tools": [ASKED],
           "completion": {"role": "assistant", "content": "ok"}}  # fmt: skip
    log.write_text(json.dumps(rec) + "\n")
    r = Renderer.load(None)
    texts = {}
    for version in ("0.5.8", "0.5.23"):
        out = tmp_path / version
        options = FileOptions(server="sglang", sglang_version=version)
        build(BuildConfig(inputs=[str(log)], out=str(out), file=options))
        texts[version] = r.decode(load_tree(str(out), None).input_ids.tolist())
    assert '"defer_loading": null' in texts["0.5.23"]
    assert '{"description": null, "name": "read"' in texts["0.5.8"]
