"""Render time of an agent session call by call with the Qwen ports: extending the last text
(``NativeTemplate.extend``) against rendering every call's whole history.

Why: call k of a session sends its whole history again. A port without ``extend`` renders that
history in Python on every call, so a session costs time quadratic in its length; with
``extend`` (:mod:`treeprep.render.native_qwen`) a call renders what it appends, plus the last
kept turn (and, in Qwen3, the turns after the old last query when a new query drops their
reasoning). The two are the same port, run side by side through
:class:`~treeprep.render.history.RenderedPrefixes`, interleaved over ``--rounds`` (minimum
kept); each call renders its prompt (generation prompt) and its full text, as the renderer does.

The session: a system message, a user query, then turns of reasoning, one tool call and a
10-line tool result, with a new user query every 100 turns.

    python bench/qwen_extend.py --turns 400,1600 --rounds 2
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from treeprep.render.history import RenderedPrefixes
from treeprep.render.native import PORTS, NativeTemplate

TOOLS = [{"type": "function", "function": {"name": "sh", "description": "run a command",
          "parameters": {"type": "object"}}}]  # fmt: skip


def session(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(turns):
        if i and i % 100 == 0:
            msgs.append({"role": "user", "content": f"Now task {i}."})
        call = {"type": "function", "function": {"name": "sh", "arguments": {"cmd": f"ls {i}"}}}
        msgs.append({"role": "assistant", "content": f"Step {i}.",
                     "reasoning_content": f"think {i} " * 20, "tool_calls": [call]})  # fmt: skip
        msgs.append({"role": "tool", "content": f"output line {i}\n" * 10})
    return msgs


def render_calls(port: NativeTemplate, msgs: list[dict[str, Any]]) -> tuple[float, int]:
    """CPU seconds to render every call of the session, and the characters rendered."""
    cache = RenderedPrefixes(port)
    chars = 0
    t = time.process_time()
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            chars += len(cache.render(msgs[:i], TOOLS, True))
            chars += len(cache.render(msgs[: i + 1], TOOLS, False))
    return time.process_time() - t, chars


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", default="400,1600", help="comma-separated session lengths")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (minimum kept)")
    p.add_argument("--ports", default="qwen3,qwen3_instruct_2507,qwen2_5")
    args = p.parse_args()
    by_name = {port.name: port for port in PORTS.values()}
    print(f"{'port':22} {'turns':>6} {'extend s':>9} {'whole s':>9} {'whole/extend':>13}")
    for name in args.ports.split(","):
        port = by_name[name]
        whole = NativeTemplate(port.name, port.render)  # the same port without extend
        for turns in map(int, args.turns.split(",")):
            msgs = session(turns)
            best = {"extend": float("inf"), "whole": float("inf")}
            for _ in range(args.rounds):
                (a, ca), (b, cb) = render_calls(port, msgs), render_calls(whole, msgs)
                assert ca == cb, "extend rendered other text than the whole render"
                best["extend"], best["whole"] = min(best["extend"], a), min(best["whole"], b)
            e, w = best["extend"], best["whole"]
            print(f"{name:22} {turns:>6} {e:>9.3f} {w:>9.3f} {w / e:>12.1f}x")


if __name__ == "__main__":
    main()
