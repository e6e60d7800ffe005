"""gptme: conversation logs and their branches (issue 40 item 5).

``sample_data/gptme/<conversation>/`` is written by us from gptme's ``Message.to_dict()`` and
``LogManager`` layout (``conversation.jsonl``, ``branches/<name>.jsonl``); the expected prompts
below are written out by hand from what gptme's ``prepare_messages`` and its OpenAI provider's
``_handle_tools`` send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from treeprep.build import BuildConfig, build
from treeprep.formats import ReadOptions, detect_format
from treeprep.formats.gptme import FORMAT
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
CONV = ROOT / "sample_data" / "gptme" / "2025-11-06-quiet-amber-heron"
MAIN = CONV / "conversation.jsonl"
BRANCH = CONV / "branches" / "keep-underscores.jsonl"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
needs_qwen = pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")

SYSTEM = (
    "You are gptme v0.29.0, a general-purpose AI assistant powered by LLMs. You are designed to "
    "help users with programming tasks, such as writing code, debugging, and learning new "
    "concepts.\n\n# Tools\n\nUse `shell` to run commands, `read` to read files and `patch` to "
    "edit them."
)  # the two pinned system messages, merged as gptme's concat does
RUN = "pytest -q tests/test_slug.py"
THINK = "<think>\nRun the failing tests first to see the error.\n</think>\n"


def _read(p: Path) -> list[Any]:
    return list(FORMAT.read(str(p), ReadOptions()))


def _dump(c: ChatCall) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in c.messages]


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


#: the last call's prompt: the budget note (ephemeral_ttl 1) is gone, two assistant turns later
LAST_PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "The tests in tests/test_slug.py fail. Fix them."},
    {"role": "assistant", "content": THINK + "Let me run the tests.\n",
     "tool_calls": [_call("call_a1", "shell", {"command": RUN})]},
    {"role": "tool", "tool_call_id": "call_a1",
     "content": f"Ran command: `{RUN}`\n\n```stdout\nF.\nFAILED tests/test_slug.py::test_words "
                "- assert 'a_b' == 'a-b'\n1 failed, 1 passed\n```"},
    {"role": "assistant", "tool_calls": [_call("call_a2", "read", {"path": "slug.py"})]},
    {"role": "tool", "tool_call_id": "call_a2",
     "content": "```slug.py\ndef slugify(s):\n    return s.lower().replace(' ', '_')\n```"},
    {"role": "assistant", "content": "The slug joins words with `_`; the test expects `-`.\n",
     "tool_calls": [_call("call_a3", "patch", {"path": "slug.py", "patch": (
         "<<<<<<< ORIGINAL\n    return s.lower().replace(' ', '_')\n=======\n"
         "    return s.lower().replace(' ', '-')\n>>>>>>> UPDATED")})]},
    {"role": "tool", "tool_call_id": "call_a3",
     "content": "Patch successfully applied to `slug.py`"},
]  # fmt: skip


def test_detection() -> None:
    for p in (MAIN, BRANCH):
        assert detect_format(str(p), p.read_bytes()) is FORMAT
    vibe = next((ROOT / "sample_data" / "mistral_vibe").rglob("messages.jsonl"))
    assert detect_format(str(vibe), vibe.read_bytes()) is not FORMAT
    other = ROOT / "sample_data" / "openai_chat.jsonl"
    assert detect_format(str(other), other.read_bytes()[:65536]) is not FORMAT
    # another logger's conversation.jsonl: no gptme startup prompt first
    chat = b'{"role": "user", "content": "hi", "timestamp": "2025-11-06T10:00:00"}\n'
    assert detect_format("logs/conversation.jsonl", chat) is not FORMAT


def test_every_assistant_message_is_a_call_prompted_as_gptme_sends_it() -> None:
    calls = _read(MAIN)
    assert all(isinstance(c, ChatCall) for c in calls)
    assert [c.call_id for c in calls] == [f"2025-11-06-quiet-amber-heron#{k}" for k in range(4)]
    assert [c.source_line for c in calls] == [4, 7, 9, 11]
    assert {(c.group_id, c.model) for c in calls} == {
        ("2025-11-06-quiet-amber-heron", "openrouter/qwen/qwen3-coder")
    }
    first = calls[0]
    assert _dump(first) == LAST_PROMPT[:2]
    assert first.completion.model_dump(exclude_none=True) == {
        "role": "assistant", "content": THINK + "Let me run the tests.\n",
        "tool_calls": [_call("call_a1", "shell", {"command": RUN})],
    }  # fmt: skip
    # one assistant turn after it: the ephemeral budget note (ttl 1) is still sent
    assert _dump(calls[2])[4] == {
        "role": "system",
        "content": "<budget>1,204 of 128,000 tokens used</budget>",
    }
    assert _dump(calls[3]) == LAST_PROMPT
    assert calls[3].completion.content == (
        "Fixed: `slugify` now joins words with `-`, as `test_words` expects."
    )


def test_a_branch_shares_the_conversations_group() -> None:
    calls = _read(BRANCH)
    assert [c.call_id for c in calls] == [
        f"2025-11-06-quiet-amber-heron/keep-underscores#{k}" for k in range(3)
    ]
    assert {c.group_id for c in calls} == {"2025-11-06-quiet-amber-heron"}
    assert _dump(calls[0]) == _dump(_read(MAIN)[0])
    assert _dump(calls[2])[-1] == {
        "role": "user",
        "content": "Keep underscores; change the test instead.",
    }


def test_branch_hints_name_where_the_logs_part() -> None:
    """The last main call lost the expired budget note (``elided-history``); the branch's call
    after its new request leaves the main log (``retry``). Both were unhinted: ``unknown``."""
    assert [c.branch_reason for c in _read(MAIN)] == [None, None, None, "elided-history"]
    assert [c.branch_reason for c in _read(BRANCH)] == [None, None, "retry"]


def test_a_branch_hints_where_it_leaves_each_other_log(tmp_path: Path) -> None:
    """A branch ``b`` of the branch ``a`` leaves the main log where ``a`` does, and ``a`` after
    its last line, but its last call lost the budget note before that: ``elided-history``
    (where its tokens part). ``a`` leaves only the main log (it is all of ``b``'s start). A
    branch with no other log beside it has nothing to leave."""
    a = _lines(BRANCH)
    stamp = {"timestamp": "2025-11-06T10:02:00.000000"}
    b = [
        *a,
        {"role": "system", "content": "Patch applied", "call_id": "call_b1", **stamp},
        {"role": "user", "content": "Run the tests too.", **stamp},
        {"role": "assistant", "content": "Running them now.", **stamp},
    ]
    conv = tmp_path / "conv"
    (conv / "branches").mkdir(parents=True)
    (conv / "conversation.jsonl").write_text(MAIN.read_text())
    for name, rows in (("a", a), ("b", b)):
        (conv / "branches" / f"{name}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in rows)
        )
    assert [c.branch_reason for c in _read(conv / "branches" / "a.jsonl")] == [None, None, "retry"]
    hints = [c.branch_reason for c in _read(conv / "branches" / "b.jsonl")]
    assert hints == [None, None, "retry", "elided-history"]
    (conv / "conversation.jsonl").unlink()
    (conv / "branches" / "a.jsonl").unlink()
    alone = [c.branch_reason for c in _read(conv / "branches" / "b.jsonl")]
    assert alone == [None, None, None, "elided-history"]


def test_the_conversation_and_its_branch_build_one_tree(tmp_path: Path) -> None:
    m = build(BuildConfig(inputs=[str(CONV)], out=str(tmp_path / "o")))
    # the branch's first two calls repeat the main log's: left out once as duplicates
    assert (m.counts.records_in_trees, m.counts.trees, m.counts.records_rejected) == (5, 1, 0)


def _lines(p: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "conv-1" / "conversation.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(x + "\n" for x in lines))
    return p


def test_a_line_that_is_not_json_is_left_out_as_gptme_leaves_it_out(tmp_path: Path) -> None:
    lines = [json.dumps(x) for x in _lines(MAIN)]
    p = _write(tmp_path, [*lines[:4], "{cut", *lines[4:]])
    items = _read(p)
    (rej,) = [x for x in items if isinstance(x, Reject)]
    assert rej.line == 5 and "gptme skips it too" in rej.reason
    calls = [x for x in items if isinstance(x, ChatCall)]
    assert _dump(calls[-1]) == LAST_PROMPT


def test_a_line_that_is_no_message_rejects_the_calls_after_it(tmp_path: Path) -> None:
    recs = _lines(MAIN)
    recs[4]["content"] = {"stdout": "F."}
    p = _write(tmp_path, [json.dumps(x) for x in recs])
    items = _read(p)
    assert [type(x) for x in items] == [ChatCall, Reject, Reject, Reject, Reject]
    assert (items[1].line, items[1].reason) == (5, "content: expected a string, got object")
    assert items[2].reason.startswith("line 5 is not a gptme message")
    assert items[4].call_id == "conv-1#3"


def test_a_tool_call_that_is_not_json_is_that_calls_reject(tmp_path: Path) -> None:
    recs = _lines(MAIN)
    recs[6]["content"] = '@read(call_a2): {"path": "slug.py"'
    items = _read(_write(tmp_path, [json.dumps(x) for x in recs]))
    rej = items[1]
    assert isinstance(rej, Reject) and rej.line == 7
    assert rej.reason == "line 7: the tool call @read(call_a2) is not JSON (or nests too deep)"
    # gptme keeps the cut call as text in later prompts, so its result answers no call there
    assert isinstance(items[2], Reject) and "'call_a2' but no earlier assistant" in items[2].reason


def test_a_tool_call_shown_in_a_code_block_is_text() -> None:
    from treeprep.formats.gptme import assistant

    text = 'Call it so:\n```\n@shell(ex1): {"command": "ls"}\n```\n@read(c9): {"path": "a"}'
    msg = assistant(text, "line 1")
    assert [tc["id"] for tc in msg["tool_calls"]] == ["c9"]
    assert msg["content"] == 'Call it so:\n```\n@shell(ex1): {"command": "ls"}\n```\n'


def test_a_tool_call_nested_too_deep_is_that_calls_reject(tmp_path: Path) -> None:
    """The arguments' JSON is parsed with Python's json, which recurses once per level."""
    recs = _lines(MAIN)
    recs[6]["content"] = '@read(call_a2): {"path": ' + "[" * 100_000 + "]" * 100_000 + "}"
    items = _read(_write(tmp_path, [json.dumps(x) for x in recs]))
    assert isinstance(items[1], Reject) and items[1].line == 7
    assert items[1].reason == "line 7: the tool call @read(call_a2) is not JSON (or nests too deep)"


@needs_qwen
def test_calls_render_as_apply_chat_template_qwen3() -> None:
    from tests.treeprep.render.hf_reference import hf_tokenizer
    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = hf_tokenizer(r)
    last = _read(MAIN)[-1]
    reply = {"role": "assistant", "content": last.completion.content}
    kw: dict[str, Any] = {"tokenize": True, "return_dict": False}
    sent = [{"content": "", **m} for m in LAST_PROMPT]  # the template reads content always
    seq = r.render(last, group_id="g")
    full = list(hf.apply_chat_template([*sent, reply], **kw))
    head = list(hf.apply_chat_template(sent, add_generation_prompt=True, **kw))
    assert seq.tokens.tolist() == full and seq.loss_spans == [(len(head), len(full))]


def _merging_session(tmp_path: Path) -> Path:
    """Consecutive user and system messages (merged), text between a call and its result
    (held), then a message with a time to live (the whole computation from there on)."""
    ts = "2025-11-06T10:00:00.000001"
    lines: list[dict[str, Any]] = [{"role": "system", "content": "You are gptme."}]
    for i in range(6):
        lines += [{"role": "user", "content": f"do {i}"}, {"role": "user", "content": "now"}]
        call = f'ok\n@shell(c{i}): {{"command": "ls {i}"}}'
        lines.append({"role": "assistant", "content": call})
        lines.append({"role": "user", "content": "wait"})
        lines.append({"role": "system", "content": f"out {i}", "call_id": f"c{i}"})
        lines.append({"role": "system", "content": "note"})
        lines.append({"role": "assistant", "content": f"done {i}"})
        if i == 3:
            lines.append({"role": "system", "content": "brief", "ephemeral_ttl": 1})
    path = tmp_path / "conv" / "conversation.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({**m, "timestamp": ts}) + "\n" for m in lines))
    return path


def test_prompts_folded_between_calls_change_nothing(tmp_path: Path, monkeypatch) -> None:
    """Each call's prompt goes on from the last call's (issue 54 item 9: a session's read was
    quadratic); computed from the whole history for every call, every record is the same."""
    from treeprep.formats import gptme

    paths = [*sorted(Path("sample_data/gptme").rglob("*.jsonl")), _merging_session(tmp_path)]
    kept = [[r.model_dump() for r in gptme.read(str(p), ReadOptions())] for p in paths]

    def whole(self: Any, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        prompt = gptme._active_generation(history)
        return gptme._chat(gptme._prune_ephemeral(prompt), self.parsed)

    monkeypatch.setattr(gptme._Prompts, "of", whole)
    assert [[r.model_dump() for r in gptme.read(str(p), ReadOptions())] for p in paths] == kept
    assert sum(isinstance(r, ChatCall) for r in gptme.read(str(paths[-1]), ReadOptions())) == 12
