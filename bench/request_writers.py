"""bench/request_writers: generated sessions of the formats whose logs hold every request whole
(Qwen Code's ``--openai-logging`` files, Gemini CLI's telemetry file), for
``bench/session_scaling.py``: the log grows with the square of the session's turns."""

from __future__ import annotations

import json
from pathlib import Path

from session_turns import turns as _turns


def write_qwen_code(folder: Path, n: int) -> Path:
    """Qwen Code's ``--openai-logging`` folder (``sample_data/qwen_code``): one file per call,
    each holding the whole request sent (so the folder grows with the square of the turns, as
    Aider's log does) and the response; reasoning sent back, a user message every tenth turn."""
    path = folder / "logs" / "openai"
    path.mkdir(parents=True)
    msgs: list[dict] = [{"role": "system", "content": "You are Qwen Code."}]
    turns = _turns(n, 11)
    for i, (user, said, cmd, out) in enumerate([*turns, (None, "Done.", "", "")]):
        if user:
            msgs.append({"role": "user", "content": [{"type": "text", "text": user}]})
        fn = {"name": "run_shell_command", "arguments": json.dumps({"command": cmd})}
        call = {"id": f"call_{i}", "type": "function", "function": fn}
        reply = {"role": "assistant", "content": said, "reasoning_content": said[:20]}
        if i < n:
            reply["tool_calls"] = [call]
        doc = {
            "timestamp": f"2026-11-20T09:00:{i % 60:02d}.000Z",
            "request": {"model": "m", "messages": msgs, "stream": True},
            "response": {"id": f"r{i}", "object": "chat.completion",
                         "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]},
            "error": None,
            "context": {"promptId": f"s1########{i // 10}", "sessionId": "s1"},
            "system": {"hostname": "h", "platform": "linux", "release": "6", "nodeVersion": "v22"},
        }  # fmt: skip
        name = f"openai-2026-11-20T09-{i // 60:02d}-{i % 60:02d}.000Z-{i:08x}.json"
        (path / name).write_text(json.dumps(doc))
        msgs = [*msgs, reply, {"role": "tool", "tool_call_id": f"call_{i}",
                               "content": [{"type": "text", "text": out}]}]  # fmt: skip
    return path


def write_gemini_telemetry(folder: Path, n: int) -> Path:
    """Gemini CLI's telemetry file (``sample_data/gemini_cli_telemetry``): per call an
    ``llm_call`` span, the request's whole ``contents`` and the streamed response (a thought, the
    text and a call); the file grows with the square of the turns."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "telemetry.log"
    spans: list[dict] = []
    logs: list[dict] = []
    contents: list[dict] = []
    system = json.dumps("You are Gemini CLI.")
    tools = json.dumps([{"functionDeclarations": [{"name": "run_shell_command"}]}])

    def log(event: str, k: int, attrs: dict, span: str | None) -> None:
        rec: dict = {"hrTime": [1796637600 + k, 0]}
        if span:
            rec["spanContext"] = {"spanId": span}
        base = {"session.id": "s1", "event.name": event, "prompt_id": "s1########1", "role": "main"}
        logs.append({**rec, "attributes": {**base, **attrs}})

    for i, (user, said, cmd, out) in enumerate(_turns(n, 12)):
        if user:
            contents.append({"role": "user", "parts": [{"text": user}]})
        sid = f"{i:016x}"
        spans.append({"_spanContext": {"spanId": sid}, "name": "llm_call", "attributes": {
            "gen_ai.system_instructions": system, "gen_ai.tool.definitions": tools}})  # fmt: skip
        log("gemini_cli.api_request", 2 * i, {"request_text": json.dumps(contents)}, sid)
        fc = {"name": "run_shell_command", "args": {"command": cmd}, "id": f"c{i}"}
        parts = [{"text": said[:20], "thought": True}, {"text": said}, {"functionCall": fc}]
        chunk = {"candidates": [{"content": {"role": "model", "parts": parts},
                                 "finishReason": "STOP"}]}  # fmt: skip
        log("gemini_cli.api_response", 2 * i + 1, {"response_text": json.dumps([chunk])}, None)
        contents = [*contents, {"role": "model", "parts": parts[1:]},
                    {"role": "user", "parts": [{"functionResponse": {
                        "name": "run_shell_command", "id": f"c{i}",
                        "response": {"output": out}}}]}]  # fmt: skip
    path.write_text("".join(json.dumps(o, indent=2) + "\n" for o in [*spans, *logs]))
    return path
