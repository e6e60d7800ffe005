"""treeprep show: the Claude Code sample session drawn with its sub-agent and compaction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from treeprep.build import BuildConfig, build
from treeprep.cli.app import app
from treeprep.show import ShowConfig, list_groups, render_view, show

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
SESSION = "7e1d2c3b-0a9f-4e8d-b7c6-5a4f3e2d1c0b"


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("show")
    shutil.copytree(SAMPLE / "claude-code", root / "in")
    shutil.copy(SAMPLE / "tau_bench_shop.json", root / "in" / "tau.json")
    o = root / "out"
    build(BuildConfig(inputs=[str(root / "in")], out=str(o)))
    return str(o)


def test_view_of_the_session(out):
    view = show(ShowConfig(out=out, group=SESSION, max_nodes=100))
    assert view["group_id"] == SESSION and view["sequences"] == 8
    assert view["agents"] == ["acompact-9d1e", "b5e71c2", "main"]
    assert view["branches"].keys() >= {"sub-agent", "compaction"}
    assert view["nodes_hidden"] == 0 and view["decoder"] == "builtin-bytes"

    def walk(segs):
        for s in segs:
            yield s
            yield from walk(s["children"])

    segs = list(walk(view["tree"]))
    assert sum(s["nodes"] for s in segs) == view["nodes"]  # collapsing loses no node
    assert sum(s["sequences_ending"] for s in segs) == 8
    sub = next(s for s in segs if s["branch_reason"] == "sub-agent")
    assert sub["preview"].startswith("Where are discount codes")
    assert "\n" not in "".join(s["preview"] for s in segs)
    con = Console(record=True, width=200)
    con.print(render_view(view))
    text = con.export_text()
    assert "sub-agent" in text and "compaction" in text and SESSION in text


def test_largest_tree_default_and_max_nodes(out):
    groups = list_groups(out)
    assert groups[0]["tokens_tree"] == max(g["tokens_tree"] for g in groups)
    view = show(ShowConfig(out=out, max_nodes=1))
    assert view["group_id"] == groups[0]["group_id"]
    assert view["segments_shown"] == 1
    assert view["nodes_hidden"] == view["nodes"] - view["tree"][0]["nodes"]


def test_cli_json_list_and_unknown_group(out):
    r = CliRunner().invoke(app, ["show", out, "--group", SESSION, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["group_id"] == SESSION
    r = CliRunner().invoke(app, ["show", out, "--list", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 3  # session + 2 tau tasks
    r = CliRunner().invoke(app, ["show", out, "--group", "no-such-group"])
    assert r.exit_code != 0 and "no tree for group" in str(r.exception)


def test_the_drawing_ends_with_a_legend_of_its_marks_and_reasons(out):
    """Issue 53 item 11: '@0 x8' and the branch reasons (``unknown`` above all) had no
    definition anywhere a user looks."""
    from treeprep.schemas.records import BRANCH_REASONS
    from treeprep.show import REASON_MEANING, legend

    assert sorted(REASON_MEANING) == sorted(BRANCH_REASONS)  # every reason is defined
    assert "does not say why" in REASON_MEANING["unknown"]
    r = CliRunner().invoke(app, ["show", out, "--group", SESSION], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    view = show(ShowConfig(out=out, group=SESSION))
    lines = legend(view)
    assert lines[0].startswith("@N: the segment starts at token N") and len(lines) == 1 + len(
        view["branches"]
    )
    assert all(line in r.stdout for line in lines)


def test_stats_explains_each_reason_under_its_table(out):
    """Issue 53 item 11: ``stats`` counted the reasons and defined none. The tau-bench trial
    parts as ``new-trial`` (it was ``unknown``), and each reason of the table has its line."""
    from treeprep.show import REASON_MEANING

    tau = show(ShowConfig(out=out, group="tau:task-0"))
    assert tau["branches"] == {"new-trial": 1}
    r = CliRunner().invoke(app, ["stats", out], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "branches by reason" in r.stdout
    for reason in ("sub-agent", "compaction", "new-trial"):
        assert f"{reason}: {REASON_MEANING[reason]}" in r.stdout
    assert "unknown:" not in r.stdout


def test_show_says_what_the_drawn_trees_prompts_lack_and_no_other_formats(out):
    groups = {g["source_format"]: g["group_id"] for g in list_groups(out)}
    assert groups.keys() == {"claude-code", "tau-bench"}
    for fmt, other in (("claude-code", "tau-bench"), ("tau-bench", "claude-code")):
        res = CliRunner().invoke(app, ["show", out, "--group", groups[fmt]])
        assert res.exit_code == 0, res.output
        notes = res.stderr.replace("\n", " ")
        assert f"{fmt}: " in notes and "no tool schemas" in notes
        assert f"{other}: " not in notes  # the build's other format is not this tree's
