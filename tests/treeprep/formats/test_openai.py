"""openai-chat, openai-chat-json, tokens and openai-responses: conversion, rejects and detection."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
import zstandard

from treeprep.formats import ReadOptions, detect_format, get_format
from treeprep.formats.base import TextRollout
from treeprep.io.compressed import read_head
from treeprep.io.inputs import expand_inputs
from treeprep.schemas import ChatCall, Reject, TokenRollout

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data"
SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
LOGS = SHARED / "logs"
needs_shared = pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/data is absent")

OPTS = ReadOptions()


def _read(fmt: str, path: Path | str, opts: ReadOptions = OPTS) -> list:
    return list(get_format(fmt).read(str(path), opts))


def _jsonl(path: Path, lines: list[bytes | dict]) -> Path:
    path.write_bytes(
        b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines)
    )
    return path


def _call(i: int, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "session_id": "s",
        "messages": [{"role": "user", "content": f"question {i}"}],
        "response": {
            "id": f"r{i}",
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
        },
        **extra,
    }


# --------------------------------------------------------------------------------------------
# openai-chat: bad input, one reject each, exact file and line
# --------------------------------------------------------------------------------------------


def test_openai_chat_bad_records_are_rejected_with_file_and_line(tmp_path: Path) -> None:
    tc = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    p = _jsonl(
        tmp_path / "calls.jsonl",
        [
            _call(1),  # 1 good
            b'{"messages": [',  # 2 malformed JSON
            _call(3, messages=[{"role": "user", "content": 42}]),  # 3 wrong type
            _call(4, messages=[{"role": "robot", "content": "hi"}]),  # 4 unknown role
            _call(5, messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}]),  # 5
            b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',  # 6 invalid UTF-8
            {"messages": [{"role": "user", "content": "no completion"}]},  # 7
            b"",  # 8 blank: not a record
            _call(
                9,
                messages=[
                    {"role": "assistant", "tool_calls": [tc]},
                    {"role": "tool", "tool_call_id": "c1", "content": "r"},
                ],
            ),  # 9 good
            _call(10, messages="hello"),  # 10 wrong type
            _call(11, reward="high"),  # 11 wrong type
            _call(12, response={"choices": []}),  # 12 no choice
        ],
    )
    items = _read("openai-chat", p)
    assert [type(x).__name__ for x in items] == ["ChatCall"] + ["Reject"] * 6 + ["ChatCall"] + [
        "Reject"
    ] * 3
    assert [(x.source_file, x.source_line) for x in items if isinstance(x, ChatCall)] == [
        (str(p), 1),
        (str(p), 9),
    ]
    rejects = {x.line: x.reason for x in items if isinstance(x, Reject)}
    assert all(
        x.file == str(p) and x.format == "openai-chat" for x in items if isinstance(x, Reject)
    )
    assert rejects[2].startswith("malformed JSON: ")
    assert rejects[3] == (
        "messages[0].content: expected a string, a list of content parts or null, got int"
    )
    assert rejects[4] == (
        "messages[0].role: unknown role 'robot' "
        "(expected system, developer, user, assistant or tool)"
    )
    assert rejects[5] == (
        "messages[0] is a tool result for tool_call_id 'nope' but no earlier assistant message "
        "made that call"
    )
    assert rejects[6] == "invalid UTF-8 at byte 46"
    assert rejects[7] == (
        "no completion: expected 'completion', 'response.choices[0].message' or "
        "'choices[0].message'"
    )
    assert rejects[10] == "messages: expected an array of messages, got string"
    assert rejects[11] == "reward: expected a number, got string"
    assert rejects[12] == "response.choices: expected a non-empty array, got array"


@pytest.mark.parametrize(
    "fmt,name",
    [
        ("openai-chat", "e.jsonl"),
        ("tokens", "e.jsonl"),
        ("openai-responses", "e.jsonl"),
        ("openai-chat-json", "e.json"),
    ],
)
def test_empty_file_is_one_reject(tmp_path: Path, fmt: str, name: str) -> None:
    p = tmp_path / name
    p.write_bytes(b"\n")
    (r,) = _read(fmt, p)
    assert isinstance(r, Reject) and (r.file, r.line, r.reason, r.format) == (
        str(p),
        0,
        "empty file",
        fmt,
    )


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_truncated_compressed_file_keeps_good_records(tmp_path: Path, codec: str) -> None:
    recs = [
        {
            "group_id": "g",
            "prompt_token_ids": list(range(i, i + 300)),
            "generation_token_ids": [i % 200, 7],
        }
        for i in range(3000)
    ]
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    if codec == "gz":
        blob = gzip.compress(data)
        cut = blob[: len(blob) // 2]
    else:  # only whole, checksummed zstd frames are read (issue 15 item 5): cut the second one
        c = zstandard.ZstdCompressor()
        first = c.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs[:1000]))
        cut = first + c.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs[1000:]))[:5000]
    p = tmp_path / f"t.jsonl.{codec}"
    p.write_bytes(cut)
    items = _read("tokens", p)
    good = [x for x in items if isinstance(x, TokenRollout)]
    assert len(good) > 100 and (codec == "gz" or len(good) == 1000)
    assert [x.source_line for x in good] == list(range(1, len(good) + 1))
    assert [x.prompt_token_ids for x in good] == [r["prompt_token_ids"] for r in recs[: len(good)]]
    last = items[-1]
    assert isinstance(last, Reject) and len(items) == len(good) + 1
    assert last.line == len(good) + 1
    kind = "gzip" if codec == "gz" else "zstd"
    assert last.reason.startswith(f"truncated or corrupt {kind} stream: ")


def test_single_50mb_line_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default limit per record is 16 MiB (issue 15 item 21, --max-record-mb); raised here
    import treeprep.io.lines

    monkeypatch.setitem(treeprep.io.lines._limits, "record_bytes", 64 << 20)
    big = "y" * (50 * 1024 * 1024)
    rec = _call(2)
    rec["messages"].append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t", "function": {"name": "cat", "arguments": "{}"}}],
        }
    )
    rec["messages"].append({"role": "tool", "tool_call_id": "t", "content": big})
    p = _jsonl(tmp_path / "big.jsonl", [_call(1), rec, _call(3)])
    items = _read("openai-chat", p)
    assert [type(x) for x in items] == [ChatCall] * 3
    assert [x.source_line for x in items] == [1, 2, 3]
    assert len(items[1].messages[2].content) == len(big)


# --------------------------------------------------------------------------------------------
# openai-chat: normalization, group ids, LiteLLM
# --------------------------------------------------------------------------------------------


def test_openai_chat_sample_normalization() -> None:
    calls = _read("openai-chat", SAMPLES / "openai_chat.jsonl")
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.group_id for c in calls] == ["fix-leap-year"] * 4 + ["python-version"] * 3
    first = calls[0]
    assert first.call_id == "fix-leap-year/0" and first.model == "example-coder"
    assert first.provenance.exact_messages and not first.provenance.exact_tokens
    # content parts are kept as given, not joined
    assert [p.text for p in first.messages[1].content] == [
        "The test ",
        "tests/test_dates.py::test_leap fails. Please fix it.",
    ]
    assert first.completion.reasoning_content == "Start by reading both files at once."
    assert [tc.id for tc in first.completion.tool_calls] == ["call_a1", "call_a2"]
    # arguments are kept as given: a JSON string here, an object in the next call
    assert first.completion.tool_calls[0].function.arguments == '{"path": "tests/test_dates.py"}'
    assert calls[1].completion.tool_calls[0].function.arguments == {
        "command": "sed -i 's/return y % 4 == 0/"
        "return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)/' dates.py"
    }
    # the context grows: call k's prompt + completion is a prefix of call k+1's prompt
    for a, b in zip(calls[:3], calls[1:4], strict=True):
        assert b.messages[: len(a.messages) + 1] == a.messages + [a.completion]
    assert calls[3].reward == 1.0 and calls[0].reward is None
    dev = calls[4]
    assert dev.messages[0].role == "system"  # developer -> system
    assert calls[6].branch_reason == "retry" and calls[6].reward == 0.5


def test_group_by_option_and_default_keys(tmp_path: Path) -> None:
    base = _call(1)
    del base["session_id"]
    p = _jsonl(
        tmp_path / "g.jsonl",
        [
            {**base, "task_id": 7, "meta": {"run": {"id": "run-a"}}},
            {**base, "metadata": {"group_id": "from-meta"}},
            base,
        ],
    )
    assert [c.group_id for c in _read("openai-chat", p)] == ["7", "from-meta", None]
    by = _read("openai-chat", p, ReadOptions(group_by="meta.run.id"))
    assert [c.group_id for c in by] == ["run-a", None, None]


def test_litellm_mocked_function_calling(tmp_path: Path) -> None:
    rec = {
        "messages": [
            {"role": "system", "content": "Tools: <function=x>"},
            {"role": "user", "content": "go"},
        ],
        "tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}],
        "raw_messages": [{"role": "user", "content": "go"}],
        "response": {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": "1", "function": {"name": "x", "arguments": "{}"}}],
                    }
                }
            ]
        },
        "raw_response": {
            "choices": [
                {"message": {"role": "assistant", "content": "<function=x>\n", "tool_calls": None}}
            ]
        },
    }
    p = tmp_path / "mock.json"
    p.write_bytes(orjson.dumps(rec))
    (c,) = _read("openai-chat-json", p)
    assert isinstance(c, ChatCall) and c.tools is None
    assert c.completion.content == "<function=x>\n" and c.completion.tool_calls is None
    rec["raw_response"]["choices"][0]["message"]["tool_calls"] = [{}]
    p.write_bytes(orjson.dumps(rec))
    (r,) = _read("openai-chat-json", p)
    assert isinstance(r, Reject) and r.line == 1 and "exact completion is lost" in r.reason


def test_litellm_sample_folder() -> None:
    files = expand_inputs([str(SAMPLES / "litellm")])
    assert len(files) == 3
    calls = []
    for path, _ in files:
        spec = detect_format(path, read_head(path))
        assert spec is not None and spec.name == "openai-chat-json" and spec.group_by_folder
        calls += _read("openai-chat-json", path)
    assert [type(c) for c in calls] == [ChatCall] * 3
    assert all(c.group_id is None and c.tools and c.source_line == 1 for c in calls)
    for a, b in zip(calls, calls[1:], strict=False):
        assert b.messages[: len(a.messages)] == a.messages
    assert calls[2].completion.content == "Done: `hello.py` prints 'Hello, World!'."


def test_openai_chat_json_bad_document(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    # an unquoted value: every orjson release reports the same line and column for it (a trailing
    # comma is reported at the comma by some releases and at the bracket by others)
    p.write_bytes(b'{\n "messages": [\n  {"role": "user", "content": x}\n ]\n}')
    (r,) = _read("openai-chat-json", p)
    assert isinstance(r, Reject) and (r.file, r.line) == (str(p), 3)
    assert r.reason.startswith("malformed JSON at column 31: unexpected character")


# --------------------------------------------------------------------------------------------
# tokens
# --------------------------------------------------------------------------------------------


def test_tokens_sample_and_bad_rollouts(tmp_path: Path) -> None:
    rolls = _read("tokens", SAMPLES / "tokens.jsonl")
    assert [type(r) for r in rolls] == [TokenRollout] * 6
    grpo = [r for r in rolls if r.group_id == "grpo-mul-17x3"]
    assert len(grpo) == 4 and len({tuple(r.prompt_token_ids) for r in grpo}) == 1
    assert [r.reward for r in grpo] == [1.0, 1.0, 0.0, 0.0]
    assert [r.advantage for r in grpo] == [0.5, 0.5, -0.5, -0.5]
    assert bytes(t for t in grpo[1].generation_token_ids if t < 256) == b"51"
    a0, a1 = [r for r in rolls if r.group_id == "agent-sum-100"]
    assert a1.prompt_token_ids[: len(a0.prompt_token_ids) + len(a0.generation_token_ids)] == (
        a0.prompt_token_ids + a0.generation_token_ids
    )

    ok = {"prompt_token_ids": [1, 2], "generation_token_ids": [3]}
    p = _jsonl(
        tmp_path / "t.jsonl",
        [
            ok,
            {**ok, "prompt_token_ids": [1, -2]},
            {**ok, "generation_token_ids": [3, True]},
            {**ok, "generation_token_ids": "3"},
            {**ok, "generation_log_probs": [-0.1, -0.2]},
            {"prompt_token_ids": [1]},
            {"messages": []},
        ],
    )
    items = _read("tokens", p)
    assert isinstance(items[0], TokenRollout) and items[0].group_id is None
    reasons = [(x.line, x.reason) for x in items[1:]]
    assert reasons == [
        (2, "prompt_token_ids[1]: expected a non-negative integer, got -2"),
        (3, "generation_token_ids[1]: expected a non-negative integer, got True"),
        (4, "generation_token_ids: expected an array of token ids, got string"),
        (5, "generation_log_probs has 2 entries, generation_token_ids has 1"),
        (6, "no 'generation_token_ids' (expected prompt_token_ids and generation_token_ids)"),
        (
            7,
            "expected prompt_token_ids and generation_token_ids, or a Responses record "
            "(responses_create_params/response.output) whose output items carry them",
        ),
    ]


@needs_shared
def test_nemo_gym_rollouts_with_ids() -> None:
    path = LOGS / "openai-responses" / "competitive_coding_challenges__example_rollouts.jsonl"
    rolls = _read("tokens", path)
    # the message items log their text too: each rollout's ids are checked against it
    assert [type(r) for r in rolls] == [TextRollout] * 5
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    for r, rec in zip(rolls, raw, strict=True):
        item = rec["response"]["output"][1]
        assert r.logged_text == "".join(p["text"] for p in item["content"])
        assert r.prompt_token_ids == item["prompt_token_ids"]
        assert r.generation_token_ids == item["generation_token_ids"]
        assert r.generation_log_probs == item["generation_log_probs"]
        assert r.reward == rec["reward"]
    # the five samples of task 0 form one GRPO group, one tree
    assert {r.group_id for r in rolls} == {"competitive_coding_challenges__example_rollouts:task-0"}
    assert len({tuple(r.prompt_token_ids) for r in rolls}) == 1


# --------------------------------------------------------------------------------------------
# openai-responses
# --------------------------------------------------------------------------------------------


def test_openai_responses_sample_turns() -> None:
    calls = _read("openai-responses", SAMPLES / "openai_responses.jsonl")
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.group_id for c in calls] == ["openai_responses:task-0"] * 8 + [
        "openai_responses:task-1"
    ]
    c0, c1, c2, c3, c4 = calls[:5]
    assert [m.role for m in c0.messages] == ["system", "user"]
    assert c0.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_order",
                "description": "Look up an order by id.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        },
        c0.tools[1],
    ]
    # reasoning + two parallel calls are one assistant turn
    assert c0.completion.reasoning_content == "Two orders: look both up in parallel."
    assert [tc.id for tc in c0.completion.tool_calls] == ["call_1", "call_2"]
    assert c0.completion.content is None
    # call 2: input + turn 1 + both tool results; its completion is a call followed by its reasoning
    assert [(m.role, m.tool_call_id) for m in c1.messages] == [
        ("system", None),
        ("user", None),
        ("assistant", None),
        ("tool", "call_1"),
        ("tool", "call_2"),
    ]
    assert c1.messages[2] == c0.completion
    assert [tc.id for tc in c1.completion.tool_calls] == ["call_3"]
    assert c1.completion.reasoning_content == "Refund A-1 first, then A-2."
    assert c2.completion.reasoning_content is None
    # an empty reasoning summary then a message: one turn, content kept as output_text parts
    assert c3.completion.reasoning_content is None and c3.completion.tool_calls is None
    assert c3.completion.text() == "Both orders are refunded: A-1 (25.00) and A-2 (40.00)."
    # a user message inside output is context for the next turn
    assert c4.messages[-1].role == "user" and c4.messages[-2] == c3.completion
    assert c4.reward == 1.0 and c4.call_id == "resp_0_0#4"
    # the second rollout shares the first lookups, then diverges
    r1 = calls[5:8]
    assert r1[0].messages == c0.messages and r1[0].completion == c0.completion
    assert [tc.id for tc in r1[1].completion.tool_calls] == ["call_5", "call_6"]
    last = calls[8]
    assert [(m.role, m.text()) for m in last.messages] == [
        ("system", "You are a support agent for an online shop."),
        ("user", "What is your refund policy?"),
    ]


def test_openai_responses_ids_and_bad_items(tmp_path: Path) -> None:
    inp = [{"type": "message", "role": "user", "content": "hi"}]
    out = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "x"}],
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3, 4],
            "generation_log_probs": [-1, -2],
        },
    ]
    good = {
        "responses_create_params": {"input": inp},
        "response": {"id": "R", "output": out},
        "task_id": "T",
    }
    bad_item = {
        "responses_create_params": {"input": inp},
        "response": {"output": [{"type": "web_search_call", "id": "w"}]},
    }
    no_turn = {
        "responses_create_params": {"input": inp},
        "response": {"output": [{"type": "function_call_output", "call_id": "c", "output": ""}]},
    }
    p = _jsonl(tmp_path / "r.jsonl", [good, bad_item, no_turn])
    items = _read("openai-responses", p)
    assert isinstance(items[0], ChatCall) and items[0].call_id == "R#0"
    roll = items[1]
    assert isinstance(roll, TokenRollout) and roll.group_id == "T" and roll.call_id == "R#1/3"
    assert (roll.prompt_token_ids, roll.generation_token_ids, roll.generation_log_probs) == (
        [1, 2],
        [3, 4],
        [-1.0, -2.0],
    )
    assert [(x.line, x.reason) for x in items[2:]] == [
        (
            2,
            "response.output[0].type: unsupported item type 'web_search_call' "
            "(expected message, reasoning, function_call or function_call_output)",
        ),
        (
            3,
            "response.output: no assistant output (expected a message, reasoning or "
            "function_call item)",
        ),
    ]


# --------------------------------------------------------------------------------------------
# detection
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rel,fmt",
    [
        ("openai_chat.jsonl", "openai-chat"),
        ("tokens.jsonl", "tokens"),
        ("openai_responses.jsonl", "openai-responses"),
        ("litellm/litellm_proxy__example-model-1757015025.500.json", "openai-chat-json"),
    ],
)
def test_detect_samples(rel: str, fmt: str) -> None:
    p = str(SAMPLES / rel)
    spec = detect_format(p, read_head(p))
    assert spec is not None and spec.name == fmt


def test_detect_when_first_record_is_longer_than_the_head(tmp_path: Path) -> None:
    pad = "z" * 100_000
    tok = {
        "responses_create_params": {"input": pad},
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": "a",
                    "prompt_token_ids": [1],
                    "generation_token_ids": [2],
                }
            ]
        },
    }
    # ids after the head: sniffed as openai-responses, whose reader still uses the ids
    p = _jsonl(tmp_path / "late_ids.jsonl", [tok])
    assert detect_format(str(p), read_head(str(p))).name == "openai-responses"  # type: ignore[union-attr]
    (roll,) = _read("openai-responses", p)
    assert isinstance(roll, TokenRollout) and roll.generation_token_ids == [2]
    # ids first: tokens
    q = _jsonl(
        tmp_path / "early.jsonl",
        [{"prompt_token_ids": [1], "generation_token_ids": [2], "pad": pad}],
    )
    assert detect_format(str(q), read_head(str(q))).name == "tokens"  # type: ignore[union-attr]
    # a chat call whose first message is huge
    c = _call(1)
    c["messages"].insert(0, {"role": "system", "content": pad})
    r = _jsonl(
        tmp_path / "long_chat.jsonl", [{"messages": c["messages"], "response": c["response"]}]
    )
    assert detect_format(str(r), read_head(str(r))).name == "openai-chat"  # type: ignore[union-attr]
    gz = tmp_path / "long_chat.jsonl.gz"
    gz.write_bytes(gzip.compress(r.read_bytes()))
    assert detect_format(str(gz), read_head(str(gz))).name == "openai-chat"  # type: ignore[union-attr]


REAL = {
    "openai-responses/competitive_coding_challenges__example_rollouts.jsonl": ("tokens", 5),
    "openai-responses/conversational_tool_use_simulation__example_rollouts.jsonl": (
        "openai-responses",
        34,
    ),
    "openai-responses/example_multi_step__example_rollouts.jsonl": ("openai-responses", 21),
    "openai-responses/workplace_assistant__example_rollouts.jsonl": ("openai-responses", 13),
}
#: the one record in the real logs that cannot be used: OpenHands' logger overwrote the raw
#: (mocked function calling) response of this call with `tool_calls: [{}]`, losing the model's text
KNOWN_BAD = "nonfncall-llm-logs/litellm_proxy__deepseek__deepseek-chat-1757015054.055.json"


@needs_shared
@pytest.mark.parametrize("rel", sorted(REAL))
def test_real_responses_files(rel: str) -> None:
    fmt, n = REAL[rel]
    p = str(LOGS / rel)
    spec = detect_format(p, read_head(p))
    assert spec is not None and spec.name == fmt
    items = _read(fmt, p)
    assert not [x for x in items if isinstance(x, Reject)]
    assert len(items) == n


@needs_shared
def test_real_litellm_logs() -> None:
    folder = LOGS / "openhands" / "tests" / "fixtures" / "llm_data"
    calls, rejects, formats = [], [], {}
    for path, _ in expand_inputs([str(folder)]):
        spec = detect_format(path, read_head(path))
        formats[Path(path).name] = spec.name if spec else None
        if spec is None:
            continue
        for x in spec.read(path, OPTS):
            (rejects if isinstance(x, Reject) else calls).append(x)
    # message-list transcripts and the README are not per-call logs: left for the builder to skip
    assert formats["fncall-llm-message.json"] is None and formats["README.md"] is None
    assert sum(v == "openai-chat-json" for v in formats.values()) == 10
    assert len(calls) == 9 and all(isinstance(c, ChatCall) for c in calls)
    assert [r.file.endswith(KNOWN_BAD) for r in rejects] == [True]
    fn = [c for c in calls if "anthropic" in c.source_file]
    assert len(fn) == 6 and all(c.tools and len(c.tools) == 3 for c in fn)
    mocked = [c for c in calls if "deepseek" in c.source_file]
    assert len(mocked) == 3 and all(c.tools is None for c in mocked)
    assert mocked[-1].completion.content.startswith("<function=finish>")
