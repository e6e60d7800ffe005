"""Issue 27 item 5: the calls the renderer normalized are counted through the build (file worker,
deduplication, manifest) and shown by ``treeprep stats``; builds without any keep their bytes.

The input is a NeMo-Gym-like rollout (``openai-responses``: ``responses_create_params`` and a
``response.output`` list) whose output text opens with an inline ``<think>`` block followed by
blank lines, the case the issue found rejected in 51 of 314 calls.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.cli.app import app
from treeprep.render import builtin
from treeprep.render.coverage import NORMALIZED_INLINE_THINK, NORMALIZED_WHITESPACE
from treeprep.render.response import ROUND_TRIP
from treeprep.schemas.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"

INLINE = "<think>\nThe sum is 4.\n</think>\n\n\nThe answer is 4.\n\n"

#: a ChatML template that collapses every run of newlines in a reply to one (as some templates
#: re-wrap text): the completion's words survive, its whitespace does not
COLLAPSING = (
    "{%- for m in messages %}<|im_start|>{{ m.role + '\\n' }}"
    "{%- if m.role == 'assistant' %}{{ m.content | replace('\\n\\n', '\\n') | trim }}"
    "{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _rollout(task: int, text: str) -> dict:
    return {
        "responses_create_params": {
            "input": [{"type": "message", "role": "user", "content": f"What is 2+2? (task {task})"}]
        },
        "_ng_task_index": task,
        "reward": 1.0,
        "response": {
            "id": f"resp_{task}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
        },
    }


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _reconciled(out: Path) -> dict[str, int]:
    m = load_manifest(str(out))
    c = m.counts
    assert c.records_read == c.records_in_trees + c.records_rejected + c.records_filtered
    assert all(0 < n <= c.records_in_trees for n in m.normalized.values())
    # every call in a tree was read back by the model's parser, where one is known (TRL's for the
    # built-in and Qwen3 templates; none for a template of no known family)
    read_back = c.records_in_trees if m.response_parser else None
    assert m.normalized.get(ROUND_TRIP) == read_back
    return {k: n for k, n in m.normalized.items() if k != ROUND_TRIP}


def _stats_show(out: Path, want: dict[str, int]) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["stats", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["normalized"]
    assert {k: n for k, n in got.items() if k != ROUND_TRIP} == want
    res = runner.invoke(app, ["stats", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for kind, n in want.items():
        assert f"normalized: {kind}" in res.stdout and f"{n:,}" in res.stdout


#: a ChatML template that splits a reply's inline <think> block itself, with its own newlines
#: around it, as Qwen3's does
SPLITTING = (
    "{%- for m in messages %}<|im_start|>{{ m.role + '\n' }}"
    "{%- if m.role == 'assistant' %}{% set c, r = m.content, m.reasoning_content %}"
    "{%- if r is not string and '</think>' in c %}"
    "{% set c, r = c.split('</think>')[-1], c.split('</think>')[0].split('<think>')[-1] %}"
    "{%- endif %}{% if r is string %}{{ '<think>\n' + r.strip('\n') + '\n</think>\n\n' }}"
    "{%- endif %}{{ c.lstrip('\n') }}"
    "{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_inline_think_rollouts_are_counted_and_shown(tmp_path: Path) -> None:
    """The built-in template prints a reply as the model wrote it, block and blank lines
    included: nothing is normalized. A template that splits the block itself with its own
    newlines renders the block made reasoning: counted ``inline-think``."""
    rows = [_rollout(0, INLINE), _rollout(1, INLINE), _rollout(2, "The answer is 4.")]
    src = _write(tmp_path / "in" / "rollouts.jsonl", rows)
    build(BuildConfig(inputs=[str(src)], out=str(tmp_path / "as-written")))
    assert _reconciled(tmp_path / "as-written") == {}
    template = tmp_path / "splitting.jinja"
    template.write_text(SPLITTING)
    out = tmp_path / "out"
    build(BuildConfig(inputs=[str(src)], out=str(out),
                      file=FileOptions(chat_template=str(template))))  # fmt: skip
    assert _reconciled(out) == {NORMALIZED_INLINE_THINK: 2}
    m = load_manifest(str(out))
    assert m.counts.records_in_trees == 3 and m.counts.records_rejected == 0
    _stats_show(out, {NORMALIZED_INLINE_THINK: 2})


@pytest.mark.skipif(not (QWEN3 / "tokenizer.json").is_file(), reason="../shared/data is absent")
def test_inline_think_rollouts_with_qwen3(tmp_path: Path) -> None:
    """Qwen3's template moves the reasoning and strips the blank lines: built, not rejected."""
    rows = [_rollout(k, INLINE) for k in range(3)]
    src = _write(tmp_path / "in" / "rollouts.jsonl", rows)
    out = tmp_path / "out"
    build(BuildConfig(inputs=[str(src)], out=str(out), tokenizer=str(QWEN3)))
    assert _reconciled(out) == {NORMALIZED_INLINE_THINK: 3}
    assert load_manifest(str(out)).counts.records_rejected == 0
    _stats_show(out, {NORMALIZED_INLINE_THINK: 3})


def test_whitespace_normalized_calls_are_counted_once_across_duplicates(tmp_path: Path) -> None:
    """A template that collapses blank lines: the calls build, counted as ``whitespace``; a
    second copy of the file is dropped by deduplication and its calls are not counted again."""
    template = tmp_path / "collapsing.jinja"
    template.write_text(COLLAPSING)
    rows = [_rollout(0, "Step one.\n\nStep two.\n"), _rollout(1, "One line.")]
    src = _write(tmp_path / "in" / "a.jsonl", rows)
    shutil.copy(src, tmp_path / "in" / "b.jsonl")
    out = tmp_path / "out"
    build(
        BuildConfig(
            inputs=[str(src.parent)], out=str(out), file=FileOptions(chat_template=str(template))
        )
    )
    m = load_manifest(str(out))
    assert m.counts.records_filtered == 2  # b.jsonl's two calls: duplicates
    assert _reconciled(out) == {NORMALIZED_WHITESPACE: 1}
    _stats_show(out, {NORMALIZED_WHITESPACE: 1})


def test_no_normalized_calls_no_field(tmp_path: Path) -> None:
    """A build with no normalized call counts only its calls read back by the model's parser;
    with no parser known either (a template of no known family), it writes no ``normalized``
    key (its bytes are as before the count)."""
    src = _write(tmp_path / "in" / "r.jsonl", [_rollout(0, "The answer is 4.")])
    out = tmp_path / "out"
    build(BuildConfig(inputs=[str(src)], out=str(out)))
    assert json.loads((out / "manifest.json").read_text())["normalized"] == {ROUND_TRIP: 1}
    _stats_show(out, {})
    template = tmp_path / "t.jinja"
    template.write_text("{#- a copy -#}" + builtin.CHAT_TEMPLATE)
    out = tmp_path / "none"
    build(
        BuildConfig(inputs=[str(src)], out=str(out), file=FileOptions(chat_template=str(template)))
    )
    assert "normalized" not in json.loads((out / "manifest.json").read_text())
