"""The SQLite stores: OpenCode's ``opencode.db``, Goose's ``sessions.db``, Crush's ``crush.db``.

Detection by schema, the prompts written out by hand, the rejects named by row, the samples
equal to what the generator writes, and the read-only access: a database held open by a writer
in the middle of a write transaction, a writer holding its exclusive lock, a truncated file.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.treeprep.formats import sqlite_samples
from treeprep.errors import InputError
from treeprep.formats import ReadOptions, _sqlite, companion_format, detect_format, get_format
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data"
OPENCODE = SAMPLES / "opencode_db" / "opencode.db"
GOOSE = SAMPLES / "goose" / "sessions.db"
CRUSH = SAMPLES / "crush" / "crush.db"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")


def _head(p: Path) -> bytes:
    return p.read_bytes()[:65536]


def _read(p: Path, opts: ReadOptions | None = None) -> list[Any]:
    spec = detect_format(str(p), _head(p))
    assert spec is not None
    return list(spec.read(str(p), opts or ReadOptions()))


def _calls(items: list[Any]) -> dict[str, ChatCall]:
    return {c.call_id: c for c in items if isinstance(c, ChatCall)}


def _msgs(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def _call(cid: str, name: str, args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


@pytest.mark.parametrize(
    ("path", "name"), [(OPENCODE, "opencode-db"), (GOOSE, "goose"), (CRUSH, "crush")]
)
def test_each_store_is_detected_by_its_schema(path: Path, name: str, tmp_path: Path) -> None:
    spec = detect_format(str(path), _head(path))
    assert spec is not None and spec.name == name
    renamed = tmp_path / "whatever.sqlite"  # by schema, not by name
    renamed.write_bytes(path.read_bytes())
    spec = detect_format(str(renamed), _head(renamed))
    assert spec is not None and spec.name == name


def test_a_database_of_other_tables_is_no_store(tmp_path: Path) -> None:
    p = tmp_path / "opencode.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE session (id TEXT, title TEXT)")  # OpenCode's name, not its columns
    con.execute("CREATE TABLE messages (id TEXT, session_id TEXT)")
    con.commit()
    con.close()
    assert detect_format(str(p), _head(p)) is None


def test_the_files_beside_a_database_belong_to_it(tmp_path: Path) -> None:
    con = sqlite_samples.crush(tmp_path / "crush.db", wal=True)
    assert (tmp_path / "crush.db-wal").exists()
    assert companion_format(str(tmp_path / "crush.db-wal")) == "crush"
    assert companion_format(str(tmp_path / "crush.db-shm")) == "crush"
    assert companion_format(str(tmp_path / "other.db-wal")) is None
    con.close()


@pytest.mark.parametrize("name", list(sqlite_samples.SAMPLES))
def test_the_sample_is_what_the_generator_writes(name: str, tmp_path: Path) -> None:
    fresh = tmp_path / Path(name).name
    sqlite_samples.SAMPLES[name](fresh).close()
    dump = [(type(x).__name__, x.model_dump(exclude={"source_file", "file"})) for x in _read(fresh)]
    want = [
        (type(x).__name__, x.model_dump(exclude={"source_file", "file"}))
        for x in _read(SAMPLES / name)
    ]
    assert dump == want


# --------------------------------------------------------------------------------------------
# OpenCode
# --------------------------------------------------------------------------------------------


def test_opencode_steps_and_a_task_sub_agent_in_its_roots_tree() -> None:
    items = _read(OPENCODE)
    calls = _calls(items)
    assert list(calls) == ["ses_1/msg_02#0", "ses_1/msg_02#1", "ses_2/msg_06#0", "ses_2/msg_06#1"]
    task = {
        "description": "count lines",
        "prompt": "Count the lines of shop.py",
        "subagent_type": "general",
    }
    second = calls["ses_1/msg_02#1"]
    assert _msgs(second) == [
        {"role": "user", "content": "How long is shop.py?"},
        {"role": "assistant", "content": "", "reasoning_content": "A sub-agent can count.",
         "tool_calls": [_call("call_1", "task", task)]},
        {"role": "tool", "content": "shop.py has 42 lines.", "tool_call_id": "call_1",
         "name": "task"},
    ]  # fmt: skip
    assert second.completion.content == "shop.py is 42 lines long."
    sub = calls["ses_2/msg_06#0"]
    assert (sub.group_id, sub.agent_id, sub.branch_reason) == ("ses_1", "ses_2", "sub-agent")
    assert _msgs(sub) == [{"role": "user", "content": "Count the lines of shop.py"}]
    assert {c.group_id for c in calls.values()} == {"ses_1"}
    rejects = [(r.line, r.call_id, r.reason[:30]) for r in items if isinstance(r, Reject)]
    assert rejects == [
        (4, "ses_1/msg_04#0", "the step has no step-finish: t"),
        (7, None, "message msg_07: data is not JS"),
        (8, "ses_3/msg_08#0", "message msg_07: data is not JS"),
    ]


# --------------------------------------------------------------------------------------------
# Goose
# --------------------------------------------------------------------------------------------


def test_goose_tool_responses_and_a_compaction() -> None:
    items = _read(GOOSE, ReadOptions(system_prompt="You are goose."))
    calls = _calls(items)
    assert list(calls) == [f"20260701_1/{k}" for k in (2, 4, 6, 8, 11)]
    first = calls["20260701_1/2"].completion.model_dump(exclude_none=True)
    assert first == {
        "role": "assistant", "content": "", "reasoning_content": "Count it.",
        "tool_calls": [_call("call_1", "developer__shell", {"command": "wc -l shop.py"})],
    }  # fmt: skip
    fourth = calls["20260701_1/8"]
    assert _msgs(fourth)[0] == {"role": "system", "content": "You are goose."}
    assert _msgs(fourth)[-1] == {"role": "tool", "content": "Error: timed out",
                                 "tool_call_id": "call_2"}  # fmt: skip
    assert fourth.model == "gpt-5"
    after = calls["20260701_1/11"]
    assert after.branch_reason == "compaction"
    assert _msgs(after) == [
        {"role": "system", "content": "You are goose."},
        {"role": "user",
         "content": "The conversation was compacted: you counted shop.py and ran the tests."},
        {"role": "user", "content": "Try again."},
    ]  # fmt: skip
    rejects = [(r.line, r.reason) for r in items if isinstance(r, Reject)]
    assert rejects == [
        (13, "message 13.content_json[0].toolCall: a tool request that did not parse (bad json)")
    ]


# --------------------------------------------------------------------------------------------
# Crush
# --------------------------------------------------------------------------------------------


def test_crush_prompts_as_prepare_prompt_builds_them() -> None:
    from treeprep.formats.crush import TODO_REMINDER

    items = _read(CRUSH)
    calls = _calls(items)
    assert list(calls) == ["s1/m2", "s1/m4", "s1/m13", "m2$$call_1/m6", "m2$$call_1/m8"]
    reminder = {"role": "user", "content": TODO_REMINDER}
    assert _msgs(calls["s1/m4"]) == [
        reminder,
        {"role": "user", "content": "How long is shop.py?"},  # trimmed, as ToAIMessage sends it
        {"role": "assistant", "content": "", "reasoning_content": "Ask an agent.",
         "tool_calls": [_call("call_1", "agent", '{"prompt":"Count the lines of shop.py"}')]},
        {"role": "tool", "content": "42 lines.", "tool_call_id": "call_1", "name": "agent"},
    ]  # fmt: skip
    assert calls["s1/m4"].completion.content == "It has 42 lines.\n"  # as generated
    assert _msgs(calls["s1/m13"]) == [
        reminder,
        {"role": "user", "content": "We measured shop.py (42 lines)."},  # the summary
        {"role": "user", "content": "Thanks, go on."},
    ]
    # the first call after the summary starts the thread anew: a compaction branch, the only hint
    assert [c.branch_reason for k, c in calls.items() if k.startswith("s1/")] == [
        None, None, "compaction",
    ]  # fmt: skip
    sub = calls["m2$$call_1/m6"]
    assert (sub.group_id, sub.agent_id, sub.parent_call_id, sub.branch_reason) == (
        "s1", "m2$$call_1", "s1/m2", "sub-agent",
    )  # fmt: skip
    assert _msgs(sub) == [{"role": "user", "content": "Count the lines of shop.py"}]
    rejects = [(r.line, r.call_id, r.reason) for r in items if isinstance(r, Reject)]
    assert rejects == [
        (10, "s1/m10", "the step finished with 'canceled': its reply is not whole"),
        (11, "s1/m11",
         "a summary call: its prompt is Crush's summary template, which the store lacks"),
    ]  # fmt: skip


def test_crush_an_orphaned_call_gets_the_interrupted_result(tmp_path: Path) -> None:
    from treeprep.formats.crush import INTERRUPTED

    p = tmp_path / "crush.db"
    con = sqlite_samples.crush(p)
    con.execute("DELETE FROM messages WHERE id = 'm3'")  # call_1's result never came
    con.close()
    m4 = _calls(_read(p))["s1/m4"]
    assert _msgs(m4)[-1] == {
        "role": "tool", "tool_call_id": "call_1", "name": "agent", "content": INTERRUPTED
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# read-only access
# --------------------------------------------------------------------------------------------


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", list(sqlite_samples.SAMPLES))
def test_a_store_in_use_by_a_writer_is_read_without_blocking_it(name: str, tmp_path: Path) -> None:
    p = tmp_path / Path(name).name
    writer = sqlite_samples.SAMPLES[name](p, wal=True)
    committed = [x.model_dump(exclude={"source_file", "file"}) for x in _read(p)]
    writer.execute("BEGIN IMMEDIATE")  # an agent in the middle of a write
    table = "message" if name.startswith("opencode") else "messages"
    writer.execute(f"DELETE FROM {table}")
    during = [x.model_dump(exclude={"source_file", "file"}) for x in _read(p)]
    assert during == committed  # the last committed state, not the open transaction's
    writer.execute("COMMIT")  # the reader held no lock that blocks the commit
    writer.close()
    assert not _calls(_read(p))  # and the next read sees what it committed


def test_reading_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "crush.db"
    sqlite_samples.crush(p).close()
    p.chmod(0o444)
    before = (_digest(p), p.stat().st_mtime_ns, sorted(x.name for x in tmp_path.iterdir()))
    assert _calls(_read(p))
    assert before == (_digest(p), p.stat().st_mtime_ns, sorted(x.name for x in tmp_path.iterdir()))


def test_a_writer_holding_its_exclusive_lock_makes_one_clear_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "crush.db"
    writer = sqlite_samples.crush(p)  # rollback-journal mode: a writer can lock readers out
    writer.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT", 0.05)
    with pytest.raises(InputError, match="locked by a writer"):
        list(get_format("crush").read(str(p), ReadOptions()))
    writer.execute("ROLLBACK")
    writer.close()


def test_a_truncated_database_is_refused_as_one_reject(tmp_path: Path) -> None:
    whole = tmp_path / "whole.db"
    sqlite_samples.opencode(whole).close()
    cut = tmp_path / "opencode.db"
    cut.write_bytes(whole.read_bytes()[: 3 * 4096 + 100])  # a copy stopped mid-write
    with pytest.raises(InputError, match="not a readable SQLite database"):
        list(get_format("opencode-db").read(str(cut), ReadOptions()))


@pytest.mark.parametrize(
    ("sample", "counts"),
    [("opencode_db", (7, 4, 3, 1)), ("goose", (6, 5, 1, 1)), ("crush", (7, 5, 2, 1))],
)
def test_the_samples_build_and_reconcile(
    sample: str, counts: tuple[int, ...], tmp_path: Path
) -> None:
    from treeprep.build import BuildConfig, build

    m = build(BuildConfig(inputs=[str(SAMPLES / sample)], out=str(tmp_path / "o")))
    c = m.counts
    assert (c.records_read, c.records_in_trees, c.records_rejected, c.trees) == counts


@needs_qwen
@pytest.mark.parametrize("path", [OPENCODE, GOOSE, CRUSH])
def test_calls_render_as_apply_chat_template_qwen3(path: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    calls = [c for c in _read(path, ReadOptions(system_prompt="You are an agent.")) if
             isinstance(c, ChatCall)]  # fmt: skip
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


_JSON_COLUMNS = {
    "opencode_db/opencode.db": [("message", "data"), ("part", "data")],
    "goose/sessions.db": [("messages", "content_json"), ("messages", "metadata_json")],
    "crush/crush.db": [("messages", "parts")],
}


@pytest.mark.parametrize("name", list(sqlite_samples.SAMPLES))
def test_mutated_rows_give_records_or_rejects_never_exceptions(name: str, tmp_path: Path) -> None:
    import json
    import random

    from tests.treeprep.formats.test_malformed import _mutate

    rng = random.Random(20260701)
    for k in range(15):
        p = tmp_path / f"m{k}.db"
        con = sqlite_samples.SAMPLES[name](p)
        table, col = rng.choice(_JSON_COLUMNS[name])
        rows = con.execute(f"SELECT rowid, {col} FROM {table}").fetchall()
        rowid, raw = rng.choice(rows)
        value = _mutate(json.loads(raw), rng) if raw else None
        con.execute(f"UPDATE {table} SET {col} = ? WHERE rowid = ?", (json.dumps(value), rowid))
        con.close()
        items = _read(p)
        assert all(isinstance(x, ChatCall | Reject) for x in items)
