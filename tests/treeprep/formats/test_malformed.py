"""Malformed records: every adapter rejects them with the file, the line and the field, never an
exception other than the project's.

Two kinds of test. A regression test per adapter (named after the fuzzing bug it pins) takes one of
our sample files, breaks one field the adapter reads (a number where an object, a list or a string
belongs, as a colleague's fuzzer did) and checks the reject: its file and line, and a reason naming
the field's JSON path and the expected type. Then a seeded mutation test over ``sample_data``: a
few hundred mutated copies (fields deleted or replaced by odd values), read by the format that the
unmutated file has (as ``--format`` would force) and by detection, where nothing but the project's
errors may escape, and the items reconcile with the input records. It runs in a few seconds.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from treeprep.errors import InputError, TreeprepError
from treeprep.formats import ReadOptions, detect_format, formats, get_format
from treeprep.formats._fields import as_dict, dicts, expect, opt_list, type_name
from treeprep.schemas import ChatCall, Reject, TokenRollout

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"
CC_SESSION = SAMPLE / "claude-code" / "7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b.jsonl"


def _jsonl(path: Path) -> list[Any]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write_jsonl(path: Path, recs: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _read(fmt: str, path: Path) -> list[Any]:
    return list(get_format(fmt).read(str(path), ReadOptions()))


def _only_reject(items: list[Any], needle: str) -> Reject:
    """The one reject whose reason holds ``needle``."""
    found = [x for x in items if isinstance(x, Reject) and needle in x.reason]
    assert len(found) == 1, [x.reason for x in items if isinstance(x, Reject)]
    return found[0]


# ---- the typed accessors --------------------------------------------------------------------


def test_accessors_name_the_path_and_the_expected_type() -> None:
    with pytest.raises(
        TreeprepError,
        match=r"^messages\[3\]\.content: expected a string or a list "
        r"of parts, got int$",
    ):
        expect(7, "messages[3].content", str, list, what="a string or a list of parts")
    with pytest.raises(TreeprepError, match=r"^x: expected an integer, got boolean$"):
        expect(True, "x", int)  # a bool is never an int here
    with pytest.raises(TreeprepError, match=r"^calls\[1\]: expected an object, got array$"):
        dicts([{}, [1]], "calls")
    with pytest.raises(TreeprepError, match=r"^m: expected an object, got float$"):
        as_dict(float("nan"), "m")
    assert opt_list(None, "x") == [] and dicts(None, "x") == []
    assert [type_name(v) for v in (None, "", {}, [], 1.5)] == [
        "null",
        "string",
        "object",
        "array",
        "float",
    ]


# ---- one regression test per adapter ----------------------------------------------------------


def test_mini_swe_agent_tool_calls_int_is_a_reject_not_typeerror(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "mini_swe_agent_wc.traj.json").read_text())
    i = next(i for i, m in enumerate(doc["messages"]) if m.get("tool_calls"))
    doc["messages"][i]["tool_calls"] = 1
    p = tmp_path / "run.traj.json"
    p.write_text(json.dumps(doc))
    r = _only_reject(_read("mini-swe-agent", p), f"messages[{i}].tool_calls")
    assert (r.file, r.line) == (str(p), 1)
    assert r.reason == f"messages[{i}].tool_calls: expected an array, got int"


def test_mini_swe_agent_unhashable_role_and_bad_info_are_named(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "mini_swe_agent_wc.traj.json").read_text())
    doc["messages"][1]["role"] = ["user"]
    p = tmp_path / "run.traj.json"
    p.write_text(json.dumps(doc))
    assert (
        "messages[1]: unknown role array" in _only_reject(_read("mini-swe-agent", p), "role").reason
    )
    doc["info"] = 1
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"run\.traj\.json:1: info: expected an object, got int"):
        _read("mini-swe-agent", p)


def test_swe_agent_tool_call_not_an_object_is_a_reject_not_attributeerror(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "swe_agent_slugify.traj").read_text())
    msgs = doc["trajectory"][1]["messages"]
    j = len(msgs) - 2
    assert msgs[j].get("tool_calls")
    msgs[j]["tool_calls"][0] = 5
    p = tmp_path / "run.traj"
    p.write_text(json.dumps(doc))
    items = _read("swe-agent", p)
    field = f"trajectory[1].messages[{j}].tool_calls[0]: expected an object, got int"
    # the completion of call 1 and the prompt of call 2 hold it: both are rejected, by name
    assert [(x.file, x.line, x.reason) for x in items if isinstance(x, Reject)] == [
        (str(p), 1, f"call trajectory[1]: {field}"),
        (str(p), 1, f"call trajectory[2]: {field}"),
    ]
    assert sum(isinstance(x, ChatCall) for x in items) >= 1  # the other calls are kept


def test_claude_code_message_not_an_object_rejects_that_line(tmp_path: Path) -> None:
    recs = _jsonl(CC_SESSION)
    n = next(i for i, r in enumerate(recs) if r.get("type") == "user")
    recs[n]["message"] = 1
    p = _write_jsonl(tmp_path / "s.jsonl", recs)
    items = _read("claude-code", p)
    r = _only_reject(items, "message: expected an object")
    assert (r.file, r.line, r.reason) == (str(p), n + 1, "message: expected an object, got int")
    # every call whose thread runs through that line says so, instead of a wrong prompt
    assert any(
        f"is line {n + 1}, which is rejected" in x.reason for x in items if isinstance(x, Reject)
    )


def test_claude_code_content_block_text_int_is_a_reject_not_typeerror(tmp_path: Path) -> None:
    recs = _jsonl(CC_SESSION)
    n = next(i for i, r in enumerate(recs) if r.get("type") == "assistant")
    recs[n]["message"]["content"] = [{"type": "text", "text": 3}]
    p = _write_jsonl(tmp_path / "s.jsonl", recs)
    r = _only_reject(_read("claude-code", p), "message.content[0].text")
    assert (r.line, r.reason) == (n + 1, "message.content[0].text: expected a string, got int")


def test_detection_survives_a_claude_code_type_that_is_a_list(tmp_path: Path) -> None:
    recs = _jsonl(CC_SESSION)
    recs[0]["type"] = ["user"]
    p = _write_jsonl(tmp_path / "s.jsonl", recs)
    spec = detect_format(str(p), p.read_bytes()[:65536])  # was TypeError: unhashable type
    assert spec is not None and spec.name == "claude-code"  # the other lines still place it
    r = _only_reject(_read("claude-code", p), "type: expected")
    assert (r.line, r.reason) == (1, "type: expected a string, got array")


def test_codex_unhashable_item_type_is_a_reject_not_typeerror(tmp_path: Path) -> None:
    src = next((SAMPLE / "codex").rglob("*.jsonl"))
    recs = _jsonl(src)
    n = next(i for i, r in enumerate(recs) if r["type"] == "response_item")
    recs[n]["type"] = {"a": None}
    recs[n + 1]["payload"]["type"] = [1]
    p = _write_jsonl(tmp_path / src.name, recs)
    items = _read("codex", p)
    assert any(isinstance(x, Reject) and x.line == n + 1 for x in items)


def test_gemini_cli_content_int_is_a_reject_naming_the_message(tmp_path: Path) -> None:
    recs = _jsonl(SAMPLE / "gemini_cli" / "session-2025-09-14T10-02-3f9c2a1b.jsonl")
    n = next(i for i, r in enumerate(recs) if r.get("type") == "user")
    recs[n]["content"] = [7]
    p = _write_jsonl(tmp_path / "session.jsonl", recs)
    items = _read("gemini-cli", p)
    mid = recs[n]["id"]
    want = f"message {mid!r}.content[0]: expected a string or a part object, got int"
    rejects = [x for x in items if isinstance(x, Reject)]
    assert rejects and all(x.reason == want and x.file == str(p) for x in rejects)
    assert all(x.line > n + 1 for x in rejects)  # each call after it, at the call's own line


def test_gemini_cli_document_message_not_an_object_is_a_reject(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "gemini_cli" / "session-2025-07-02T08-00-7b21e0c4.json").read_text())
    doc["messages"].append(1.5)
    p = tmp_path / "session.json"
    p.write_text(json.dumps(doc, indent=2))
    r = _only_reject(_read("gemini-cli", p), "got float")
    assert r.reason == "expected a message record (an object), got float"


def test_anthropic_content_int_is_a_reject_not_typeerror(tmp_path: Path) -> None:
    recs = _jsonl(SAMPLE / "anthropic_messages.jsonl")
    recs[1]["request"]["messages"][0]["content"] = 1
    recs[2]["response"]["content"] = [{"type": "text", "text": None}, {"type": "text", "text": 2}]
    p = _write_jsonl(tmp_path / "a.jsonl", recs)
    items = _read("anthropic", p)
    assert len(items) == 3 and isinstance(items[0], ChatCall)
    assert (items[1].line, items[1].reason) == (
        2,
        "request.messages[0].content: expected a string or a list of content blocks, got int",
    )
    assert (items[2].line, items[2].reason) == (
        3,
        "response.content[1].text: expected a string, got int",
    )


def test_openhands_observation_int_rejects_the_event_and_later_calls(tmp_path: Path) -> None:
    recs = _jsonl(SAMPLE / "openhands" / "events.jsonl")
    n = next(i for i, r in enumerate(recs) if r.get("kind") == "ObservationEvent")
    recs[n]["observation"] = 1
    p = _write_jsonl(tmp_path / "events.jsonl", recs)
    items = _read("openhands-events", p)
    [r] = [x for x in items if isinstance(x, Reject) and x.line == n + 1]
    assert (r.file, r.reason) == (str(p), "observation: expected an object, got int")
    later = [x for x in items if (getattr(x, "line", 0) or getattr(x, "source_line", 0)) > n + 1]
    assert later and all(
        isinstance(x, Reject) and f"line {n + 1} is rejected" in x.reason for x in later
    )


def test_openai_chat_json_request_tools_is_read_not_keyerror(tmp_path: Path) -> None:
    src = next((SAMPLE / "litellm").glob("*.json"))
    rec = json.loads(src.read_text())
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    rec.pop("tools", None)
    req = rec.setdefault("request", {})
    assert isinstance(req, dict)
    req["tools"] = tools  # was KeyError: 'request.tools'
    (tmp_path / src.name).write_text(json.dumps(rec))
    [call] = _read("openai-chat-json", tmp_path / src.name)
    assert isinstance(call, ChatCall) and call.tools is not None
    assert [t["function"]["name"] for t in call.tools] == ["f"]
    req["tools"] = 5
    (tmp_path / src.name).write_text(json.dumps(rec))
    [r] = _read("openai-chat-json", tmp_path / src.name)
    assert isinstance(r, Reject) and "request.tools" in r.reason


def test_tau_function_not_an_object_is_a_reject_not_attributeerror(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "tau_bench_shop.json").read_text())
    j = next(j for j, m in enumerate(doc[0]["traj"]) if m.get("tool_calls"))
    doc[0]["traj"][j]["tool_calls"][0]["function"] = "x"
    p = tmp_path / "tau.json"
    p.write_text(json.dumps(doc, indent=2))
    items = _read("tau-bench", p)
    want = f"[0].traj[{j}].tool_calls[0].function: expected an object, got string"
    r = _only_reject(items, want)
    assert (r.file, r.line, r.reason) == (str(p), 2, want)  # the line where [0] starts
    assert any(isinstance(x, ChatCall) for x in items)  # the other trajectories are kept


def test_tau2_info_not_an_object_rejects_the_file_by_name(tmp_path: Path) -> None:
    doc = json.loads((SAMPLE / "tau2_bench_shop.json").read_text())
    doc["info"]["environment_info"] = [1]
    p = tmp_path / "tau2.json"
    p.write_text(json.dumps(doc, indent=2))
    with pytest.raises(
        InputError,
        match=r"tau2\.json:1: info\.environment_info: expected an "
        r"object, got array",
    ):
        _read("tau2-bench", p)
    doc = json.loads((SAMPLE / "tau2_bench_shop.json").read_text())
    doc["simulations"][0]["reward_info"] = -1
    p.write_text(json.dumps(doc, indent=2))
    r = _only_reject(_read("tau2-bench", p), "reward_info")
    assert r.reason == "simulations[0].reward_info: expected an object, got int"


# ---- seeded mutations of every sample file ------------------------------------------------

_ODD: list[Any] = [None, 1, -1, True, "", "x", [], {}, [1], {"a": None}, 1.5, float("nan")]
#: formats with exactly one call (or reject) per record: a JSONL line, or the file
_PER_LINE = {"anthropic", "openai-chat", "tokens"}
_PER_FILE = {"openai-chat-json"}


def _paths(v: Any, pre: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield pre
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*pre, k))
    elif isinstance(v, list):
        for i, x in enumerate(v[:6]):
            yield from _paths(x, (*pre, i))


def _mutate(v: Any, rng: random.Random) -> Any:
    """``v`` with one field deleted or replaced by an odd value."""
    ps = [p for p in _paths(v) if p]
    if not ps:
        return v
    p = rng.choice(ps)
    cur = v
    for k in p[:-1]:
        cur = cur[k]
    if rng.random() < 0.35 and isinstance(cur, dict):
        del cur[p[-1]]
    else:
        cur[p[-1]] = copy.deepcopy(rng.choice(_ODD))  # a shared [] could come to hold itself
    return v


def _sidecar(p: Path) -> bool:
    """A file read with a log but no log itself: a Mistral Vibe or kimi-cli sub-agent
    ``meta.json``, kimi-cli's ``wire.jsonl``, the project, message and part files of OpenCode's
    storage (read with their session's file), the ``--tools`` file of the Cursor sample, a Cline 4
    session's manifest."""
    rel = p.relative_to(SAMPLE).parts
    if rel[:2] == ("cursor", "options"):
        return True
    if rel[:2] == ("cline", "sessions") and not p.name.endswith(".messages.json"):
        return True
    storage = rel[:2] == ("opencode", "storage") and rel[2] != "session"
    return p.name in ("meta.json", "wire.jsonl") or storage


#: the seeds of the mutation test: one by default, ``TREEPREP_MUTATION_SEEDS=N`` for N
#: (docs/development.md; 940 seeds found three readers raising on odd values on 2026-12-07)
SEEDS = [20240607 + k for k in range(int(os.environ.get("TREEPREP_MUTATION_SEEDS", "1")))]


def _mutants(tmp_path: Path, copies: int, seed: int) -> Iterator[tuple[str, Path, int]]:
    """(format of the original, mutated copy, its records) for every sample file."""
    rng = random.Random(seed)
    sources = sorted(
        p
        for p in SAMPLE.rglob("*")
        if p.is_file() and p.suffix in (".json", ".jsonl", ".traj") and not _sidecar(p)
    )
    assert len(sources) >= 15
    for src in sources:
        spec = detect_format(str(src), src.read_bytes()[:65536])
        assert spec is not None, src
        text = src.read_text()
        is_jsonl = src.suffix == ".jsonl"
        for k in range(copies):
            out = tmp_path / f"m{k}" / src.relative_to(SAMPLE)
            out.parent.mkdir(parents=True, exist_ok=True)
            if is_jsonl:
                recs = [json.loads(x) for x in text.splitlines() if x.strip()]
                for _ in range(3):
                    i = rng.randrange(len(recs))
                    recs[i] = _mutate(recs[i], rng)
                out.write_text("".join(json.dumps(r) + "\n" for r in recs))
                yield spec.name, out, len(recs)
            else:
                doc = json.loads(text)
                for _ in range(4):
                    doc = _mutate(doc, rng)
                out.write_text(json.dumps(doc, indent=2))
                yield spec.name, out, 1


def _read_all(fmt: str, path: Path) -> list[Any]:
    """Everything the adapter yields; InputError (the whole file unusable) counts as one
    reject, as stage 1 records it. Any other exception fails the test."""
    out: list[Any] = []
    try:
        for x in formats()[fmt].read(str(path), ReadOptions()):
            out.append(x)
    except InputError as e:
        assert e.file == str(path) and e.reason
        out.append(Reject(file=e.file, line=e.line, reason=e.reason))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_samples_give_records_or_rejects_never_exceptions(
    tmp_path: Path, seed: int
) -> None:
    seen: dict[str, int] = {}
    for fmt, path, n_records in _mutants(tmp_path, copies=12, seed=seed):
        names = {fmt}
        detected = detect_format(str(path), path.read_bytes()[:65536])  # must not raise
        if detected is not None:
            names.add(detected.name)
        for name in sorted(names):
            items = _read_all(name, path)
            for x in items:
                assert isinstance(x, ChatCall | TokenRollout | Reject), x
                if isinstance(x, Reject):
                    assert x.file == str(path) and x.reason, x
                    assert not x.reason.startswith("internal error"), x
                else:
                    assert x.source_file == str(path)
            if name != fmt:
                continue
            seen[fmt] = seen.get(fmt, 0) + 1
            if fmt in _PER_LINE:
                # one item per line, or one reject for the whole file
                assert len(items) == n_records or (len(items) == 1 and isinstance(items[0], Reject))
            elif fmt in _PER_FILE:
                assert len(items) == 1
    assert len(seen) >= 14, seen  # every sample format was exercised


# ---- found by TREEPREP_MUTATION_SEEDS (2026-12-07: 940 seeds, 4 copies each) ---------------


def test_a_part_type_that_is_an_object_is_a_reject(tmp_path: Path) -> None:
    """``value_parts`` looked the type up in a set: an object as the type raised TypeError."""
    row = {"messages": [{"role": "user", "content": [{"type": {}, "text": "hi"}]},
                        {"role": "assistant", "content": "hello"}]}  # fmt: skip
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(row))
    (rej,) = _read_all("chat-messages", path)
    assert isinstance(rej, Reject) and "content[0]" in rej.reason


def test_atif_subagent_trajectories_that_are_no_array_are_a_reject(tmp_path: Path) -> None:
    docs = json.loads((SAMPLE / "atif" / "trajectories.json").read_text())
    docs[1]["subagent_trajectories"] = 1.5
    path = tmp_path / "trajectories.json"
    path.write_text(json.dumps(docs))
    reasons = [x.reason for x in _read_all("atif", path) if isinstance(x, Reject)]
    assert "[1].subagent_trajectories: expected an array, got float" in reasons


def test_copilot_tool_requests_that_are_no_array_are_a_reject(tmp_path: Path) -> None:
    src = next((SAMPLE / "copilot_cli").rglob("events.jsonl"))
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    k = next(i for i, e in enumerate(lines) if e["data"].get("toolRequests"))
    lines[k]["data"]["toolRequests"] = True
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    reasons = [x.reason for x in _read_all("copilot-cli", path) if isinstance(x, Reject)]
    assert any(r.endswith("toolRequests: expected an array, got boolean") for r in reasons)
