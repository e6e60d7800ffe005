"""Logged token ids checked against their logged text (issue 40 item 1).

The built-in byte tokenizer makes ids that are readable by construction (ids 0-255 are bytes,
258 is ``<|im_end|>``), so each case below says what the ids decode to; the real NeMo-Gym
rollouts (Qwen ids) are checked with the Qwen3 tokenizer, which produced them, and with
gpt-oss's, which did not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import RenderError, TokenizerError
from treeprep.formats import ReadOptions, get_format
from treeprep.formats.base import TextRollout
from treeprep.render import Renderer
from treeprep.render.idcheck import MIN_CHECKED, MISMATCH, missing_from
from treeprep.schemas import TokenRollout

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT / ".." / "shared" / "data"
NEMO = (
    SHARED / "logs" / "openai-responses" / "competitive_coding_challenges__example_rollouts.jsonl"
)
needs_shared = pytest.mark.skipif(not NEMO.is_file(), reason="../shared/data is absent")

IM_END = 258
PROMPT = [257, *b"user\nhi", IM_END, 10, 257, *b"assistant\n"]


@pytest.fixture(scope="module")
def byte_renderer() -> Renderer:
    return Renderer.load(None)


def _rollout(said: str, logged: str, tools: list[str] | None = None, file: str = "a.jsonl") -> Any:
    return TextRollout(
        call_id="c",
        prompt_token_ids=PROMPT,
        generation_token_ids=[*said.encode(), IM_END],
        logged_text=logged,
        logged_tool_names=tools or [],
        source_file=file,
    )


def test_ids_that_decode_to_their_text_are_trained_exactly(byte_renderer: Renderer) -> None:
    rec = _rollout("<think>\nok\n</think>\n\nHello  world", "Hello world\n")
    seq = byte_renderer.render(rec, group_id="g")
    assert seq.tokens.tolist() == PROMPT + [*b"<think>\nok\n</think>\n\nHello  world", IM_END]
    assert seq.loss_spans == [(len(PROMPT), len(seq.tokens))]


def test_ids_of_other_text_are_rejected_with_the_reason(byte_renderer: Renderer) -> None:
    with pytest.raises(RenderError) as e:
        byte_renderer.render(_rollout("Bonjour le monde", "Hello world"), group_id="g")
    assert e.value.reason.startswith(MISMATCH) and "the message text" in e.value.reason
    call = '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
    byte_renderer.render(_rollout(call, "", ["ls"]), group_id="g")  # the name is there
    with pytest.raises(RenderError, match="a tool-call name"):
        byte_renderer.render(_rollout(call, "", ["ls", "cat"]), group_id="g")


def test_a_file_where_most_calls_fail_stops_the_build() -> None:
    r = Renderer.load(None)
    for _ in range(3):
        r.render(_rollout("yes", "yes"), group_id="g")
    for _ in range(MIN_CHECKED - 4):  # 3 good, 4 bad: not yet most of 8
        with pytest.raises(RenderError):
            r.render(_rollout("no", "yes"), group_id="g")
    with pytest.raises(RenderError):  # another file's calls are its own tally
        r.render(_rollout("no", "yes", file="b.jsonl"), group_id="g")
    with pytest.raises(TokenizerError, match=r"a.jsonl: 5 of 8 calls .* wrong --tokenizer\?"):
        r.render(_rollout("no", "yes"), group_id="g")


def test_nothing_logged_to_compare_passes() -> None:
    assert missing_from("anything", "", []) is None
    assert missing_from("anything", "  \n", []) is None


def test_no_check_ids_reads_plain_rollouts(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(
        json.dumps({"prompt_token_ids": [1], "generation_token_ids": [2], "response": "x"})
    )
    spec = get_format("tokens")
    (checked,) = spec.read(str(p), ReadOptions())
    (plain,) = spec.read(str(p), ReadOptions(check_ids=False))
    assert isinstance(checked, TextRollout) and checked.logged_text == "x"
    assert type(plain) is TokenRollout


def _tokens_file(path: Path, n_bad: int, n_good: int = 1) -> None:
    rows = [
        {"call_id": f"bad{i}", "prompt_token_ids": PROMPT, "generation_token_ids": [*b"no", IM_END],
         "generation_text": "yes"}
        for i in range(n_bad)
    ] + [
        {"call_id": f"good{i}", "prompt_token_ids": PROMPT, "generation_text": "yes",
         "generation_token_ids": [*b"yes", IM_END]}
        for i in range(n_good)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_build_rejects_per_file_and_no_check_ids_keeps_them(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    _tokens_file(logs / "r.jsonl", n_bad=2)
    m = build(BuildConfig(inputs=[str(logs)], out=str(tmp_path / "o")))
    assert (m.counts.records_read, m.counts.records_in_trees, m.counts.records_rejected) == (
        3,
        1,
        2,
    )
    rejects = [json.loads(x) for x in (tmp_path / "o" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rejects] == [("r.jsonl", 1), ("r.jsonl", 2)]
    assert all(r["reason"].startswith(MISMATCH) for r in rejects)
    m = build(
        BuildConfig(inputs=[str(logs)], out=str(tmp_path / "o2"), file=FileOptions(check_ids=False))
    )
    assert (m.counts.records_in_trees, m.counts.records_rejected) == (3, 0)


def test_build_of_mostly_failing_calls_stops(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    _tokens_file(logs / "r.jsonl", n_bad=MIN_CHECKED)
    with pytest.raises(TokenizerError, match="r.jsonl: 8 of 8 calls"):
        build(BuildConfig(inputs=[str(logs)], out=str(tmp_path / "o")))


@needs_shared
@pytest.mark.parametrize(("tokenizer", "agrees"), [("qwen3", True), ("gpt-oss", False)])
def test_real_nemo_gym_ids_with_their_tokenizer_and_another(tokenizer: str, agrees: bool) -> None:
    r = Renderer.load(SHARED / "tokenizers" / tokenizer, native_templates=False)  # decode only
    rolls = list(get_format("tokens").read(str(NEMO), ReadOptions()))
    assert len(rolls) == 5 and all(isinstance(x, TextRollout) for x in rolls)
    for roll in rolls:
        if agrees:
            seq = r.render(roll, group_id="g")
            ids = roll.prompt_token_ids + roll.generation_token_ids
            assert np.array_equal(seq.tokens, ids)
        else:
            with pytest.raises(RenderError, match="the message text"):
                r.render(roll, group_id="g")
