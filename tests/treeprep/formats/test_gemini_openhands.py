"""Gemini CLI chat sessions and OpenHands V1 event streams (issue 14 item 2).

The samples are ours (``sample_data/gemini_cli``, ``sample_data/openhands``); the real OpenHands
fixture from ``../shared/data`` holds no system prompt and no user message, so both of its calls
are rejected with that reason: every record ends in a tree or a reject.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treeprep.build import BuildConfig, build
from treeprep.errors import EmptyBuildError
from treeprep.formats import ReadOptions, detect_format, get_format
from treeprep.io.compressed import read_head
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data"
GEMINI = sorted((SAMPLE / "gemini_cli").iterdir())
OPENHANDS = SAMPLE / "openhands" / "events.jsonl"
REAL_OH = (
    ROOT
    / ".."
    / "shared"
    / "data"
    / "logs"
    / "openhands"
    / "tests"
    / "sdk"
    / "conversation"
    / "goal"
    / "fixtures"
    / "events.jsonl"
)


def _read(fmt: str, path: Path, **kw: object) -> list:
    return list(get_format(fmt).read(str(path), ReadOptions(**kw)))  # type: ignore[arg-type]


@pytest.mark.parametrize("path", [*GEMINI, OPENHANDS], ids=lambda p: p.name)
def test_samples_are_detected(path: Path) -> None:
    spec = detect_format(str(path), read_head(str(path)))
    assert spec is not None
    assert spec.name == ("openhands-events" if path == OPENHANDS else "gemini-cli")


def test_gemini_jsonl_session() -> None:
    path = next(p for p in GEMINI if p.suffix == ".jsonl")
    calls = _read("gemini-cli", path)
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.call_id for c in calls] == ["g-01", "g-02", "g-03", "g-04", "g-05", "g-06"]
    first, second = calls[0], calls[1]
    # the last version of g-01 (its results filled in) is what later prompts hold
    assert [m.role for m in second.messages] == ["user", "assistant", "tool", "tool"]
    assert second.messages[2].content.startswith("from slug import slugify")  # type: ignore[union-attr]
    assert first.completion.tool_calls and len(first.completion.tool_calls) == 2
    # the logged args object stays an object (issue 50 item 1: it was turned into a JSON string)
    assert first.completion.tool_calls[1].function.arguments == {
        "absolute_path": "/home/dev/slug/slug.py"
    }
    assert first.completion.reasoning_content is not None
    assert first.completion.reasoning_content.startswith("**Locating the failure**")
    assert first.timestamp == "2025-09-14T10:02:19.402Z" and first.group_id.startswith("3f9c")
    # the info line is not in any prompt; the rewound g-05 is still a call, g-06 forks before it
    g5, g6 = calls[4], calls[5]
    assert all(m.text() != "Checkpoint saved." for m in g6.messages)
    assert g5.messages[-1].text() == "Also strip punctuation."
    assert g6.messages[-1].text() == "Thanks, that is all."
    assert len(g6.messages) == len(g5.messages)
    # Gemini CLI sends no thought back (GeminiChat.processStreamResponse stores the model turn
    # without its thought parts): g-01 and g-02 had thoughts, so no prompt holds reasoning and
    # the calls after them are hinted reasoning-dropped (before: the thoughts were in the prompts)
    assert calls[1].completion.reasoning_content is not None
    assert not any(m.reasoning_content for c in calls for m in c.messages)
    # the user went back: the call after the rewind starts a branch, hinted so (was unhinted)
    dropped = ["reasoning-dropped"] * 2
    assert [c.branch_reason for c in calls] == [None, *dropped, None, None, "retry"]


def test_gemini_legacy_document_and_system_prompt() -> None:
    path = next(p for p in GEMINI if p.suffix == ".json")
    calls = _read("gemini-cli", path, system_prompt="You are Gemini CLI.")
    assert [c.call_id for c in calls] == ["a2", "a4"]
    assert calls[1].messages[0].role == "system" and calls[1].messages[-1].text().startswith("And")
    text = path.read_text()
    assert calls[1].source_line == text[: text.index('"a4"')].count("\n") + 1


def test_gemini_missing_tool_result_rejects_later_calls(tmp_path: Path) -> None:
    lines = [
        {"sessionId": "s", "projectHash": "p", "startTime": "2025-01-01T00:00:00Z"},
        {"id": "u", "timestamp": "t", "type": "user", "content": "go"},
        {
            "id": "g1",
            "timestamp": "2025-01-01T00:00:01Z",
            "type": "gemini",
            "content": "",
            "toolCalls": [{"id": "c1", "name": "ls", "args": {}, "status": "cancelled"}],
        },
        {"id": "g2", "timestamp": "2025-01-01T00:00:02Z", "type": "gemini", "content": "ok"},
    ]
    p = tmp_path / "session-x.jsonl"
    p.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    out = _read("gemini-cli", p)
    assert isinstance(out[0], ChatCall)
    assert isinstance(out[1], Reject) and "has no recorded result" in out[1].reason
    assert out[1].line == 4


def test_openhands_sample_session() -> None:
    calls = _read("openhands-events", OPENHANDS)
    assert [type(c) for c in calls] == [ChatCall] * 4
    first = calls[0]
    assert [m.role for m in first.messages] == ["system", "user"]
    assert first.tools and [t["function"]["name"] for t in first.tools][0] == "terminal"
    assert len(first.completion.tool_calls or []) == 2  # one response, two parallel actions
    assert first.completion.reasoning_content == "I should run the linter first."
    last = calls[-1]
    assert [m.role for m in last.messages[-3:]] == ["tool", "assistant", "tool"]
    assert last.completion.text().startswith("`make lint` passes")
    assert last.timestamp is not None


def _edited_sample(tmp_path: Path, edit: object) -> Path:
    lines = [orjson.loads(x) for x in OPENHANDS.read_bytes().splitlines()]
    edit(lines)  # type: ignore[operator]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_openhands_prompts_hold_what_the_sdk_sends(tmp_path: Path) -> None:
    """SystemPromptEvent.to_llm_message sends the dynamic context as a second part of the
    system message, MessageEvent.to_llm_message appends the agent context's extended content
    (a triggered skill's knowledge) to the user's message: both reach the prompt, as parts the
    server joins (read from OpenHands/software-agent-sdk, event/llm_convertible)."""

    def edit(lines: list[dict]) -> None:
        lines[1]["dynamic_context"] = {"type": "text", "text": "<REPO>acme/app</REPO>"}
        lines[2]["activated_skills"] = ["flake8"]
        lines[2]["extended_content"] = [{"type": "text", "text": "<EXTRA_INFO>skill</EXTRA_INFO>"}]

    first = _read("openhands-events", _edited_sample(tmp_path, edit))[0]
    system, user = first.messages
    assert [p.text for p in system.content] == [
        "You are OpenHands agent, a helpful AI assistant.",
        "<REPO>acme/app</REPO>",
    ]
    assert [p.text for p in user.content] == [
        "The CI job fails on `make lint`. Please fix it.",
        "<EXTRA_INFO>skill</EXTRA_INFO>",
    ]


def test_openhands_an_image_is_refused_not_dropped(tmp_path: Path) -> None:
    def edit(lines: list[dict]) -> None:
        image = {"type": "image", "image_urls": ["data:image/png;base64,AAAA"]}
        lines[2]["llm_message"]["content"].append(image)

    out = tmp_path / "out"
    with pytest.raises(EmptyBuildError):  # every call's prompt holds the user's message
        build(BuildConfig(inputs=[str(_edited_sample(tmp_path, edit))], out=str(out)))
    rejects = [orjson.loads(x) for x in (out / "rejects.jsonl").read_bytes().splitlines()]
    assert len(rejects) == 4 and all("type 'image'" in r["reason"] for r in rejects)


@pytest.mark.skipif(not REAL_OH.is_file(), reason="../shared/data is absent")
def test_openhands_real_fixture_rejects_with_reasons(tmp_path: Path) -> None:
    out = _read("openhands-events", REAL_OH)
    assert [type(x) for x in out] == [Reject, Reject]
    assert all("no SystemPromptEvent" in r.reason for r in out)
    assert all("no user message" in r.reason for r in out)
    assert "whose call is not in the stream" in out[1].reason
    # every record rejected: the build stops (no manifest) and the rejects say why
    from treeprep.errors import EmptyBuildError

    with pytest.raises(EmptyBuildError, match="2 read, 2 rejected"):
        build(BuildConfig(inputs=[str(REAL_OH)], out=str(tmp_path / "o")))
    rejects = (tmp_path / "o" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 2 and all("no SystemPromptEvent" in r for r in rejects)


@pytest.mark.skipif(not REAL_OH.is_file(), reason="../shared/data is absent")
def test_openhands_real_fixture_with_system_prompt_still_needs_a_user_message() -> None:
    out = _read("openhands-events", REAL_OH, system_prompt="sys")
    assert all(isinstance(r, Reject) and "SystemPromptEvent" not in r.reason for r in out)


def test_samples_build_and_reconcile(tmp_path: Path) -> None:
    m = build(
        BuildConfig(inputs=[str(SAMPLE / "gemini_cli"), str(OPENHANDS)], out=str(tmp_path / "o"))
    )
    assert m.formats == {"gemini-cli": 8, "openhands-events": 4}
    assert m.counts.records_rejected == 0 and m.counts.records_in_trees == 12


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(["user", "gemini", "gemini-tools", "info", "rewind", "version"]),
        min_size=1,
        max_size=12,
    )
)
def test_gemini_random_sessions_every_call_is_a_record_or_reject(tmp_path: Path, ops) -> None:
    """Every gemini message written (once, whatever its versions) is one call or one reject."""
    lines: list[dict] = [{"sessionId": "s", "projectHash": "p"}]
    ids: list[str] = []
    n_gemini = 0
    for k, op in enumerate(ops):
        if op == "rewind" and ids:
            lines.append({"$rewindTo": ids[len(ids) // 2]})
            continue
        if op == "version" and ids:
            last = next((x for x in reversed(lines) if x.get("id") == ids[-1]), None)
            if last is not None:
                lines.append(dict(last))
            continue
        mid = f"m{k}"
        kind = "gemini" if op.startswith("gemini") else ("info" if op == "info" else "user")
        rec: dict = {"id": mid, "timestamp": "2025-01-01T00:00:00Z", "type": kind, "content": mid}
        if op == "gemini-tools":
            resp = {"functionResponse": {"id": f"c{k}", "name": "ls", "response": {"output": "x"}}}
            rec["toolCalls"] = [
                {
                    "id": f"c{k}",
                    "name": "ls",
                    "args": {"k": k},
                    "status": "success",
                    "result": [resp],
                }
            ]
        n_gemini += kind == "gemini"
        ids.append(mid)
        lines.append(rec)
    p = tmp_path / "session-h.jsonl"
    p.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    out = _read("gemini-cli", p)
    assert len(out) == n_gemini
    assert all(isinstance(x, ChatCall | Reject) for x in out)


def test_gemini_user_parts_stay_parts_as_its_telemetry_logs_them(tmp_path: Path) -> None:
    """Gemini CLI sends a prompt with referenced files as several text parts (its telemetry logs
    them so); the session file's reader keeps them as parts too, so that both logs of one request
    render alike, joined as ``--server`` says (were glued with nothing between)."""
    doc = orjson.loads(GEMINI[0].read_bytes())
    texts = ["What does `git stash -u` do?", "--- Content from referenced files ---"]
    parts = [{"text": t} for t in texts]
    doc["messages"][0]["content"] = parts
    path = tmp_path / GEMINI[0].name
    path.write_bytes(orjson.dumps(doc))
    first = _read("gemini-cli", path)[0]
    assert [p.text for p in first.messages[-1].content] == texts
