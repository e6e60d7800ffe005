"""``--parallel-calls split`` (issue 40 item 6): a turn of parallel tool calls rendered as
consecutive single-call turns, checked with the real gpt-oss tokenizer and its official template
(which renders only the first of parallel calls) against ``apply_chat_template``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from treeprep.errors import RenderError
from treeprep.modes import ParallelCalls
from treeprep.render.parallel import FIRST_ONLY, LATER, SPLIT, UNTRAINED, split_call
from treeprep.schemas import ChatCall

ROOT = Path(__file__).resolve().parents[3]
GPT_OSS = ROOT / ".." / "shared" / "data" / "tokenizers" / "gpt-oss"
needs_gpt_oss = pytest.mark.skipif(not GPT_OSS.is_dir(), reason="../shared/data is absent")

TOOLS = [
    {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
]  # fmt: skip
PROMPT = [
    {"role": "system", "content": "You are a helper."},
    {"role": "user", "content": "Read a.py and b.py."},
]


def _tc(cid: str | None, path: str) -> dict[str, Any]:
    args = {"path": path}
    return {"id": cid, "type": "function", "function": {"name": "read", "arguments": args}}


def _turn(*calls: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls), **kw}


def _result(cid: str | None, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": text}


PARALLEL = _turn(_tc("c1", "a.py"), _tc("c2", "b.py"), reasoning_content="Both files.")
RESULTS = [_result("c2", "B = 2"), _result("c1", "A = 1")]  # answered out of order
FINAL = {"role": "assistant", "content": "a.py sets A, b.py sets B."}


def _calls() -> tuple[ChatCall, ChatCall]:
    first = ChatCall(call_id="s#0", messages=PROMPT, completion=PARALLEL, tools=TOOLS)
    second = ChatCall(
        call_id="s#1", messages=[*PROMPT, PARALLEL, *RESULTS], completion=FINAL, tools=TOOLS
    )
    return first, second


def _dump(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def test_split_matches_results_by_id_and_keeps_text_and_reasoning_on_the_first() -> None:
    first, second = _calls()
    split, later = split_call(second)
    a1 = _turn(_tc("c1", "a.py"), reasoning_content="Both files.")
    a2 = _turn(_tc("c2", "b.py"))
    assert [m.model_dump(exclude_none=True) for m in split.messages] == [
        *PROMPT,
        {k: v for k, v in a1.items() if v is not None},
        _result("c1", "A = 1"),
        {k: v for k, v in a2.items() if v is not None},
        _result("c2", "B = 2"),
    ]
    assert later == [4]  # the second sub-turn of the previous call's completion
    cut, none = split_call(first)
    assert none == [] and [tc.id for tc in cut.completion.tool_calls or []] == ["c1"]
    assert cut.completion.reasoning_content == "Both files."


def test_results_without_ids_pair_by_position_and_unmatched_turns_stay() -> None:
    turn = _turn(_tc(None, "a.py"), _tc(None, "b.py"))
    rec = ChatCall(
        call_id="x", messages=[*PROMPT, turn, _result(None, "A"), _result(None, "B")],
        completion=FINAL,
    )  # fmt: skip
    split, later = split_call(rec)
    assert [m.role for m in split.messages[2:]] == ["assistant", "tool", "assistant", "tool"]
    assert split.messages[5].content == "B" and later == [4]
    lost = ChatCall(call_id="y", messages=[*PROMPT, PARALLEL, RESULTS[0]], completion=FINAL)
    assert split_call(lost) == (lost, [])  # c1 has no result: left as logged


@pytest.fixture(scope="module")
def gpt_oss() -> Any:
    from treeprep.render import Renderer

    return Renderer.load(str(GPT_OSS), server="llama.cpp")


@needs_gpt_oss
def test_gpt_oss_refuses_parallel_calls_pointing_to_the_split(gpt_oss: Any) -> None:
    r = gpt_oss
    r.parallel_calls = ParallelCalls.off
    with pytest.raises(RenderError, match=r"tool call 2 of 2 .* or --parallel-calls split"):
        r.render(_calls()[0], group_id="g")


@needs_gpt_oss
def test_split_calls_render_as_apply_chat_template_gpt_oss(
    gpt_oss: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.utils import chat_template_utils as ctu

    from tests.treeprep.render.hf_reference import hf_tokenizer
    from treeprep.render.dates import DEFAULT_DATE

    class _Fixed(ctu.datetime):  # type: ignore[misc, name-defined]
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return DEFAULT_DATE  # the reference's strftime_now at the renderer's fixed date

    monkeypatch.setattr(ctu, "datetime", _Fixed)

    r = gpt_oss
    r.parallel_calls = ParallelCalls.split_turns
    hf = hf_tokenizer(r)
    kw: dict[str, Any] = {"tools": TOOLS, "tokenize": True, "return_dict": False}

    def tokens(msgs: list[dict[str, Any]], gen: bool = False) -> list[int]:
        # the template reads content always, and the reasoning as ``thinking``
        sent = [{"content": "", **m, "thinking": m.get("reasoning_content")} for m in msgs]
        return list(hf.apply_chat_template(sent, add_generation_prompt=gen, **kw))

    first, second = _calls()
    seq = r.render(first, group_id="g")
    assert r.last_rewrites == {SPLIT: 1}
    head, full = tokens(PROMPT, gen=True), tokens([*PROMPT, r.normalize(split_call(first)[0])[1]])
    assert seq.tokens.tolist() == full and seq.loss_spans == [(len(head), len(full))]

    seq = r.render(second, group_id="g")
    assert r.last_rewrites == {SPLIT: 1, LATER: 1}
    msgs = r.normalize(split_call(second)[0])[0]
    assert [m["role"] for m in msgs[2:]] == ["assistant", "tool", "assistant", "tool"]
    # the prompt as apply_chat_template renders it; gpt-oss drops the history's reasoning before
    # a final answer, which is rendered after its prompt (history-kept: treeprep.render.prompted)
    head = tokens(msgs, gen=True)
    assert seq.tokens.tolist()[: len(head)] == head
    assert r.decode(seq.tokens[len(head) :]).endswith("a.py sets A, b.py sets B.<|return|>")
    # call 2 of the parallel turn, trained as the call it would have been on its own
    b_head, b_full = tokens(msgs[:4], gen=True), tokens(msgs[:5])
    assert head[: len(b_full)] == b_full and b_full[: len(b_head)] == b_head
    assert seq.loss_spans == [(len(b_head), len(b_full)), (len(head), len(seq.tokens))]
    assert "b.py" in r.decode(seq.tokens[len(b_head) : len(b_full)])


@needs_gpt_oss
def test_a_later_call_that_does_not_read_back_is_not_trained(gpt_oss: Any) -> None:
    """Call 2 of the parallel turn with arguments that are a JSON string, not an object
    (llama.cpp parses them for gpt-oss's template and refuses text that is not JSON): the
    template shows them, so the coverage check passes, but its response parser cannot read them
    back as the call: that sub-turn is counted untrained, and the call's own completion still
    trains."""
    r = gpt_oss
    r.parallel_calls = ParallelCalls.split_turns
    assert r.response_parser is not None
    args = '"b.py"'
    freeform = {"id": "c2", "type": "function", "function": {"name": "read", "arguments": args}}
    parallel = _turn(_tc("c1", "a.py"), freeform, reasoning_content="Both files.")
    second = ChatCall(
        call_id="s#1", messages=[*PROMPT, parallel, *RESULTS], completion=FINAL, tools=TOOLS
    )
    seq = r.render(second, group_id="g")
    assert r.last_rewrites == {SPLIT: 1, UNTRAINED: 1}
    assert len(seq.loss_spans) == 1
    assert r.decode(seq.tokens[seq.loss_spans[0][0] :]).endswith("sets B.<|return|>")
    # the same turn with call 2's arguments as an object reads back, and is trained
    assert r.render(_calls()[1], group_id="g") and r.last_rewrites == {SPLIT: 1, LATER: 1}


def test_build_counts_the_split_and_stats_shows_it(tmp_path: Path) -> None:
    """The built-in tokenizer's template shows parallel calls; split is done when asked anyway,
    and counted (the gpt-oss renders are checked above)."""
    from treeprep.cli.app import app

    conv = {"messages": [*PROMPT, PARALLEL, *RESULTS, FINAL], "tools": TOOLS}
    (tmp_path / "chat.jsonl").write_text(json.dumps(conv) + "\n")
    run = CliRunner()
    args = ["build", str(tmp_path / "chat.jsonl"), "--json", "--workers", "1"]
    res = run.invoke(app, [*args, "-o", str(tmp_path / "split"), "--parallel-calls", "split"])
    assert res.exit_code == 0, res.output
    counts = json.loads(res.stdout)
    assert (counts["records_in_trees"], counts["records_rejected"]) == (2, 0)
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert manifest["curation"] == {LATER: 1, SPLIT: 2}
    res = run.invoke(app, ["stats", str(tmp_path / "split")])
    assert res.exit_code == 0, res.output
    assert "parallel-calls:split" in res.stdout and "parallel-calls:later-call" in res.stdout
    res = run.invoke(app, [*args, "-o", str(tmp_path / "off")])
    assert json.loads(res.stdout)["records_in_trees"] == 2
    assert "curation" not in json.loads((tmp_path / "off" / "manifest.json").read_text())
    # the log ends on the parallel turn: no later call answers call 2, which is counted
    cut = {"messages": [*PROMPT, PARALLEL], "tools": TOOLS}
    (tmp_path / "chat.jsonl").write_text(json.dumps(cut) + "\n")
    res = run.invoke(app, [*args, "-o", str(tmp_path / "cut"), "--parallel-calls", "split"])
    manifest = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert manifest["curation"] == {FIRST_ONLY: 1, SPLIT: 1}
