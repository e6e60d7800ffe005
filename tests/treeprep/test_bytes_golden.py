"""Golden bytes: builds of known inputs hash to values recorded from earlier code.

They guard that moving code between modules changes no byte of the shards, the manifest, the
rejects or the plan. Each sample of ``sample_data/`` is built and packed on its own, from the
fixed list :data:`SAMPLE_GOLDEN` (one hash per sample: of the sha256 of every file the build
and the plan write), so a new sample adds its own entry and moves no other; a sample left out
of the list fails :func:`test_every_sample_has_a_hash`. The Aider sample is given as its two
files (a folder walk skips dot-files). The real logs of ``../shared/data`` are one build, when
present. The builds run from the repository root (the adversarial suite checks that the bytes
do not depend on where the inputs lie).

A change that is meant to change the bytes (a schema version, a new column, a format read
differently) re-records the entries it moves, and only those, and says so in its commit.
The per-sample entries were recorded at 2f12586, whose whole-sample build still hashed to the
values recorded before (issue 42: earlier, one build of all samples held every hash, so each
new format re-recorded them all; the history of those re-recordings is in ``git log``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.pack import PackConfig, pack

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_data"
SHARED = ROOT / ".." / "shared" / "data"

#: a sample (an entry of ``sample_data/``) -> the hash of its build and plan (:func:`_digest`)
SAMPLE_GOLDEN = {
    "aider": "5a35fe9dca531bd19efcf4b7503df31a922f8c73d6bb577ebbccca41999f841c",
    "anthropic_messages.jsonl": "e94e9f2a3e0b89b96202a2bc9998b126fa958411100747d002455ef830f0174d",
    "atif": "027f28d15bf26bbd6f9ac5eb7b7b2ab335ab9652452d74f64e8d730296fbc82f",
    "claude-code": "b3289a166d324fabb09f0b667f8c338a36aaea32b793bc749786d33bd16da311",
    "cline": "ba87b593f44a667af38d045731aaef951f84ee87562e22d48af88ed4479e4daf",
    "codex": "60eb2388e62216a25023544f85217d77de58e82ab93af21d10b4aa65e21b6b18",
    "cursor": "a1fdfa0117eacc0eb225c89369b800df7af272a9fa73726996cdb5944d98d1a6",
    "copilot_cli": "4c662d6b7affbb961cb9c92b63b0c5435a62d9955d7e1316c8fa00a7fc06bdb3",
    "crush": "85514cde9b11c40f8ce8cf49d0077766dc93d7f405ee1c11e06ac430596d9a11",
    "conversations": "47317610ce5ab8bf62a7a6b34e7152dd1e9a4130e2d8ec775ceb2e645b7cd11c",
    "gemini_cli": "d1ba7e2d0e89f5ebedf378d91c0ab45ce8ce1f3fc2bc2a7e9733669403d430f7",
    "gemini_cli_telemetry": "b9d6d433d420f6ff3f7450cda13cae9a18bf1d2d29ae184b5cbe0bb07ae98881",
    "gemini_cli_subagents": "1aa16d9d228d878872ece19414b50992ea105ee2daf92906f8cf5e1a30768e57",
    "goose": "38a491e66d197717ce7f9b305e9523d227f500d17344f3c85fcdb3bf607d1b67",
    # re-recorded 2026-12-07: an earlier reply's inline <think> block reaches the template as
    # sent (the server does not split a prompt's messages); the built-in template prints it.
    # Again the same day: a completion's block is trained as the model wrote it where the
    # template prints it so (one newline after </think>, not the split's blank line)
    "gptme": "c66054b2877c202c678cc01315e5de6af8c6005dfbabc07f1a7173c090c2b6e6",
    "kimi_cli": "4b376ef79f11744cd3a27225e6fefd2a8bac9d260b8e752c1d80d86f98ce2998",
    "litellm": "bb2d4220b3bb527787ed81dc6ff2372bb2df06a143c4ceff04de0291454e94b8",
    "mini_swe_agent_wc.traj.json": (
        "e101cef9339c5215a0b8bd733ae0546cbc623fec6f66abdc556b238ca22dde89"
    ),
    "mistral_vibe": "86528108fdb803ba03a7a429ba7d27429bc02b1563a5a5821c2cbc65bf060ed8",
    "openai_chat.jsonl": "663667357e567065be46b79a3ea536431f843a8c0974d2202c00c417a29ccc2e",
    "openai_responses.jsonl": "9a25210e022733b2dc6ec266de516f99a66c02bc906a557e910429db6dbfb872",
    "openai_responses_aviary.jsonl": (
        "654b774066778562dad4d440c1b559e8bffcc41c75f174cbe17ac5e3100c6fbc"
    ),
    "opencode": "01c6ae2abd01dccb5358345d697b1ebb08ce810f6be6ec8ad37532612f71cb5d",
    "qwen_code": "ddd54d4092fe69b1a79bd7697b50ce8c49bfb337e3561b5484c7261a0e04e16b",
    "opencode_db": "4981128d0fc21195df22a6c9635bdedb1b4d9ad5b54eb54ea94b245b7f5fbb84",
    "openhands": "aea73dbc47f31d2aa47c06b55d9818a4bff850dc6dff47e54af8c756fe519fe2",
    "pi": "c46363926e3aa810e0e1c69efc937ca3b58bd07688f915d8ffa4046d44e14494",
    "session_traces.jsonl": "77f701968676a5962a18db06443d6d956d7a1e679f91cc1808cf1dfdfe8f55c8",
    "swe_agent_slugify.traj": "a226bad88c1351256f6bb1a56375112bbdac8997aba33192a09bd5d9298f2505",
    "tau2_bench_shop.json": "11c333119a5d27e6aaf2dbd40cf26f9dcb2f121310deb78c59577315712b82ee",
    "tau_bench_shop.json": "233d21349845b02569fb5e81e4e2b7f65a8e955f0b3d76c8aea309fa9cfb9810",
    "tokens.jsonl": "7a54f33e7b77b31ee026830e6410a2144418444652b0f4b1a236da54d5428b9f",
    "trajectory_dataset": "89ef603110d080ef8f021445009a81b86636b9d42d8020947982493355ec008f",
}

#: inputs of a sample other than the entry itself
SAMPLE_INPUTS = {
    "aider": ["sample_data/aider/.aider.llm.history", "sample_data/aider/.aider.chat.history.md"],
}

#: the options of a sample that builds nothing without them (Cursor: every transcript refused)
SAMPLE_OPTIONS = {
    "cursor": FileOptions(
        system_prompt="sample_data/cursor/options/system-prompt.txt",
        tools="sample_data/cursor/options/tools.json",
    ),
}

#: the real logs, re-recorded where a tool_result's text blocks are joined with a newline (2 of
#: the Claude Code logs' results have several), then where an assistant's several text blocks
#: stay parts that the server joins (9 of its 173 responses; the manifest counts 162 calls so),
#: then where user messages in a row are one message, as Claude Code sends them (86 of the 173
#: Claude Code prompts had some; normalizeMessagesForAPI, read in 2.1.112 and 2.1.337), then
#: where a response's text block of whitespace alone is not sent again (Claude Code's merge of
#: a response's lines leaves it out)
REAL_GOLDEN = {
    "manifest.json": "e1470542261114674656ecb056415c37a2e4ad2b672e4898bd7154c6457b6b52",
    "plans/b131072-w2-n2-s3/plan.arrow": (
        "cdb0130b4544f5e4706294fa86302b6aa6b200c3d82d0fccd06c44e9bb966e43"
    ),
    "plans/b131072-w2-n2-s3/summary.json": (
        "1984c8fffa4a24a26929e68424a701c0985b3a53d17be9f779990c50b298e08e"
    ),
    "rejects.jsonl": "9993489ed909d9a309819b20046eefb1b2e29968f1fa616ce94f384b4475bea1",
    "shards/shard-00000.arrow": "7343f987dbfbad62f9f20c32225243b531e405d9822571240a8b61cbdbae1dbd",
}


def _build_and_pack(
    out: Path,
    inputs: list[str],
    tokenizer: str | None,
    budget: int,
    file: FileOptions | None = None,
) -> dict[str, str]:
    build(BuildConfig(inputs=inputs, out=str(out), tokenizer=tokenizer, file=file or FileOptions()))
    pack(str(out), PackConfig(budget=budget, world_size=2, steps_of=2, seed=3))
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".work" not in p.relative_to(out).parts
    }


def _digest(files: dict[str, str]) -> str:
    """One hash for a build's files: of their names and sha256, one line each, sorted."""
    return hashlib.sha256(
        "".join(f"{k} {v}\n" for k, v in sorted(files.items())).encode()
    ).hexdigest()


def test_every_sample_has_a_hash() -> None:
    samples = {p.name for p in SAMPLES.iterdir() if p.name != "README.md"}
    assert sorted(samples - SAMPLE_GOLDEN.keys()) == [], "add their hashes to SAMPLE_GOLDEN"
    assert sorted(SAMPLE_GOLDEN.keys() - samples) == [], "samples listed but absent"


@pytest.mark.parametrize("sample", sorted(SAMPLE_GOLDEN))
def test_sample_bytes_unchanged(
    sample: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    inputs = SAMPLE_INPUTS.get(sample, [f"sample_data/{sample}"])
    # budget 2048 cuts the longer trees into parts, so the cut and the prefixes are covered too
    files = _build_and_pack(tmp_path / "out", inputs, None, 2048, SAMPLE_OPTIONS.get(sample))
    got = _digest(files)
    assert got == SAMPLE_GOLDEN[sample], f"{sample}: {got}, of {files}"


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data is absent")
def test_real_logs_qwen3_bytes_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    got = _build_and_pack(
        tmp_path / "out", ["../shared/data/logs"], "../shared/data/tokenizers/qwen3", 131072
    )
    assert got == REAL_GOLDEN
