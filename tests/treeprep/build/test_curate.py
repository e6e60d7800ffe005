"""Curation at build time (issue 27 item 8, and item 6's reasoning merge): deduplication across
files, filters, secret redaction; every record left out is counted, by reason, and the counts
reconcile."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.build.curate import REDACTED, Filters, merge_reasoning
from treeprep.errors import EmptyBuildError, TreeprepError
from treeprep.export import export_sequences
from treeprep.modes import ReasoningMerge
from treeprep.schemas import ChatCall
from treeprep.schemas.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[3]
CLAUDE = ROOT / "sample_data" / "claude-code"


def _call(i: int, *, group: str = "g", **kw) -> dict:
    return {
        "group_id": group,
        "call_id": f"{group}-{i}",
        "messages": [{"role": "user", "content": f"question {i}"}],
        "completion": {"role": "assistant", "content": f"answer {i}"},
        **kw,
    }


def _jsonl(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return path


def _reconciles(out: Path) -> dict:
    m = load_manifest(str(out))
    c = m.counts
    assert c.records_read == c.records_in_trees + c.records_rejected + c.records_filtered
    assert c.records_filtered == sum(m.filtered.values())
    assert sum(e.records_filtered for e in m.inputs) == c.records_filtered
    return m.filtered


def test_a_log_given_twice_is_trained_once(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    _jsonl(logs / "a.jsonl", [_call(i) for i in range(3)])
    shutil.copy(logs / "a.jsonl", logs / "b.jsonl")  # the same calls: same identity
    # the same text under another group and call id: the same tokens
    _jsonl(logs / "c.jsonl", [_call(0, group="h"), _call(9, group="h")])
    once = tmp_path / "once"
    m = build(BuildConfig(inputs=[str(logs / "a.jsonl")], out=str(once)))
    out = tmp_path / "out"
    m2 = build(BuildConfig(inputs=[str(logs)], out=str(out)))
    assert _reconciles(out) == {"duplicate call": 3, "duplicate tokens": 1}
    assert m2.counts.records_read == 8 and m2.counts.records_in_trees == 4
    assert m2.counts.tokens_linear > m.counts.tokens_linear  # c.jsonl's second call is new
    from treeprep.stats import compute_stats

    st = compute_stats(str(out))
    assert st["records_filtered"] == 4 and st["filtered"]["duplicate call"] == 3
    assert st["tokens_linear"] == m2.counts.tokens_linear  # the estimate reads deduplicated trees
    off = tmp_path / "off"
    m3 = build(BuildConfig(inputs=[str(logs)], out=str(off), dedup=False))
    assert m3.counts.records_in_trees == 8 and m3.counts.records_filtered == 0
    assert "filtered" not in (off / "manifest.json").read_text()
    assert m3.counts.tokens_linear > m2.counts.tokens_linear  # the estimate no longer inflated


def test_same_tokens_under_another_identity_are_a_duplicate(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    _jsonl(logs / "a.jsonl", [_call(0), _call(1)])
    _jsonl(logs / "b.jsonl", [_call(0, group="other"), _call(5, group="other")])
    out = tmp_path / "out"
    m = build(BuildConfig(inputs=[str(logs)], out=str(out)))
    assert _reconciles(out) == {"duplicate tokens": 1}
    assert m.counts.records_in_trees == 3
    got = sorted(r["call_id"] for r in _export(out, tmp_path))
    assert got == ["g-0", "g-1", "other-5"]


def test_duplicates_within_one_file_are_kept(tmp_path: Path) -> None:
    """k identical samples of one prompt are k samples: only copies in other files go."""
    src = _jsonl(tmp_path / "a.jsonl", [_call(0), {**_call(0), "call_id": "again"}])
    m = build(BuildConfig(inputs=[str(src)], out=str(tmp_path / "out")))
    assert m.counts.records_in_trees == 2 and m.counts.records_filtered == 0


def test_a_duplicate_a_later_call_shares_as_prefix_is_kept(tmp_path: Path) -> None:
    """Stage 1 stores a call's tokens after its shared prefix with the row before; a duplicate
    row that a kept row needs for that prefix stays, and the kept row is whole."""
    short = _call(0)
    longer = {**_call(1), "messages": [*short["messages"], short["completion"]]}
    longer["messages"].append({"role": "user", "content": "and more"})
    logs = tmp_path / "logs"
    _jsonl(logs / "a.jsonl", [short])
    _jsonl(logs / "b.jsonl", [short, longer])
    out = tmp_path / "out"
    build(BuildConfig(inputs=[str(logs)], out=str(out)))
    _reconciles(out)
    ref = tmp_path / "ref"
    build(BuildConfig(inputs=[str(logs / "b.jsonl")], out=str(ref)))
    whole = {tuple(r["input_ids"]) for r in _export(ref, tmp_path)}
    assert {tuple(r["input_ids"]) for r in _export(out, tmp_path)} == whole


def _export(out: Path, tmp: Path) -> list[dict]:
    dest = tmp / f"{out.name}.jsonl"
    export_sequences(str(out), str(dest))
    return [orjson.loads(line) for line in dest.read_bytes().splitlines()]


def test_filters_count_what_they_leave_out(tmp_path: Path) -> None:
    recs = [
        _call(0, timestamp="2025-01-10T00:00:00Z", model="claude-opus-4"),
        _call(1, timestamp="2025-03-10T00:00:00Z", model="claude-opus-4"),
        _call(2, timestamp="2025-03-11T00:00:00Z", model="gpt-5"),
        _call(3, model="claude-opus-4"),
        _call(4, timestamp="2025-06-01T00:00:00Z"),
    ]
    src = _jsonl(tmp_path / "a.jsonl", recs)
    out = tmp_path / "out"
    cfg = BuildConfig(
        inputs=[str(src)],
        out=str(out),
        file=FileOptions(since="2025-02-01", until="2025-05-01", model_name="claude-*"),
    )
    m = build(cfg)
    assert m.counts.records_in_trees == 1
    assert _reconciles(out) == {
        "after --until": 1,
        "before --since": 1,
        "model not --model-name": 1,
        "no timestamp recorded (--since/--until)": 1,
    }
    # issue 53 item 10: nothing was rejected, so no "see rejects.jsonl" (an empty file)
    with pytest.raises(EmptyBuildError, match=r"5 filtered, 0 files skipped\): .* written$"):
        build(
            BuildConfig(
                inputs=[str(src)], out=str(tmp_path / "o2"), file=FileOptions(model_name="nope")
            )
        )
    with pytest.raises(TreeprepError, match="ISO 8601"):
        BuildConfig(inputs=[str(src)], out="x", file=FileOptions(since="last tuesday"))


def test_project_filter_reads_claude_code_cwd(tmp_path: Path) -> None:
    assert '"cwd": "/home/dev/shop"' in next(CLAUDE.glob("*.jsonl")).read_text()
    kept = build(
        BuildConfig(
            inputs=[str(CLAUDE)], out=str(tmp_path / "a"), file=FileOptions(project="/home/dev")
        )
    )
    assert kept.counts.records_filtered == 0 and kept.counts.records_in_trees > 0
    gone = tmp_path / "b"
    with pytest.raises(EmptyBuildError):
        build(
            BuildConfig(inputs=[str(CLAUDE)], out=str(gone), file=FileOptions(project="/srv/other"))
        )
    since = build(
        BuildConfig(
            inputs=[str(CLAUDE)], out=str(tmp_path / "c"), file=FileOptions(since="2026-01-01")
        )
    )
    assert since.counts.records_in_trees == kept.counts.records_in_trees


def test_project_and_time_filters_read_codex_session_meta(tmp_path: Path) -> None:
    """Codex records its working directory in ``session_meta.cwd`` and a timestamp on every
    line: both reach the calls, so --project and --since/--until filter Codex sessions too (they
    were left out as "no project recorded")."""
    codex = ROOT / "sample_data" / "codex"
    assert '"cwd": "/home/dev/wc"' in next(codex.rglob("*.jsonl")).read_text()
    kept = build(
        BuildConfig(
            inputs=[str(codex)], out=str(tmp_path / "a"), file=FileOptions(project="/home/dev")
        )
    )
    assert kept.counts.records_filtered == 0 and kept.counts.records_in_trees > 0
    with pytest.raises(EmptyBuildError):
        build(
            BuildConfig(
                inputs=[str(codex)], out=str(tmp_path / "b"), file=FileOptions(project="/srv/other")
            )
        )
    early = build(
        BuildConfig(
            inputs=[str(codex)], out=str(tmp_path / "c"), file=FileOptions(until="2025-12-31")
        )
    )
    assert early.counts.records_in_trees == kept.counts.records_in_trees
    with pytest.raises(EmptyBuildError):  # the session is from 2025-11-02
        build(
            BuildConfig(
                inputs=[str(codex)], out=str(tmp_path / "d"), file=FileOptions(since="2025-11-03")
            )
        )


def test_filter_reasons_unit() -> None:
    from types import SimpleNamespace as NS

    f = Filters(project="/home/dev/shop")
    assert f.reason(NS(project="/home/dev/shop/sub")) is None
    assert f.reason(NS(project="/home/dev/shopping")) == "project not --project"
    assert f.reason(NS()) == "no project recorded (--project)"
    assert not Filters()


SECRETS = {
    "AWS Access Key": "AKIAIOSFODNN7EXAMPLE",
    "GitHub Token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
}


def test_redact_secrets_replaces_them_before_rendering(tmp_path: Path) -> None:
    pytest.importorskip("detect_secrets")
    aws, github = SECRETS["AWS Access Key"], SECRETS["GitHub Token"]
    text = f"export AWS_ACCESS_KEY_ID={aws}\ngit push # {github}"
    sha = "commit 3f786850e387550fdab836ed7e6dc881de23001b"  # a hash is not a secret
    recs = [
        {
            **_call(0),
            "messages": [
                {"role": "user", "content": "deploy"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "sh", "arguments": '{"cmd": "env"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "t1", "content": f"{text}\n{sha}"},
            ],
        }
    ]
    src = _jsonl(tmp_path / "a.jsonl", recs)
    out = tmp_path / "out"
    m = build(BuildConfig(inputs=[str(src)], out=str(out), file=FileOptions(redact="secrets")))
    assert m.curation == {"redacted:AWS Access Key": 1, "redacted:GitHub Token": 1}
    dump = (out / "manifest.json").read_text()
    assert "redacted:AWS Access Key" in dump
    ids = _export(out, tmp_path)[0]["input_ids"]
    rendered = bytes(i for i in ids if i < 256).decode("utf-8", "replace")
    assert REDACTED in rendered and sha in rendered
    assert not any(s in rendered for s in SECRETS.values())
    plain = build(BuildConfig(inputs=[str(src)], out=str(tmp_path / "plain")))
    assert plain.curation == {}
    assert "curation" not in (tmp_path / "plain" / "manifest.json").read_text()


def _claude_turn() -> dict:
    return {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "Check the file.",
        "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    }


def _claude_history() -> list[dict]:
    return [
        {"role": "user", "content": "list the files"},
        _claude_turn(),
        {"role": "tool", "tool_call_id": "t", "content": "a.py"},
    ]


@pytest.mark.parametrize("how", ["drop", "fold"])
def test_reasoning_merge_counts_changed_calls(tmp_path: Path, how: str) -> None:
    recs = [
        {**_call(0), "messages": _claude_history()},
        _call(1),
    ]
    src = _jsonl(tmp_path / "a.jsonl", recs)
    m = build(
        BuildConfig(
            inputs=[str(src)], out=str(tmp_path / how), file=FileOptions(reasoning_merge=how)
        )
    )
    assert m.curation == {f"reasoning-merge:{how}": 1}
    c = ChatCall.model_validate({**_call(0), "messages": _claude_history()})
    assert merge_reasoning(c, ReasoningMerge(how))
    turn = c.messages[1]
    if how == "drop":
        assert turn.reasoning_content is None and turn.content == "Let me look."
    else:
        assert turn.content is None
        assert turn.reasoning_content == "Check the file.\n\nLet me look."
    assert not merge_reasoning(c, ReasoningMerge(how))  # nothing left to merge


def test_drop_keeps_the_completions_reasoning() -> None:
    """drop is for the history: a completion's reasoning is what the model said, never dropped
    (with text and a tool call too, gpt-oss's template then refuses the call); fold keeps it."""
    c = ChatCall.model_validate({**_call(0), "completion": _claude_turn()})
    assert not merge_reasoning(c, ReasoningMerge.drop)
    assert c.completion.reasoning_content == "Check the file."
    assert c.completion.content == "Let me look."
    assert merge_reasoning(c, ReasoningMerge.fold)
    assert c.completion.reasoning_content == "Check the file.\n\nLet me look."


def test_fold_reads_responses_text_parts_as_the_renderer_does() -> None:
    """Codex and other Responses logs give a turn's text as ``output_text`` parts, which the
    renderer joins as text: fold moves them to the reasoning like a plain text (it left them, and
    gpt-oss then rejected every such Codex call); a part that is not text is left alone."""
    parts = [{"type": "output_text", "text": "Let me "}, {"type": "text", "text": "look."}]
    c = ChatCall.model_validate({**_call(0), "completion": {**_claude_turn(), "content": parts}})
    assert merge_reasoning(c, ReasoningMerge.fold)
    assert (c.completion.reasoning_content, c.completion.content) == (
        "Check the file.\n\nLet me look.",
        None,
    )
    image = [*parts, {"type": "input_image", "image_url": "data:"}]
    c = ChatCall.model_validate({**_call(0), "completion": {**_claude_turn(), "content": image}})
    assert not merge_reasoning(c, ReasoningMerge.fold)


GPT_OSS = ROOT / ".." / "shared" / "data" / "tokenizers" / "gpt-oss"


@pytest.mark.skipif(not GPT_OSS.exists(), reason="../shared/data is absent")
def test_reasoning_merge_lets_claude_turns_render_with_gpt_oss(tmp_path: Path) -> None:
    """gpt-oss's template (llama.cpp renders with it) refuses a turn with text, reasoning and a
    tool call. llama.cpp sends a history turn without its text, so only the call whose
    completion has all three is rejected; merged, the call renders, and the folded text is
    trained in the analysis channel."""
    turn = _claude_turn()
    history = [
        {"role": "user", "content": "list the files"},
        turn,
        {"role": "tool", "tool_call_id": "t", "content": "a.py"},
    ]
    plain = {**_claude_turn(), "content": "", "reasoning_content": None}
    recs = [
        {**_call(0), "messages": history, "completion": _claude_turn()},
        {**_call(1), "messages": history, "completion": plain},
    ]
    src = _jsonl(tmp_path / "a.jsonl", recs)
    tok = str(GPT_OSS)
    m = build(
        BuildConfig(
            inputs=[str(src)],
            out=str(tmp_path / "off"),
            tokenizer=tok,
            file=FileOptions(server="llama.cpp"),
        )
    )
    assert (m.counts.records_in_trees, m.counts.records_rejected) == (1, 1)
    assert (
        "Cannot pass both content and thinking" in (tmp_path / "off" / "rejects.jsonl").read_text()
    )
    for how in ("drop", "fold"):
        out = tmp_path / how
        m = build(
            BuildConfig(
                inputs=[str(src)],
                out=str(out),
                tokenizer=tok,
                file=FileOptions(reasoning_merge=how, server="llama.cpp"),
            )
        )
        assert m.curation == {f"reasoning-merge:{how}": 2}
        # drop keeps the completion's reasoning, which the template refuses with its text
        assert m.counts.records_in_trees == (1 if how == "drop" else 2)


def _anthropic_record(session: str) -> dict:
    """A Claude API call whose history holds a turn of thinking, text and a tool call."""
    turn = [
        {"type": "thinking", "thinking": "Check the file.", "signature": "s"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "t", "name": "ls", "input": {}},
    ]
    result = [{"type": "tool_result", "tool_use_id": "t", "content": "a.py"}]
    messages = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": turn},
        {"role": "user", "content": result},
    ]
    response = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "a.py"}],
        "stop_reason": "end_turn",
    }
    request = {"model": "claude", "max_tokens": 64, "messages": messages}
    return {"session_id": session, "request": request, "response": response}


@pytest.mark.parametrize("how", ["drop", "fold"])
def test_a_files_curation_does_not_depend_on_the_file_read_before(tmp_path: Path, how: str) -> None:
    """The calls of one file share their history's message objects, which curation rewrites in
    place; the next file read by the same process starts afresh, so that a file's work (and its
    counts) are that file's alone, whatever the worker read before it."""
    logs = tmp_path / "logs"
    _jsonl(logs / "a.jsonl", [_anthropic_record("s1")])
    _jsonl(logs / "b.jsonl", [_anthropic_record("s2")])
    one = FileOptions(reasoning_merge=how)
    alone = build(BuildConfig(inputs=[str(logs / "b.jsonl")], out=str(tmp_path / "b"), file=one))
    both = build(BuildConfig(inputs=[str(logs)], out=str(tmp_path / "ab"), file=one))
    assert alone.curation == {f"reasoning-merge:{how}": 1}
    assert both.curation == {f"reasoning-merge:{how}": 2}
