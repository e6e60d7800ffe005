"""claude-code adapter: real sessions (skipped without ../shared), our sample, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import detect_format
from treeprep.formats.base import ReadOptions
from treeprep.formats.claude_code import FORMAT, read
from treeprep.modes import Server
from treeprep.schemas import ChatCall, Reject

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
CC = DATA / "logs" / "claude-code"
SESSION = "258c7280-ae70-4798-800f-63464d01a85d"
SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "claude-code"
SAMPLE_SESSION = "7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b"
real = pytest.mark.skipif(not CC.is_dir(), reason="../shared/data is absent")


def _split(path: Path, opts: ReadOptions | None = None) -> tuple[list[ChatCall], list[Reject]]:
    items = list(read(str(path), opts or ReadOptions()))
    return (
        [i for i in items if isinstance(i, ChatCall)],
        [i for i in items if isinstance(i, Reject)],
    )


@real
def test_real_main_session_merges_responses_by_message_id():
    calls, rejects = _split(CC / f"{SESSION}.jsonl")
    assert rejects == []
    assert len(calls) == 152  # 299 assistant lines = 152 API responses
    assert {c.group_id for c in calls} == {SESSION}
    assert {c.agent_id for c in calls} == {"main"}
    assert sum(len(c.completion.tool_calls or []) > 1 for c in calls) == 22  # parallel tool calls
    assert all(c.provenance.reconstructed and not c.provenance.exact_messages for c in calls)
    # every call continues the previous one exactly, except the first after the compaction; a
    # reply with a text block of whitespace alone is sent again without it (Claude Code's merge
    # of a response's lines)
    resent = 0
    for a, b in zip(calls, calls[1:], strict=False):
        ext = a.messages + [a.completion]
        if b.branch_reason == "compaction":
            assert b.messages[0].text().startswith("This session is being continued")
            assert len(b.messages) == 1 and b.source_line == 1261
        elif b.messages[: len(ext)] != ext:
            assert b.messages[: len(ext)] == [*a.messages, _as_sent(a.completion)]
            resent += 1
    assert [c.branch_reason for c in calls].count("compaction") == 1
    assert resent == 9


def _as_sent(m: Any) -> Any:
    """A reply as Claude Code sends it again: its text of whitespace alone left out where a
    call or other text remains (the reader's completion holds one text as a string)."""
    parts = [m.content] if isinstance(m.content, str) else list(m.content or [])
    texts = [p if isinstance(p, str) else p.text for p in parts]
    kept = [p for p, t in zip(parts, texts, strict=True) if not (t and not t.strip())]
    if not kept and not m.tool_calls:
        return m  # only thinking would remain: sent as it is
    if not kept:
        return m.model_copy(update={"content": None})
    one = len(kept) == 1
    first = kept[0] if isinstance(kept[0], str) else kept[0].text
    return m.model_copy(update={"content": first if one else kept})


@real
def test_real_subagent_and_compaction_files_join_the_session_tree():
    main, _ = _split(CC / f"{SESSION}.jsonl")
    sub, rej = _split(CC / SESSION / "subagents" / "agent-a881341.jsonl")
    assert rej == [] and len(sub) == 3
    assert {c.agent_id for c in sub} == {"a881341"} and {c.group_id for c in sub} == {SESSION}
    assert {c.branch_reason for c in sub} == {"sub-agent"}
    task_call = next(c for c in main if c.call_id == sub[0].parent_call_id)
    assert any(
        tc.function.name == "Task" and tc.id == "toolu_01VmaERAwhb19LGUwu9GenaK"
        for tc in task_call.completion.tool_calls or []
    )
    comp, rej = _split(CC / SESSION / "subagents" / "agent-acompact-fffbd0.jsonl")
    assert rej == [] and len(comp) == 1
    c = comp[0]
    assert c.branch_reason == "compaction" and c.group_id == SESSION
    assert c.agent_id == "acompact-fffbd0"
    pre = next(x for x in main if x.call_id == c.parent_call_id)
    ext = pre.messages + [pre.completion]
    assert c.messages[: len(ext)] == ext  # the summariser continues the pre-compaction prefix
    assert c.messages[-1].text().startswith("Your task is to create a detailed summary")


@real
@pytest.mark.parametrize(
    ("name", "n_calls"), [("short.jsonl", 1), ("subagent.jsonl", 12), ("tool_heavy.jsonl", 4)]
)
def test_real_short_sessions(name, n_calls):
    path = CC / name
    assert detect_format(str(path), path.read_bytes()[:65536]) is FORMAT
    calls, rejects = _split(path)
    assert rejects == [] and len(calls) == n_calls


def test_sample_session_with_subagent_and_compaction():
    calls, rej = _split(SAMPLE / f"{SAMPLE_SESSION}.jsonl")
    assert rej == []
    assert [c.call_id for c in calls] == ["msg_A1", "msg_A2", "msg_A3", "msg_A4", "msg_A5"]
    a1 = calls[0]
    assert a1.completion.reasoning_content.startswith("I should look")
    assert [tc.id for tc in a1.completion.tool_calls] == ["toolu_R1", "toolu_R2"]
    # both parallel results follow the response, the off-chain one included
    a2 = calls[1]
    assert [m.role for m in a2.messages] == ["user", "assistant", "tool", "tool"]
    assert [m.tool_call_id for m in a2.messages[2:]] == ["toolu_R1", "toolu_R2"]
    a3 = calls[2]
    assert a3.messages[-1].role == "user" and "system-reminder" in a3.messages[-1].text()
    assert calls[3].branch_reason == "compaction" and len(calls[3].messages) == 1
    assert calls[4].branch_reason is None
    sub, rej = _split(SAMPLE / SAMPLE_SESSION / "subagents" / "agent-b5e71c2.jsonl")
    assert rej == [] and [c.parent_call_id for c in sub] == ["msg_A2", "msg_S1"]
    comp, rej = _split(SAMPLE / SAMPLE_SESSION / "subagents" / "agent-acompact-9d1e.jsonl")
    assert rej == [] and comp[0].parent_call_id == "msg_A3"
    ext = calls[2].messages + [calls[2].completion]
    assert comp[0].messages[: len(ext)] == ext
    assert comp[0].messages[len(ext)].role == "tool"


def test_system_prompt_and_tools_options():
    tools = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
    calls, _ = _split(
        SAMPLE / f"{SAMPLE_SESSION}.jsonl",
        ReadOptions(system_prompt="You are Claude.", tools=tools),
    )
    assert all(c.messages[0].role == "system" and c.tools == tools for c in calls)
    assert calls[0].messages[0].content == "You are Claude."


# ---- bad input ------------------------------------------------------------------------------


def _line(uuid, parent, type_, content, mid=None, **kw):
    d = {
        "parentUuid": parent,
        "isSidechain": False,
        "sessionId": "s-bad",
        "version": "1.0.98",
        "type": type_,
        "uuid": uuid,
        **kw,
    }
    if type_ == "assistant":
        d["message"] = {"id": mid, "role": "assistant", "model": "m", "content": content}
    else:
        d["message"] = {"role": "user", "content": content}
    return d


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _text(t):
    return [{"type": "text", "text": t}]


def test_broken_chain_and_cycle_reject_only_their_calls(tmp_path):
    p = _write(
        tmp_path / "bad.jsonl",
        [
            _line("u1", None, "user", "hi"),
            _line("a1", "u1", "assistant", _text("hello"), "m1"),
            _line("u2", "a1", "user", "more"),
            _line("a2", "u2", "assistant", _text("ok"), "m2"),
            _line("u3", "nowhere", "user", "lost"),  # broken chain (line 5)
            _line("a3", "u3", "assistant", _text("??"), "m3"),
            _line("x1", "x2", "user", "loop"),  # a cycle x1 -> x2 -> x1
            _line("x2", "x1", "user", "loop"),
            _line("a4", "x2", "assistant", _text("!!"), "m4"),
        ],
    )
    calls, rej = _split(p)
    assert [c.call_id for c in calls] == ["m1", "m2"]
    assert [(r.line, r.call_id) for r in rej] == [(6, "m3"), (9, "m4")]
    assert "broken parent chain: parentUuid nowhere (from line 5)" in rej[0].reason
    assert "cycle in parentUuid" in rej[1].reason
    assert all(r.file == str(p) and r.format == "claude-code" for r in rej)


def test_orphan_tool_result_is_one_reject_and_left_out(tmp_path):
    p = _write(
        tmp_path / "orphan.jsonl",
        [
            _line("u1", None, "user", "hi"),
            _line("a1", "u1", "assistant", _text("hello"), "m1"),
            _line(
                "u2",
                "a1",
                "user",
                [{"type": "tool_result", "tool_use_id": "toolu_gone", "content": "?"}],
            ),
            _line("u3", "u2", "user", "go on"),
            _line("a2", "u3", "assistant", _text("ok"), "m2"),
        ],
    )
    calls, rej = _split(p)
    assert [c.call_id for c in calls] == ["m1", "m2"]
    assert [m.role for m in calls[1].messages] == ["user", "assistant", "user"]
    assert len(rej) == 1 and rej[0].line == 3
    assert "tool_use_id toolu_gone has no matching tool_use" in rej[0].reason


def test_subagent_file_without_parent_session_rejects_each_call(tmp_path):
    d = tmp_path / "sess-x" / "subagents"
    d.mkdir(parents=True)
    lines = [
        _line("s1", None, "user", "look around", agentId="q1", isSidechain=True),
        _line("s2", "s1", "assistant", _text("done"), "ms1", agentId="q1", isSidechain=True),
        "not json",
    ]
    p = d / "agent-q1.jsonl"
    p.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    calls, rej = _split(p)
    assert calls == []
    assert [(r.line, r.call_id) for r in rej] == [(2, "ms1"), (3, None)]
    assert "parent session file s-bad.jsonl is absent" in rej[0].reason
    assert "malformed JSON" in rej[1].reason


def test_sniff_is_specific():
    head = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode() + b"\n"
    assert not FORMAT.sniff("x.jsonl", head)


@real
def test_real_calls_render_with_qwen3():
    render = pytest.importorskip("treeprep.render")
    r = render.Renderer.load(str(DATA / "tokenizers" / "qwen3"))
    calls, _ = _split(CC / "tool_heavy.jsonl")
    sub, _ = _split(CC / SESSION / "subagents" / "agent-a881341.jsonl")
    for i, c in enumerate(calls + sub):
        seq = r.render(c, group_id=c.group_id, order=i)
        assert len(seq.tokens) > 0 and seq.loss_spans
        assert r.decode(seq.tokens).startswith("<|im_start|>user\n")


def test_regression_inline_sidechain_branched_as_unknown(tmp_path):
    """Claude Code < 1.0.x writes a sub-agent's lines inline (``isSidechain: true``)."""
    task = {"type": "tool_use", "id": "tu1", "name": "Task", "input": {"prompt": "find it"}}
    p = _write(
        tmp_path / "old.jsonl",
        [
            _line("u1", None, "user", "find the bug"),
            _line("a1", "u1", "assistant", [task], "m1"),
            _line("s1", None, "user", "find it", isSidechain=True),
            _line("s2", "s1", "assistant", _text("looking"), "ms1", isSidechain=True),
            _line("s3", "s2", "user", "go on", isSidechain=True),
            _line("s4", "s3", "assistant", _text("found it"), "ms2", isSidechain=True),
            _line(
                "u2",
                "a1",
                "user",
                [{"type": "tool_result", "tool_use_id": "tu1", "content": "found it"}],
            ),
            _line("a2", "u2", "assistant", _text("fixed"), "m2"),
        ],
    )
    calls, rej = _split(p)
    assert rej == []
    by_id = {c.call_id: c for c in calls}
    assert [by_id[k].branch_reason for k in ("m1", "ms1", "ms2", "m2")] == [
        None,
        "sub-agent",
        "sub-agent",
        None,
    ]
    assert by_id["ms1"].agent_id == by_id["ms2"].agent_id == "sidechain-s1"
    assert by_id["m1"].agent_id == by_id["m2"].agent_id == "main"
    assert [m.content for m in by_id["ms2"].messages] == ["find it", "looking", "go on"]
    # in the tree the sidechain is its own root, hinted sub-agent rather than unknown
    render = pytest.importorskip("treeprep.render")
    from treeprep.trie import build_tree

    r = render.Renderer.load(None)
    seqs = [r.render(c, group_id="g", order=i) for i, c in enumerate(calls)]
    tree = build_tree(seqs, "g")
    assert "unknown" not in tree.node_branch_reason
    assert "sub-agent" in tree.node_branch_reason


def test_a_history_is_handed_to_every_call_as_the_same_dicts(monkeypatch, tmp_path):
    """Each call replays its thread; the messages of its history are made once per session, so
    a call's prompt holds the very dicts the call before handed over (make_call then knows the
    history by identity, writing no JSON of it)."""
    import treeprep.formats.claude_code as cc

    handed: list[list[dict]] = []
    make_call = cc.make_call

    def capture(fields, **kw):
        handed.append(list(fields["messages"]))
        return make_call(fields, **kw)

    monkeypatch.setattr(cc, "make_call", capture)
    sid = "7e1d2c3b-0a9f-4e8d-b7c6-000000000001"
    head = {"isSidechain": False, "userType": "external", "sessionId": sid, "version": "2.1.39"}
    lines, parent = [], None
    for i in range(6):
        for kind, message in (
            ("user", {"role": "user", "content": f"step {i}"} if i == 0 else {"role": "user",
             "content": [{"type": "tool_result", "tool_use_id": f"t{i - 1}", "content": "ok"}]}),
            ("assistant", {"id": f"m{i}", "role": "assistant", "content": [{"type": "text",
             "text": f"run {i}"}], "model": "claude-opus-4-6"}),
            ("assistant", {"id": f"m{i}", "role": "assistant", "content": [{"type": "tool_use",
             "id": f"t{i}", "name": "Bash", "input": {"command": "ls"}}],
             "model": "claude-opus-4-6"}),
        ):  # fmt: skip
            uuid = f"00000000-0000-4000-8000-{len(lines):012d}"
            lines.append({**head, "parentUuid": parent, "uuid": uuid, "type": kind,
                          "message": message, "timestamp": "2026-01-05T10:00:00.000Z"})  # fmt: skip
            parent = uuid
    path = tmp_path / f"{sid}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    calls, rejects = _split(path)
    assert rejects == [] and len(calls) == 6 and len(handed) == 6
    for before, after in zip(handed, handed[1:], strict=False):
        assert len(after) == len(before) + 2  # the last reply and its tool result
        assert all(a is b for a, b in zip(before, after, strict=False))


def test_a_user_line_of_several_text_blocks_stays_parts(tmp_path):
    """Claude Code sends a user turn's text blocks (a reminder, the prompt) as blocks; a server's
    Messages endpoint makes them text parts, which it joins (``--server``): one block is a
    string, several stay parts."""
    blocks = [*_text("<system-reminder>x</system-reminder>"), *_text("fix it")]
    p = _write(
        tmp_path / "s.jsonl",
        [
            _line("u1", None, "user", blocks),
            _line("a1", "u1", "assistant", _text("done"), "m1"),
            _line("u2", "a1", "user", _text("thanks")),
            _line("a2", "u2", "assistant", _text("ok"), "m2"),
        ],
    )
    calls, rej = _split(p)
    assert rej == [] and len(calls) == 2
    first, reply = calls[1].messages[0], calls[1].messages[2]
    assert [part.text for part in first.content] == [blocks[0]["text"], "fix it"]
    assert reply.content == "thanks"


def _served_session(tmp_path: Path) -> Path:
    """A response of thinking, an empty text block and a tool call (one line each), its result
    of two text blocks, and the response after it."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}}
    texts = [*_text("a"), *_text("b")]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": texts}
    return _write(
        tmp_path / "s.jsonl",
        [
            _line("u1", None, "user", "Hi"),
            _line("a1", "u1", "assistant", [{"type": "thinking", "thinking": "Plan."}], "m1"),
            _line("a2", "a1", "assistant", _text(""), "m1"),
            _line("a3", "a2", "assistant", [use], "m1"),
            _line("u2", "a3", "user", [result]),
            _line("a4", "u2", "assistant", _text("Done."), "m2"),
        ],
    )


BILLING = "x-anthropic-billing-header: cc_version=2.1.39; cch=a5145;You are Claude Code."


@pytest.mark.parametrize(
    ("server", "system", "assistant", "result", "arguments_json"),
    [
        # vLLM 0.34 (_convert_block, _convert_user_tool_result): an empty text block skipped,
        # a result's text blocks joined with a newline, the input written by json.dumps
        ("vllm", BILLING, {}, "a\nb", "python"),
        # llama.cpp (server_chat_convert_anthropic_to_oai): the empty block kept as a part, the
        # result's text blocks joined with nothing, the attribution stamp pinned, the input
        # written by nlohmann's dump()
        ("llama.cpp", BILLING.replace("a5145", "fffff"), {"content": _text("")}, "ab", None),
    ],
    ids=["vllm", "llama.cpp"],
)  # fmt: skip
def test_a_session_s_requests_are_converted_as_the_server_converts_them(
    tmp_path, server, system, assistant, result, arguments_json
):
    """Claude Code sends each request to a server's Messages endpoint, which converts it:
    ``--server`` says whose conversion the prompts are rebuilt with (written out here from
    each server's code, at the versions named)."""
    opts = ReadOptions(server=Server(server), system_prompt=BILLING)
    calls, rej = _split(_served_session(tmp_path), opts)
    assert rej == [] and len(calls) == 2
    got = [m.model_dump(exclude_none=True) for m in calls[1].messages]
    call = {"id": "toolu_1", "type": "function",
            "function": {"name": "Bash", "arguments": {"cmd": "ls"}}}  # fmt: skip
    assert got == [
        {"role": "system", "content": system},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", **assistant, "reasoning_content": "Plan.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": result},
    ]
    assert calls[1].arguments_json == arguments_json


def test_on_sglang_a_response_s_thinking_sent_again_rejects_the_calls_after_it(tmp_path):
    """SGLang's endpoint writes earlier thinking where its --reasoning-parser says, which the
    transcript does not record: the calls whose prompt sends it back are rejected. Without
    thinking, a result's several text blocks stay parts (SGLang joins them with a space)."""
    opts = ReadOptions(server=Server.sglang)
    items = list(read(str(_served_session(tmp_path)), opts))
    assert isinstance(items[0], ChatCall) and isinstance(items[1], Reject)
    assert "earlier thinking" in items[1].reason
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    del lines[1]  # the thinking line
    lines[1]["parentUuid"] = "u1"
    calls, rej = _split(_write(tmp_path / "t.jsonl", lines), opts)
    assert rej == [] and calls[1].messages[-1].model_dump(exclude_none=True) == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": [*_text("a"), *_text("b")],
    }
