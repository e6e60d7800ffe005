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

Cost: each call walks its own thread, O(calls x thread length) dictionary lookups: about 0.1 s for
the 1,863-line real session. The alternative (one incremental walk) breaks on rewinds and forks.

Branch hints: every call of a sub-agent file is ``sub-agent``, and so is every call whose lines
carry ``isSidechain: true`` inside a main session file (Claude Code before 1.0.x wrote sub-agent
sidechains inline; their agent id is ``sidechain-<first sidechain uuid>``); the summariser call and
the first call after a compaction boundary are ``compaction``. Other divergences (a user rewinding
the conversation) are left to the trie as ``unknown``.

Bad input gives rejects, never exceptions: a malformed line; a ``parentUuid`` that points nowhere
(broken chain) or loops (cycle) rejects each call whose prompt needs that link; a ``tool_result``
whose ``tool_use`` is nowhere in the session rejects that line and is left out of every prompt; a
sub-agent file whose parent session file is absent rejects each of its calls (the sub-agent cannot
be linked to its ``Task`` call, and a compaction summariser's prompt cannot be rebuilt at all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from treeprep.errors import RecordError
from treeprep.formats._claude_layout import not_a_chain, parent_session_path
from treeprep.formats._fields import as_dict, expect, make_call, opt_str
from treeprep.formats._read import head_json_objects, records
from treeprep.formats.anthropic import assistant_message
from treeprep.formats.base import FormatSpec, Item, ReadOptions
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


@dataclass
class _Line:
    no: int  # 1-based line number in its file
    rec: dict[str, Any]
    own: bool  # in the file being read (False: in the parent session file)


@dataclass
class _Session:
    """The lines that a thread can reach: the file's own, plus its parent session's."""

    path: str
    by_uuid: dict[str, _Line] = field(default_factory=dict)
    # message.id -> its lines (file order); keyed per origin so a parent's ids never mix with ours
    responses: dict[tuple[bool, str], list[_Line]] = field(default_factory=dict)
    tool_use_owner: dict[str, tuple[bool, str]] = field(default_factory=dict)
    results: dict[str, list[tuple[_Line, dict[str, Any]]]] = field(default_factory=dict)
    meta_children: dict[str, list[_Line]] = field(default_factory=dict)
    parent_of_line: dict[int, str] = field(default_factory=dict)
    #: uuid -> line of the lines rejected as misshapen (so a chain through one says so)
    rejected: dict[str, int] = field(default_factory=dict)
    #: the messages made of lines, by the lines' (and blocks') identity: see :meth:`made`
    _made: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def made(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()``, made once per session for ``key`` (what it is made of, by identity: the
        session holds those lines and blocks, so their ids stay theirs).

        Each call replays its whole thread, so a session's calls made every message of their
        history again: reading a session was quadratic in its length (800 turns: 320,400
        assistant messages merged). The messages are pure functions of their lines, and handing
        the same dicts to every call lets :func:`~treeprep.formats._fields.make_call` know a
        history by identity; nothing changes a dict once it is handed over."""
        m = self._made.get(key)
        if m is None:
            m = self._made[key] = make()
        return m

    def add(self, ln: _Line) -> None:
        r = ln.rec
        u = r.get("uuid")
        if isinstance(u, str):
            # own lines win over the parent's (a file never needs the parent's copy of its line)
            if u not in self.by_uuid or ln.own:
                self.by_uuid[u] = ln
        msg = r.get("message")
        content = msg.get("content") if isinstance(msg, dict) else None
        if (
            r.get("type") == "assistant"
            and isinstance(msg, dict)
            and isinstance(msg.get("id"), str)
        ):
            key = (ln.own, msg["id"])
            self.responses.setdefault(key, []).append(ln)
            if isinstance(content, list):
                for b in content:
                    if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id"):
                        self.tool_use_owner[b["id"]] = key
        if r.get("type") == "user" and isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    self.results.setdefault(str(b.get("tool_use_id")), []).append((ln, b))
        if r.get("type") == "user" and r.get("isMeta") and isinstance(r.get("parentUuid"), str):
            self.meta_children.setdefault(r["parentUuid"], []).append(ln)


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
            if isinstance(c, list):
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
        opt_str(msg.get("id"), "message.id")
        opt_str(msg.get("model"), "message.model")
    content = msg.get("content")
    if content is not None and not isinstance(
        expect(content, "message.content", str, list, what=_CONTENT), str
    ):
        _check_blocks(content, "message.content")


class _ChainError(Exception):
    pass


def _before(a: _Line, cut: _Line) -> bool:
    """Was line ``a`` written before ``cut``? Parent-session lines precede the sub-agent file."""
    if a.own != cut.own:
        return not a.own
    return a.no < cut.no


def _text_of_blocks(blocks: list[Any]) -> str:
    return "".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


def _tool_result_content(b: dict[str, Any]) -> str | list[dict[str, Any]]:
    c = b.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts: list[dict[str, Any]] = []
        for p in c:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append({"type": "text", "text": p.get("text", "")})
            elif isinstance(p, dict):
                parts.append(dict(p))
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts
    return str(c)


def _tool_message(blk: dict[str, Any], tid: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": tid, "content": _tool_result_content(blk)}


def _assistant_message(lines: list[_Line]) -> dict[str, Any]:
    """Merge the content blocks of one API response (its lines in file order)."""
    blocks: list[Any] = []
    for ln in lines:
        content = ln.rec["message"].get("content")
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        else:
            blocks.extend(content or [])
    return assistant_message(blocks)


def _user_messages(ln: _Line) -> list[dict[str, Any]]:
    """The user-role messages of one user line (its text; tool results are handled apart)."""
    content = ln.rec.get("message", {}).get("content")
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        return []
    parts: list[dict[str, Any]] = []
    for b in content:
        if not isinstance(b, dict) or b.get("type") == "tool_result":
            continue
        if b.get("type") == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        else:
            parts.append(dict(b))  # images and documents stay parts; the renderer decides
    if not parts:
        return []
    if all(p["type"] == "text" for p in parts):
        return [{"role": "user", "content": "".join(p["text"] for p in parts)}]
    return [{"role": "user", "content": parts}]


def _chain(sess: _Session, start: str | None, file: str) -> list[_Line]:
    """The thread ending at ``start`` (oldest first). Raises _ChainError naming the bad link."""
    out: list[_Line] = []
    seen: set[str] = set()
    u = start
    child: _Line | None = None
    while u:
        if u in seen:
            raise _ChainError(f"cycle in parentUuid: uuid {u} is reached twice")
        seen.add(u)
        ln = sess.by_uuid.get(u)
        if ln is None and u in sess.rejected:
            raise _ChainError(f"parentUuid {u} is line {sess.rejected[u]}, which is rejected")
        if ln is None:
            where = f"line {child.no}" if child is not None else "the call's first line"
            raise _ChainError(
                f"broken parent chain: parentUuid {u} (from {where}) is not in {file}"
                + (" or its parent session" if child is not None and not child.own else "")
            )
        out.append(ln)
        child = ln
        if ln.rec.get("type") == "system" and ln.rec.get("subtype") == "compact_boundary":
            break  # the thread after a compaction is a new root
        p = ln.rec.get("parentUuid")
        u = p if isinstance(p, str) else None
    out.reverse()
    return out


def _prompt(
    sess: _Session, chain: list[_Line], cut: _Line, orphans: set[tuple[int, bool]]
) -> tuple[list[dict[str, Any]], str | None, bool]:
    """Replay a thread into OpenAI messages.

    Returns (messages, id of the last assistant response in it, whether it crossed a compaction).
    """
    msgs: list[dict[str, Any]] = []
    done_results: set[tuple[int, bool, str]] = set()
    last_resp: str | None = None
    compacted = False
    seen_resp: set[tuple[bool, str]] = set()
    on_chain = {id(x) for x in chain}

    def attach_meta(ln: _Line) -> None:
        u = ln.rec.get("uuid")
        for m in sess.meta_children.get(u, []) if isinstance(u, str) else []:
            # context hung on a line of the same file only: the compaction file's hook reminders
            # point into the main session, whose own thread does not carry them; adding them to
            # the summariser alone would make two reconstructions of one history disagree
            if id(m) not in on_chain and m.own == ln.own and _before(m, cut):
                msgs.extend(sess.made(("u", id(m)), partial(_user_messages, m)))

    for ln in chain:
        r = ln.rec
        t = r.get("type")
        if t == "system" and r.get("subtype") == "compact_boundary":
            compacted = True
            continue
        if t == "assistant":
            key = (ln.own, r["message"].get("id"))
            if key in seen_resp:
                attach_meta(ln)
                continue
            seen_resp.add(key)
            lines = [x for x in sess.responses.get(key, [ln]) if _before(x, cut)]
            am = sess.made(("a", *map(id, lines)), partial(_assistant_message, lines))
            msgs.append(am)
            last_resp = key[1]
            found: list[tuple[_Line, dict[str, Any], str]] = []
            for tc in am.get("tool_calls") or []:
                for rl, blk in sess.results.get(str(tc["id"]), []):
                    if _before(rl, cut):
                        found.append((rl, blk, str(tc["id"])))
            found.sort(key=lambda x: (x[0].own, x[0].no))
            for rl, blk, tid in found:
                k = (rl.no, rl.own, tid)
                if k in done_results:
                    continue
                done_results.add(k)
                msgs.append(sess.made(("t", id(blk), tid), partial(_tool_message, blk, tid)))
            for x in lines:
                attach_meta(x)
            continue
        if t == "user":
            # tool results come with their assistant turn
            msgs.extend(sess.made(("u", id(ln)), partial(_user_messages, ln)))
            attach_meta(ln)
            continue
        attach_meta(ln)  # progress/system lines: not seen by the model, but context may hang off
    return msgs, last_resp, compacted


def _inline_agent(chain: list[_Line], first: _Line) -> str:
    """``sidechain-<uuid>`` named after the first sidechain line of an inline sub-agent thread."""
    root = next((x for x in chain if x.rec.get("isSidechain")), first)
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


def _identify(path: str, own: list[_Line]) -> _File:
    session_id = next((ln.rec["sessionId"] for ln in own if ln.rec.get("sessionId")), None)
    agent_ids = {ln.rec.get("agentId") for ln in own if ln.rec.get("isSidechain")} - {None}
    sidechain = bool(agent_ids) and all(
        ln.rec.get("isSidechain") for ln in own if ln.rec.get("type") in ("user", "assistant")
    )
    agent_id = str(sorted(str(a) for a in agent_ids)[0]) if sidechain else "main"
    is_compact = sidechain and agent_id.startswith("acompact")
    return _File(path, session_id, agent_id, sidechain, is_compact)


def _link_parent(sess: _Session, f: _File) -> tuple[str | None, str | None]:
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
        sess.add(_Line(no, rec, False))
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


def _orphans(sess: _Session, f: _File) -> tuple[set[tuple[int, bool]], list[tuple[int, Item]]]:
    """Tool results whose tool_use is nowhere in the session: (their lines, a reject per own
    line). The line is rejected, the rest of the session is kept."""
    orphans: set[tuple[int, bool]] = set()
    out: list[tuple[int, Item]] = []
    orphan_lines: set[int] = set()
    for tid, found in sess.results.items():
        if tid in sess.tool_use_owner:
            continue
        for rl, _blk in found:
            orphans.add((rl.no, rl.own))
            if rl.own and rl.no not in orphan_lines:
                orphan_lines.add(rl.no)
                reason = (
                    f"tool_result for tool_use_id {tid} has no matching tool_use in this session; "
                    "left out of every prompt"
                )
                out.append((rl.no, Reject(file=f.path, line=rl.no, reason=reason, format=NAME)))
    return orphans, out


def _branch(
    f: _File,
    first: _Line,
    chain: list[_Line],
    compacted: bool,
    seen_compactions: set[str],
) -> tuple[str | None, str]:
    """(the call's branch hint, its agent id); the first call after each compaction boundary
    is marked in ``seen_compactions``."""
    if f.sidechain:
        return ("compaction" if f.is_compact else "sub-agent"), f.agent_id
    if first.rec.get("isSidechain"):
        # Claude Code before 1.0.x: a sub-agent's lines sit inline in the session file
        return "sub-agent", _inline_agent(chain, first)
    if compacted:
        boundary = next(
            x.rec.get("uuid", "") for x in chain if x.rec.get("subtype") == "compact_boundary"
        )
        if boundary not in seen_compactions:
            seen_compactions.add(boundary)
            return "compaction", f.agent_id
    return None, f.agent_id


def _call(
    sess: _Session,
    f: _File,
    mid: str,
    lines: list[_Line],
    ctx: _CallContext,
) -> Item:
    """One API response (its lines in file order) as a ChatCall, or the Reject saying why not."""
    first = lines[0]

    def reject(reason: str) -> Reject:
        return Reject(file=f.path, line=first.no, reason=reason, format=NAME, call_id=mid)

    if ctx.parent_missing:
        return reject(ctx.parent_missing)
    try:
        chain = _chain(sess, first.rec.get("parentUuid"), f.path)
    except _ChainError as e:
        return reject(f"cannot rebuild the prompt of API response {mid}: {e}")
    messages, prev_resp, compacted = _prompt(sess, chain, first, ctx.orphans)
    completion = _assistant_message(lines)
    if (
        not completion.get("content")
        and not completion.get("tool_calls")
        and not (completion.get("reasoning_content"))
    ):
        return reject(f"API response {mid} has no text, thinking or tool_use block to train on")
    if not messages:
        return reject(f"API response {mid} has an empty prompt (no user line before it)")
    reason, call_agent = _branch(f, first, chain, compacted, ctx.seen_compactions)
    parent_call = prev_resp
    if parent_call is None and f.sidechain:
        parent_call = ctx.task_call
    gid = f.session_id
    opts = ctx.opts
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
            *([{"role": "system", "content": opts.system_prompt}] if opts.system_prompt else []),
            *messages,
        ],
        "tools": opts.tools,
        "completion": completion,
        "provenance": {"exact_tokens": False, "exact_messages": False, "reconstructed": True},
        "branch_reason": reason,
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
    orphans: set[tuple[int, bool]]
    #: compaction boundaries whose first call has been hinted ``compaction``
    seen_compactions: set[str] = field(default_factory=set)


def _misshapen(rec: dict[str, Any]) -> str | None:
    try:
        _check_line(rec)
    except RecordError as e:
        return str(e)
    return None


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    """Every API response of the file as one ChatCall (plus rejects), in file order."""
    out: list[tuple[int, Item]] = []
    own: list[_Line] = []
    sess = _Session(path)
    for no, rec in records(path, NAME, objects=True):
        if isinstance(rec, Reject):
            out.append((no, rec))
        elif (why := _misshapen(rec)) is not None:
            out.append((no, Reject(file=path, line=no, reason=why, format=NAME)))
            if isinstance(rec.get("uuid"), str):
                sess.rejected[rec["uuid"]] = no
        else:
            own.append(_Line(no, rec, True))
    f = _identify(path, own)
    look_alike = not_a_chain(own)
    for ln in own:
        sess.add(ln)
    task_call, parent_missing = _link_parent(sess, f) if f.sidechain else (None, None)
    orphans, orphan_rejects = _orphans(sess, f)
    out.extend(orphan_rejects)
    ctx = _CallContext(opts, task_call, parent_missing, orphans)
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
            out.append((no, _call(sess, f, mid, lines, ctx)))
    out.sort(key=lambda x: x[0])
    for _no, item in out:
        yield item


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=20)


def _opt_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
