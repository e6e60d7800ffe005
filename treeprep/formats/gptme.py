"""``gptme``: gptme conversation logs (``~/.local/share/gptme/logs/<id>/conversation.jsonl``).

Learnt from gptme/gptme (``gptme/message.py``, ``gptme/logmanager/manager.py``,
``gptme/llm/llm_openai.py``, ``gptme/llm/utils.py``, ``gptme/tools/base.py``). A conversation
folder holds ``conversation.jsonl``, one ``Message.to_dict()`` per line (``role`` of
``system``/``user``/``assistant``, ``content`` a string, ``timestamp``, and when set ``files``,
``file_hashes``, ``pinned``, ``hide``, ``ephemeral_ttl``, ``call_id``, ``metadata`` with
``model``, ``usage``, ``prompt_generation``), and one ``branches/<name>.jsonl`` per branch (a
whole copy of the branch's log; its calls before the fork are the main log's, so the trie
shares them and the build's dedup leaves the copies out).

Calls. Every assistant message is one call; its prompt is what gptme's ``prepare_messages`` and
the OpenAI provider send for the messages before it:

* prompt generations: when messages carry ``metadata.prompt_generation``, only the newest
  generation's system messages are sent (first), then the rest without the older generations
  and the unmarked pinned system prefix;
* ephemeral messages: a message with ``ephemeral_ttl = N`` is dropped once more than N
  assistant messages follow it (pinned messages never are), and then adjacent messages of one
  role without ``call_id`` are merged, joined by a blank line (gptme's ``concat``), so the
  several system messages of gptme's startup prompt are one system message;
* tool calls (the ``tool`` tool format): an assistant line ``@name(call_id): {json}`` is a tool
  call (not inside a fenced code block); the text before each call is the content, text after
  the last one is left out as gptme leaves it out; a ``system`` message with a ``call_id`` is
  the ``tool`` result, and other messages met between the calls and their results are moved
  after them (``_handle_tools``).
  Markdown and XML tool uses (````shell`` blocks) stay text, as gptme sends them;
* reasoning: gptme logs a reasoning model's output as a ``<think>...</think>`` block opening
  the content, and sends it back so; it stays in the content, where the renderer reads a
  completion's block as its reasoning (:func:`treeprep.render.messages.split_inline_think`)
  and hands an earlier reply to the template as sent.

Branch hints. The first call whose prompt has lost an ephemeral message that the call before
it was sent is hinted ``elided-history`` (gptme dropped it: its tokens leave the earlier call's
prefix there). A branch is gptme's copy of the log from the point the user branched and went on
differently (``LogManager.branch``): the first call of a branch file at or after a line where
it leaves one of the conversation's other logs (``conversation.jsonl``, the other branches) is
hinted ``retry``. The main log is the trunk and gets no such hint: its branch files sort
before it in a build, and the trie keeps the unhinted log the main continuation
(:mod:`treeprep.trie`).

What is not rebuilt (the provenance says reconstructed): gptme's context reduction near the
model's limit (``reduce_log``/``limit_log`` truncate long outputs), attached ``files`` (gptme
embeds text files when sending; their contents are not in the log), and the tool schemas sent
in the ``tool`` format (``--tools`` gives them). A message's ``metadata.model`` is the call's
model.

A line that is not JSON is one reject and is left out of the prompts after it, as gptme skips it
when it loads the log; a line that is not a gptme message (an unknown role, a content that is
not a string) is one reject and the calls after it are rejected with it, their prompts would
miss it. Group: the conversation folder's name, shared by its branches. Detected by the file
name (``conversation.jsonl`` or ``branches/*.jsonl``) and a first record that is a gptme
system message (``role``, a string ``content``, a ``timestamp``, no other keys than gptme's):
gptme writes its startup prompt first, other chat loggers' ``conversation.jsonl`` need not.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import chat_tool_call, expect, make_call, type_name
from treeprep.formats._read import head_json_objects, records
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io import reads
from treeprep.schemas import Reject

NAME = "gptme"
_FIELDS = frozenset(
    {"role", "content", "timestamp", "files", "file_hashes", "call_id", "pinned", "hide",
     "quiet", "ephemeral_ttl", "metadata"}
)  # fmt: skip
_ROLES = ("system", "user", "assistant")
_MAIN = "conversation.jsonl"  # the main log's name (compressed: a suffix after it)
#: gptme's ``toolcall_re``: ``@name(call_id): {`` at the start of a line
_TOOLCALL = re.compile(r"^@([\w.]+)\(([\w\-:\.]+)\):\s*(?={)", re.MULTILINE)


def _is_message(rec: Any) -> bool:
    return (
        isinstance(rec, dict)
        and rec.get("role") in _ROLES
        and isinstance(rec.get("content"), str)
        and isinstance(rec.get("timestamp"), str)
        and set(rec) <= _FIELDS
    )


def sniff(path: str, head: bytes) -> bool:
    name = os.path.basename(path)
    folder = os.path.basename(os.path.dirname(path))
    if not (name.startswith(_MAIN) or (folder == "branches" and ".jsonl" in name)):
        return False
    recs = head_json_objects(head)  # gptme writes its startup prompt first
    return bool(recs) and _is_message(recs[0]) and recs[0]["role"] == "system"


# --------------------------------------------------------------------------------------------
# one line -> a checked message
# --------------------------------------------------------------------------------------------


def _message(rec: dict[str, Any]) -> dict[str, Any]:
    """The line as a gptme message (the fields gptme reads), or RecordError naming the field."""
    role = rec.get("role")
    if role not in _ROLES:
        raise RecordError(f"role: expected 'system', 'user' or 'assistant', got {role!r}")
    expect(rec.get("content"), "content", str)
    ttl = rec.get("ephemeral_ttl")
    if ttl is not None:
        expect(ttl, "ephemeral_ttl", int)
    call_id = rec.get("call_id")
    if call_id is not None:
        expect(call_id, "call_id", str)
    meta = rec.get("metadata")
    if meta is not None:
        expect(meta, "metadata", dict)
    return rec


def _meta(m: dict[str, Any], key: str) -> Any:
    meta = m.get("metadata")
    return meta.get(key) if isinstance(meta, dict) else None


# --------------------------------------------------------------------------------------------
# prepare_messages: prompt generations, ephemeral messages, merging
# --------------------------------------------------------------------------------------------


def _active_generation(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gptme's ``_active_prompt_generation``."""
    latest = next(
        (_meta(m, "prompt_generation") for m in reversed(msgs)
         if _meta(m, "prompt_generation") is not None),
        None,
    )  # fmt: skip
    if latest is None:
        return msgs
    legacy = 0  # the unmarked pinned system prefix: the startup prompt before generations
    for m in msgs:
        if m["role"] != "system" or not m.get("pinned") or _meta(m, "prompt_generation"):
            break
        legacy += 1
    active = [m for m in msgs if _meta(m, "prompt_generation") == latest]
    rest = [m for m in msgs[legacy:] if _meta(m, "prompt_generation") is None]
    return active + rest


def _ttl(m: dict[str, Any]) -> int | None:
    """How many assistant messages may follow ``m`` before gptme drops it (None: never)."""
    ttl = m.get("ephemeral_ttl")
    return None if m.get("pinned") or not isinstance(ttl, int) else ttl


def _prune_ephemeral(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gptme's ``prune_ephemeral_messages`` and ``_merge_consecutive_messages``."""
    after = 0
    kept: list[dict[str, Any]] = []
    for m in reversed(msgs):
        ttl = _ttl(m)
        if ttl is not None and after > ttl:
            continue
        kept.append(m)
        after += m["role"] == "assistant"
    merged: list[dict[str, Any]] = []
    for m in reversed(kept):
        prev = merged[-1] if merged else None
        if prev and prev["role"] == m["role"] and not m.get("call_id") and not prev.get("call_id"):
            merged[-1] = {**prev, "content": f"{prev['content']}\n\n{m['content']}"}
        else:
            merged.append(m)
    return merged


# --------------------------------------------------------------------------------------------
# messages -> chat (the OpenAI provider's _handle_tools)
# --------------------------------------------------------------------------------------------


_FENCE = re.compile(r"^(`{3,})", re.MULTILINE)


def _code_blocks(text: str) -> list[tuple[int, int]]:
    """Character ranges of the fenced code blocks of ``text`` (an opening fence up to the next
    bare fence of as many backticks), where gptme does not look for tool calls."""
    fences = list(_FENCE.finditer(text))
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(fences):
        opening = fences[i]
        for j in range(i + 1, len(fences)):
            f = fences[j]
            eol = text.find("\n", f.end())
            eol = len(text) if eol < 0 else eol
            if len(f.group(1)) == len(opening.group(1)) and not text[f.end() : eol].strip():
                out.append((opening.start(), eol))
                i = j
                break
        i += 1
    return out


def _json_end(s: str, start: int) -> int | None:
    """The end of the JSON value starting at ``start`` (None when it is not one)."""
    try:
        _, end = json.JSONDecoder().raw_decode(s, start)
    except (json.JSONDecodeError, RecursionError):  # not JSON, or nested too deep to parse
        return None
    return end


def assistant(content: str, where: str, *, strict: bool = True) -> dict[str, Any]:
    """An assistant message's content as chat: text and tool calls. A call whose arguments are
    not a JSON object is a RecordError when ``strict`` (the completion); otherwise it and what
    follows stay text, as gptme's parser stops there (a message of the history).

    >>> assistant('Listing.\\n@ls(c1): {"path": "."}', "line 3")["tool_calls"][0]["function"]
    {'name': 'ls', 'arguments': {'path': '.'}}
    """
    out: dict[str, Any] = {"role": "assistant"}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    pos = 0
    blocks = _code_blocks(content)
    for m in _TOOLCALL.finditer(content):
        if m.start() < pos or any(a <= m.start() < b for a, b in blocks):
            continue  # inside the previous call's JSON, or an example in a code block
        stop = _json_end(content, m.end())
        args = None if stop is None else json.loads(content[m.end() : stop])
        if stop is None or not isinstance(args, dict):
            if not strict:
                break
            what = (
                "is not JSON (or nests too deep)"
                if stop is None
                else f"has {type_name(args)} arguments"
            )
            raise RecordError(f"{where}: the tool call @{m.group(1)}({m.group(2)}) {what}")
        before = content[pos : m.start()]
        if before.strip():
            texts.append(before)
        calls.append(chat_tool_call(m.group(2), m.group(1), args))
        pos = stop
    if calls:
        out["content"] = "".join(texts) or None
        out["tool_calls"] = calls
    else:
        out["content"] = content
    return out


def _chat(
    msgs: list[dict[str, Any]], parsed: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """gptme messages as the chat messages the OpenAI provider sends. ``parsed`` holds the
    history's assistant messages already parsed, by content: each call's prompt is the whole
    history, and parsing it again per call made a session's read quadratic in its text."""
    chat = _Chat({} if parsed is None else parsed)
    for m in msgs:
        chat.add(m)
    return chat.messages()


class _Chat:
    """:func:`_chat` one message at a time (a left fold; :meth:`messages` ends it)."""

    def __init__(self, parsed: dict[str, dict[str, Any]]) -> None:
        self.parsed = parsed
        self.out: list[dict[str, Any]] = []
        self.held: list[dict[str, Any]] = []  # messages between tool calls and their results
        self.pending: set[str] = set()

    def add(self, m: dict[str, Any]) -> None:
        role, content = m["role"], m["content"]
        if role == "system" and m.get("call_id"):
            self.out.append({"role": "tool", "tool_call_id": m["call_id"], "content": content})
            self.pending.discard(m["call_id"])
            return
        if role == "assistant":
            self.out.extend(self.held)
            self.held = []
            msg = self.parsed.get(content) or self.parsed.setdefault(
                content, assistant(content, "", strict=False)
            )
            self.pending = {tc["id"] for tc in msg.get("tool_calls") or []}
            self.out.append(msg)
            return
        if self.pending:
            self.held.append({"role": role, "content": content})
        else:
            self.out.extend(self.held)
            self.held = []
            self.out.append({"role": role, "content": content})

    def copy(self) -> _Chat:
        c = _Chat(self.parsed)
        c.out, c.held, c.pending = list(self.out), list(self.held), set(self.pending)
        return c

    def messages(self) -> list[dict[str, Any]]:
        return self.out + self.held


class _Prompts:
    """``_chat(_prune_ephemeral(_active_generation(history)), parsed)`` for a history that
    grows, each call going on from the last one's state (issue 54 item 9: a session's read was
    quadratic). While no message has a prompt generation or a time to live, the first two steps
    choose and prune nothing and all three are left folds: the merge's state is its last
    message (a later one may merge into it), the chat's the messages merged before it. After
    such a message, each call computes its prompt from the whole history, as gptme does."""

    def __init__(self, parsed: dict[str, dict[str, Any]]) -> None:
        self.parsed = parsed
        self.seen = 0  # history messages folded
        self.folds = True
        self.chat = _Chat(parsed)  # the merged messages before the last
        self.last: dict[str, Any] | None = None  # the last merged message

    def of(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.folds:
            try:
                for m in history[self.seen :]:
                    ttl = m.get("ephemeral_ttl")
                    if _meta(m, "prompt_generation") is not None or isinstance(ttl, int):
                        self.folds = False
                        break
                    self._merge(m)
            except Exception:
                self.folds = False  # the whole computation raises it again, as it always did
                raise
            self.seen = len(history)
        if not self.folds:
            return _chat(_prune_ephemeral(_active_generation(history)), self.parsed)
        chat = self.chat.copy()
        if self.last is not None:
            chat.add(self.last)
        return chat.messages()

    def _merge(self, m: dict[str, Any]) -> None:
        """:func:`_prune_ephemeral`'s merge of consecutive messages, one message at a time."""
        prev = self.last
        if prev and prev["role"] == m["role"] and not m.get("call_id") and not prev.get("call_id"):
            self.last = {**prev, "content": f"{prev['content']}\n\n{m['content']}"}
            return
        if prev is not None:
            self.chat.add(prev)
        self.last = m


# --------------------------------------------------------------------------------------------
# the file -> calls
# --------------------------------------------------------------------------------------------


def _conversation(path: str) -> tuple[str, str]:
    """(the conversation id: its folder's name, the branch)."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path).split(".jsonl")[0]
    if os.path.basename(folder) == "branches":
        return os.path.basename(os.path.dirname(folder)), name
    return os.path.basename(folder), "main"


class _Expiry:
    """The ephemeral messages of a growing history that gptme still sends; :meth:`expired` names
    the first that expired since it was last asked (a walk of the live ones, not the history)."""

    def __init__(self) -> None:
        self.replies = 0  # assistant messages so far
        self.live: list[tuple[int, int, int]] = []  # (ttl, replies up to it, line) of each one

    def add(self, m: dict[str, Any], line: int) -> None:
        self.replies += m["role"] == "assistant"
        ttl = _ttl(m)
        if ttl is not None:
            self.live.append((ttl, self.replies, line))

    def expired(self) -> int | None:
        """The line of the first message that expired since the last call (None: none did)."""
        gone = [line for ttl, at, line in self.live if self.replies - at > ttl]
        self.live = [e for e in self.live if self.replies - e[1] <= e[0]]
        return min(gone, default=None)


def _logged(path: str) -> list[Any]:
    """The records of a log in order (None for a line that is not JSON)."""
    return [None if isinstance(v, Reject) else v for _, v in records(path, NAME, objects=True)]


class _Forks:
    """Where a branch file leaves the conversation's other logs (``conversation.jsonl``, the
    other branches): at its first record that differs from that log's. The records are compared
    as the branch is read; none for the main log."""

    def __init__(self, path: str, branch: str) -> None:
        self.others: list[list[Any]] = []  # the records of each log not left yet
        self.found: list[int] = []  # the lines where the branch left one, since the last call
        if branch == "main":
            return
        folder = os.path.dirname(os.path.abspath(path))
        conv = os.path.dirname(folder)
        names = [os.path.join(conv, n) for n in reads.listdir(conv) if n.startswith(_MAIN)]
        names += [os.path.join(folder, n) for n in reads.listdir(folder) if ".jsonl" in n]
        for other in names:
            if not reads.isfile(other) or os.path.samefile(other, path):
                continue
            try:
                self.others.append(_logged(other))
            except (InputError, OSError):
                continue  # that log is unreadable: its own read says why

    def see(self, i: int, rec: Any, line: int) -> None:
        """The branch's record ``i`` (None: not JSON), at ``line``."""
        if not self.others:
            return
        same = [t for t in self.others if i < len(t) and t[i] == rec]
        if len(same) < len(self.others):
            self.found.append(line)
            self.others = same

    def hint(self, gone: int | None) -> str | None:
        """The hint of the call now read. ``gone``: the line of the first message its prompt
        lost (an expired ephemeral one); a fork since the last call: where the log left another.
        The earlier of the two is where its tokens part."""
        fork = self.found[0] if self.found else None
        self.found = []
        if gone is not None and (fork is None or gone < fork):
            return "elided-history"
        return "retry" if fork is not None else None


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    conv, branch = _conversation(path)
    stem = conv if branch == "main" else f"{conv}/{branch}"
    history: list[dict[str, Any]] = []
    prompts = _Prompts({})  # the history's assistant messages parsed once, the prompt folded
    expiry = _Expiry()
    forks = _Forks(path, branch)
    broken: str | None = None  # why the prompts stop being whole
    k = 0
    for i, (line, rec) in enumerate(records(path, NAME, objects=True)):
        forks.see(i, None if isinstance(rec, Reject) else rec, line)
        if isinstance(rec, Reject):
            rec.reason += "; gptme skips it too, the prompts after it are as gptme sent them"
            yield rec
            continue
        cid = f"{stem}#{k}"
        try:
            m = _message(rec)
        except RecordError as e:
            if broken is None:
                broken = f"line {line} is not a gptme message ({e}): the prompts after it miss it"
            yield Reject(file=path, line=line, format=NAME, reason=str(e))
            continue
        if m["role"] != "assistant":
            history.append(m)
            expiry.add(m, line)
            continue
        k += 1
        hint = forks.hint(expiry.expired())
        if broken is not None:
            yield Reject(file=path, line=line, format=NAME, call_id=cid, reason=broken)
        else:
            try:
                yield _call(path, line, m, history, opts, conv, stem, k, prompts, hint=hint)
            except RecordError as e:
                yield Reject(file=path, line=line, format=NAME, call_id=cid, reason=str(e))
        history.append(m)
        expiry.add(m, line)


def _call(
    path: str,
    line: int,
    m: dict[str, Any],
    history: list[dict[str, Any]],
    opts: ReadOptions,
    conv: str,
    stem: str,
    k: int,
    prompts: _Prompts,
    *,
    hint: str | None,
) -> Item:
    prompt = prompts.of(history)
    if opts.system_prompt and not (prompt and prompt[0]["role"] == "system"):
        prompt.insert(0, {"role": "system", "content": opts.system_prompt})
    model = _meta(m, "model")
    stamp = m.get("timestamp")
    fields = {
        "group_id": conv, "call_id": f"{stem}#{k - 1}",
        "parent_call_id": f"{stem}#{k - 2}" if k > 1 else None,
        "model": model if isinstance(model, str) else None,
        "messages": prompt, "completion": assistant(m["content"], f"line {line}"),
        "tools": opts.tools, "timestamp": stamp if isinstance(stamp, str) else None,
        "branch_reason": hint,
        "provenance": {"exact_messages": False, "reconstructed": True},
        "source_file": path, "source_line": line, "source_format": NAME,
    }  # fmt: skip
    return make_call(fields, file=path, line=line, fmt=NAME)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=27)
__all__ = ["FORMAT", "NAME", "assistant"]
