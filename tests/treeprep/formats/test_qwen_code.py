"""The ``qwen-code`` reader (treeprep/formats/qwen_code.py): Qwen Code's ``--openai-logging``
files, one call each. The reference for the prompt is the request body Qwen Code logged as it sent
it, rendered by transformers' ``apply_chat_template`` without treeprep's reader in between; the
reference for what a file holds is Qwen Code 0.24.4's ``openaiLogger.ts`` (the sample's shape)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import InputError
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.qwen_code import FORMAT
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "qwen_code"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
S1 = "5b1e9c2a-3f4d-4e6a-8b7c-9d0e1f2a3b4c"
S2 = "c7d8e9f0-1a2b-4c3d-9e4f-5a6b7c8d9e0f"
FILES = sorted(SAMPLE.glob("openai-*.json"))


def _read(path: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(path), opts or ReadOptions()))


def _fmt(path: Path) -> str:
    return detect_format(str(path), read_head(str(path))).name


def _one(path: Path, opts: ReadOptions | None = None) -> ChatCall:
    (item,) = _read(path, opts)
    assert isinstance(item, ChatCall), item
    return item


def test_each_file_is_one_call_of_its_session_and_agent() -> None:
    got = []
    for path in FILES:
        (item,) = _read(path)
        if isinstance(item, Reject):
            got.append(("reject", item.reason))
        else:
            got.append((item.group_id, item.agent_id, item.branch_reason, item.call_id))
    sub = "general-purpose-7e8f9a0b"
    assert got == [
        (S1, "main", None, "chatcmpl-5f0a1b2c-0001"),
        (S1, "main", None, "chatcmpl-5f0a1b2c-0002"),
        (S1, sub, "sub-agent", "chatcmpl-5f0a1b2c-010"),  # round 0 of the sub-agent
        (S1, sub, None, "chatcmpl-5f0a1b2c-011"),
        ("reject", "the call failed and no response was logged (error: '429 Requests rate limit "
         "exceeded, please try again later.'); a retry is its own file"),
        (S1, "main", None, "chatcmpl-5f0a1b2c-0003"),
        # /compress: no session in its context, DashScope's request metadata names it
        (S1, "main", "compaction", "chatcmpl-5f0a1b2c-0004"),
        (S2, "main", None, "chatcmpl-0c1d2e3f4a5b6c7d"),
        (S2, "main", None, "chatcmpl-1d2e3f4a5b6c7d8e"),
    ]  # fmt: skip


def test_the_completion_is_the_logged_response_and_the_prompt_the_request() -> None:
    call = _one(FILES[1])
    doc = json.loads(FILES[1].read_text())
    assert [m.role for m in call.messages] == [
        "system", "user", "assistant", "user", "assistant", "tool"
    ]  # fmt: skip
    # the system message's one part (DashScope's cache mark beside it) is its text
    assert call.messages[0].text() == doc["request"]["messages"][0]["content"][0]["text"]
    # the earlier turn as sent back: its reasoning and its call, arguments as Qwen Code wrote them
    turn = call.messages[4]
    assert turn.reasoning_content == "The total is computed in shop/cart.py. Read it first."
    assert turn.tool_calls and turn.tool_calls[0].function.arguments == (
        '{"absolute_path":"/home/dev/shop/shop/cart.py"}'
    )
    comp = doc["response"]["choices"][0]["message"]
    assert call.completion.reasoning_content == comp["reasoning_content"]
    assert call.completion.content is None and call.completion.tool_calls
    assert call.completion.tool_calls[0].function.name == "task"
    assert call.model == "qwen3-coder-plus" and call.timestamp == "2026-11-20T09:00:09.481Z"
    # the default provider mirrors reasoning into ``reasoning``: one field, read once
    later = _one(FILES[-1])
    assert later.messages[4].reasoning_content == "Search for where discount is used."
    assert all(c.tools for c in map(_one, (FILES[0], FILES[-1])))
    assert not any("cache_control" in t for t in _one(FILES[0]).tools or [])


def _flat(m: dict[str, Any]) -> dict[str, Any]:
    """The reference's own flattening of a logged message for the template, as an OpenAI-style
    server does before it renders: its one text part as the content (the sample's messages hold
    one part each, asserted, so no join is at stake), ``null`` content as ``""``."""
    c = m.get("content")
    if isinstance(c, list):
        assert len(c) == 1 and c[0]["type"] == "text", m
        return {**m, "content": c[0]["text"]}
    return {**m, "content": "" if c is None else c}


@needs_qwen
@pytest.mark.parametrize("path", FILES, ids=[p.name[30:48] for p in FILES])
def test_renders_as_apply_chat_template_of_the_logged_request(path: Path) -> None:
    """Regression for the reader, not only the renderer: the reference is the raw file, so a
    DashScope cache mark kept on a tool schema (the template would print it) or a lost message
    fails here."""
    from tests.treeprep.render.hf_reference import hf_convention, hf_tokenizer
    from treeprep.render import Renderer

    doc = json.loads(path.read_text())
    if doc["response"] is None:
        pytest.skip("a failed attempt: no call")
    r = Renderer.load(str(QWEN3))
    hf = hf_tokenizer(r)
    req = doc["request"]
    msgs = hf_convention([_flat(m) for m in req["messages"]])
    comp = hf_convention([_flat(doc["response"]["choices"][0]["message"])])[0]
    tools = [{"type": t["type"], "function": t["function"]} for t in req.get("tools", [])] or None
    kw = {"tools": tools, "tokenize": True, "return_dict": False}
    full = list(hf.apply_chat_template([*msgs, comp], **kw))
    head = list(hf.apply_chat_template(msgs, add_generation_prompt=True, **kw))
    seq = r.render(_one(path), group_id="g")
    assert seq.tokens.tolist() == full and seq.loss_spans == [(len(head), len(full))]


def test_build_makes_a_tree_per_session(tmp_path: Path) -> None:
    from treeprep.stats import collect, summarize

    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "out")))
    c = m.counts
    # the session file in chats/ is refused: one reject
    assert (c.records_read, c.records_in_trees, c.records_rejected, c.trees) == (10, 8, 2, 2)
    reasons = summarize(collect(str(tmp_path / "out")))["by_branch_reason"]
    assert {k: v["branches"] for k, v in reasons.items()} == {"sub-agent": 1, "compaction": 1}


def test_a_request_rebuilt_for_the_log_is_marked_reconstructed(tmp_path: Path) -> None:
    """Qwen Code on Anthropic, Gemini or the Responses API logs a chat body it rebuilds for the
    log, without ``stream``; the OpenAI pipeline always sets it."""
    doc = json.loads(FILES[0].read_text())
    assert _one(FILES[0]).provenance.reconstructed is False
    for k in ("stream", "stream_options", "metadata", "preserve_thinking", "enable_thinking"):
        doc["request"].pop(k)
    path = tmp_path / FILES[0].name
    path.write_text(json.dumps(doc, indent=2))
    p = _one(path).provenance
    assert p.reconstructed and not p.exact_messages


def test_group_is_the_session_else_the_folder(tmp_path: Path) -> None:
    doc = json.loads(FILES[-1].read_text())
    path = tmp_path / FILES[-1].name
    del doc["context"]["sessionId"]
    path.write_text(json.dumps(doc))
    assert _one(path).group_id is None  # the build groups it by folder (group_by_folder)
    assert FORMAT.group_by_folder
    doc["context"] = None  # 0.15 writes no context: the main session's agent
    path.write_text(json.dumps(doc))
    assert (_one(path).group_id, _one(path).agent_id) == (None, "main")
    assert _one(path, ReadOptions(group_by="system.hostname")).group_id == "devbox"


def test_detected_by_name_and_opening_or_by_content(tmp_path: Path) -> None:
    assert {_fmt(p) for p in FILES} == {"qwen-code"}
    # a renamed copy: its whole record is in the head
    renamed = tmp_path / "call-1.json"
    shutil.copy(FILES[0], renamed)
    assert _fmt(renamed) == "qwen-code"
    # a request longer than the head (a logged image): the name and the opening decide
    doc = json.loads(FILES[0].read_text())
    doc["request"]["messages"][3]["content"].append(
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 200_000}}
    )
    big = tmp_path / FILES[0].name
    big.write_text(json.dumps(doc, indent=2))
    assert _fmt(big) == "qwen-code"
    # renamed too: the skeleton of the whole record (treeprep.formats._sniff) has its keys
    big.rename(tmp_path / "call-2.json")
    assert _fmt(tmp_path / "call-2.json") == "qwen-code"
    # a LiteLLM per-call log stays openai-chat-json
    litellm = next((ROOT / "sample_data" / "litellm").glob("*.json"))
    assert _fmt(litellm) == "openai-chat-json"


def _chat_session(path: Path) -> Path:
    """A Qwen Code session file (0.24's ``ChatRecord``: Claude Code's envelope, Gemini parts)."""
    env = {"sessionId": S1, "cwd": "/home/dev/shop", "version": "0.24.4", "gitBranch": "main"}
    recs = [
        {"uuid": "u1", "parentUuid": None, "type": "user",
         "message": {"role": "user", "parts": [{"text": "Fix the cart total."}]}, **env},
        {"uuid": "u2", "parentUuid": "u1", "type": "assistant", "model": "qwen3-coder-plus",
         "message": {"role": "model", "parts": [{"text": "Done."}]}, **env},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_a_session_file_is_refused_with_the_way_to_exact_logs(tmp_path: Path) -> None:
    """Regression: Qwen Code's session files were read as Claude Code's (the same envelope),
    whose reader found no response id in them: no call and no reject, silently."""
    from treeprep.formats import get_format

    path = _chat_session(tmp_path / "session.jsonl")
    assert _fmt(path) == "qwen-code-chat"
    assert _fmt(next((SAMPLE / "chats").glob("*.jsonl"))) == "qwen-code-chat"
    with pytest.raises(InputError) as e:
        list(get_format("qwen-code-chat").read(str(path), ReadOptions()))
    assert "--openai-logging" in e.value.reason and e.value.line == 1
    # read as Claude Code's anyway, its reply is a reject naming the missing id
    (rej,) = get_format("claude-code").read(str(path), ReadOptions())
    assert isinstance(rej, Reject) and rej.line == 2
    assert rej.reason == "message.id: expected a string, got null"
