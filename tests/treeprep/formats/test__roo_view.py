"""Roo Code's condensed view of a task history (treeprep/formats/_roo_view.py).

The history below is written by hand as Roo Code 3.52.1 stores one (``summarizeConversation``:
a ``user`` summary appended with a ``condenseId``, every earlier untagged message given that
``condenseParent``; ``truncateConversation``: a marker inserted before the first kept message).
The expected prompts are written out from Roo Code's own rules, not from treeprep's reading:
``getEffectiveApiHistory`` (from the last summary on, orphaned ``tool_result`` blocks left out),
``mergeConsecutiveApiMessages`` (consecutive user messages sent as one, a later one merged into
a summary), then the blocks converted as the ``cline`` format converts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeprep.formats import ReadOptions
from treeprep.formats._roo_view import View, Views, sent
from treeprep.formats.cline import FORMAT
from treeprep.schemas import ChatCall, Reject

QWEN3 = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers" / "qwen3"
SYSTEM = "You are Roo."
SUMMARY_1 = "## Conversation Summary\nThe user asked to fix cli.py; it was read and patched."
SUMMARY_2 = "## Conversation Summary\ncli.py was fixed and checked."


def _use(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": name, "input": args}


def _result(cid: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": cid, "content": text}


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def _history() -> list[dict[str, Any]]:
    """Two automatic condenses' worth of a task: c1 after [4], c2 (manual) after [8], then the
    user's next message [10], which holds a result whose call was condensed away."""
    h: list[dict[str, Any]] = [
        {"role": "user", "content": [_text("<task>Fix cli.py</task>")]},
        {"role": "assistant", "content": [_text("Reading."), _use("t1", "read_file", path="a")]},
        {"role": "user", "content": [_result("t1", "print(1")]},
        {"role": "assistant", "content": [_use("t2", "apply_diff", path="cli.py")]},
        {"role": "user", "content": [_result("t2", "applied")]},
        {"role": "user", "content": [_text(SUMMARY_1)], "isSummary": True, "condenseId": "c1"},
        {"role": "assistant", "content": [_use("t3", "execute_command", command="python cli.py")]},
        {"role": "user", "content": [_result("t3", "1"), _text("<environment_details>")]},
        {"role": "assistant", "content": [_text("Fixed.")]},
        {"role": "user", "content": [_text(SUMMARY_2)], "isSummary": True, "condenseId": "c2"},
        {"role": "user", "content": [_result("t3", "1"), _text("Now add tests.")]},
        {"role": "assistant", "content": [_text("Adding tests.")]},
    ]  # fmt: skip
    for i, m in enumerate(h):
        m["ts"] = 1_770_000_000_000 + i
    for m in h[:5]:
        m["condenseParent"] = "c1"
    for m in h[5:9]:
        m["condenseParent"] = "c2"  # the first summary too: it had no parent
    return h


def _read(tmp_path: Path, hist: list[dict[str, Any]]) -> list[Any]:
    p = tmp_path / "t1" / "api_conversation_history.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(hist))
    return list(FORMAT.read(str(p), ReadOptions(system_prompt=SYSTEM)))


def _shape(call: ChatCall) -> list[tuple[str, Any]]:
    """Each prompt message as (role, its text or its parts' texts, or its tool call ids)."""
    out = []
    for m in call.messages:
        if m.tool_calls:
            out.append((m.role, [tc.id for tc in m.tool_calls]))
        elif isinstance(m.content, list):
            out.append((m.role, [p.text for p in m.content]))  # type: ignore[union-attr]
        else:
            out.append((m.role, m.content))
    return out


def test_each_call_is_prompted_with_the_view_roo_code_sent(tmp_path: Path) -> None:
    calls = _read(tmp_path, _history())
    assert all(isinstance(c, ChatCall) for c in calls), calls
    sys = ("system", SYSTEM)
    assert [_shape(c) for c in calls] == [
        [sys, ("user", "<task>Fix cli.py</task>")],
        [sys, ("user", "<task>Fix cli.py</task>"), ("assistant", ["t1"]), ("tool", "print(1")],
        # from the first summary on: what precedes it (its tags came later for [0]-[4]) is not sent
        [sys, ("user", SUMMARY_1)],
        [sys, ("user", SUMMARY_1), ("assistant", ["t3"]), ("tool", "1"),
         ("user", "<environment_details>")],
        # the user's message merged into the second summary, its orphaned result left out
        [sys, ("user", [SUMMARY_2, "Now add tests."])],
    ]  # fmt: skip
    assert [c.branch_reason for c in calls] == [None, None, "compaction", None, "compaction"]
    assert [c.parent_call_id for c in calls] == [None, "t1#0", "t1#1", "t1#2", "t1#3"]


def test_a_message_of_orphaned_results_alone_is_dropped(tmp_path: Path) -> None:
    h = _history()
    h[10]["content"] = [_result("t3", "1")]
    h.insert(11, {"role": "assistant", "content": [_text("Nothing to do.")], "ts": 1})
    last = _read(tmp_path, h)[-2]
    assert _shape(last) == [("system", SYSTEM), ("user", SUMMARY_2)]


def test_consecutive_user_messages_are_sent_as_one(tmp_path: Path) -> None:
    """mergeConsecutiveApiMessages: a marked history's consecutive user messages are one message
    (results first, then the texts of both, as the blocks convert)."""
    h = _history()[:9]
    h.insert(7, {"role": "user", "content": "Also keep the shebang.", "ts": 1})
    calls = _read(tmp_path, h)
    assert _shape(calls[-1])[-2:] == [
        ("tool", "1"),
        ("user", ["Also keep the shebang.", "<environment_details>"]),
    ]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda h: h[3].pop("condenseParent"), "[5] is its summary), in a form an earlier"),
        (lambda h: h[5].update(role="assistant"), "[5] is its summary), in a form an earlier"),
    ],
    ids=["untagged-before-summary", "assistant-summary"],
)
def test_an_earlier_roo_codes_summary_is_not_rebuilt(tmp_path: Path, edit: Any, why: str) -> None:
    h = _history()[:9]
    edit(h)
    items = _read(tmp_path, h)
    if h[5]["role"] == "assistant":  # the summary is no reply of the model's: not trained
        assert isinstance(items[2], Reject) and "summary" in items[2].reason
        del items[2]
    assert [type(x) for x in items] == [ChatCall, ChatCall, Reject, Reject]
    assert all(why in r.reason for r in items[2:])


def test_calls_with_a_truncation_marker_in_view_are_rejected(tmp_path: Path) -> None:
    """A sliding-window marker is inserted before the first message it keeps, so where it lies
    says nothing of which calls came after it: those calls are not rebuilt. One that lies before
    the last summary is not in the view (getEffectiveApiHistory counts only markers after it)."""
    h = _history()
    note = "[Sliding window truncation: 2 messages hidden to reduce context]"
    marker = {"role": "user", "content": note, "isTruncationMarker": True, "truncationId": "x1"}
    h[1]["truncationParent"] = h[2]["truncationParent"] = "x1"
    h.insert(3, {**marker, "condenseParent": "c1"})
    items = _read(tmp_path, h)
    assert [type(x) for x in items] == [ChatCall, Reject, ChatCall, ChatCall, ChatCall]
    assert "[3] is its sliding-window marker" in items[1].reason
    h = _history()
    h.insert(7, {**marker, "condenseParent": "c2"})  # tagged by the second condense
    items = _read(tmp_path, h)
    assert [type(x) for x in items] == [ChatCall, ChatCall, ChatCall, Reject, ChatCall]


def test_an_unmarked_history_is_read_as_stored(tmp_path: Path) -> None:
    """Without Roo Code's fields (Cline, or Roo Code before any condense) consecutive user
    messages stay apart, as Cline sends them; with them, they are merged."""
    h = [{k: v for k, v in m.items() if k != "condenseParent"} for m in _history()[:2]]
    h.insert(1, {"role": "user", "content": "Also keep the shebang."})
    (call,) = _read(tmp_path, h)
    assert _shape(call)[1:] == [
        ("user", "<task>Fix cli.py</task>"),
        ("user", "Also keep the shebang."),
    ]
    h[0]["condenseParent"] = "c0"  # a tag whose summary a rewind removed: Roo Code's file
    (call,) = _read(tmp_path, h)
    assert _shape(call)[1:] == [("user", ["<task>Fix cli.py</task>", "Also keep the shebang."])]


@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
def test_the_views_render_as_apply_chat_template_qwen3(tmp_path: Path) -> None:
    from tests.treeprep.render.hf_reference import assert_calls_match_apply_chat_template
    from treeprep.render import Renderer

    h = _history()
    h.insert(7, {"role": "user", "content": "Also keep the shebang.", "condenseParent": "c2"})
    calls = _read(tmp_path, h)
    assert len(calls) == 5 and all(isinstance(c, ChatCall) for c in calls)
    assert_calls_match_apply_chat_template(Renderer.load(str(QWEN3)), calls)


def test_a_result_stored_before_its_call_is_left_out_until_the_call_is_made(
    tmp_path: Path,
) -> None:
    """getEffectiveApiHistory keeps a result whose tool_use is anywhere in the view: a result
    stored before its call is left out of the calls before the call, and sent (before it, as
    stored) in those after, which no chat template takes: those calls are rejected."""
    h = _history()[:9]
    h[7]["content"].insert(1, _result("t9", "early"))
    h.insert(9, {"role": "assistant", "content": [_use("t9", "read_file", path="b")], "ts": 1})
    h.insert(10, {"role": "user", "content": [_result("t9", "late")], "ts": 2})
    h.insert(11, {"role": "assistant", "content": [_text("Done.")], "ts": 3})
    items = _read(tmp_path, h)
    assert [type(x) for x in items] == [ChatCall] * 5 + [Reject]
    assert _shape(items[3])[3:] == [("tool", "1"), ("user", "<environment_details>")]
    assert _shape(items[4])[3:] == [("tool", "1"), ("user", "<environment_details>"),
                                    ("assistant", "Fixed.")]  # fmt: skip
    assert "tool_call_id 't9' but no earlier assistant message made that call" in items[5].reason


_IDS = st.sampled_from(["a", "b", "c", 7])
_BLOCK = st.one_of(
    st.builds(lambda i: {"type": "tool_result", "tool_use_id": i, "content": "r"}, _IDS),
    st.just({"type": "text", "text": "t"}),
)
_MESSAGE = st.one_of(
    st.builds(lambda b: {"role": "user", "content": b}, st.lists(_BLOCK, max_size=3)),
    st.sampled_from([{"role": "user", "content": "s"}, {"role": "user", "content": None}]),
    st.builds(
        lambda ids: {"role": "assistant", "content": [_use(i, "f") for i in ids]},
        st.lists(_IDS, max_size=2),
    ),
    st.sampled_from(
        [
            {"role": "user", "content": "sum", "isSummary": True},
            {"role": "assistant", "content": "sum", "isSummary": True},
            {"role": "user", "content": "cut", "isTruncationMarker": True},
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_MESSAGE, st.booleans(), st.booleans()), max_size=14))
def test_views_built_on_from_the_last_are_the_views_built_whole(
    stored: list[tuple[dict[str, Any], bool, bool]],
) -> None:
    """Views (each call's view built on from the last call's) against sent (each built from the
    stored history alone): the same view or reason at every call, and the messages it says it
    kept are the last view's own."""
    history = [{**m, "condenseParent": "c"} if tagged else dict(m) for m, tagged, _ in stored]
    views, last = Views(history), None
    for i in [i for i, (_, _, call) in enumerate(stored) if call] + [len(history)]:
        got, want = views.at(i), sent(history, i)
        if isinstance(want, str):
            assert got == want
            continue
        assert isinstance(got, View)
        assert (got.start, got.messages) == (want.start, want.messages)
        if got.kept:
            assert last is not None and last.start == got.start and got.kept <= len(last.messages)
            kept = zip(got.messages[: got.kept], last.messages[: got.kept], strict=True)
            assert all(a is b for a, b in kept)
        last = got
