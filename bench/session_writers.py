"""bench/session_writers: the generated sessions of ``bench/session_scaling.py``, one writer per
format, shaped after the samples in ``sample_data/``.

Each writer makes a session of N turns in a folder and returns what to build: a turn is an
assistant message with one tool call and its result, every tenth turn opens with a user message
(:func:`_turns`). :data:`OPTIONS` gives the build options a format's session needs (Cursor's system
prompt and tools, SWE-agent's record limit); :func:`write` returns both.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

from request_writers import write_gemini_telemetry, write_qwen_code
from session_turns import turns as _turns

from treeprep.build import FileOptions


def write_pi(folder: Path, n: int) -> Path:
    """A Pi session (``sample_data/pi``): a header, then one message per line."""
    path = folder / "--home-dev-app--" / "2025-10-20T14-00-00-000Z_session.jsonl"
    path.parent.mkdir(parents=True)
    lines: list[dict] = [
        {"type": "session", "id": "s1", "timestamp": "2025-10-20T14:00:00.000Z", "cwd": "/app"}
    ]
    stamp = 1760968920000

    def msg(message: dict) -> dict:
        nonlocal stamp
        stamp += 1000
        return {"type": "message", "timestamp": "2025-10-20T14:00:00.000Z", "message": message}

    model = {"api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5"}
    for i, (user, said, cmd, out) in enumerate(_turns(n, 1)):
        if user is not None:
            lines.append(msg({"role": "user", "content": [{"type": "text", "text": user}]}))
        call = {"type": "toolCall", "id": f"t{i}", "name": "bash", "arguments": {"command": cmd}}
        content = [{"type": "text", "text": said}, call]
        said_msg = {"role": "assistant", "content": content, **model, "stopReason": "toolUse"}
        lines.append(msg(said_msg))
        result = [{"type": "text", "text": out}]
        ran = {"role": "toolResult", "toolCallId": f"t{i}", "toolName": "bash", "content": result}
        lines.append(msg(ran))
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_cline(folder: Path, n: int) -> Path:
    """A Cline task (``sample_data/cline``): the whole conversation as one JSON list."""
    path = folder / "tasks" / "1762340400000" / "api_conversation_history.json"
    path.parent.mkdir(parents=True)
    messages: list[dict] = []
    info = {"modelId": "claude-sonnet-4-5", "providerId": "anthropic", "mode": "act"}
    for i, (user, said, cmd, out) in enumerate(_turns(n, 2)):
        results: list[dict] = [{"type": "text", "text": f"<task>\n{user}\n</task>"}] if user else []
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].extend(results)
        elif results:
            messages.append({"role": "user", "content": results})
        call = {"type": "tool_use", "id": f"t{i}", "name": "execute_command"}
        call["input"] = {"command": cmd}
        content = [{"type": "text", "text": said}, call]
        messages.append({"role": "assistant", "id": f"m{i}", "content": content, "modelInfo": info})
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": out}
        messages.append({"role": "user", "content": [result]})
    done = [{"type": "text", "text": "Done."}]
    messages.append({"role": "assistant", "id": "end", "content": done})
    path.write_text(json.dumps(messages))
    return path


def write_gptme(folder: Path, n: int) -> Path:
    """A gptme conversation (``sample_data/gptme``): one message per line, tools as ``@tool``."""
    path = folder / "2025-11-06-long-session" / "conversation.jsonl"
    path.parent.mkdir(parents=True)
    ts = "2025-11-06T10:00:00.000001"
    lines: list[dict] = [{"role": "system", "content": "You are gptme.", "timestamp": ts}]
    meta = {"model": "openrouter/qwen/qwen3-coder"}
    for i, (user, said, cmd, out) in enumerate(_turns(n, 3)):
        if user is not None:
            lines.append({"role": "user", "content": user, "timestamp": ts})
        said = f"{said}\n@shell(c{i}): {json.dumps({'command': cmd})}"
        lines.append({"role": "assistant", "content": said, "timestamp": ts, "metadata": meta})
        ran = f"Ran command\n```stdout\n{out}\n```"
        lines.append({"role": "system", "content": ran, "timestamp": ts, "call_id": f"c{i}"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_gptme_think(folder: Path, n: int) -> Path:
    """:func:`write_gptme` with every reply opening with an inline ``<think>`` block and one
    newline after it, as the gptme sample's replies do: the completion trains as written where
    the template prints it so, else made reasoning."""
    path = write_gptme(folder, n)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for i, line in enumerate(lines):
        if line["role"] == "assistant":
            line["content"] = f"<think>\nStep {i}: look before acting.\n</think>\n{line['content']}"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_chat_row(folder: Path, n: int, request: dict | None = None) -> Path:
    """One OpenAI fine-tuning row (``sample_data/conversations/openai_finetune.jsonl``), with the
    request's fields ``request`` (its ``chat_template_kwargs``, ``reasoning_effort``)."""
    path = folder / "rows.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for i, (user, said, cmd, out) in enumerate(_turns(n, 4)):
        if user is not None:
            messages.append({"role": "user", "content": user})
        args = json.dumps({"command": cmd})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
        messages.append({"role": "assistant", "content": said, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": out})
    messages.append({"role": "assistant", "content": "Done."})
    row = {"messages": messages, **(request or {})}
    path.write_text(json.dumps(row) + "\n")
    return path


def write_claude_code(folder: Path, n: int) -> Path:
    """A Claude Code session (``sample_data/claude-code``): one line per content block, each
    line's ``parentUuid`` the line before, tool results in user lines."""
    sid = "7e1d2c3b-0a9f-4e8d-b7c6-000000000000"
    path = folder / "-home-dev-app" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True)
    lines: list[dict] = []
    head = {"isSidechain": False, "userType": "external", "cwd": "/app", "sessionId": sid}
    head["version"] = "2.1.39"

    def line(kind: str, message: dict) -> None:
        uuid = f"00000000-0000-4000-8000-{len(lines):012d}"
        parent = lines[-1]["uuid"] if lines else None
        stamp = f"2026-01-05T10:{len(lines) // 60 % 60:02d}:{len(lines) % 60:02d}.000Z"
        lines.append({"parentUuid": parent, **head, "type": kind, "message": message,
                      "uuid": uuid, "timestamp": stamp})  # fmt: skip

    for i, (user, said, cmd, out) in enumerate(_turns(n, 5)):
        if user is not None:
            line("user", {"role": "user", "content": user})
        reply = {"model": "claude-opus-4-6", "id": f"msg_{i}", "type": "message"}
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": cmd}}
        for block in ({"type": "text", "text": said}, call):
            line("assistant", {**reply, "role": "assistant", "content": [block]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": out}
        line("user", {"role": "user", "content": [result]})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def write_codex(folder: Path, n: int) -> Path:
    """A Codex rollout (``sample_data/codex``): a session_meta line, then one Responses API item
    per line (``function_call`` and its ``function_call_output``)."""
    sid = "5f0c1a2e-7b3d-4e21-9a55-000000000000"
    path = folder / "2025" / "11" / "02" / f"rollout-2025-11-02T09-15-00-{sid}.jsonl"
    path.parent.mkdir(parents=True)
    stamp = "2025-11-02T09:15:00.000Z"
    meta = {"id": sid, "timestamp": stamp, "cwd": "/app", "originator": "codex_cli_rs",
            "cli_version": "0.53.0", "base_instructions": {"text": "You are Codex."}}  # fmt: skip
    lines: list[dict] = [
        {"timestamp": stamp, "type": "session_meta", "payload": meta},
        {"timestamp": stamp, "type": "turn_context", "payload": {"model": "gpt-5-codex"}},
    ]

    def item(payload: dict) -> None:
        lines.append({"timestamp": stamp, "type": "response_item", "payload": payload})

    for i, (user, said, cmd, out) in enumerate(_turns(n, 6)):
        if user is not None:
            item({"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": user}]})  # fmt: skip
        item({"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": said}]})  # fmt: skip
        args = json.dumps({"command": ["bash", "-lc", cmd]})
        item({"type": "function_call", "name": "shell", "arguments": args, "call_id": f"c{i}"})
        item({"type": "function_call_output", "call_id": f"c{i}", "output": out})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def write_gemini_cli(folder: Path, n: int) -> Path:
    """A Gemini CLI session (``sample_data/gemini_cli``, the one-document form): user and gemini
    messages, each gemini message's tool calls with their recorded results."""
    path = folder / "session-2025-07-02T08-00-7b21e0c4.json"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = "2025-07-02T08:00:01.500Z"
    messages: list[dict] = []
    for i, (user, said, cmd, out) in enumerate(_turns(n, 7)):
        if user is not None or not messages:
            messages.append({"id": f"u{i}", "timestamp": stamp, "type": "user",
                             "content": user or "start"})  # fmt: skip
        result = [{"functionResponse": {"id": f"c{i}", "name": "run_shell_command",
                                        "response": {"output": out}}}]  # fmt: skip
        call = {"id": f"c{i}", "name": "run_shell_command", "args": {"command": cmd},
                "status": "success", "timestamp": stamp, "result": result}  # fmt: skip
        reply = {"id": f"g{i}", "timestamp": stamp, "type": "gemini", "content": said}
        messages.append({**reply, "thoughts": [], "model": "gemini-2.5-pro", "toolCalls": [call]})
    doc = {"sessionId": "7b21e0c4-0f3a-4d6e-8c59-000000000000", "projectHash": "9e1b",
           "startTime": stamp, "lastUpdated": stamp, "messages": messages}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def write_opencode(folder: Path, n: int) -> Path:
    """An OpenCode export (``sample_data/opencode/export-*.json``): a user message opens each
    user turn, and the assistant message after it holds one step (start, text, tool, finish)
    per turn until the next user turn."""
    sid = "ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD"
    path = folder / f"export-{sid}.json"
    folder.mkdir(parents=True, exist_ok=True)
    messages: list[dict] = []
    model = {"modelID": "claude-sonnet-4-5", "providerID": "anthropic"}

    def part(mid: str, kind: str, **fields: object) -> dict:
        return {"id": f"prt_{mid}_{kind}_{len(messages)}", "sessionID": sid, "messageID": mid,
                "type": kind, **fields}  # fmt: skip

    for i, (user, said, cmd, out) in enumerate(_turns(n, 8)):
        if user is not None or not messages:
            uid, aid = f"msg_u{i:05d}", f"msg_a{i:05d}"
            text = part(uid, "text", text=user or "start")
            messages.append({"info": {"id": uid, "sessionID": sid, "role": "user"},
                             "parts": [text]})  # fmt: skip
            info = {"id": aid, "sessionID": sid, "role": "assistant", "parentID": uid, **model,
                    "finish": "tool-calls"}  # fmt: skip
            messages.append({"info": info, "parts": []})
        parts = messages[-1]["parts"]
        state = {"status": "completed", "input": {"command": cmd}, "output": out}
        parts += [part(aid, "step-start"), part(aid, "text", text=said),
                  part(aid, "tool", callID=f"c{i}", tool="bash", state=state),
                  part(aid, "step-finish", reason="tool-calls")]  # fmt: skip
    info = {"id": sid, "version": "1.0.24", "directory": "/app", "title": "long session"}
    path.write_text(json.dumps({"info": info, "messages": messages}))
    return path


def write_openhands_events(folder: Path, n: int) -> Path:
    """An OpenHands V1 event stream (``sample_data/openhands/events.jsonl``): the system prompt
    event, user MessageEvents, one ActionEvent per turn (its thought, one terminal call) and its
    ObservationEvent."""
    path = folder / "events.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = "2025-10-03T14:21:01.000"
    params = {"type": "object", "properties": {"command": {"type": "string"}}}
    fn = {"name": "terminal", "description": "Run bash.", "parameters": params}
    tool = {"type": "function", "function": fn}
    events: list[dict] = [{"id": "e-sys", "timestamp": stamp, "source": "agent", "tools": [tool],
                           "system_prompt": {"type": "text", "text": "You are OpenHands."},
                           "kind": "SystemPromptEvent"}]  # fmt: skip
    for i, (user, said, cmd, out) in enumerate(_turns(n, 9)):
        if user is not None:
            msg = {"role": "user", "content": [{"type": "text", "text": user}]}
            events.append({"id": f"e-u{i}", "timestamp": stamp, "source": "user",
                           "llm_message": msg, "kind": "MessageEvent"})  # fmt: skip
        call = {"id": f"t{i}", "name": "terminal", "arguments": json.dumps({"command": cmd}),
                "origin": "completion"}  # fmt: skip
        events.append({"id": f"e-a{i}", "timestamp": stamp, "source": "agent",
                       "thought": [{"type": "text", "text": said}],
                       "action": {"kind": "TerminalAction", "command": cmd},
                       "tool_name": "terminal", "tool_call_id": f"t{i}", "tool_call": call,
                       "llm_response_id": f"resp-{i}", "kind": "ActionEvent"})  # fmt: skip
        seen = {"content": [{"type": "text", "text": out}], "is_error": False,
                "kind": "TerminalObservation"}  # fmt: skip
        events.append({"id": f"e-o{i}", "timestamp": stamp, "source": "environment",
                       "tool_name": "terminal", "tool_call_id": f"t{i}", "observation": seen,
                       "action_id": f"e-a{i}", "kind": "ObservationEvent"})  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def write_cursor(folder: Path, n: int) -> Path:
    """A Cursor agent transcript (``sample_data/cursor``): one line per message, the user's words
    in ``<user_query>`` tags. Cursor logs no tool results, so a transcript with a tool call is
    refused: a turn here is a user line (the user's words, or the tool output pasted in) and an
    assistant line, built with a system prompt and tools given (:data:`OPTIONS`)."""
    sid = "b7a2e915-4d8c-4c1b-a3f6-000000000000"
    path = folder / "agent-transcripts" / sid / f"{sid}.jsonl"
    path.parent.mkdir(parents=True)
    lines: list[dict] = []
    for user, said, cmd, out in _turns(n, 11):
        query = f"<user_query>\n{user or out}\n</user_query>"
        lines.append({"role": "user", "message": {"content": [{"type": "text", "text": query}]}})
        reply = [{"type": "text", "text": f"{said}\n\n    {cmd}"}]
        lines.append({"role": "assistant", "message": {"content": reply}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "options").mkdir()
    (folder / "options" / "system-prompt.txt").write_text("You are a coding assistant in Cursor.")
    params = {"type": "object", "properties": {"command": {"type": "string"}}}
    fn = {"name": "Shell", "description": "Run a shell command.", "parameters": params}
    tools = [{"type": "function", "function": fn}]
    (folder / "options" / "tools.json").write_text(json.dumps(tools))
    return path


def write_aider(folder: Path, n: int, files: bool = False) -> Path:
    """Aider's LLM history (``sample_data/aider/.aider.llm.history``): per turn a ``TO LLM``
    request logging the whole message list sent (the system prompt, a cache-marked repo map, the
    history, then the user's words or Aider's "I ran this command" with its output) and the ``LLM
    RESPONSE`` after it (text and a SEARCH/REPLACE edit); the log grows with the square of the
    turns. Each request begins with the one before, as the other formats' calls do: files added
    to the chat, which Aider sends after the history, would make each prompt leave the one
    before, and make_call and the renderer share a history only with a prompt that begins the
    next. The chat history (``.aider.chat.history.md``) is not written: it is refused as a
    whole, one reject however long.

    ``files``: a file is in the chat, as in most real sessions: every request sends it (as it is
    after the last edit) and Aider's acknowledgement after the history and before the user's
    words, so that each prompt leaves the one before after the history (``aider-files``)."""
    path = folder / ".aider.llm.history"
    folder.mkdir(parents=True, exist_ok=True)
    history = (
        "-------\nSYSTEM Act as an expert software developer.\nSYSTEM \nSYSTEM Always use best "
        "practices.\n-------\nUSER type: text\nUSER text: Here are summaries of some files "
        "present in my git repository:\ncli.py:\n  def main(): ...\n\n"
        "USER cache_control: {'type': 'ephemeral'}\n"
    )
    with path.open("w") as f:
        for i, (user, said, cmd, out) in enumerate(_turns(n, 12)):
            ask = user or f"I ran this command:\n\n{cmd}\n\nAnd got this output:\n\n{out}"
            asked = "-------\n" + "".join(f"USER {x}\n" for x in ask.split("\n"))
            edit = [said, "", f"file_{i}.py", "```python", "<<<<<<< SEARCH", f"    run({i})",
                    "=======", f"    run({i + 1})", ">>>>>>> REPLACE", "```"]  # fmt: skip
            reply = "".join(f"ASSISTANT {x}\n" for x in edit)
            stamp = f"2025-03-01T10:{i // 60 % 60:02d}:{i % 60:02d}"
            chat = _aider_files(i) if files else ""
            f.write(f"TO LLM {stamp}\n{history}{chat}{asked}LLM RESPONSE {stamp}\n{reply}")
            history += asked + "-------\n" + reply
    return path


def _aider_files(i: int) -> str:
    """The messages with which Aider sends the chat's files (a 40-line ``app.py`` after ``i``
    edits) and its acknowledgement."""
    body = [f"def step_{j}():\n    return run({i if j == i % 40 else j})" for j in range(20)]
    added = "I have *added these files to the chat* so you can go ahead and edit them.\n\napp.py"
    text = f"{added}\n```\n" + "\n".join(body) + "\n```"
    user = "".join(f"USER {x}\n" for x in text.split("\n"))
    return f"-------\n{user}-------\nASSISTANT Ok, any changes I propose will be to those files.\n"


def write_swe_agent(folder: Path, n: int) -> Path:
    """A SWE-agent trajectory (``sample_data/swe_agent_slugify.traj``) in SWE-agent 1.x's form:
    per step the processed history after it, with the ``last_n_observations: 5`` history
    processor that SWE-agent's default configs use: every output but the last five reads "Old
    environment output: (N lines omitted)". So each prompt leaves the one before at the output
    that was elided last; the file holds every step's history, and grows with the square of the
    turns."""
    path = folder / "run.traj"
    folder.mkdir(parents=True, exist_ok=True)
    history: list[dict] = [
        {"role": "system", "content": "You are an autonomous programmer working in a shell."},
        {"role": "user", "content": "Fix the bug in text.py."},
    ]
    outputs: list[int] = []  # the index in history of each tool output
    steps: list[dict] = []
    for i, (user, said, cmd, out) in enumerate(_turns(n, 13)):
        if user is not None and i:
            history.append({"role": "user", "content": user})
        args = json.dumps({"command": cmd})
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "bash", "arguments": args}}  # fmt: skip
        history.append({"role": "assistant", "content": said, "thought": said, "action": cmd,
                        "tool_calls": [call]})  # fmt: skip
        history.append({"role": "tool", "content": out, "tool_call_ids": [f"call_{i}"]})
        outputs.append(len(history) - 1)
        if len(outputs) > 5:
            old = history[outputs[-6]]
            lines = old["content"].count("\n") + 1
            history[outputs[-6]] = {
                **old,
                "content": f"Old environment output: ({lines} lines omitted)",
            }
        steps.append({"action": cmd, "observation": out, "response": said, "thought": said,
                      "messages": [dict(m) for m in history]})  # fmt: skip
    doc = {"trajectory": steps, "history": history, "info": {"exit_status": "submitted"}}
    path.write_text(json.dumps(doc))
    return path


def _store(
    path: Path, sessions: str, messages: str, session: str, insert: str, rows: list[tuple]
) -> Path:
    """An SQLite store at ``path``: its ``sessions`` and ``messages`` tables, one session row,
    and the message ``rows`` inserted by ``insert`` (Goose's and Crush's stores)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    for statement in (sessions, messages, session):
        db.execute(statement)
    db.executemany(insert, rows)
    db.commit()
    db.close()
    return path


def write_goose(folder: Path, n: int) -> Path:
    """A Goose session store (``sample_data/goose/sessions.db``): one session's messages, each
    row's ``content_json`` a list of content items (text, toolRequest, toolResponse)."""
    rows: list[tuple[str, str]] = []
    for i, (user, said, cmd, out) in enumerate(_turns(n, 10)):
        if user is not None or not rows:
            rows.append(("user", json.dumps([{"type": "text", "text": user or "start"}])))
        call = {"status": "success", "value": {"name": "shell", "arguments": {"command": cmd}}}
        request = {"type": "toolRequest", "id": f"c{i}", "toolCall": call}
        rows.append(("assistant", json.dumps([{"type": "text", "text": said}, request])))
        result = {"status": "success", "value": {"content": [{"type": "text", "text": out}]}}
        response = {"type": "toolResponse", "id": f"c{i}", "toolResult": result}
        rows.append(("user", json.dumps([response])))
    return _store(
        folder / "sessions.db",
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, working_dir TEXT NOT NULL, "
        "created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)",
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role "
        "TEXT, content_json TEXT, created_timestamp INTEGER, metadata_json TEXT)",
        "INSERT INTO sessions (id, working_dir) VALUES ('s1', '/app')",
        "INSERT INTO messages (session_id, role, content_json, created_timestamp, metadata_json) "
        "VALUES ('s1', ?, ?, ?, '{}')",
        [(role, content, k) for k, (role, content) in enumerate(rows)],
    )


def write_crush(folder: Path, n: int) -> Path:
    """A Crush store (``sample_data/crush/crush.db``): one session, one message per step, its
    ``parts`` typed (text, tool_call, finish), each step's results in a ``tool`` message."""

    def part(kind: str, **data: object) -> dict:
        return {"type": kind, "data": data}

    rows: list[tuple[str, list[dict]]] = []
    for i, (user, said, cmd, out) in enumerate(_turns(n, 12)):
        if user is not None:
            rows.append(("user", [part("text", text=user)]))
        call = part("tool_call", id=f"c{i}", name="bash", input=json.dumps({"command": cmd}))
        done = part("finish", reason="tool_use")
        rows.append(("assistant", [part("text", text=said), call, done]))
        result = part("tool_result", tool_call_id=f"c{i}", name="bash", content=out)
        rows.append(("tool", [result]))
    return _store(
        folder / "crush.db",
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, parent_session_id TEXT, "
        "summary_message_id TEXT, created_at INTEGER)",
        "CREATE TABLE messages (id TEXT PRIMARY KEY, session_id TEXT, role TEXT, parts TEXT, "
        "model TEXT, created_at INTEGER, is_summary_message INTEGER)",
        "INSERT INTO sessions (id, created_at) VALUES ('s1', 1)",
        "INSERT INTO messages VALUES (?, 's1', ?, ?, 'm', ?, 0)",
        [(f"m{k}", role, json.dumps(parts), k) for k, (role, parts) in enumerate(rows)],
    )


def write_atif(folder: Path, n: int) -> Path:
    """A Harbor ATIF trajectory (``sample_data/atif/trajectory.json``): one JSON document, a
    system step, then agent steps each with its tool call and the observation of its result."""
    steps: list[dict] = [{"step_id": 1, "source": "system", "message": "You are an agent."}]
    for i, (user, said, cmd, out) in enumerate(_turns(n, 13)):
        if user is not None:
            steps.append({"step_id": len(steps) + 1, "source": "user", "message": user})
        call = {"tool_call_id": f"c{i}", "function_name": "bash", "arguments": {"command": cmd}}
        seen = {"results": [{"source_call_id": f"c{i}", "content": out}]}
        steps.append({"step_id": len(steps) + 1, "source": "agent", "model_name": "m",
                      "message": said, "tool_calls": [call], "observation": seen})  # fmt: skip
    doc = {"schema_version": "ATIF-v1.4", "session_id": "s1",
           "agent": {"name": "terminus", "version": "1"}, "steps": steps}  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trajectory.json"
    path.write_text(json.dumps(doc))
    return path


REMINDER = "<system-reminder>\nBe brief.\n</system-reminder>"


def write_kimi_cli(folder: Path, n: int) -> Path:
    """A Kimi Code CLI context file (``sample_data/kimi_cli``): markers and messages, a reminder
    injected after each request (merged into it when sent), reasoning on every reply."""
    path = folder / "sessions" / "0f" / "s1" / "context.jsonl"
    path.parent.mkdir(parents=True)
    lines: list[dict] = [{"role": "_system_prompt", "content": "You are Kimi Code CLI."}]
    cp = 0
    for i, (user, said, cmd, out) in enumerate(_turns(n, 9)):
        if user:
            lines += [{"role": "_checkpoint", "id": cp}, {"role": "user", "content": user}]
            lines.append({"role": "user", "content": REMINDER})
            cp += 1
        fn = {"name": "Shell", "arguments": json.dumps({"command": cmd})}
        call = {"type": "function", "id": f"Shell:{i}", "function": fn}
        content = [{"type": "think", "think": said[:20], "encrypted": None},
                   {"type": "text", "text": said}]  # fmt: skip
        lines += [
            {"role": "_checkpoint", "id": cp}, {"role": "_usage", "token_count": 100 + i},
            {"role": "assistant", "content": content, "tool_calls": [call]},
            {"role": "tool", "content": out, "tool_call_id": f"Shell:{i}"},
        ]  # fmt: skip
        cp += 1
    lines.append({"role": "assistant", "content": "Done."})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def write_copilot_cli(folder: Path, n: int) -> Path:
    """A GitHub Copilot CLI session (``sample_data/copilot_cli``): events, a turn's response and
    its tool's events, a user message every tenth turn."""
    path = folder / "session-state" / "s1" / "events.jsonl"
    path.parent.mkdir(parents=True)
    events: list[dict] = []

    def ev(kind: str, **data: object) -> None:
        parent = events[-1]["id"] if events else None
        stamp = "2026-10-22T09:00:00.000Z"
        events.append({"type": kind, "data": data, "id": f"e{len(events)}", "timestamp": stamp,
                       "parentId": parent})  # fmt: skip

    ev("session.start", sessionId="s1", producer="copilot-agent", selectedModel="m")
    ev("system.message", role="system", content="You are the GitHub Copilot CLI.")
    for i, (user, said, cmd, out) in enumerate(_turns(n, 10)):
        if user:
            ev("user.message", content=user, transformedContent=f"<t>{i}</t>\n\n{user}")
        call = {"toolCallId": f"c{i}", "name": "bash", "arguments": {"command": cmd}}
        ev("assistant.turn_start", turnId=str(i))
        ev("assistant.message", content=said, toolRequests=[call], reasoningText=said[:20],
           apiCallId=f"r{i}")  # fmt: skip
        ev("tool.execution_start", toolCallId=f"c{i}", toolName="bash")
        ev("tool.execution_complete", toolCallId=f"c{i}", success=True, result={"content": out})
        ev("assistant.turn_end", turnId=str(i))
    ev("assistant.message", content="Done.", toolRequests=[], apiCallId="end")
    path.write_text("".join(json.dumps(x) + "\n" for x in events))
    return path


def write_roo_code(folder: Path, n: int) -> Path:
    """A Roo Code task: the Cline task condensed after its second turn, as Roo Code 3.52 stores
    it (a ``user`` summary appended with a ``condenseId``, every earlier message given it as its
    ``condenseParent``), so that every later call is prompted with Roo Code's view of the history
    (:mod:`treeprep.formats._roo_view`)."""
    path = write_cline(folder, n)
    messages = json.loads(path.read_text())
    at = next(i for i in range(3, len(messages) - 1) if messages[i]["role"] == "user")
    for m in messages[: at + 1]:
        m["condenseParent"] = "c1"
    summary = {"type": "text", "text": "## Conversation Summary\nThe task so far."}
    messages.insert(at + 1, {"role": "user", "content": [summary], "isSummary": True,
                             "condenseId": "c1"})  # fmt: skip
    path.write_text(json.dumps(messages))
    return path


WRITERS: dict[str, Callable[[Path, int], Path]] = {
    "pi": write_pi,
    "cline": write_cline,
    "roo-code": write_roo_code,
    "gptme": write_gptme,
    "gptme-think": write_gptme_think,
    "chat-row": write_chat_row,
    # Qwen3's thinking turned off in every call, and gpt-oss's effort: a kwarg the template reads
    "chat-row-kwargs": lambda folder, n: write_chat_row(
        folder, n, {"chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "high"}}
    ),
    "claude-code": write_claude_code,
    "codex": write_codex,
    "gemini-cli": write_gemini_cli,
    "opencode": write_opencode,
    "openhands-events": write_openhands_events,
    "goose": write_goose,
    "cursor": write_cursor,
    "aider": write_aider,
    "aider-files": lambda folder, n: write_aider(folder, n, files=True),
    "swe-agent": write_swe_agent,
    "crush": write_crush,
    "atif": write_atif,
    "kimi-cli": write_kimi_cli,
    "copilot-cli": write_copilot_cli,
    "qwen-code": write_qwen_code,
    "gemini-cli-telemetry": write_gemini_telemetry,
}

#: the options a format's session is built with, from the folder its writer wrote in (Cursor's
#: transcripts hold no system prompt nor tools)
OPTIONS: dict[str, Callable[[Path], FileOptions]] = {
    "cursor": lambda folder: FileOptions(
        system_prompt=str(folder / "options" / "system-prompt.txt"),
        tools=str(folder / "options" / "tools.json"),
    ),
    # a trajectory is one JSON document holding every step's history: 400 steps make 41 MB
    "swe-agent": lambda folder: FileOptions(max_record_bytes=1 << 30),
}


def write(fmt: str, folder: Path, n: int) -> tuple[Path, FileOptions]:
    """A session of ``n`` turns of ``fmt`` written in ``folder``: what to build, and with what."""
    path = WRITERS[fmt](folder, n)
    return path, OPTIONS[fmt](folder) if fmt in OPTIONS else FileOptions()
