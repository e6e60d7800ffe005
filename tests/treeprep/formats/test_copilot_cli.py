"""copilot-cli: GitHub Copilot CLI sessions (``session-state/<id>/events.jsonl``).

``sample_data/copilot_cli/`` is written by us from the event schema of ``@github/copilot``
1.0.102. The expected chats are written out by hand from the replay of 1.0.60
(``Session.processEventForState``, ``G6n``, ``Ryt``, ``Wet``), not read back from the adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, companion_format, detect_format
from treeprep.formats.copilot_cli import FORMAT, INTERRUPTED
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "copilot_cli"
SID = "5f0c2a4e-8b1d-4c7e-9a3f-2d6e1b0c9a11"
EVENTS = SAMPLE / "session-state" / SID / "events.jsonl"
SYSTEM = (
    "You are the GitHub Copilot CLI, a terminal assistant built by GitHub.\n"
    "<environment_context>\n* Current working directory: /work/calc\n* Operating System: Linux\n"
    "</environment_context>"
)
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(path: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FORMAT.read(str(path), opts or ReadOptions()))


def _dump(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def _without_reasoning(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "reasoning_content"}


def _call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


class _Session:
    """Events of a session, written as Copilot writes them (an envelope per line)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, **data: Any) -> _Session:
        n = len(self.events)
        parent = self.events[-1]["id"] if self.events else None
        stamp = f"2026-10-22T09:00:{n:02d}.000Z"
        self.events.append({"type": kind, "data": data, "id": f"e{n}", "timestamp": stamp,
                            "parentId": parent})  # fmt: skip
        return self

    def reply(self, api: str, content: str = "", *calls: tuple[str, str], **kw: Any) -> _Session:
        reqs = [{"toolCallId": c, "name": n, "arguments": {"a": c}, "type": "function"}
                for c, n in calls]  # fmt: skip
        return self.add("assistant.message", messageId=api, content=content, toolRequests=reqs,
                        apiCallId=api, **kw)  # fmt: skip

    def result(self, cid: str, text: str) -> _Session:
        return self.add("tool.execution_complete", toolCallId=cid, success=True,
                        result={"content": text, "detailedContent": f"shown: {text}"})  # fmt: skip

    def write(self, tmp: Path) -> Path:
        path = tmp / "session-state" / "s1" / "events.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        return path


def _start() -> _Session:
    s = _Session().add("session.start", sessionId="s1", producer="copilot-agent",
                       copilotVersion="1.0.102", selectedModel="m1")  # fmt: skip
    return s.add("system.message", role="system", content="S").add("user.message", content="go")


def test_detection_and_the_files_beside_the_events() -> None:
    assert detect_format(str(EVENTS), EVENTS.read_bytes()) is FORMAT
    workspace = EVENTS.parent / "workspace.yaml"
    assert companion_format(str(workspace)) == "copilot-cli"
    checkpoint = EVENTS.parent / "checkpoints" / "001-adding-type-hints.md"
    assert companion_format(str(checkpoint)) == "copilot-cli"
    # OpenHands also writes an ``events.jsonl``: what lies beside it is not Copilot's
    beside = ROOT / "sample_data" / "openhands" / "notes.txt"
    assert companion_format(str(beside)) is None
    for other in ("openai_chat.jsonl", "openai_responses.jsonl", "session_traces.jsonl"):
        p = ROOT / "sample_data" / other
        assert detect_format(str(p), p.read_bytes()[:65536]) is not FORMAT


def test_the_sample_session_as_copilot_replays_it() -> None:
    items = _read(EVENTS)
    assert [type(x) for x in items] == [ChatCall] * 4 + [Reject] + [ChatCall] * 2
    assert [x.source_line if isinstance(x, ChatCall) else x.line for x in items] == [
        6, 11, 16, 23, 25, 31, 36,
    ]  # fmt: skip
    assert items[4].reason == (
        "a sub-agent's response: Copilot does not log its system prompt and first prompt"
    )
    calls = [x for x in items if isinstance(x, ChatCall)]
    assert [c.call_id for c in calls] == [f"{SID}#{k}" for k in range(6)]
    assert {(c.group_id, c.model) for c in calls} == {(SID, "claude-sonnet-4.5")}
    assert calls[0].timestamp == "2026-10-22T09:00:06.000Z"
    view = _call("toolu_01", "view", path="/work/calc/calc.py")
    first = {"role": "assistant", "content": "Let me look at the implementation.",
             "reasoning_content": "Read calc.py first.", "tool_calls": [view]}  # fmt: skip
    assert calls[0].completion.model_dump(exclude_none=True) == first
    # the two messages of one response: one call, sent back as one message
    bash = _call("toolu_02", "bash", command="pytest -q", description="Run tests")
    chunks = {"role": "assistant", "content": "I'll run the test suite.",
              "reasoning_content": "Run pytest.", "tool_calls": [bash]}  # fmt: skip
    assert calls[2].completion.model_dump(exclude_none=True) == chunks
    user = "<current_datetime>2026-10-22T09:00:{}.000+00:00</current_datetime>\n\n{}"
    asked = user.format("04", "What does add([]) return?") + (
        "\n\n<system_reminder>\n<sql_tables>Available tables: todos</sql_tables>\n"
        "</system_reminder>"
    )
    task = _call("toolu_03", "task", agent_type="explore", prompt="Find test_calc.py")
    one = _call("toolu_04", "bash", command="pytest -q tests/test_calc.py",
                description="Run one file")  # fmt: skip
    # after the abort: the cut call's stand-in result, and no reasoning in the history
    assert _dump(calls[5]) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": asked},
        _without_reasoning(first),
        {"role": "tool", "tool_call_id": "toolu_01",
         "content": "1. def add(xs):\n2.     return sum(xs)\n"},
        {"role": "assistant", "content": "`add([])` returns `0`: `sum([])` is `0`."},
        {"role": "user", "content": user.format("15", "Run the tests")},
        _without_reasoning(chunks),
        {"role": "tool", "tool_call_id": "toolu_02", "content": INTERRUPTED},
        {"role": "user", "content": user.format("23", "Run only test_calc.py")},
        {"role": "assistant", "tool_calls": [task],
         "reasoning_content": "Let a sub-agent find the file."},
        {"role": "tool", "tool_call_id": "toolu_03", "content": "It is tests/test_calc.py."},
        {"role": "assistant", "tool_calls": [one]},
        {"role": "tool", "tool_call_id": "toolu_04", "content": "pytest: command not found"},
    ]  # fmt: skip
    # before the abort the reasoning was sent back
    assert _dump(calls[1])[2] == first
    assert [len(c.messages) for c in calls] == [2, 4, 6, 9, 11, 13]


def test_a_result_is_moved_next_to_its_call_and_a_second_one_left_out(tmp_path: Path) -> None:
    """``G6n``: the results of a call's message follow it in the order the chat holds them
    (here B came first), a message between moves after them, a call's second result is left
    out."""
    s = _start().reply("r1", "", ("c1", "ls"), ("c2", "cat"))
    s.add("user.message", content="steer")  # typed while the tools ran
    s.result("c2", "B").result("c1", "A").result("c1", "again").reply("r2", "done")
    calls = _read(s.write(tmp_path))
    chat = [(m["role"], m.get("tool_call_id"), m.get("content")) for m in _dump(calls[1])[2:]]
    assert chat == [
        ("assistant", None, None), ("tool", "c2", "B"), ("tool", "c1", "A"),
        ("user", None, "steer"),
    ]  # fmt: skip


def test_a_sub_agents_events_stay_out_of_the_main_chat(tmp_path: Path) -> None:
    s = _start().reply("r1", "", ("t1", "task"))
    s.events.append({**s.add("user.message", content="find it").events.pop(), "agentId": "a1"})
    s.reply("r2", "", ("g1", "glob"), parentToolCallId="t1")
    s.events[-1]["agentId"] = "a1"
    s.add("tool.execution_complete", toolCallId="g1", success=True, result={"content": "f.py"},
          parentToolCallId="t1")  # fmt: skip
    s.result("t1", "found f.py").reply("r3", "done")
    items = _read(s.write(tmp_path))
    assert [type(x) for x in items] == [ChatCall, Reject, ChatCall]
    assert [m["role"] for m in _dump(items[2])] == ["system", "user", "assistant", "tool"]
    assert _dump(items[2])[-1]["content"] == "found f.py"


def test_resumes_and_model_changes_drop_the_reasoning(tmp_path: Path) -> None:
    s = _start().reply("r1", "a", reasoningText="think")
    s.add("session.resume", sessionWasActive=True).add("user.message", content="1").reply("r2", "b")
    s.add("session.model_change", newModel="m2").add("user.message", content="2")
    s.reply("r3", "c", reasoningText="t3").add("user.message", content="3").reply("r4", "d")
    s.add("session.resume", sessionWasActive=False).add("user.message", content="4")
    s.reply("r5", "e")
    calls = _read(s.write(tmp_path))
    assert [c.model for c in calls] == ["m1", "m1", "m2", "m2", "m2"]
    assert _dump(calls[1])[2] == {"role": "assistant", "content": "a", "reasoning_content": "think"}
    assert _dump(calls[2])[2] == {"role": "assistant", "content": "a"}
    assert _dump(calls[3])[-2] == {"role": "assistant", "content": "c", "reasoning_content": "t3"}
    assert _dump(calls[4])[-4] == {"role": "assistant", "content": "c"}


def test_auto_mode_rewrites_the_history_for_the_model_it_resolves(tmp_path: Path) -> None:
    """With model ``auto`` Copilot resolves a model per request and rewrites the history for it
    (``maybeRewriteChatHistoryForEffectiveModel``): a response by another model than the last
    is prompted without the reasoning before it."""
    s = _start().add("session.model_change", newModel="auto")
    s.reply("r1", "a", reasoningText="t1", model="m1").add("user.message", content="1")
    s.reply("r2", "b", model="m1").add("user.message", content="2").reply("r3", "c", model="m2")
    calls = _read(s.write(tmp_path))
    assert [c.model for c in calls] == ["m1", "m1", "m2"]
    assert _dump(calls[1])[2] == {"role": "assistant", "content": "a", "reasoning_content": "t1"}
    assert _dump(calls[2])[2] == {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    ("event", "data", "why"),
    [
        ("user.message", {"content": "see", "attachments": [{"type": "file", "path": "a.py"}]},
         "a user message with attachments"),
        ("session.compaction_complete", {"success": True, "summaryContent": "<overview/>"},
         "a compaction"),
        ("tool.execution_complete",
         {"toolCallId": "u1", "success": True, "isUserRequested": True,
          "result": {"content": "ok"}},
         "the output of a command the user ran"),
        ("session.resume", {"continuePendingWork": True}, "a resume that goes on with pending"),
        ("skill.context_delivered", {"content": "x"}, "an event this reader does not know"),
    ],
)  # fmt: skip
def test_after_what_the_log_cannot_give_back_every_call_is_rejected(
    tmp_path: Path, event: str, data: dict[str, Any], why: str
) -> None:
    s = _start().reply("r1", "a").add(event, **data).add("user.message", content="more")
    s.reply("r2", "b").reply("r3", "c")
    items = _read(s.write(tmp_path))
    assert [type(x) for x in items] == [ChatCall, Reject, Reject]
    assert items[1].reason.startswith(f"line 5: {why}")
    assert items[1].reason.endswith("(the prompts after it would miss it)")
    assert [x.call_id for x in items[1:]] == ["s1#1", "s1#2"]


def test_a_truncated_prompt_and_split_reasoning_reject_one_call(tmp_path: Path) -> None:
    s = _start().add("session.truncation", messagesRemovedDuringTruncation=3).reply("r1", "a")
    s.add("user.message", content="x").reply("r2", "b", reasoningText="1")
    s.reply("r2", "c", reasoningText="2").add("user.message", content="y").reply("r3", "d")
    items = _read(s.write(tmp_path))
    assert [type(x) for x in items] == [Reject, Reject, ChatCall]
    assert items[0].reason == (
        "Copilot truncated this prompt when it sent it (3 messages removed) and logs only the "
        "counts"
    )
    assert items[1].reason.startswith("a response split into 2 messages with reasoning in more")
    # the split response is in the history as Copilot sends it: one message, the first reasoning
    assert _dump(items[2])[-2] == {"role": "assistant", "content": "bc", "reasoning_content": "1"}


def test_a_response_with_a_message_that_does_not_fit_is_one_reject(tmp_path: Path) -> None:
    s = _start().reply("r1", "part one").reply("r1", "", ("c1", "apply_patch"))
    s.events[-1]["data"]["toolRequests"][0]["type"] = "custom"
    items = _read(s.write(tmp_path))
    assert [type(x) for x in items] == [Reject]
    assert items[0].line == 5 and "a custom (freeform) tool call" in items[0].reason


def test_a_bad_line_rejects_every_later_call(tmp_path: Path) -> None:
    s = _start().reply("r1", "a").add("user.message", content="x").reply("r2", "b")
    path = s.write(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(4, '{"type": "user.message", "data": {"content": 3}, "id": "x", '
                    '"timestamp": "t", "parentId": null}')  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    items = _read(path)
    assert [type(x) for x in items] == [ChatCall, Reject, Reject]
    assert items[1].line == 5 and items[1].reason == "content: expected a string, got int"
    assert items[2].reason == f"line 5: {items[1].reason} (the prompts after it would miss it)"


def test_the_sample_builds_one_tree(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(SAMPLE)], out=str(tmp_path / "o")))
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (6, 1, 1)


@needs_qwen
def test_calls_render_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = [x for x in _read(EVENTS) if isinstance(x, ChatCall)]
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)
