"""Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``).

What the files hold (measured on real sessions, see ``../shared/data/README.md``):

* one line per *content block*: an API response with thinking, text and three tool calls is five
  ``assistant`` lines sharing ``message.id``, chained by ``parentUuid``;
* ``user`` lines with a string (a prompt) or blocks (``text``, ``tool_result``); ``isMeta`` user
  lines are injected context (hook output, caveats) that the model sees but nobody typed;
* ``progress``, ``system``, ``file-history-snapshot`` and ``queue-operation`` lines that the model
  never sees but that sit on the ``parentUuid`` chain;
* a compaction: a ``system`` line with ``subtype: compact_boundary``, ``parentUuid: null`` and
  ``logicalParentUuid``, then a ``user`` line with ``isCompactSummary: true``; the summariser call
  itself lives in ``<session>/subagents/agent-acompact-*.jsonl`` whose lines point (``parentUuid``)
  into the main session, the summary request hanging off the logical parent;
* sub-agents in ``<session>/subagents/agent-<id>.jsonl`` (``isSidechain: true``, ``agentId``),
  started by a ``Task`` tool call of the main session; the main session's ``agent_progress`` lines
  say which ``tool_use`` id started which ``agentId``;
* no system prompt and no tool schemas: ``--system-prompt`` / ``--tools`` supply them
  (:class:`ReadOptions`), otherwise none are rendered.

Claude Code sends each call's request to a Messages endpoint, which converts it into chat
messages: the request's turns are converted as ``--server``'s endpoint converts them
(:func:`~treeprep.formats.anthropic.turn_messages`: vLLM's, llama.cpp's or SGLang's; a turn
SGLang's refuses, or writes as no log says, such as earlier thinking, rejects the call).

How a call is rebuilt. Each API response (one ``message.id``) is one :class:`ChatCall`; its prompt
is the thread before its first line: walk ``parentUuid`` from there to the root (a compaction
boundary is a root), then replay the thread oldest first. Two things are not on the chain and are
attached where they belong:

* tool results: parallel tool calls are chained ``tool_use A -> tool_use B -> result B``, with
  ``result A`` hanging off ``tool_use A``. After each assistant response every result of its tool
  calls that was written before the call being rebuilt is emitted, in file order (the API request
  carries them all in the next user turn).
* ``isMeta`` context lines hanging off a thread line of the same file. The compaction file's two
  hook reminders hang off main-session lines whose own thread never carries them; they are left
  out so that the summariser continues the pre-compaction prefix exactly.

Cost: a thread is replayed once per session, not once per call: the next call goes on from the
last one's replay unless a line written between them changes the history already replayed
(:mod:`treeprep.formats._claude_replay`, which checks itself against whole replays on a sparse
schedule). A session of 1,600 turns builds in 4.95 CPU-seconds, 6.6x its 400 turns (linear is
4x), where replaying every call whole took 18.6 s, 10.6x (``bench/session_scaling.py``).

Branch hints: every call of a sub-agent file is ``sub-agent``, and so is every call whose lines
carry ``isSidechain: true`` inside a main session file (Claude Code before 1.0.x wrote sub-agent
sidechains inline; their agent id is ``sidechain-<first sidechain uuid>``); the summariser call and
the first call after a compaction boundary are ``compaction``. Other divergences (a user rewinding
the conversation) are left to the trie as ``unknown``.

Attachments: Claude Code 2.1.97 on writes ``attachment`` lines on the thread, most of which it
sends to the model as context. They are not replayed yet: a call whose prompt holds one that
Claude Code sends is rejected naming it (:func:`~._claude_session.attachment_sent`;
``docs/claude-code-attachments.md``).

Bad input gives rejects, never exceptions: a malformed line; a ``parentUuid`` that points nowhere
(broken chain) or loops (cycle) rejects each call whose prompt needs that link; a ``tool_result``
whose ``tool_use`` is nowhere in the session rejects that line and is left out of every prompt; a
sub-agent file whose parent session file is absent rejects each of its calls (the sub-agent cannot
be linked to its ``Task`` call, and a compaction summariser's prompt cannot be rebuilt at all).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._anthropic_llama import system_message
from treeprep.formats._claude_layout import not_a_chain, parent_session_path
from treeprep.formats._claude_replay import ChainError, Replay, Threads
from treeprep.formats._claude_session import Line, Session, response_message
from treeprep.formats._fields import as_dict, expect, make_call, opt_str
from treeprep.formats._read import head_json_objects, records
from treeprep.formats.anthropic import ARGUMENTS_JSON
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.modes import Server
from treeprep.schemas import Reject

NAME = "claude-code"
_TYPES = {
    "user",
    "assistant",
    "system",
    "progress",
    "summary",
    "file-history-snapshot",
    "queue-operation",
    "attachment",
}


_SIGNATURE = ("sessionId", "parentUuid", "uuid", "version")


def sniff(path: str, head: bytes) -> bool:
    """A JSONL file whose lines carry Claude Code's envelope :data:`_SIGNATURE` (look-alikes are
    told apart by their chain: :func:`~treeprep.formats._claude_layout.not_a_chain`)."""
    objs = head_json_objects(head)
    for o in objs:
        t = o.get("type")
        if isinstance(t, str) and t in _TYPES and all(k in o for k in _SIGNATURE):
            return True
    if not objs and head.lstrip().startswith(b"{"):
        # a first line longer than the head: fall back to the envelope's keys
        return all(f'"{k}"'.encode() in head for k in (*_SIGNATURE, "isSidechain"))
    return False


_CONTENT = "a string or a list of content blocks"


def _check_blocks(blocks: list[Any], where: str) -> None:
    """Content blocks as the adapter reads them: a typed object whose text is a string."""
    for i, b in enumerate(blocks):
        at = f"{where}[{i}]"
        b = as_dict(b, at)
        t = expect(b.get("type"), f"{at}.type", str)
        if t in ("text", "thinking"):
            opt_str(b.get(t), f"{at}.{t}")
        elif t == "tool_use":
            expect(b.get("id"), f"{at}.id", str)
        elif t == "tool_result":
            expect(b.get("tool_use_id"), f"{at}.tool_use_id", str)
            c = b.get("content")
            if c is not None and isinstance(expect(c, f"{at}.content", str, list), list):
                _check_blocks(c, f"{at}.content")


def _check_line(rec: dict[str, Any]) -> None:
    """The envelope and message fields this adapter reads have their shapes; else RecordError
    naming the field (the line is rejected and left out of the session)."""
    t = opt_str(rec.get("type"), "type")
    for key in ("uuid", "parentUuid", "logicalParentUuid", "sessionId", "agentId"):
        opt_str(rec.get(key), key)
    if t not in ("user", "assistant"):
        return
    msg = as_dict(rec.get("message"), "message")
    if t == "assistant":
        # a response is known by its id: an assistant line without one would be no call and no
        # reject (a look-alike writes them: Qwen Code's session files)
        expect(msg.get("id"), "message.id", str)
        opt_str(msg.get("model"), "message.model")
    content = msg.get("content")
    if content is not None and not isinstance(
        expect(content, "message.content", str, list, what=_CONTENT), str
    ):
        _check_blocks(content, "message.content")


def _inline_agent(replay: Replay, first: Line) -> str:
    """``sidechain-<uuid>`` named after the first sidechain line of an inline sub-agent thread."""
    root = replay.first_sidechain or first
    agent = root.rec.get("agentId")
    return str(agent) if agent else f"sidechain-{str(root.rec.get('uuid', root.no))[:8]}"


@dataclass(frozen=True)
class _File:
    """Who wrote the file being read: the main session, or one sub-agent of it."""

    path: str
    session_id: str | None
    #: ``main``, or the sub-agent's id
    agent_id: str
    #: a sub-agent transcript (``<session>/subagents/agent-<id>.jsonl``)
    sidechain: bool
    #: the compaction summariser's transcript (``agent-acompact-*``)
    is_compact: bool


def _identify(path: str, own: list[Line]) -> _File:
    session_id = next((ln.rec["sessionId"] for ln in own if ln.rec.get("sessionId")), None)
    agent_ids = {ln.rec.get("agentId") for ln in own if ln.rec.get("isSidechain")} - {None}
    sidechain = bool(agent_ids) and all(
        ln.rec.get("isSidechain") for ln in own if ln.rec.get("type") in ("user", "assistant")
    )
    agent_id = str(sorted(str(a) for a in agent_ids)[0]) if sidechain else "main"
    is_compact = sidechain and agent_id.startswith("acompact")
    return _File(path, session_id, agent_id, sidechain, is_compact)


def _link_parent(sess: Session, f: _File) -> tuple[str | None, str | None]:
    """Read a sub-agent's parent session into ``sess``.

    Returns (the API response whose Task call started the sub-agent, or None; the reason every
    call is rejected when the parent session file is absent, else None).
    """
    ppath = parent_session_path(f.path, f.session_id)
    if ppath is None:
        return None, (
            f"sub-agent transcript (agentId {f.agent_id}) of session {f.session_id}: its parent "
            f"session file {f.session_id}.jsonl is absent (expected next to the "
            "'<session>/subagents/' folder, or next to the agent file in the flat layout of "
            "Claude Code before 2.1.2), so the sub-agent cannot be linked to its Task "
            "call" + (" and the summariser prompt cannot be rebuilt" if f.is_compact else "")
        )
    tool_use_by_agent: dict[str, str] = {}
    for no, rec in records(ppath, NAME, objects=True):
        if isinstance(rec, Reject) or _misshapen(rec) is not None:
            continue  # reported when the parent file itself is read
        sess.add(Line(no, rec, False))
        d = rec.get("data")
        if (
            rec.get("type") == "progress"
            and isinstance(d, dict)
            and d.get("type") == "agent_progress"
            and d.get("agentId")
            and rec.get("parentToolUseID")
        ):
            tool_use_by_agent.setdefault(str(d["agentId"]), str(rec["parentToolUseID"]))
    tu = tool_use_by_agent.get(f.agent_id)
    owner = sess.tool_use_owner.get(tu) if tu else None
    return (owner[1] if owner is not None and not owner[0] else None), None


def _orphans(sess: Session, f: _File) -> list[tuple[int, Item]]:
    """A reject per own line holding a tool result whose tool_use is nowhere in the session. The
    line is rejected, the rest of the session is kept (no replay attaches the result)."""
    out: list[tuple[int, Item]] = []
    orphan_lines: set[int] = set()
    for tid, found in sess.results.items():
        if tid in sess.tool_use_owner:
            continue
        for rl, _blk in found:
            if rl.own and rl.no not in orphan_lines:
                orphan_lines.add(rl.no)
                reason = (
                    f"tool_result for tool_use_id {tid} has no matching tool_use in this session; "
                    "left out of every prompt"
                )
                out.append((rl.no, Reject(file=f.path, line=rl.no, reason=reason, format=NAME)))
    return out


def _branch(
    f: _File,
    first: Line,
    replay: Replay,
    seen_compactions: set[str],
) -> tuple[str | None, str]:
    """(the call's branch hint, its agent id); the first call after each compaction boundary
    is marked in ``seen_compactions``."""
    if f.sidechain:
        return ("compaction" if f.is_compact else "sub-agent"), f.agent_id
    if first.rec.get("isSidechain"):
        # Claude Code before 1.0.x: a sub-agent's lines sit inline in the session file
        return "sub-agent", _inline_agent(replay, first)
    boundary = replay.boundary
    if boundary is not None:
        if boundary not in seen_compactions:
            seen_compactions.add(boundary)
            return "compaction", f.agent_id
    return None, f.agent_id


def _call(
    f: _File,
    mid: str,
    lines: list[Line],
    ctx: _CallContext,
) -> Item:
    """One API response (its lines in file order) as a ChatCall, or the Reject saying why not."""
    first = lines[0]

    def reject(reason: str) -> Reject:
        return Reject(file=f.path, line=first.no, reason=reason, format=NAME, call_id=mid)

    if ctx.parent_missing:
        return reject(ctx.parent_missing)
    try:
        replay = ctx.threads.replay(first)
    except (ChainError, RecordError) as e:  # a bad link; a turn the server's endpoint refuses
        return reject(f"cannot rebuild the prompt of API response {mid}: {e}")
    completion = response_message(lines)
    if (
        not completion.get("content")
        and not completion.get("tool_calls")
        and not (completion.get("reasoning_content"))
    ):
        return reject(f"API response {mid} has no text, thinking or tool_use block to train on")
    if not replay.messages:
        return reject(f"API response {mid} has an empty prompt (no user line before it)")
    if replay.unreplayed is not None:
        ln, kind = replay.unreplayed
        return reject(
            f"cannot rebuild the prompt of API response {mid}: line {ln.no}"
            f"{'' if ln.own else ' of the parent session'} is an attachment "
            f"({kind!r}) that Claude Code sends to the model as context, and treeprep does not "
            "replay attachment lines yet (Claude Code 2.1.97 on writes them)"
        )
    reason, call_agent = _branch(f, first, replay, ctx.seen_compactions)
    parent_call = replay.last_response
    if parent_call is None and f.sidechain:
        parent_call = ctx.task_call
    gid = f.session_id
    opts = ctx.opts
    llama = opts.server == Server.llama_cpp
    if opts.group_by:
        v = first.rec.get(opts.group_by)
        gid = None if v is None else str(v)
    fields: dict[str, Any] = {
        "group_id": gid,
        "agent_id": call_agent,
        "call_id": mid,
        "parent_call_id": parent_call,
        "model": first.rec["message"].get("model"),
        "timestamp": _opt_text(first.rec.get("timestamp")),  # for --since/--until
        "project": _opt_text(first.rec.get("cwd")),  # for --project
        "messages": [
            *_system(opts),
            *replay.messages,  # a copy: the replay goes on with the next call
        ],
        "tools": opts.tools,
        "completion": completion,
        "provenance": {"exact_tokens": False, "exact_messages": False, "reconstructed": True},
        "branch_reason": reason,
        # as the server's Messages endpoint writes them (llama.cpp's nlohmann dump(): None
        # there, render.llama_caps)
        "arguments_json": None if llama else ARGUMENTS_JSON,
        "source_file": f.path,
        "source_line": first.no,
        "source_format": NAME,
    }
    return make_call(fields, file=f.path, line=first.no, fmt=NAME)


@dataclass
class _CallContext:
    """What the calls of one file share while they are rebuilt."""

    opts: ReadOptions
    #: the parent session's API response whose Task call started this sub-agent
    task_call: str | None
    #: why every call is rejected (a sub-agent whose parent session file is absent)
    parent_missing: str | None
    #: the live replays of the file's threads
    threads: Threads
    #: compaction boundaries whose first call has been hinted ``compaction``
    seen_compactions: set[str] = field(default_factory=set)


def _system(opts: ReadOptions) -> list[dict[str, Any]]:
    """The system message of ``--system-prompt``, as the server's Messages endpoint writes a
    request's ``system`` string (llama.cpp pins the attribution line's stamp)."""
    if not opts.system_prompt:
        return []
    if opts.server == Server.llama_cpp:
        return system_message(opts.system_prompt)
    if opts.server == Server.sglang and not opts.system_prompt.strip():
        return []  # SGLang's endpoint leaves a blank system string out
    return [{"role": "system", "content": opts.system_prompt}]


def _misshapen(rec: dict[str, Any]) -> str | None:
    try:
        _check_line(rec)
    except RecordError as e:
        return str(e)
    return None


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    """Every API response of the file as one ChatCall (plus rejects), in file order."""
    out: list[tuple[int, Item]] = []
    own: list[Line] = []
    sess = Session(path, opts.server)
    for no, rec in records(path, NAME, objects=True):
        if isinstance(rec, Reject):
            out.append((no, rec))
        elif (why := _misshapen(rec)) is not None:
            out.append((no, Reject(file=path, line=no, reason=why, format=NAME)))
            if isinstance(rec.get("uuid"), str):
                sess.rejected[rec["uuid"]] = no
        else:
            own.append(Line(no, rec, True))
    f = _identify(path, own)
    look_alike = not_a_chain(own)
    for ln in own:
        sess.add(ln)
    task_call, parent_missing = _link_parent(sess, f) if f.sidechain else (None, None)
    out.extend(_orphans(sess, f))
    ctx = _CallContext(opts, task_call, parent_missing, Threads(sess, path))
    for (is_own, mid), lines in sess.responses.items():
        if not is_own:
            continue
        if lines[0].rec["message"].get("model") == "<synthetic>":
            continue  # written by Claude Code itself (an error notice), not an API response
        no = lines[0].no
        if look_alike is not None:
            out.append(
                (no, Reject(file=path, line=no, reason=look_alike, format=NAME, call_id=mid))
            )
        else:
            out.append((no, _call(f, mid, lines, ctx)))
    out.sort(key=lambda x: x[0])
    for _no, item in out:
        yield item


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=20)


def _opt_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
