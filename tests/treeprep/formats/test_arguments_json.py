"""How each agent wrote a tool call's arguments that its log holds as an object: read from the
agents' sources (the reader's comment names the line), kept as the call's ``arguments_json``,
and shown by Harmony's render (tests/treeprep/render/test_harmony.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeprep.errors import InputError
from treeprep.formats import ReadOptions, detect_format
from treeprep.schemas import ChatCall

SAMPLES = Path(__file__).resolve().parents[3] / "sample_data"


def _calls(path: Path) -> list[ChatCall]:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out: list[ChatCall] = []
    for f in files:
        spec = detect_format(str(f), f.read_bytes()[:65536])
        if spec is None:
            continue
        try:
            out += [c for c in spec.read(str(f), ReadOptions()) if isinstance(c, ChatCall)]
        except InputError:  # a file its reader refuses whole (Cline 4's transcript)
            continue
    return out


@pytest.mark.parametrize(
    ("sample", "wire"),
    [
        ("claude-code", "python"),  # a Messages endpoint's json.dumps (vLLM, LiteLLM's proxy)
        ("anthropic_messages.jsonl", "python"),
        ("tau2_bench_shop.json", "python"),  # tau2's json.dumps(tc.arguments)
        ("opencode", "javascript"),  # the AI SDK's JSON.stringify(part.input)
        ("opencode_db", "javascript"),
        ("pi", "javascript"),  # pi-ai's JSON.stringify(tc.arguments)
        ("cline", "javascript"),  # Cline's JSON.stringify(toolMessage.input)
        ("openai_chat.jsonl", None),  # the request's own strings
    ],
)
def test_each_reader_names_how_its_agent_wrote_arguments(sample: str, wire: str | None) -> None:
    calls = _calls(SAMPLES / sample)
    assert calls and {c.arguments_json for c in calls} == {wire}
