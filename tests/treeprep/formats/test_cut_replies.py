"""A reply the model did not end (the token limit, a filter, a paused turn) is no completion: the
chat template writes an end of turn after it that the model never said
(``treeprep.formats._fields.cut_reason``). Each API logs it its own way; each reader that sees
it rejects the call, and the reply still stands in the prompts after it where the agent sends it
back."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.treeprep.formats import sqlite_samples
from treeprep.formats import ReadOptions, get_format
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data"


def _items(fmt: str, path: Path) -> list[Any]:
    return list(get_format(fmt).read(str(path), ReadOptions()))


def _chat(finish: str) -> dict[str, Any]:
    msg = {"role": "assistant", "content": "The answer is"}
    return {
        "messages": [{"role": "user", "content": "What is 6 x 7?"}],
        "response": {"choices": [{"index": 0, "message": msg, "finish_reason": finish}]},
    }


@pytest.mark.parametrize(
    ("finish", "cut"), [("stop", False), ("tool_calls", False), ("length", True),
                        ("content_filter", True)]
)  # fmt: skip
def test_openai_chat(tmp_path: Path, finish: str, cut: bool) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps(_chat(finish)) + "\n")
    (item,) = _items("openai-chat", path)
    assert isinstance(item, Reject) is cut
    if cut:
        assert item.reason == (
            f"response.choices[0].finish_reason '{finish}': the reply was cut before the model "
            "ended its turn (the end of turn a template writes after it was never said)"
        )


def test_qwen_code(tmp_path: Path) -> None:
    """Qwen Code reports a reply cut by the token limit (or its tool call's JSON cut short,
    which it then repairs) as ``length``."""
    src = sorted((SAMPLES / "qwen_code").glob("openai-*.json"))[-1]
    doc = json.loads(src.read_text())
    doc["response"]["choices"][0]["finish_reason"] = "length"
    path = tmp_path / src.name
    path.write_text(json.dumps(doc, indent=2))
    (item,) = _items("qwen-code", path)
    assert isinstance(item, Reject) and "finish_reason 'length'" in item.reason


@pytest.mark.parametrize("stop", ["end_turn", "tool_use", "max_tokens", "pause_turn", "refusal"])
def test_anthropic(tmp_path: Path, stop: str) -> None:
    rec = {
        "request": {"messages": [{"role": "user", "content": "What is 6 x 7?"}]},
        "response": {"type": "message", "role": "assistant", "stop_reason": stop,
                     "content": [{"type": "text", "text": "The answer is"}]},
    }  # fmt: skip
    path = tmp_path / "messages.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (item,) = _items("anthropic", path)
    assert isinstance(item, Reject) is (stop not in ("end_turn", "tool_use"))
    if isinstance(item, Reject):
        assert item.reason.startswith(f"response.stop_reason '{stop}': the reply was cut")


def test_openai_responses_the_last_turn_only(tmp_path: Path) -> None:
    """An ``incomplete`` response: its last reply was cut, the turns before it are whole."""
    rec = json.loads((SAMPLES / "openai_responses.jsonl").read_text().splitlines()[0])
    whole = _items("openai-responses", _write(tmp_path / "a.jsonl", rec))
    rec["response"]["status"] = "incomplete"
    rec["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    cut = _items("openai-responses", _write(tmp_path / "b.jsonl", rec))
    assert all(isinstance(c, ChatCall) for c in whole) and len(cut) == len(whole) > 1
    assert [(c.call_id, c.messages, c.completion) for c in cut[:-1]] == [
        (c.call_id, c.messages, c.completion) for c in whole[:-1]
    ]
    assert isinstance(cut[-1], Reject) and cut[-1].call_id == whole[-1].call_id
    assert cut[-1].reason.startswith("response.status 'incomplete': the reply was cut")


def _write(path: Path, rec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(rec) + "\n")
    return path


def test_opencode_the_step_is_rejected_and_still_sent_back(tmp_path: Path) -> None:
    src = next((SAMPLES / "opencode").glob("export-*.json"))
    doc = json.loads(src.read_text())
    before = [i for i in _items("opencode", src) if isinstance(i, ChatCall)]
    # the first step of an assistant message that is followed by more calls
    target = before[0].call_id
    mid, step = target.split("/")[-1].split("#")
    msg = next(m for m in doc["messages"] if m["info"]["id"] == mid)
    finishes = [p for p in msg["parts"] if p["type"] == "step-finish"]
    finishes[int(step)]["reason"] = "length"
    path = tmp_path / src.name
    path.write_text(json.dumps(doc))
    after = _items("opencode", path)
    rejected = [i for i in after if isinstance(i, Reject)]
    assert [r.call_id for r in rejected] == [target]
    assert "the step-finish reason 'length': the reply was cut" in rejected[0].reason
    # every later call's prompt is as before: the cut step is sent back all the same
    kept = [i for i in after if isinstance(i, ChatCall)]
    assert [c.messages for c in kept] == [c.messages for c in before[1:]]


def test_crush_max_tokens_is_not_a_whole_reply(tmp_path: Path) -> None:
    path = tmp_path / "crush.db"
    sqlite_samples.crush(path).close()
    before = {i.call_id: i for i in _items("crush", path) if isinstance(i, ChatCall)}
    con = sqlite3.connect(path)
    con.execute(
        "UPDATE messages SET parts = replace(parts, '\"end_turn\"', '\"max_tokens\"') "
        "WHERE id = 'm4'"
    )
    con.commit()
    con.close()
    after = _items("crush", path)
    cut = [i for i in after if isinstance(i, Reject) and "max_tokens" in i.reason]
    assert len(cut) == 1 and "its reply is not whole" in cut[0].reason
    kept = {i.call_id: i for i in after if isinstance(i, ChatCall)}
    assert len(kept) == len(before) - 1 and all(before[k] == v for k, v in kept.items())


def test_pi_length_is_rejected_and_still_sent_back(tmp_path: Path) -> None:
    """Pi's ``length`` stop: Pi sends the reply again (only ``error`` and ``aborted`` are left
    out of its context), but the limit cut it, so it is no completion."""
    reply = {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}],
             "api": "openai-completions", "provider": "openai", "model": "m"}  # fmt: skip
    done = {**reply, "content": [{"type": "text", "text": "42."}], "stopReason": "stop"}
    msgs = [{"role": "user", "content": "What is 6 x 7?"}, {**reply, "stopReason": "length"},
            {"role": "user", "content": "Go on."}, done]  # fmt: skip
    lines = [{"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/"}]
    for i, m in enumerate(msgs, 1):
        lines.append({"type": "message", "id": f"m{i}", "parentId": f"m{i - 1}" if i > 1 else None,
                      "timestamp": "t", "message": {"timestamp": i, **m}})  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rej, call = _items("pi", path)
    assert isinstance(rej, Reject) and rej.call_id == "s/m2"
    assert rej.reason.startswith("message.stopReason 'length': the reply was cut")
    assert isinstance(call, ChatCall)
    assert [(m.role, m.text()) for m in call.messages] == [
        ("user", "What is 6 x 7?"), ("assistant", "The answer is"), ("user", "Go on.")
    ]  # fmt: skip
