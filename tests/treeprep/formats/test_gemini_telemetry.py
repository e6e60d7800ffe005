"""The ``gemini-cli-telemetry`` reader (treeprep/formats/gemini_telemetry.py): Gemini CLI's
telemetry file, written in the shape of 0.61.0's OpenTelemetry file exporters (pretty-printed
objects one after another: ``llm_call`` spans, ``gemini_cli.api_request`` / ``api_response`` /
``api_error`` log records)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.gemini_telemetry import FORMAT
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "gemini_cli_telemetry" / "telemetry.log"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
SID = "4c2e9a1f-7b3d-4e5a-9c8b-1d2e3f4a5b6c"


def _read(path: Path) -> list[Any]:
    return list(FORMAT.read(str(path), ReadOptions()))


def _objects(path: Path) -> list[dict[str, Any]]:
    text, dec, out, i = path.read_text(), json.JSONDecoder(), [], 0
    while (i := len(text) - len(text[i:].lstrip())) < len(text):
        obj, i = dec.raw_decode(text, i)
        out.append(obj)
    return out


def _write(path: Path, objs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(o, indent=2, ensure_ascii=False) + "\n" for o in objs))
    return path


def _said(items: list[Any]) -> list[tuple[Any, ...]]:
    return [
        ("reject", x.reason)
        if isinstance(x, Reject)
        else (x.agent_id, x.branch_reason, x.model, len(x.messages))
        for x in items
    ]


SAMPLE_SAID = [
    ("main", None, "gemini-2.5-pro", 2),
    ("reject", "the call failed: '429 Resource exhausted. Please try again later.'"),
    ("main", None, "gemini-2.5-pro", 4),
    ("codebase_investigator-7f3a9c21", "sub-agent", "gemini-2.5-flash", 2),
    ("main", None, "gemini-2.5-pro", 6),
    ("utility_next_speaker", "sub-agent", "gemini-2.5-flash", 7),
]


def test_each_request_is_a_call_answered_by_its_response() -> None:
    items = _read(SAMPLE)
    assert _said(items) == SAMPLE_SAID
    first, retry = items[0], items[2]
    assert first.group_id == SID and first.timestamp == "2026-12-07T09:20:01.500Z"
    # the system instruction and the tools come from the request's llm_call span
    assert first.messages[0].role == "system" and first.messages[0].text().startswith(
        "You are an interactive CLI agent"
    )
    assert [t["function"]["name"] for t in first.tools] == [
        "read_file", "run_shell_command", "codebase_investigator"
    ]  # fmt: skip
    # the session context and the question: one user turn of two text parts, as sent
    assert [p.text[:18] for p in first.messages[1].content] == [
        "<session_context>\n", "test_cart fails: t"
    ]  # fmt: skip
    # the streamed chunks make one completion: the thought its reasoning; the call id loses
    # the "read_file__" prefix Gemini CLI puts on the response's, as the next request has it
    comp = first.completion
    assert comp.reasoning_content.startswith("**Reading the cart**")
    assert comp.content == "Let me read `cart.py`."
    assert comp.tool_calls[0].id == "read_file_1796637601_0"
    assert retry.messages[2].tool_calls[0].id == comp.tool_calls[0].id
    assert (retry.messages[3].role, retry.messages[3].tool_call_id) == (
        "tool", "read_file_1796637601_0"
    )  # fmt: skip
    assert retry.messages[3].text() == "def total(items, discount=0.0):\n    return sum(items)\n"
    # the sent history holds no thought (Gemini CLI strips them)
    assert retry.messages[2].reasoning_content is None


def test_records_in_any_order_pair_the_same(tmp_path: Path) -> None:
    """The exporters flush spans and logs in batches: the file is not in time order."""
    objs = _objects(SAMPLE)
    random.Random(7).shuffle(objs)
    got = _read(_write(tmp_path / "telemetry.log", objs))
    assert _said(got) == SAMPLE_SAID


def test_a_cut_tail_and_an_unanswered_request(tmp_path: Path) -> None:
    text = SAMPLE.read_text()
    cut = text[: text.rindex('"event.name": "gemini_cli.api_response"')]
    path = tmp_path / "telemetry.log"
    path.write_text(cut)
    got = _read(path)
    tail = [x for x in got if isinstance(x, Reject) and "malformed JSON" in x.reason]
    assert len(tail) == 1 and "are not read" in tail[0].reason
    answered = [x for x in got if isinstance(x, ChatCall)]
    assert len(answered) == 4  # the next-speaker check lost its response with the tail
    assert any(isinstance(x, Reject) and x.reason.startswith("no response") for x in got)


def test_a_number_json_stringify_never_writes_is_a_reject(tmp_path: Path) -> None:
    """``NaN`` is no JSON (Gemini CLI's ``JSON.stringify`` writes ``null``): the object holding
    one is a reject naming the field, the others are read."""
    objs = _objects(SAMPLE)
    names = [o.get("attributes", {}).get("event.name") for o in objs]
    k = max(i for i, name in enumerate(names) if name == "gemini_cli.api_response")
    objs[k]["attributes"]["duration_ms"] = float("nan")
    got = _read(_write(tmp_path / "telemetry.log", objs))
    bad = [x for x in got if isinstance(x, Reject) and "finite" in x.reason]
    assert [x.reason for x in bad] == ["attributes.duration_ms: expected a finite number, got NaN"]
    assert bad[0].line == 1 + sum(json.dumps(o, indent=2).count("\n") + 1 for o in objs[:k])
    assert len([x for x in got if isinstance(x, ChatCall)]) == 4  # its call lost its response


def test_a_reply_the_model_did_not_end_is_a_reject(tmp_path: Path) -> None:
    objs = _objects(SAMPLE)
    last = next(
        o for o in reversed(objs)
        if o.get("attributes", {}).get("event.name") == "gemini_cli.api_response"
    )  # fmt: skip
    chunk = json.loads(last["attributes"]["response_text"])
    chunk["candidates"][0]["finishReason"] = "MAX_TOKENS"
    last["attributes"]["response_text"] = json.dumps(chunk)
    got = _read(_write(tmp_path / "telemetry.log", objs))
    assert isinstance(got[-1], Reject) and got[-1].reason.startswith("finishReason 'MAX_TOKENS'")


def test_a_user_turn_of_text_and_function_responses_is_a_reject(tmp_path: Path) -> None:
    """A steering hint goes before the function responses in one user turn: no chat form keeps
    that order, so the call is a reject, not a reordering."""
    objs = _objects(SAMPLE)
    req = next(
        o for o in objs
        if o.get("attributes", {}).get("event.name") == "gemini_cli.api_request"
        and "functionResponse" in o["attributes"]["request_text"]
    )  # fmt: skip
    contents = json.loads(req["attributes"]["request_text"])
    contents[-1]["parts"].insert(0, {"text": "User steering update: use pytest."})
    req["attributes"]["request_text"] = json.dumps(contents)
    got = _read(_write(tmp_path / "telemetry.log", objs))
    assert any(
        isinstance(x, Reject) and x.reason.endswith("mixes text and function responses")
        for x in got
    )


def test_detected_and_built(tmp_path: Path) -> None:
    assert detect_format(str(SAMPLE), read_head(str(SAMPLE))).name == "gemini-cli-telemetry"
    litellm = next((ROOT / "sample_data" / "litellm").glob("*.json"))
    assert detect_format(str(litellm), read_head(str(litellm))).name == "openai-chat-json"
    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "out")))
    c = m.counts
    assert (c.records_read, c.records_in_trees, c.records_rejected, c.trees) == (6, 5, 1, 1)
    # the next-speaker check was sent with no system instruction: what the model saw, not a gap
    # of the log (FormatSpec.whole_requests), so no note suggests --system-prompt
    assert FORMAT.whole_requests and "gemini-cli-telemetry" not in m.prompt_gaps


@needs_qwen
def test_calls_render_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = [x for x in _read(SAMPLE) if isinstance(x, ChatCall)]
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


def test_a_file_written_with_log_prompts_off_says_so(tmp_path: Path) -> None:
    objs = _objects(SAMPLE)
    for o in objs:
        o.get("attributes", {}).pop("request_text", None)
    got = _read(_write(tmp_path / "telemetry.log", objs))
    assert {x.reason for x in got if isinstance(x, Reject)} >= {
        "no request_text: Gemini CLI wrote this file with logPrompts off, so the prompt is not "
        "in it"
    }
    assert not any(isinstance(x, ChatCall) for x in got)


def test_prompts_kept_call_to_call_are_the_prompts_converted_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each caller's history is converted once (``ParsedHistory``): the calls equal those of
    every request converted afresh."""
    from treeprep.formats import gemini_telemetry
    from treeprep.formats._history import ParsedHistory

    kept = _read(SAMPLE)

    def afresh(self: Any, raw: list[Any], where: str) -> list[dict[str, Any]]:
        return gemini_telemetry._convert(raw, 0, where).messages

    monkeypatch.setattr(ParsedHistory, "messages", afresh)
    assert _read(SAMPLE) == kept
