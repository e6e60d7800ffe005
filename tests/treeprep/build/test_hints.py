"""treeprep.build.hints: the branch hint of a call that leaves no sequence (rejected in stage 1,
dropped as a duplicate between the stages) passes to the next call of its thread, so the branch
that call now starts is named, not ``unknown``; the tokens stay as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow.ipc as ipc

from treeprep.build import BuildConfig, build
from treeprep.build.hints import HeldHints
from treeprep.build.workfiles import drop_rows
from treeprep.shards import iter_trees


def _call(group: str, turns: list[str], answer: str, **extra: str) -> dict:
    """An OpenAI chat record: user turns answered by ``ok`` in history, then ``answer``."""
    msgs: list[dict] = []
    for i, t in enumerate(turns):
        if i:
            msgs.append({"role": "assistant", "content": "ok"})
        msgs.append({"role": "user", "content": t})
    return {
        "group_id": group,
        "messages": msgs,
        "completion": {"role": "assistant", "content": answer},
        **extra,
    }


def _write(path: Path, rows: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _reasons(out: Path, group: str) -> list[str]:
    tree = next(iter_trees(str(out), groups=[group]))
    return sorted(r for r in tree.node_branch_reason if r)


def test_a_kept_call_takes_the_hint_held_for_its_thread_only() -> None:
    held = HeldHints()
    held.hold(("g", None, "main"), "compaction")
    held.hold(("g", None, "sub"), None)  # no hint: nothing held
    assert held.take(("g", None, "sub"), None) is None
    assert held.take(("g", None, "main"), "retry") == "retry"  # its own hint wins; taken
    assert held.take(("g", None, "main"), None) is None


def test_a_rejected_calls_hint_passes_to_the_next_call_of_its_thread(tmp_path: Path) -> None:
    """The compaction call's reply is empty (rejected): the call after it starts the branch."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(
        logs / "s.jsonl",
        [
            _call("g", ["fix the bug"], "looking"),
            _call("g", ["summary: bug found"], "", branch_reason="compaction"),  # rejected
            _call("g", ["summary: bug found", "go on"], "fixed"),
        ],
    )
    m = build(BuildConfig(inputs=[str(logs)], out=str(tmp_path / "o")))
    assert (m.counts.records_rejected, m.counts.records_in_trees) == (1, 2)
    assert _reasons(tmp_path / "o", "g") == ["compaction"]  # was ["unknown"]


def test_a_duplicate_rows_hint_passes_to_the_next_row_of_its_thread(tmp_path: Path) -> None:
    """A sub-agent's first call repeats a call of another file (another group): deduplication
    drops it, and the sub-agent's next call takes its hint, in the local engine and in
    :func:`drop_rows` (the Ray engine's)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "a.jsonl", [_call("other", ["count the lines"], "42")])
    sub = {"agent_id": "helper"}
    _write(
        logs / "b.jsonl",
        [
            _call("h", ["fix the bug"], "looking"),
            _call("h", ["count the lines"], "42", branch_reason="sub-agent", **sub),  # a copy
            _call("h", ["count the lines", "and words"], "7 words", **sub),
        ],
    )
    out = tmp_path / "o"
    m = build(BuildConfig(inputs=[str(logs)], out=str(out)))
    assert m.filtered == {"duplicate tokens": 1}
    assert _reasons(out, "h") == ["sub-agent"]  # was ["unknown"]
    work = [ipc.open_file(str(p)).read_all() for p in sorted(out.rglob("sequences.arrow"))]
    table = next(t for t in work if "h" in t.column("group_id").to_pylist())
    kept = drop_rows(table, np.array([1]))
    assert kept.column("branch_reason").to_pylist() == [None, "sub-agent"]
    assert kept.column("agent_id").to_pylist() == ["main", "helper"]
