"""bench/session_scaling: how a build's CPU grows with a session's length, per format.

A session of N turns renders N calls, and each call's prompt is the whole history before it: the
linear text is O(N^2), but the unique text (what the trie keeps) is O(N). The README says a
build grows with the unique text; this bench checks it. For each format it generates one session
of N turns and one of 4N (from the shapes of the samples in ``sample_data/``), builds each in
this process with the built-in tokenizer, and prints the CPU seconds of both and their ratio: a
build linear in the unique text gives about 4x, one quadratic in it about 16x.

The formats are the ones whose sessions a user found to grow quadratically: Pi (a JSONL session
tree), Cline (one ``api_conversation_history.json``), gptme (``conversation.jsonl``) and a chat
dataset row (one OpenAI fine-tuning row holding every turn), and Claude Code (a JSONL session, one
line per content block, each call's prompt replayed from its ``parentUuid`` thread); then Codex (a
rollout of Responses API items), Gemini CLI (one session document), OpenCode (an export),
OpenHands (a V1 event stream) and Goose (its SQLite store); then the two never measured before,
Cursor (an agent transcript) and Aider (its LLM history, which logs every request whole, so that
the log itself grows with the square of the turns); then Crush (its SQLite store) and Harbor's
ATIF (one trajectory document); then two whose prompts leave the one before after the history:
Aider with a file in the chat (``aider-files``: Aider sends the files after the history) and
SWE-agent (``swe-agent``: the ``last_n_observations`` history processor elides an old output in
each call); and Roo Code (``roo-code``: the Cline task condensed after its second turn, so that
every later call is prompted with Roo Code's view of the history). A turn is an assistant
message with one tool call and its result; every tenth turn
opens with a user message. Cursor logs no tool results (a transcript with a tool call is
refused), so its turns are a user and an assistant line, built with a system prompt and tools
given; Aider's are a request and its reply (the writers: ``bench/session_writers.py``).
``--tokenizer`` builds with a real tokenizer and its template (gpt-oss's has no native port: the
jinja template renders, see :mod:`treeprep.render.incremental`), ``--reasoning-merge fold`` as
gpt-oss's template needs for a turn of text beside tool calls; ``--server`` as the build's
(``vllm``, the default, renders gpt-oss with Harmony: :mod:`treeprep.render.harmony`;
``llama.cpp`` with its template).

The sizes are interleaved over ``--rounds`` rounds (N, 4N, N, 4N, ...; the project's rule:
ratios measured side by side, so that load drift hits both alike), and the minimum CPU time of
each is kept. ``--profile FORMAT`` instead runs cProfile on one 4N build of that format and
prints the top functions by cumulative and by own time.

    python bench/session_scaling.py --turns 200 --rounds 3
    python bench/session_scaling.py --turns 400 --formats pi --profile pi
    python bench/session_scaling.py --turns 400 --tokenizer ../shared/data/tokenizers/qwen3
    python bench/session_scaling.py --turns 100 --formats swe-agent,claude-code \\
        --tokenizer ../shared/data/tokenizers/gpt-oss --reasoning-merge fold --server llama.cpp
    python bench/session_scaling.py --turns 100 --formats swe-agent,claude-code \\
        --tokenizer ../shared/data/tokenizers/gpt-oss
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

from treeprep.build import BuildConfig, FileOptions, build

sys.path.insert(0, str(Path(__file__).resolve().parent))
from session_writers import WRITERS, write  # noqa: E402  (bench/session_writers.py)

__all__ = ["WRITERS", "build_cpu", "measure", "write"]


def build_cpu(
    inputs: Path, out: Path, tokenizer: str | None = None, file: FileOptions | None = None
) -> float:
    """CPU seconds of one in-process build of ``inputs`` (``tokenizer``: a tokenizer folder, None
    the built-in one; ``file``: the options), OUT fresh."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.process_time()
    file = file or FileOptions()
    manifest = build(
        BuildConfig(inputs=[str(inputs)], out=str(out), tokenizer=tokenizer, file=file)
    )
    seconds = time.process_time() - start
    if manifest.counts.records_rejected:
        raise SystemExit(f"{inputs}: {manifest.counts.records_rejected} records rejected")
    return seconds


def measure(
    work: Path,
    formats: list[str],
    turns: int,
    rounds: int,
    tokenizer: str | None = None,
    merge: str = "off",
    server: str = "vllm",
) -> None:
    sizes = (turns, 4 * turns)
    sessions = {
        (f, n): _merged(write(f, work / f"{f}-{n}", n), merge, server)
        for f in formats
        for n in sizes
    }
    best: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for f in formats:
            for n in sizes:
                path, file = sessions[f, n]
                s = build_cpu(path, work / "out", tokenizer, file)
                best[f, n] = min(best.get((f, n), s), s)
    print(f"{'format':<10} {'N':>6} {'cpu N s':>9} {'4N':>6} {'cpu 4N s':>9} {'ratio':>6}")
    for f in formats:
        a, b = best[f, sizes[0]], best[f, sizes[1]]
        print(f"{f:<10} {sizes[0]:>6} {a:>9.2f} {sizes[1]:>6} {b:>9.2f} {b / a:>6.1f}")


def _merged(
    session: tuple[Path, FileOptions], merge: str, server: str = "vllm"
) -> tuple[Path, FileOptions]:
    """``session`` built with ``--reasoning-merge merge`` (gpt-oss's template refuses a turn of
    text and tool calls unless folded) and ``--server server`` (vllm renders gpt-oss with
    Harmony, llama.cpp with its template)."""
    path, file = session
    return path, dataclasses.replace(file, reasoning_merge=merge, server=server)


def profile(
    work: Path,
    fmt: str,
    turns: int,
    tokenizer: str | None = None,
    merge: str = "off",
    server: str = "vllm",
) -> None:
    path, file = _merged(write(fmt, work / fmt, turns), merge, server)
    profiler = cProfile.Profile()
    profiler.runcall(build_cpu, path, work / "out", tokenizer, file)
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=200, help="N: the short session's turns")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (minimum kept)")
    p.add_argument("--formats", default=",".join(WRITERS), help="comma-separated formats")
    p.add_argument("--profile", choices=sorted(WRITERS), help="profile one build of N turns")
    p.add_argument("--tokenizer", help="a tokenizer folder (default: the built-in tokenizer)")
    p.add_argument(
        "--reasoning-merge", default="off", choices=["off", "drop", "fold"],
        help="build with --reasoning-merge (fold: gpt-oss trains text beside tool calls)",
    )  # fmt: skip
    p.add_argument(
        "--server", default="vllm", choices=["vllm", "sglang", "llama.cpp"],
        help="build with --server (vllm renders gpt-oss with Harmony, llama.cpp with its template)",
    )  # fmt: skip
    args = p.parse_args()
    merge, server = args.reasoning_merge, args.server
    with tempfile.TemporaryDirectory(prefix="session-scaling-") as tmp:
        if args.profile:
            profile(Path(tmp), args.profile, args.turns, args.tokenizer, merge, server)
        else:
            fmts = args.formats.split(",")
            measure(Path(tmp), fmts, args.turns, args.rounds, args.tokenizer, merge, server)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
