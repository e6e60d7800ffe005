"""``--parallel-calls split``: parallel tool calls rendered as consecutive single-call turns.

Some chat templates cannot show parallel calls: gpt-oss's renders only the first tool call of an
assistant turn (Harmony ends a call with ``<|call|>`` and waits for its result), so a completion
with three calls would train one, and a history turn with three calls would prompt the model with
one. With ``split`` the renderer rewrites such turns before rendering, as the model would have
made the calls one by one:

* **history**: an assistant turn with N > 1 tool calls followed by their results (the run of
  ``tool`` messages after it, matched to the calls by ``tool_call_id``, or by position when the
  log has no ids and there are N results) becomes N turns ``assistant(call k)``, ``tool(result
  k)``; the turn's text and reasoning stay on the first. A turn whose results cannot be matched is
  left as it is (the template then decides, and the coverage check still guards the completion);
* **completion**: a completion with N > 1 calls keeps its text, its reasoning and its first call.
  Its calls 2..N are trained in the *next* call's sequence, whose prompt logs their results: the
  sub-turns 2..N of the last assistant turn of a prompt get loss spans of their own, each the
  tokens an ``apply_chat_template`` of the prompt up to that sub-turn would train (checked to be
  a token prefix of the sequence, to show the call and to read back as that call through the
  model's response parser, as a completion is: :mod:`.response`; otherwise that sub-turn is not
  trained and counted). A parallel completion that no later call of the log answers (the last
  call of a log) trains its first call only: the calls no later call of its file answers are
  counted at the end of the file (``parallel-calls:first-only``).

Every call the rewrite touched is counted in the manifest's curation counts
(``parallel-calls:split``), sub-turns trained in the next call's sequence as
``parallel-calls:later-call``, and those that could not be (not a token prefix, or not read
back) as ``parallel-calls:later-call-untrained``; ``treeprep stats`` prints them.
"""

from __future__ import annotations

import json
from typing import Any

from treeprep.schemas import ChatCall, Message

__all__ = ["FIRST_ONLY", "LATER", "SPLIT", "UNTRAINED", "call_key", "split_call"]

#: the curation counts (``Manifest.curation``)
SPLIT = "parallel-calls:split"
LATER = "parallel-calls:later-call"
UNTRAINED = "parallel-calls:later-call-untrained"
FIRST_ONLY = "parallel-calls:first-only"


def call_key(group_id: str, tc: Any) -> str:
    """A tool call of a group, as a parallel completion and a later prompt both log it."""
    fn = tc.function
    return json.dumps([group_id, tc.id, fn.name, fn.arguments], sort_keys=True, default=str)


def _results(messages: list[Message], i: int, calls: list[Any]) -> list[list[Message]] | None:
    """The results of the N calls of the turn at ``i``, one list per call (None: not matched)."""
    run: list[Message] = []
    for m in messages[i + 1 :]:
        if m.role != "tool":
            break
        run.append(m)
    ids = [tc.id for tc in calls]
    if all(ids) and len(set(ids)) == len(ids):
        by_id: dict[Any, list[Message]] = {x: [] for x in ids}
        for r in run:
            if r.tool_call_id not in by_id:
                return None
            by_id[r.tool_call_id].append(r)
        if any(not v for v in by_id.values()):
            return None
        return [by_id[x] for x in ids]
    if len(run) == len(calls) and not any(r.tool_call_id for r in run):
        return [[r] for r in run]
    return None


def _turns(turn: Message, results: list[list[Message]]) -> list[Message]:
    out: list[Message] = []
    for k, (tc, res) in enumerate(zip(turn.tool_calls or [], results, strict=True)):
        head = {"content": None, "reasoning_content": None} if k else {}
        out.append(turn.model_copy(update={**head, "tool_calls": [tc]}))
        out.extend(res)
    return out


def split_call(rec: ChatCall) -> tuple[ChatCall, list[int]]:
    """``rec`` with its parallel turns split (the same object when nothing is), and the indices in
    the new messages of the sub-turns 2..N of the prompt's last assistant turn (the previous
    call's parallel completion, trained here)."""
    msgs = rec.messages
    last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    out: list[Message] = []
    later: list[int] = []
    changed = False
    i = 0
    while i < len(msgs):
        m = msgs[i]
        calls = m.tool_calls or []
        results = _results(msgs, i, calls) if m.role == "assistant" and len(calls) > 1 else None
        if results is None:
            out.append(m)
            i += 1
            continue
        start = len(out)
        out.extend(_turns(m, results))
        if i == last:
            later = [j for j in range(start, len(out)) if out[j].role == "assistant"][1:]
        i += 1 + sum(len(r) for r in results)
        changed = True
    comp = rec.completion
    if len(comp.tool_calls or []) > 1:
        comp = comp.model_copy(update={"tool_calls": (comp.tool_calls or [])[:1]})
        changed = True
    if not changed:
        return rec, []
    return rec.model_copy(update={"messages": out, "completion": comp}), later
