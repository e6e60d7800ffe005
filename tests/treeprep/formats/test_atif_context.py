"""ATIF completed (issue 40 item 2): context boundaries, empty observations, absent references,
arrays of trajectories, sub-agents by ``trajectory_id``.

``sample_data/atif/trajectories.json`` is written by us from the ATIF v1.7 field names
(``trajectory_id``, ``extra.context_management``); the expected prompts below are written out by
hand from the rules in :mod:`treeprep.formats.atif`, not read back from the adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.atif import FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data" / "atif" / "trajectories.json"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _read(path: Path) -> list[Any]:
    return list(FORMAT.read(str(path), ReadOptions()))


def _doc(steps: list[dict[str, Any]], sid: str = "s", **extra: Any) -> dict[str, Any]:
    agent = {"name": "a", "version": "1"}
    return {"schema_version": "ATIF-v1.7", "session_id": sid, "agent": agent, "steps": steps,
            **extra}  # fmt: skip


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=2))
    return path


def _roles(call: ChatCall) -> list[tuple[str, str]]:
    return [(m.role, m.text()) for m in call.messages]


SYS = {"step_id": 1, "source": "system", "message": "sys"}
USER = {"step_id": 2, "source": "user", "message": "go"}
BOUNDARY = {"context_management": {"type": "compaction", "boundary": "replace"}}


# --------------------------------------------------------------------------------------------
# the sample: an array of two runs of one task
# --------------------------------------------------------------------------------------------

SAMPLE_SYS = "You are an agent in a Linux terminal. Use bash."
TASK = "Count the lines of every .log file under /var/app."
SUMMARY = (
    "Summary so far: the task is to count the lines of the .log files under /var/app; a.log has "
    "12 lines and b.log 30 (42 in all)."
)


def test_an_array_of_trajectories_is_detected_and_read_element_by_element() -> None:
    assert detect_format(str(SAMPLE), SAMPLE.read_bytes()[:65536]) is FORMAT
    items = _read(SAMPLE)
    assert all(isinstance(c, ChatCall) for c in items)
    assert [(c.trajectory_id, c.agent_id, c.branch_reason, c.source_line) for c in items] == [
        ("adp-task-12-run-1", "main", None, 2),
        ("adp-task-12-run-1", "main", None, 2),
        ("adp-task-12-run-1", "main", "compaction", 2),
        ("adp-task-12-run-2", "main", None, 35),
        ("adp-task-12-run-2", "main", None, 35),
        ("adp-task-12-run-2", "helper-a", "sub-agent", 35),  # siblings sharing a session_id
        ("adp-task-12-run-2", "helper-b", "sub-agent", 35),  # stay two agents
    ]
    assert {c.group_id for c in items} == {"adp-task-12"}  # two samples of one task: one group


def test_a_replace_boundary_starts_a_new_context_after_the_system_prompt() -> None:
    first, second, after = _read(SAMPLE)[:3]
    assert _roles(after) == [("system", SAMPLE_SYS), ("user", SUMMARY)]
    assert after.completion.content == "a.log has 12 lines and b.log has 30: 42 lines in all."
    # the empty untied result of step 4 is no message; the tool result is
    assert _roles(second)[-1] == ("tool", "/var/app/a.log\n/var/app/b.log")
    assert first.tools and first.tools[0]["function"]["name"] == "bash"


def test_empty_steps_and_results_never_render_as_empty_turns(tmp_path: Path) -> None:
    steps = [
        SYS, USER,
        {"step_id": 3, "source": "agent", "message": "look", "observation": {"results": [
            {"content": ""}, {"content": None}, {"content": "found it"}]}},
        {"step_id": 4, "source": "user", "message": ""},
        {"step_id": 5, "source": "agent", "message": "done"},
    ]  # fmt: skip
    _, last = _read(_write(tmp_path / "t.json", _doc(steps)))
    assert _roles(last) == [("system", "sys"), ("user", "go"), ("assistant", "look"),
                            ("user", "found it")]  # fmt: skip


def test_a_boundary_on_an_agent_step_keeps_only_its_summary(tmp_path: Path) -> None:
    steps = [
        SYS,
        {"step_id": 2, "source": "user", "message": "old context"},
        {"step_id": 3, "source": "agent", "message": "", "llm_call_count": 0,
         "tool_calls": [{"tool_call_id": "k", "function_name": "compact", "arguments": {}}],
         "observation": {"results": [{"source_call_id": "k", "content": ""},
                                     {"content": "the summary"}]},
         "extra": BOUNDARY},
        {"step_id": 4, "source": "user", "message": "new context"},
        {"step_id": 5, "source": "agent", "message": "answer"},
    ]  # fmt: skip
    (call,) = _read(_write(tmp_path / "t.json", _doc(steps)))  # llm_call_count 0: not a call
    assert _roles(call) == [("system", "sys"), ("user", "the summary"), ("user", "new context")]
    assert call.branch_reason == "compaction"


# --------------------------------------------------------------------------------------------
# references between files
# --------------------------------------------------------------------------------------------


def _spawning(refs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    spawn = {"step_id": 3, "source": "agent", "message": "delegating",
             "tool_calls": [{"tool_call_id": "d", "function_name": "delegate", "arguments": {}}],
             "observation": {"results": [{"source_call_id": "d", "content": "ok",
                                          "subagent_trajectory_ref": refs}]}}  # fmt: skip
    return _doc([SYS, USER, spawn, {"step_id": 4, "source": "agent", "message": "end"}],
                sid="parent", **extra)  # fmt: skip


def test_absent_referenced_files_are_one_reject_each(tmp_path: Path) -> None:
    refs = [{"trajectory_path": "missing.json"}, {"trajectory_id": "nowhere"}]
    p = _write(tmp_path / "p.json", _spawning(refs, continued_trajectory_ref="gone.json"))
    *calls, a, b, c = _read(p)
    assert len(calls) == 2 and all(isinstance(x, Reject) for x in (a, b, c))
    ref = "steps[2].observation.results[0].subagent_trajectory_ref"
    assert a.reason == (f"{ref}: the referenced trajectory is absent (the file 'missing.json'): "
                        "its calls are not in this build")  # fmt: skip
    assert b.reason.startswith(f"{ref}: the referenced trajectory is absent (the trajectory "
                               "'nowhere')")  # fmt: skip
    assert c.reason.startswith("continued_trajectory_ref: the referenced trajectory is absent")


def test_a_subagent_file_links_by_trajectory_id_with_a_shared_session_id(tmp_path: Path) -> None:
    parent = _write(tmp_path / "p.json", _spawning([{"trajectory_id": "helper-x"}]))
    sub = _doc([{"step_id": 1, "source": "user", "message": "sub task"},
                {"step_id": 2, "source": "agent", "message": "sub answer"}],
               sid="parent", trajectory_id="helper-x")  # fmt: skip
    sibling = _doc([USER, {"step_id": 3, "source": "agent", "message": "other"}], sid="parent",
                   trajectory_id="helper-y")  # fmt: skip
    _write(tmp_path / "sub.json", sub)
    _write(tmp_path / "sibling.json", sibling)
    assert all(isinstance(x, ChatCall) for x in _read(parent))  # the reference is found
    (call,) = _read(tmp_path / "sub.json")
    assert (call.group_id, call.agent_id, call.branch_reason) == ("parent", "helper-x", "sub-agent")
    (other,) = _read(tmp_path / "sibling.json")  # same session, not referenced: its own run
    assert (other.agent_id, other.branch_reason, other.trajectory_id) == ("main", None, "helper-y")


def test_a_bad_element_of_an_array_is_one_reject_naming_its_line(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    good = _doc([USER, {"step_id": 3, "source": "agent", "message": "hi"}])
    p.write_text(json.dumps([good, {"steps": "no"}], indent=2))
    call, rej = _read(p)
    assert isinstance(call, ChatCall) and call.source_line == 2
    assert isinstance(rej, Reject) and rej.line > 2 and rej.reason.startswith("[1]: expected")


# --------------------------------------------------------------------------------------------
# rendering equals apply_chat_template
# --------------------------------------------------------------------------------------------


def _assistant(text: str, calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                           for i, n, a in calls]  # fmt: skip
    return m


@needs_qwen
def test_the_sample_renders_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import hf_tokenizer
    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = hf_tokenizer(r)
    doc = json.loads(SAMPLE.read_text())
    tools = doc[0]["agent"]["tool_definitions"]
    ls = _assistant("I will list the log files first.",
                    [("call_1", "bash", {"cmd": "ls /var/app/*.log"})])  # fmt: skip
    prompts = [
        [{"role": "system", "content": SAMPLE_SYS}, {"role": "user", "content": TASK}],
        [{"role": "system", "content": SAMPLE_SYS}, {"role": "user", "content": TASK}, ls,
         {"role": "tool", "tool_call_id": "call_1", "content": "/var/app/a.log\n/var/app/b.log"}],
        [{"role": "system", "content": SAMPLE_SYS}, {"role": "user", "content": SUMMARY}],
    ]  # fmt: skip
    calls = _read(SAMPLE)[:3]
    for call, prompt in zip(calls, prompts, strict=True):
        seq = r.render(call, group_id="g")
        comp = call.completion.model_dump(exclude_none=True)
        kw = {"tools": tools, "tokenize": True, "return_dict": False}
        full = list(hf.apply_chat_template([*prompt, comp], **kw))
        head = list(hf.apply_chat_template(prompt, add_generation_prompt=True, **kw))
        assert seq.tokens.tolist() == full and seq.loss_spans == [(len(head), len(full))]
