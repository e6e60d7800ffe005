"""Fuzzing every format adapter with hypothesis (issue 41 item 3).

For each format, one of our sample files is mutated the ways real logs go wrong: a field deleted
or given the wrong type, a value nested thousands deep, a huge string, ``NaN``/``Infinity``, a
key given twice, the file cut short, bytes that are not UTF-8. The mutated file is detected and
read (by its original format, as ``--format`` would force it, and by what detection says), and
each record is rendered with the built-in tokenizer, as stage 1 does. Formats read from several
files have their sidecars fuzzed too (OpenCode's message and part files, a Vibe ``meta.json``, a
Claude Code sub-agent), and Parquet datasets their rows. What must hold: nothing
but the project's errors escapes (an :class:`~treeprep.errors.InputError` is the file's one
reject, as the builder records it); every reject names the file, a line and a reason that is not
an ``internal error``; every record is a tree's sequence or a reject, so the counts reconcile.

Budgets: a short one by default (:data:`EXAMPLES` examples per case, derandomized, so a CI run
is the same every time; its tests take about 4 s on a 2-core machine, plus the imports), a
long one with ``TREEPREP_FUZZ_EXAMPLES=N`` (random, N examples per case). With
``TREEPREP_FUZZ_SAVE=DIR`` a crashing input is also written to DIR, for the corpus:
``fuzz_corpus/<case>/<name>`` holds inputs that crashed an adapter once (kept as regression
files), each read by the format its folder names, and built together once, the manifest's
counts reconciling.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from treeprep.errors import InputError, RenderError
from treeprep.formats import ReadOptions, detect_format, formats
from treeprep.modes import Server
from treeprep.schemas import ChatCall, Reject, TokenRollout

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
LONG = int(os.environ.get("TREEPREP_FUZZ_EXAMPLES", "0"))
#: examples per format in the default run
EXAMPLES = 6
SAVE = os.environ.get("TREEPREP_FUZZ_SAVE")

#: one sample per format (JSON or text; Parquet samples have JSONL siblings of their format)
SOURCES: dict[str, str] = {
    "aider-chat-history": "aider/.aider.chat.history.md",
    "aider-llm-history": "aider/.aider.llm.history",
    "anthropic": "anthropic_messages.jsonl",
    "atif": "atif/trajectory.json",
    "chat-messages": "conversations/openai_finetune.jsonl",
    "claude-code": "claude-code/7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b.jsonl",
    "cline": "cline/tasks/1762340400000/api_conversation_history.json",
    "cline-session": "cline/sessions/1787000000000_ab12c/1787000000000_ab12c.messages.json",
    "cursor": "cursor/agent-transcripts/b7a2e915-4d8c-4c1b-a3f6-0e9d2c7b5a18/"
    "b7a2e915-4d8c-4c1b-a3f6-0e9d2c7b5a18.jsonl",
    "copilot-cli": "copilot_cli/session-state/5f0c2a4e-8b1d-4c7e-9a3f-2d6e1b0c9a11/events.jsonl",
    "codex": "codex/2025/11/02/"
    "rollout-2025-11-02T09-15-00-5f0c1a2e-7b3d-4e21-9a55-0d6c2b8e4f11.jsonl",
    "gemini-cli": "gemini_cli/session-2025-09-14T10-02-3f9c2a1b.jsonl",
    "gptme": "gptme/2025-11-06-quiet-amber-heron/conversation.jsonl",
    "kimi-cli": "kimi_cli/sessions/9c1e4f0a7b3d2e6f8a5b4c3d2e1f0a9b/"
    "5d2c8e1a-4b7f-4c3e-9a6d-2f1e0b9c8d7a/context_1.jsonl",
    "mini-swe-agent": "mini_swe_agent_wc.traj.json",
    "mistral-vibe": "mistral_vibe/session_20251104_101500_3b9e1c2a/messages.jsonl",
    "openai-chat": "openai_chat.jsonl",
    "openai-chat-json": "litellm/litellm_proxy__example-model-1757015025.500.json",
    "qwen-code": "qwen_code/openai-2026-11-20T09-00-09.480Z-2b3c4d5e.json",
    "gemini-cli-telemetry": "gemini_cli_telemetry/telemetry.log",
    "qwen-code-chat": "qwen_code/chats/5b1e9c2a-3f4d-4e6a-8b7c-9d0e1f2a3b4c.jsonl",
    "openai-responses": "openai_responses.jsonl",
    "openhands-events": "openhands/events.jsonl",
    "opencode": "opencode/export-ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD.json",
    "pi": "pi/--home-dev-shop--/"
    "2025-11-05T09-00-00-000Z_9a8b7c6d-1e2f-4a3b-8c4d-5e6f7a8b9c0d.jsonl",
    "session-traces": "session_traces.jsonl",
    "sharegpt": "conversations/sharegpt_tools.json",
    "swe-agent": "swe_agent_slugify.traj",
    "tau-bench": "tau_bench_shop.json",
    "tau2-bench": "tau2_bench_shop.json",
    "tokens": "tokens.jsonl",
    "trajectory-dataset": "trajectory_dataset/swe_agent_trajectories.jsonl",
}

#: formats read from several files: (the format, the file read, the file mutated: a sidecar)
SIDECARS: dict[str, tuple[str, str, str]] = {
    "opencode-storage-part": (
        "opencode",
        "opencode/storage/session/4b0ea68d7af9a6031a7ffda7ad66e0cb83315750/"
        "ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ.json",
        "opencode/storage/part/msg_a4f10c002ffeQ2/prt_a1b2c3d4e007Zq8Lr2Tn5Vb0aZ.json",
    ),
    "opencode-storage-message": (
        "opencode",
        "opencode/storage/session/4b0ea68d7af9a6031a7ffda7ad66e0cb83315750/"
        "ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ.json",
        "opencode/storage/message/ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ/msg_a4f10c002ffeQ2.json",
    ),
    "mistral-vibe-meta": (
        "mistral-vibe",
        "mistral_vibe/session_20251104_103000_7c41d0e9/messages.jsonl",
        "mistral_vibe/session_20251104_101500_3b9e1c2a/meta.json",
    ),
    "kimi-cli-meta": (
        "kimi-cli",
        "kimi_cli/sessions/9c1e4f0a7b3d2e6f8a5b4c3d2e1f0a9b/"
        "5d2c8e1a-4b7f-4c3e-9a6d-2f1e0b9c8d7a/subagents/explore-7f3a/context.jsonl",
        "kimi_cli/sessions/9c1e4f0a7b3d2e6f8a5b4c3d2e1f0a9b/"
        "5d2c8e1a-4b7f-4c3e-9a6d-2f1e0b9c8d7a/subagents/explore-7f3a/meta.json",
    ),
    "claude-code-subagent": (
        "claude-code",
        "claude-code/7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b.jsonl",
        "claude-code/7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b/subagents/agent-b5e71c2.jsonl",
    ),
}

#: Parquet samples: their rows mutated as records, written back as Parquet
PARQUET: dict[str, tuple[str, str]] = {
    "chat-messages-parquet": ("chat-messages", "conversations/hf_messages.parquet"),
    "trajectory-dataset-parquet": (
        "trajectory-dataset",
        "trajectory_dataset/openhands_trajectories.parquet",
    ),
}

_DUP = "\x00dup\x00"  # a key replaced by a copy of the object's first key in the text
_DEEP = "\x00deep\x00"  # a string replaced by a nesting of arrays in the text
_ODD: list[Any] = [None, 0, -1, 1.5, True, "", "x", [], {}, [1, [2]], {"a": {}}, 10**30]


#: formats whose samples are not text (SQLite stores): their rows' JSON is mutated in their own
#: test file instead
FUZZED_ELSEWHERE: dict[str, str] = {
    "crush": "tests/treeprep/formats/test_sqlite_stores.py",
    "goose": "tests/treeprep/formats/test_sqlite_stores.py",
    "opencode-db": "tests/treeprep/formats/test_sqlite_stores.py",
}


def test_every_format_has_a_fuzzed_sample() -> None:
    assert set(SOURCES) | set(FUZZED_ELSEWHERE) == set(formats())
    assert not set(SOURCES) & set(FUZZED_ELSEWHERE)
    for where in FUZZED_ELSEWHERE.values():
        assert (SAMPLE.parent / where).is_file()
    for fmt, rel in SOURCES.items():
        p = SAMPLE / rel
        spec = detect_format(str(p), p.read_bytes()[:65536])
        assert spec is not None and spec.name == fmt, (fmt, rel)


# --------------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------------


def _paths(v: Any, pre: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every value of ``v`` (lists: their first few elements)."""
    yield pre
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*pre, k))
    elif isinstance(v, list):
        for i, x in enumerate(v[:4]):
            yield from _paths(x, (*pre, i))


def _set(v: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return v if new is _DELETE else new
    cur = v
    for k in path[:-1]:
        cur = cur[k]
    if new is _DELETE and isinstance(cur, dict):
        del cur[path[-1]]
    elif new is not _DELETE:
        cur[path[-1]] = new
    return v


_DELETE = object()


def _value(kind: str, old: Any, rnd: random.Random, pool: list[Any]) -> Any:
    if kind == "swap":  # another value of the same file: real-shaped, in the wrong place
        return json.loads(json.dumps(rnd.choice(pool))) if pool else old
    if kind == "delete":
        return _DELETE
    if kind == "wrong-type":
        return json.loads(json.dumps(rnd.choice(_ODD)))
    if kind == "deep":
        return _DEEP
    if kind == "huge":
        return "x" * rnd.choice((70_000, 1_000_000))
    if kind == "non-finite":
        return rnd.choice((float("nan"), float("inf"), float("-inf")))
    if kind == "dup-key" and isinstance(old, dict) and old:
        return {_DUP: rnd.choice(_ODD), **old}
    return old


def _dumps(v: Any, indent: int | None, rnd: random.Random) -> str:
    text = json.dumps(v, indent=indent, ensure_ascii=False)
    if _DEEP in text or "\\u0000deep\\u0000" in text:
        depth = rnd.choice((300, 5000, 100_000))
        text = text.replace('"\\u0000deep\\u0000"', "[" * depth + "]" * depth)
    while '"\\u0000dup\\u0000"' in text:
        i = text.index('"\\u0000dup\\u0000"')
        j = text.find('"', text.find(",", i) + 1)  # the object's next key: given twice now
        k = text.find('"', j + 1)
        key = text[j : k + 1] if j > 0 and k > j else '"role"'
        text = text[:i] + key + text[i + len('"\\u0000dup\\u0000"') :]
    return text


KINDS = ("delete", "wrong-type", "swap", "deep", "huge", "non-finite", "dup-key")
BYTE_KINDS = ("none", "truncate", "invalid-utf8", "none")


def _mutate(src: Path, seed: int, kind: str, byte_kind: str, n: int = 1) -> bytes:
    """The sample's bytes with ``n`` mutations (the first of ``kind``, the others drawn) on its
    records or document (a JSONL file's lines may also be repeated or swapped), then
    ``byte_kind`` applied to the bytes."""
    rnd = random.Random(seed)
    data = src.read_bytes()
    kinds = [kind, *(rnd.choice(KINDS) for _ in range(n - 1))]
    if src.suffix in (".jsonl",):
        recs = [json.loads(x) for x in data.decode().splitlines() if x.strip()]
        pool = [_get(r, p) for r in recs for p in _paths(r)]
        for k in kinds:
            i = rnd.randrange(len(recs))
            ps = list(_paths(recs[i]))
            p = rnd.choice(ps)
            recs[i] = _set(recs[i], p, _value(k, _get(recs[i], p), rnd, pool))
        if rnd.random() < 0.2:  # a line repeated, or two lines in the other order
            i, j = rnd.randrange(len(recs)), rnd.randrange(len(recs))
            if rnd.random() < 0.5:
                recs.insert(j, json.loads(json.dumps(recs[i])))
            else:
                recs[i], recs[j] = recs[j], recs[i]
        data = "".join(_dumps(r, None, rnd) + "\n" for r in recs).encode()
    elif src.suffix in (".json", ".traj"):
        doc = json.loads(data)
        pool = [_get(doc, p) for p in _paths(doc)]
        for k in kinds:
            ps = list(_paths(doc))
            p = rnd.choice(ps[1:] or ps)
            doc = _set(doc, p, _value(k, _get(doc, p), rnd, pool))
        data = _dumps(doc, 2, rnd).encode()
    else:  # a text log: a huge line, or a deep JSON line inside it
        lines = data.split(b"\n")
        i = rnd.randrange(len(lines))
        lines.insert(i, b"x" * 1_000_000 if kind == "huge" else lines[i] * 2)
        data = b"\n".join(lines)
    if byte_kind == "truncate" and data:
        data = data[: rnd.randrange(len(data))]
    elif byte_kind == "invalid-utf8" and data:
        at = rnd.randrange(len(data))
        data = data[:at] + rnd.choice((b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80")) + data[at:]
    return data


def _get(v: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        v = v[k]
    return v


# --------------------------------------------------------------------------------------------
# stage 1 on one file, as the builder runs it
# --------------------------------------------------------------------------------------------


_RENDERER: Any = None


def _renderer() -> Any:
    global _RENDERER
    if _RENDERER is None:
        from treeprep.render import Renderer

        _RENDERER = Renderer.load(None)
    return _RENDERER


def _stage1(fmt: str, path: Path, opts: ReadOptions | None = None) -> tuple[int, int, list[Reject]]:
    """(records read, sequences rendered, rejects) of ``path`` read as ``fmt`` (with ``opts``),
    as the builder's stage 1 counts them; any exception but the project's fails the test."""
    from treeprep.build.files import _too_deep

    read = seqs = 0
    rejects: list[Reject] = []
    items = formats()[fmt].read(str(path), opts or ReadOptions())
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except InputError as e:  # the rest of the file: one reject
            assert e.file and e.reason, e
            read += 1
            rejects.append(Reject(file=str(path), line=e.line, reason=e.reason))
            break
        read += 1
        if isinstance(item, Reject):
            rejects.append(item)
            continue
        assert isinstance(item, ChatCall | TokenRollout), item
        assert item.source_file == str(path), item.source_file
        if _too_deep(item) is not None:
            rejects.append(Reject(file=str(path), line=item.source_line, reason="too deep"))
            continue
        try:
            _renderer().render(item, group_id="g")
            seqs += 1
        except RenderError as e:
            rejects.append(Reject(file=str(path), line=item.source_line, reason=str(e)))
    for r in rejects:
        assert r.reason and not r.reason.startswith("internal error"), r
        assert r.line >= 0
    assert read == seqs + len(rejects)  # every record: a sequence or a reject
    return read, seqs, rejects


def _place(tmp: Path, rel: str, data: bytes, read: str | None = None) -> Path:
    """The mutated file at the sample's relative path in ``tmp`` (folder-named formats need it);
    with ``read``, the sample's folder is copied first and the file to read returned."""
    if tmp.exists():
        shutil.rmtree(tmp)
    if read is not None:
        top = rel.split("/")[0]
        shutil.copytree(SAMPLE / top, tmp / top)
    out = tmp / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return tmp / read if read is not None else out


def _check(
    fmt: str,
    path: Path,
    *,
    mutated: Path | None = None,
    case: str | None = None,
    opts: ReadOptions | None = None,
) -> None:
    """Stage 1 of ``path`` by ``fmt`` and by what detection says (with ``opts``); with
    ``TREEPREP_FUZZ_SAVE`` a crashing input (``mutated``, when that is a sidecar of ``path``) is
    kept for the corpus under its case's name."""
    try:
        _stage1(fmt, path, opts)
        detected = detect_format(str(path), path.read_bytes()[:65536])
        if detected is not None and detected.name != fmt:
            _stage1(detected.name, path, opts)
    except InputError as e:  # detection may refuse a file whose first record is unusable
        assert e.file == str(path) and e.reason
    except BaseException:
        if SAVE:
            src = mutated or path
            digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
            dest = Path(SAVE) / (case or fmt) / f"{digest}{_suffix(src)}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
        raise


def _suffix(p: Path) -> str:
    return "".join(p.suffixes[-1:]) or ".txt"


_SETTINGS = settings(
    max_examples=LONG or EXAMPLES,
    deadline=None,
    derandomize=not LONG,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)


#: one mutation: its seed, what it does to a record and to the bytes, and how many times
_MUTATION = {
    "seed": st.integers(0, 2**32 - 1),
    "kind": st.sampled_from(KINDS),
    "byte_kind": st.sampled_from(BYTE_KINDS),
    "n": st.integers(1, 4),
}


@pytest.mark.parametrize("fmt", sorted(SOURCES))
@_SETTINGS
@given(**_MUTATION)
def test_fuzzed_records_end_as_trees_or_rejects(
    fmt: str, seed: int, kind: str, byte_kind: str, n: int, tmp_path: Path
) -> None:
    rel = SOURCES[fmt]
    data = _mutate(SAMPLE / rel, seed, kind, byte_kind, n)
    _check(fmt, _place(tmp_path / "in", rel, data))


#: reader options that change how a format reads its records: the server's Messages endpoint
#: (llama.cpp's conversion, SGLang's, vLLM's merge of inline system messages), for Anthropic
#: requests and Claude Code's replayed ones
_OPTIONS = {
    "anthropic-llama.cpp": ("anthropic", ReadOptions(server=Server.llama_cpp)),
    "anthropic-merge": ("anthropic", ReadOptions(merge_inline_system=True)),
    "anthropic-sglang": ("anthropic", ReadOptions(server=Server.sglang)),
    "claude-code-llama.cpp": ("claude-code", ReadOptions(server=Server.llama_cpp)),
    "claude-code-sglang": ("claude-code", ReadOptions(server=Server.sglang)),
}


@pytest.mark.parametrize("case", sorted(_OPTIONS))
@_SETTINGS
@given(**_MUTATION)
def test_fuzzed_records_read_with_other_options_end_as_trees_or_rejects(
    case: str, seed: int, kind: str, byte_kind: str, n: int, tmp_path: Path
) -> None:
    fmt, opts = _OPTIONS[case]
    rel = SOURCES[fmt]
    data = _mutate(SAMPLE / rel, seed, kind, byte_kind, n)
    _check(fmt, _place(tmp_path / "in", rel, data), case=case, opts=opts)


@pytest.mark.parametrize("case", sorted(SIDECARS))
@_SETTINGS
@given(**_MUTATION)
def test_fuzzed_sidecar_files_end_as_trees_or_rejects(
    case: str, seed: int, kind: str, byte_kind: str, n: int, tmp_path: Path
) -> None:
    fmt, read, rel = SIDECARS[case]
    data = _mutate(SAMPLE / rel, seed, kind, byte_kind, n)
    path = _place(tmp_path / "in", rel, data, read=read)
    _check(fmt, path, mutated=tmp_path / "in" / rel, case=case)


def _mutate_parquet(src: Path, seed: int, kind: str, byte_kind: str, n: int) -> bytes | None:
    """The Parquet sample with its rows mutated (None when pyarrow cannot write the mutated rows
    as a table: a column of mixed types), then ``byte_kind`` applied to the file's bytes."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rnd = random.Random(seed)
    rows = pq.read_table(src).to_pylist()
    pool = [_get(r, p) for r in rows for p in _paths(r)]
    for k in [kind, *(rnd.choice(KINDS) for _ in range(n - 1))]:
        if k in ("deep", "dup-key"):  # text-level mutations: not in a Parquet file
            k = "wrong-type"
        i = rnd.randrange(len(rows))
        p = rnd.choice(list(_paths(rows[i])))
        rows[i] = _set(rows[i], p, _value(k, _get(rows[i], p), rnd, pool))
    buf = io.BytesIO()
    try:
        table = pa.Table.from_pylist([r if isinstance(r, dict) else {"x": r} for r in rows])
        pq.write_table(table, buf)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
    data = buf.getvalue()
    if byte_kind == "truncate":
        data = data[: rnd.randrange(len(data))]
    elif byte_kind == "invalid-utf8":
        at = rnd.randrange(len(data))
        data = data[:at] + b"\xff\xfe" + data[at:]
    return data


@pytest.mark.parametrize("case", sorted(PARQUET))
@_SETTINGS
@given(**_MUTATION)
def test_fuzzed_parquet_rows_end_as_trees_or_rejects(
    case: str, seed: int, kind: str, byte_kind: str, n: int, tmp_path: Path
) -> None:
    fmt, rel = PARQUET[case]
    data = _mutate_parquet(SAMPLE / rel, seed, kind, byte_kind, n)
    assume(data is not None)
    assert data is not None
    _check(fmt, _place(tmp_path / "in", rel, data), case=case)


# --------------------------------------------------------------------------------------------
# the corpus: inputs that crashed once
# --------------------------------------------------------------------------------------------


def _corpus() -> list[tuple[str, Path]]:
    if not CORPUS.is_dir():
        return []
    return sorted(
        (d.name, p) for d in CORPUS.iterdir() if d.is_dir() for p in d.iterdir() if p.is_file()
    )


def _corpus_file(case: str, data: bytes, tmp: Path) -> tuple[str, Path]:
    """(format, file to read) of a corpus input of ``case`` (a format, or a sidecar case)."""
    if case in SIDECARS:
        fmt, read, rel = SIDECARS[case]
        return fmt, _place(tmp, rel, data, read=read)
    if case in PARQUET:
        fmt, rel = PARQUET[case]
        return fmt, _place(tmp, rel, data)
    return case, _place(tmp, SOURCES[case], data)


@pytest.mark.parametrize(("case", "path"), _corpus(), ids=lambda x: getattr(x, "name", x))
def test_corpus_inputs_end_as_trees_or_rejects(case: str, path: Path, tmp_path: Path) -> None:
    _check(*_corpus_file(case, path.read_bytes(), tmp_path / "in"))


def test_corpus_builds_and_its_counts_reconcile(tmp_path: Path) -> None:
    from treeprep.build import BuildConfig, build

    files = _corpus()
    assert files, "the corpus is empty"
    inputs = tmp_path / "in"
    for k, (case, path) in enumerate(files):
        _corpus_file(case, path.read_bytes(), inputs / f"{k:03d}")
    m = build(BuildConfig(inputs=[str(inputs)], out=str(tmp_path / "o"), max_errors=None))
    c = m.counts
    filtered = sum(m.filtered.values())
    assert c.records_read == c.records_in_trees + c.records_rejected + filtered
    rejects = (tmp_path / "o" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == c.records_rejected
    assert not [r for r in rejects if "internal error" in r]
