"""Tests mirror the rooms: every product module has a test at its mirrored path, or one line in
:data:`COVERED_BY` naming the suite that covers it.

The mirrored path of ``treeprep/render/encoder.py`` is ``tests/treeprep/render/test_encoder.py``
(``schemas/``, ``trainer/`` and ``cli/`` likewise; a leading underscore is kept:
``formats/_read.py`` -> ``test__read.py``). A module covered elsewhere names its suite and a word
that both spell (a name it defines, the format name it registers, an option it declares), so a
line cannot point at a suite that never reaches the module. A command module of ``cli/`` is
reached by its command's name, which the suite must pass as a literal (``"stats"``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
ROOMS = ("schemas", "treeprep", "trainer", "cli")
SKIP = {"__init__.py", "__main__.py"}

#: module -> (the suite that covers it, under tests/; a word the module and the suite both spell)
COVERED_BY: dict[str, tuple[str, str]] = {
    # schemas/
    "schemas/manifest.py": ("schemas/test_contract.py", "manifest"),
    "schemas/parts.py": ("treeprep/test_memory.py", "keep_cap"),
    "schemas/plan.py": ("schemas/test_old_plans.py", "PlanSummary"),
    "schemas/tokenizer.py": ("treeprep/render/test_identity.py", "sha256_text"),
    # treeprep/
    "treeprep/build/config.py": ("treeprep/build/test_build_config.py", "BuildConfig"),
    "treeprep/build/dedup.py": ("treeprep/build/test_curate.py", "duplicates"),
    "treeprep/build/out.py": ("adversarial/test_adv_out.py", "lock_out"),
    "treeprep/build/workfiles.py": ("treeprep/build/test_hints.py", "drop_rows"),
    "treeprep/dry_run.py": ("cli/test_dry_run.py", "BuildFacts"),
    "treeprep/errors.py": ("adversarial/test_adv_options.py", "TreeprepError"),
    "treeprep/export.py": ("treeprep/test_export_rejects.py", "export_sequences"),
    "treeprep/formats/_atif_links.py": (
        "treeprep/formats/test_atif_handoff.py",
        "subagent_trajectory_ref",
    ),
    "treeprep/formats/_anthropic_blocks.py": ("treeprep/formats/test_anthropic.py", "billing"),
    "treeprep/formats/_claude_layout.py": ("treeprep/formats/test_claude_code.py", "subagents"),
    "treeprep/formats/_claude_session.py": ("treeprep/formats/test_claude_code.py", "tool_result"),
    "treeprep/formats/_gemini_layout.py": ("treeprep/formats/test_gemini_subagents.py", "chats"),
    "treeprep/formats/_rows.py": ("treeprep/formats/test_dataset_rows.py", "Toucan"),
    "treeprep/formats/_sniff.py": ("treeprep/formats/test_detection.py", "first_record"),
    "treeprep/formats/_sqlite.py": ("treeprep/formats/test_sqlite_stores.py", "sqlite"),
    "treeprep/formats/base.py": ("treeprep/build/test_files.py", "FormatSpec"),
    "treeprep/formats/crush.py": ("treeprep/formats/test_sqlite_stores.py", "crush"),
    "treeprep/formats/gemini_cli.py": ("treeprep/formats/test_gemini_openhands.py", "gemini-cli"),
    "treeprep/formats/goose.py": ("treeprep/formats/test_sqlite_stores.py", "goose"),
    "treeprep/formats/mini_swe_agent.py": (
        "treeprep/formats/test_swe_agent.py",
        "mini-swe-agent",
    ),
    "treeprep/formats/openai_chat.py": ("treeprep/formats/test_openai.py", "openai-chat"),
    "treeprep/formats/openai_responses.py": (
        "treeprep/formats/test_responses_steps.py",
        "openai-responses",
    ),
    "treeprep/formats/opencode_db.py": ("treeprep/formats/test_sqlite_stores.py", "opencode-db"),
    "treeprep/formats/openhands_events.py": (
        "treeprep/formats/test_gemini_openhands.py",
        "openhands-events",
    ),
    "treeprep/formats/tokens.py": ("treeprep/render/test_idcheck.py", "prompt_token_ids"),
    "treeprep/io/reads.py": ("treeprep/build/test_companions.py", "meta.json"),
    "treeprep/pack/cut.py": ("treeprep/pack/test_plan.py", "cut_tree"),
    "treeprep/pack/forest.py": ("treeprep/pack/test_openings.py", "opening_lengths"),
    "treeprep/rejects.py": ("treeprep/test_rejects_origin.py", "summarize_rejects"),
    "treeprep/render/builtin.py": ("treeprep/render/test_renderer.py", "build_backend"),
    "treeprep/render/coverage.py": ("treeprep/formats/test_codex_hosted.py", "undeclared_tools"),
    "treeprep/render/encoder.py": ("treeprep/render/test_renderer.py", "CachedEncoder"),
    "treeprep/render/incremental.py": ("treeprep/render/test_gpt_oss.py", "IncrementalRenderer"),
    "treeprep/render/messages.py": ("treeprep/render/test_inline_think.py", "split_inline_think"),
    "treeprep/render/rollout.py": ("treeprep/render/test_renderer.py", "generation_log_probs"),
    "treeprep/render/template.py": ("treeprep/render/test_template_limits.py", "RenderLimits"),
    "treeprep/render/tokenizer.py": ("treeprep/render/test_renderer.py", "load_folder"),
    "treeprep/shards.py": ("adversarial/test_adv_rebuild.py", "iter_trees"),
    "treeprep/show.py": ("cli/test_show.py", "ShowConfig"),
    "treeprep/formats/_atif_handoff.py": ("treeprep/formats/test_atif_handoff.py", "summarization"),
    # trainer/
    "trainer/attention/call.py": ("trainer/attention/test_backends.py", "tree_attention"),
    "trainer/attention/dense.py": ("trainer/attention/test_backends.py", "dense"),
    "trainer/attention/flash.py": ("trainer/attention/test_backends.py", "flash"),
    "trainer/attention/hf.py": ("trainer/models/test_upstream.py", "register_attention"),
    "trainer/attention/mask.py": ("trainer/attention/test_blocks.py", "TreeMask"),
    "trainer/attention/nodes.py": ("trainer/attention/test_blocks.py", "NODE_CHUNK"),
    "trainer/attention/options.py": ("trainer/attention/test_blocks.py", "LayerOptions"),
    "trainer/attention/stream.py": ("trainer/parts/test_host_stores.py", "PREFIX_WINDOW"),
    "trainer/batch/assembly.py": ("trainer/batch/test_tree_batch.py", "Missing"),
    "trainer/batch/targets.py": ("trainer/objective/test_loss.py", "Targets"),
    "trainer/data/rows.py": ("trainer/data/test_reader.py", "NULL_ROW"),
    "trainer/distributed.py": ("trainer/test_context.py", "DistInfo"),
    "trainer/loss.py": ("trainer/test_public_api.py", "MOVED"),
    "trainer/models/float64.py": ("trainer/test_verify_float64.py", "float64_throughout"),
    "trainer/models/run.py": ("trainer/test_equivalence.py", "tree_logits"),
    "trainer/online.py": ("trainer/test_shared_prefixes.py", "build_step"),
    "trainer/parts/host.py": ("trainer/run/test_host_pool_faults.py", "HostPoolExhausted"),
    "trainer/parts/plan.py": ("trainer/test_context.py", "part_layout"),
    "trainer/parts/schedule.py": ("trainer/objective/test_rl.py", "run_parts"),
    "trainer/parts/sharded.py": ("trainer/test_fsdp_parts.py", "ShardedHandOff"),
    "trainer/parts/state.py": ("trainer/parts/test_handoff_state.py", "KVStore"),
    "trainer/reference.py": ("trainer/test_verify_reference64.py", "reference_gradients"),
    "trainer/run/loop.py": ("trainer/run/test_train.py", '"train"'),
    "trainer/run/plot.py": ("trainer/run/test_trackers.py", "train.png"),
    "trainer/run/run_identity.py": ("trainer/run/test_resume.py", "check_resume"),
    "trainer/run/run_lock.py": ("trainer/run/test_run_folders.py", "FolderLocked"),
    "trainer/verify.py": ("trainer/test_verify_objective.py", "verify_gradients"),
    # cli/ (the command modules are found by their command's name, below)
    "cli/app.py": ("cli/test_options.py", "app"),
    "cli/config_file.py": ("cli/test_train_config.py", "--config"),
    "cli/train_progress.py": ("cli/test_tables.py", "start_line"),
}


def _modules() -> list[str]:
    return sorted(
        p.relative_to(ROOT).as_posix()
        for room in ROOMS
        for p in (ROOT / room).rglob("*.py")
        if p.name not in SKIP
    )


def _mirror(module: str) -> Path:
    path = Path(module)
    return ROOT / "tests" / path.parent / f"test_{path.stem}.py"


def _commands() -> dict[str, str]:
    """Each command module of cli/ -> the command's name, as the app registers it."""
    from treeprep.cli.app import app

    return {
        f"cli/{c.callback.__module__.rsplit('.', 1)[1]}.py": str(c.name)
        for c in app.registered_commands
        if c.callback is not None and c.name
    }


def test_every_module_has_a_mirrored_test_or_a_covering_suite() -> None:
    commands = _commands()
    missing = [
        m
        for m in _modules()
        if not _mirror(m).exists() and m not in COVERED_BY and m not in commands
    ]
    assert missing == [], "add tests/<room>/.../test_<module>.py, or a line in COVERED_BY"


def test_a_mirrored_module_needs_no_line() -> None:
    """A line for a module that has its mirrored test, or that no longer exists, is stale."""
    modules = set(_modules())
    stale = [m for m in COVERED_BY if m not in modules or _mirror(m).exists()]
    assert stale == []


@pytest.mark.parametrize("module", sorted(COVERED_BY))
def test_the_covering_suite_reaches_the_module(module: str) -> None:
    suite, word = COVERED_BY[module]
    assert word in (ROOT / module).read_text(encoding="utf-8"), f"{module} never spells {word!r}"
    assert word in (TESTS / suite).read_text(encoding="utf-8"), f"{suite} never spells {word!r}"


def test_every_command_is_invoked_by_a_suite() -> None:
    texts = [p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py")]
    unreached = [
        f"{m} ({name})"
        for m, name in sorted(_commands().items())
        if not _mirror(m).exists() and not any(f'"{name}"' in t for t in texts)
    ]
    assert unreached == []
