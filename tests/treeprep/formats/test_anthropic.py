"""anthropic (Messages API request/response logs) adapter on our sample and bad input."""

from __future__ import annotations

import json
from pathlib import Path

from treeprep.formats import detect_format
from treeprep.formats.anthropic import FORMAT, convert_tools
from treeprep.formats.base import ReadOptions
from treeprep.modes import Server
from treeprep.schemas import ChatCall, Reject

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "anthropic_messages.jsonl"


def _split(path, opts=None):
    items = list(FORMAT.read(str(path), opts or ReadOptions()))
    return [i for i in items if isinstance(i, ChatCall)], [
        i for i in items if isinstance(i, Reject)
    ]


def test_sample():
    assert detect_format(str(SAMPLE), SAMPLE.read_bytes()[:65536]) is FORMAT
    calls, rej = _split(SAMPLE, ReadOptions(group_by="session_id"))
    assert rej == [] and [c.call_id for c in calls] == ["msg_01Lis1", "msg_01Lis2", "msg_01Por1"]
    assert {c.group_id for c in calls} == {"trip-1"}
    c0, c1, c2 = calls
    assert c0.messages[0].content == "You are a concise travel assistant."
    assert [t["function"]["name"] for t in c0.tools] == ["get_weather", "get_time"]
    assert c0.completion.reasoning_content.startswith("I need both")
    assert [t.function.arguments for t in c0.completion.tool_calls] == [
        {"city": "Lisbon"},
        {"city": "Lisbon"},
    ]
    assert [(m.role, m.tool_call_id, m.content) for m in c1.messages[3:]] == [
        ("tool", "toolu_w1", "14°C, light rain until 18:00"),
        ("tool", "toolu_t1", "16:05 (WET)"),
    ]
    # the next request carries the earlier response exactly
    assert c1.messages[2] == c0.completion
    assert c2.messages[: len(c1.messages) + 1] == c1.messages + [c1.completion]
    assert all(c.provenance.exact_messages and not c.provenance.reconstructed for c in calls)


def test_convert_tools_drops_server_tools():
    out = convert_tools(
        [
            {"name": "f", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ]
    )
    assert out == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]


def test_bad_lines(tmp_path):
    ok = json.loads(SAMPLE.read_text().splitlines()[0])
    bad_role = json.loads(json.dumps(ok))
    bad_role["request"]["messages"].append({"role": "developer", "content": "x"})
    orphan = json.loads(json.dumps(ok))
    orphan["request"]["messages"] = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "?"}],
        }
    ]
    p = tmp_path / "a.jsonl"
    p.write_text(
        "\n".join(
            [
                json.dumps(ok),
                "{oops",
                json.dumps(bad_role),
                json.dumps(orphan),
                json.dumps({"request": ok["request"], "response": {"choices": []}}),
            ]
        )
    )
    calls, rej = _split(p)
    assert len(calls) == 1
    assert [r.line for r in rej] == [2, 3, 4, 5]
    assert "malformed JSON" in rej[0].reason
    assert "role 'developer', expected 'user', 'assistant' or 'system'" in rej[1].reason
    assert "tool_call_id 'nope'" in rej[2].reason
    assert "'response' Messages API object" in rej[3].reason


def test_sniff_rejects_openai_chat():
    line = {
        "messages": [{"role": "user", "content": "x"}],
        "response": {"choices": [{"message": {"role": "assistant", "content": "y"}}]},
    }
    assert not FORMAT.sniff("x.jsonl", json.dumps(line).encode() + b"\n")


def test_text_blocks_of_a_user_turn_stay_parts_for_the_servers_join(tmp_path):
    """A Messages endpoint (vLLM's, SGLang's) turns a user turn's text blocks into text parts of
    one message, which the server joins: the reader hands the blocks over as parts, and the
    renderer joins them as ``--server`` says (:mod:`treeprep.render.text_parts`)."""
    from treeprep.render import Renderer

    rec = json.loads(SAMPLE.read_text().splitlines()[0])
    blocks = [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Weather?"}]
    rec["request"]["messages"][0]["content"] = blocks
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,), rej = _split(path)
    assert rej == []
    user = call.messages[1]
    assert [p.text for p in user.content] == ["<reminder>", "Weather?"]
    r = Renderer.load(None)
    for server, sep in (("vllm", "\n"), ("sglang", " ")):
        r.set_server(server)
        msgs, _, _ = r.normalize(call)
        assert msgs[1]["content"] == f"<reminder>{sep}Weather?"


def test_a_tool_result_s_text_blocks_are_joined_as_the_endpoint_joins_them(tmp_path):
    """vLLM's Messages endpoint sends a ``tool_result`` as one tool message, its text blocks
    joined with a newline (``_convert_user_tool_result``, 0.31 to 0.34); Claude Code's results
    read so too. A system prompt's blocks are joined with nothing between them there."""
    from treeprep.formats.claude_code import FORMAT as CLAUDE_CODE

    rec = json.loads(SAMPLE.read_text().splitlines()[1])
    result = rec["request"]["messages"][2]["content"][0]
    assert result["type"] == "tool_result"
    result["content"] = [{"type": "text", "text": "14°C"}, {"type": "text", "text": "rain"}]
    rec["request"]["system"] = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,), rej = _split(path)
    assert rej == [] and call.messages[0].content == "AB"
    assert [m.content for m in call.messages if m.role == "tool"][0] == "14°C\nrain"

    blocks = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    lines = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s",
         "message": {"role": "user", "content": "Go."}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "s",
         "message": {"id": "m1", "role": "assistant", "content": [
             {"type": "tool_use", "id": "t1", "name": "Task", "input": {"p": "x"}}]}},
        {"type": "user", "uuid": "u2", "parentUuid": "a1", "sessionId": "s", "message": {
            "role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": blocks}]}},
        {"type": "assistant", "uuid": "a2", "parentUuid": "u2", "sessionId": "s",
         "message": {"id": "m2", "role": "assistant", "content": [
             {"type": "text", "text": "Done."}]}},
    ]  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    calls = [i for i in CLAUDE_CODE.read(str(path), ReadOptions()) if isinstance(i, ChatCall)]
    assert [m.content for m in calls[-1].messages if m.role == "tool"] == ["one\ntwo"]


def test_claude_code_s_attribution_block_is_left_out_as_the_endpoint_does(tmp_path):
    """Claude Code (2.1.x) sends ``x-anthropic-billing-header: ...; cch=<hash>;`` as its first
    system block; vLLM's Messages endpoint leaves such blocks out (``_convert_system_message``),
    so two calls of a session share their system prompt again."""
    lines = SAMPLE.read_text().splitlines()[:2]
    recs = [json.loads(x) for x in lines]
    for k, rec in enumerate(recs):
        rec["request"]["system"] = [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.90; cch={k}a;"},
            {"type": "text", "text": "You are Claude Code."},
        ]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    calls, rej = _split(path)
    assert rej == [] and [c.messages[0].content for c in calls] == ["You are Claude Code."] * 2


def test_an_assistant_s_text_blocks_stay_parts_for_the_server_to_join(tmp_path):
    """A Messages endpoint hands an assistant turn's several text blocks on as parts (vLLM's
    ``_convert_message_content``), which the server joins as it joins any message's; the
    completion is one reply, its blocks joined with nothing between them."""
    from treeprep.render import Renderer

    rec = json.loads(SAMPLE.read_text().splitlines()[1])
    blocks = [{"type": "text", "text": "Checking."}, {"type": "text", "text": "Both now."}]
    prior = rec["request"]["messages"][1]
    assert prior["role"] == "assistant"
    prior["content"] = blocks + [b for b in prior["content"] if b["type"] == "tool_use"]
    rec["response"]["content"] = [*blocks, {"type": "text", "text": "!"}]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,), rej = _split(path)
    assert rej == []
    r = Renderer.load(None)
    for server, sep in (("vllm", "\n"), ("sglang", " ")):
        r.set_server(server)
        msgs, comp, _ = r.normalize(call)
        assert msgs[2]["content"] == f"Checking.{sep}Both now."
        assert comp["content"] == "Checking.Both now.!"


def test_blocks_convert_as_the_endpoint_converts_them(tmp_path):
    """vLLM's Messages endpoint (``_convert_block``, 0.34) skips empty text blocks and empty
    thinking, and joins an assistant's thinking blocks with nothing: an empty block between two
    texts leaves them two parts, one beside an empty block is the content alone."""
    rec = json.loads(SAMPLE.read_text().splitlines()[1])
    prior = rec["request"]["messages"][1]
    calls = [b for b in prior["content"] if b["type"] == "tool_use"]
    prior["content"] = [
        {"type": "thinking", "thinking": "First, "}, {"type": "thinking", "thinking": ""},
        {"type": "text", "text": ""}, {"type": "text", "text": "Checking."},
        {"type": "thinking", "thinking": "then more."}, *calls,
    ]  # fmt: skip
    rec["request"]["messages"].append(
        {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "Go"}]}
    )
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,), rej = _split(path)
    assert rej == []
    assistant = call.messages[2]
    assert (assistant.content, assistant.reasoning_content) == ("Checking.", "First, then more.")
    assert call.messages[-1].role == "user" and call.messages[-1].content == "Go"


def test_the_request_s_effort_and_template_kwargs_are_the_call_s(tmp_path):
    """vLLM's endpoint hands ``output_config.effort`` on as the reasoning effort and
    ``chat_template_kwargs`` as they are; either of the wrong type is a reject naming it."""
    rec = json.loads(SAMPLE.read_text().splitlines()[0])
    rec["request"]["output_config"] = {"effort": "high"}
    rec["request"]["chat_template_kwargs"] = {"enable_thinking": False}
    bad = [json.loads(json.dumps(rec)) for _ in range(3)]
    bad[0]["request"]["output_config"] = {"effort": 2}
    bad[1]["request"]["output_config"] = "high"
    bad[2]["request"]["chat_template_kwargs"] = ["x"]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [rec, *bad]))
    (call,), rej = _split(path)
    assert (call.reasoning_effort, call.chat_template_kwargs) == (
        "high",
        {"enable_thinking": False},
    )
    assert [r.reason for r in rej] == [
        "request.output_config.effort: expected a string, got int",
        "request.output_config: expected an object, got string",
        "request.chat_template_kwargs: expected an object, got array",
    ]


#: a template that reads the effort and takes one it does not know for ``max`` (as GLM-5.3's
#: does, per vLLM's resolver), or that reads whether thinking is on
_EFFORT_TEMPLATE = (
    "{% set e = reasoning_effort if reasoning_effort in ['low', 'medium', 'high', 'xhigh'] "
    "else 'max' %}{% for m in messages %}{% if m.role == 'assistant' %}effort={{ e }}|{% endif %}"
    "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}effort={{ e }}|"
    "{% endif %}"
)
_THINKING_TEMPLATE = _EFFORT_TEMPLATE.replace(
    "effort={{ e }}", "thinking={{ enable_thinking }}"
).replace("{% set e = reasoning_effort if reasoning_effort in ['low', 'medium', 'high', "
          "'xhigh'] else 'max' %}", "")  # fmt: skip


def test_thinking_turned_off_is_the_effort_vllm_s_endpoint_probes_for(tmp_path):
    """``thinking: {type: disabled}`` (or ``between_tools``) is sent by vLLM's Messages endpoint
    as ``none``, unless the template renders ``none`` as it renders an effort, then ``low``
    (``DisabledThinkingEffortResolver``, 0.34); it wins over ``output_config.effort``."""
    from treeprep.render import Renderer

    rec = json.loads(SAMPLE.read_text().splitlines()[0])
    rec["response"]["content"] = [{"type": "text", "text": "Done."}]  # the templates show text
    rec["request"]["thinking"] = {"type": "disabled"}
    rec["request"]["output_config"] = {"effort": "high"}
    on = json.loads(json.dumps(rec))
    on["request"]["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    bad = json.loads(json.dumps(rec))
    bad["request"]["thinking"] = "off"
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (rec, on, bad)))
    (off, kept), rej = _split(path)
    assert (off.thinking_disabled, kept.thinking_disabled) == (True, False)
    assert [r.reason for r in rej] == ["request.thinking: expected an object, got string"]
    cases = ((_EFFORT_TEMPLATE, "effort=low|", "effort=high|"),
             (_THINKING_TEMPLATE, "thinking=False|", "thinking=True|"))  # fmt: skip
    for source, said, asked in cases:
        (tmp_path / "t.jinja").write_text(source)
        r = Renderer.load(None, chat_template=tmp_path / "t.jinja")
        for call, want in ((off, said), (kept, asked)):
            seq = r.render(call, group_id="g")
            assert r.decode(seq.tokens[: seq.loss_spans[-1][0]]).endswith(want)


_BILLING = "x-anthropic-billing-header: cc_version=2.1.90; cch=1a2b3;"


def _with_inline_system(tmp_path):
    """The sample's first call with Claude Code's attribution block and two inline system
    messages (per-turn reminders), one of them a string, one of blocks."""
    rec = json.loads(SAMPLE.read_text().splitlines()[0])
    rec["response"]["content"] = [{"type": "text", "text": "Done."}]  # the templates show text
    req = rec["request"]
    req["system"] = [{"type": "text", "text": _BILLING}, {"type": "text", "text": "You are CC."}]
    req["messages"][1:1] = [{"role": "system", "content": "<reminder A>"}]
    req["messages"].append({"role": "system", "content": [
        {"type": "text", "text": _BILLING}, {"type": "text", "text": "B1"},
        {"type": "text", "text": ""}, {"type": "text", "text": "B2"}]})  # fmt: skip
    req["messages"].append({"role": "system", "content": _BILLING})  # nothing left of it
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return path, [m["role"] for m in req["messages"] if m["role"] != "system"]


def test_inline_system_messages_are_read_as_vllm_s_endpoint_reads_them(tmp_path):
    """vLLM 0.34's Messages endpoint takes ``system`` messages in ``messages`` (Claude Code's
    per-turn reminders): their text (a string, or the text blocks joined with nothing, the
    attribution block left out; none: no message) stays in place where the template takes a
    system message after the first, and is appended to the leading system prompt, joined with
    nothing, where it does not (``_convert_system_message``, ``_convert_messages``)."""
    path, roles = _with_inline_system(tmp_path)
    (kept,), rej = _split(path)
    assert rej == []
    assert [(m.role, m.content) for m in kept.messages if m.role == "system"] == [
        ("system", "You are CC."), ("system", "<reminder A>"), ("system", "B1B2")]  # fmt: skip
    assert [m.role for m in kept.messages][:3] == ["system", "user", "system"]
    (merged,), rej = _split(path, ReadOptions(merge_inline_system=True))
    assert rej == [] and merged.messages[0].content == "You are CC.<reminder A>B1B2"
    assert [m.role for m in merged.messages[1:]] == roles and "system" not in roles


def test_inline_system_messages_are_read_as_sglang_s_endpoint_reads_them(tmp_path):
    """SGLang 0.5.23's endpoint (``_convert_to_chat_completion_request``) keeps the
    attribution block, joins the system blocks with a newline, and either keeps an inline
    system message in place as it is (its blocks as parts, empty ones too) or, where its probe
    says the template does not show one, appends each stripped, its text blocks joined with a
    newline (``_extract_system_text``)."""
    path, roles = _with_inline_system(tmp_path)
    opts = ReadOptions(server=Server.sglang)
    (kept,), rej = _split(path, opts)
    assert rej == []
    blocks = [{"type": "text", "text": t} for t in (_BILLING, "B1", "", "B2")]
    assert [m.model_dump(exclude_none=True) for m in kept.messages if m.role == "system"] == [
        {"role": "system", "content": f"{_BILLING}\nYou are CC."},
        {"role": "system", "content": "<reminder A>"},
        {"role": "system", "content": blocks},
        {"role": "system", "content": _BILLING},
    ]
    (merged,), rej = _split(path, ReadOptions(server=Server.sglang, merge_inline_system=True))
    assert rej == [] and [m.role for m in merged.messages[1:]] == roles
    assert merged.messages[0].content == "\n".join(
        [_BILLING, "You are CC.", "<reminder A>", _BILLING, "B1", "B2", _BILLING]
    )


def test_a_build_merges_inline_system_messages_where_vllm_s_probe_says(tmp_path):
    """The build asks the renderer's template as vLLM's endpoint asks it: rendered with
    [system, user, system, user] in jinja's own sandbox, a template that fails merges (here by
    calling ``raise_exception``, which that sandbox does not define either)."""
    from treeprep.build import BuildConfig, FileOptions, build
    from treeprep.render import Renderer
    from treeprep.shards import iter_trees

    path, _roles = _with_inline_system(tmp_path)
    decode = Renderer.load(None).decode
    prompts = {}
    for name, guard in (("takes", ""), ("refuses", "{{ raise_exception('first only') }}")):
        t = tmp_path / f"{name}.jinja"
        t.write_text(
            "{% for m in messages %}{% if m.role == 'system' and not loop.first %}" + guard
            + "{% endif %}<{{ m.role }}>{{ m.content if m.content is string else '' }}"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
        )  # fmt: skip
        out = tmp_path / name
        build(BuildConfig(inputs=[str(path)], out=str(out), file=FileOptions(chat_template=str(t))))
        ((seq,),) = [list(tree.iter_sequences()) for tree in iter_trees(str(out))]
        first = seq["loss_mask"].index(1)
        prompts[name] = decode(seq["input_ids"][:first])
    assert prompts["takes"].startswith("<system>You are CC.<user>")
    assert "<system><reminder A>" in prompts["takes"] and prompts["takes"].count("<system>") == 3
    assert prompts["refuses"].startswith("<system>You are CC.<reminder A>B1B2<user>")
    assert prompts["refuses"].count("<system>") == 1


def test_a_tool_result_s_images_are_a_user_message_after_it_as_vllm_sends_them(tmp_path):
    """vLLM's endpoint (``_convert_user_tool_result``, 0.34) makes a result its text blocks'
    ``tool`` message, its ``tool_reference`` items first as parts, then a user message of its
    images: the images are not dropped, and a text-only template cannot render the call."""
    rec = json.loads(SAMPLE.read_text().splitlines()[1])
    turn = rec["request"]["messages"][2]
    image = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    turn["content"][0]["content"] = [
        {"type": "text", "text": "a"}, {"type": "image", "source": image},
        {"type": "text", "text": "b"},
    ]  # fmt: skip
    turn["content"][1]["content"] = [
        {"type": "tool_reference", "tool_name": "grep"}, {"type": "text", "text": "c"},
    ]  # fmt: skip
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (call,), rej = _split(path)
    assert rej == []
    got = [m.model_dump(exclude_none=True) for m in call.messages[3:]]
    first, second = turn["content"][0]["tool_use_id"], turn["content"][1]["tool_use_id"]
    assert got == [
        {"role": "tool", "tool_call_id": first, "content": "a\nb"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        ]},
        {"role": "tool", "tool_call_id": second, "content": [
            {"type": "tool_reference", "name": "grep"}, {"type": "text", "text": "c"},
        ]},
    ]  # fmt: skip


def test_a_tool_s_strict_and_defer_loading_are_handed_on_as_vllm_s_endpoint_does():
    """vLLM's endpoint (0.34, ``_convert_tools``) passes a tool's ``strict`` and
    ``defer_loading`` to its model, which writes them where set."""
    out = convert_tools([{"name": "f", "input_schema": {}, "strict": True, "defer_loading": None}])
    assert out == [
        {"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}
    ]
