"""trajectory-dataset and field mapping (issue 27 item 2).

The samples in ``sample_data/trajectory_dataset/`` are written from the datasets' documented
columns (nebius SWE-agent-trajectories: ``trajectory`` of ``role``/``text``/``system_prompt``/
``mask`` turns, roles ``system``/``user``/``ai``; SWE-rebench-openhands: OpenAI turns under
``trajectory``, ``tools`` as JSON text, ``resolved``), not copied from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import TreeprepError
from treeprep.formats import detect_format, get_format
from treeprep.formats.base import ReadOptions
from treeprep.formats.trajectory import FieldMap, parse_map
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data" / "trajectory_dataset"
NEBIUS = SAMPLES / "swe_agent_trajectories.jsonl"
OPENHANDS = SAMPLES / "openhands_trajectories.parquet"
QWEN3 = ROOT / ".." / "shared" / "data" / "tokenizers" / "qwen3"
FMT = get_format("trajectory-dataset")


def _read(path: Path, opts: ReadOptions | None = None) -> list[Any]:
    return list(FMT.read(str(path), opts or ReadOptions()))


def test_known_datasets_are_detected_without_flags() -> None:
    for p in (NEBIUS, OPENHANDS):
        assert detect_format(str(p), p.read_bytes()[:65536]) is FMT
    swe = ROOT / "sample_data" / "swe_agent_slugify.traj"  # has 'trajectory', but of steps
    assert detect_format(str(swe), swe.read_bytes()[:65536]) is not FMT


def test_nebius_turns_mask_and_empty_reply() -> None:
    items = _read(NEBIUS)
    calls = [c for c in items if isinstance(c, ChatCall)]
    rejects = [r for r in items if isinstance(r, Reject)]
    rows = [json.loads(x) for x in NEBIUS.read_text().splitlines()]
    # row 1: 4 'ai' turns, one with mask false (context): 3 calls
    first = [c for c in calls if c.source_line == 1]
    assert len(first) == 3 and {c.reward for c in first} == {1.0}
    assert first[0].messages[0].role == "system"
    assert first[0].messages[0].content == rows[0]["trajectory"][0]["system_prompt"]
    oops = rows[0]["trajectory"][4]["text"]
    assert all(c.completion.content != oops for c in calls)
    assert any(m.content == oops and m.role == "assistant" for m in first[1].messages)
    # row 2: the empty 'ai' turn is rejected, never trained
    assert len(rejects) == 1 and rejects[0].reason.startswith("trajectory[4]: ")
    assert "reply is empty" in rejects[0].reason and rejects[0].line == 2
    assert [c.reward for c in calls if c.source_line == 2] == [0.0]


def test_openhands_parquet_runs_of_a_task_share_a_tree() -> None:
    calls = _read(OPENHANDS, ReadOptions(group_by="instance_id"))
    assert all(isinstance(c, ChatCall) for c in calls) and len(calls) == 4
    assert {c.group_id for c in calls} == {"acme__units-7"}
    assert {c.trajectory_id for c in calls} == {"acme__units-7.run-0", "acme__units-7.run-1"}
    assert len({c.call_id for c in calls}) == 4
    assert [t["function"]["name"] for t in calls[0].tools or []] == ["execute_bash", "finish"]
    assert calls[1].messages[-1].role == "tool" and calls[1].messages[-1].tool_call_id


def test_bad_mask_is_a_reject(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    turns = [{"role": "user", "text": "q"}, {"role": "ai", "text": "a", "mask": 2}]
    p.write_text(json.dumps({"trajectory": turns}) + "\n")
    (r,) = _read(p)
    assert isinstance(r, Reject) and r.reason == "trajectory[1].mask: expected 0 or 1, got 2"


CUSTOM = {
    "sys": "Be brief.",
    "dialog": [
        {"speaker": "human", "utterance": "2+2?"},
        {"speaker": "bot", "utterance": "4", "train": 1},
        {"speaker": "human", "utterance": "and 3+3?"},
        {"speaker": "bot", "utterance": "6", "train": 0},
        {"speaker": "human", "utterance": "thanks"},
        {"speaker": "bot", "utterance": "You're welcome."},
    ],
}
PAIRS = [
    "messages=dialog",
    "role=speaker",
    "content=utterance",
    "mask=train",
    "system=sys",
    "role.bot=assistant",
]


def _custom(tmp_path: Path) -> Path:
    p = tmp_path / "custom.jsonl"
    p.write_text(json.dumps(CUSTOM) + "\n")
    return p


def _check_custom(calls: list[Any]) -> None:
    assert [c.completion.content for c in calls] == ["4", "You're welcome."]
    assert [m.role for m in calls[1].messages] == ["system"] + ["user", "assistant"] * 2 + ["user"]


def test_map_pairs_and_map_file_read_any_chat_dataset(tmp_path: Path) -> None:
    p = _custom(tmp_path)
    fm = parse_map(PAIRS)
    _check_custom(_read(p, ReadOptions(field_map=fm)))
    toml = tmp_path / "mapping.toml"
    toml.write_text(
        'messages = "dialog"\nrole = "speaker"\ncontent = "utterance"\nmask = "train"\n'
        'system = "sys"\n[roles]\nbot = "assistant"\n'
    )
    assert parse_map(file=str(toml)) == fm
    assert parse_map(["mask=keep"], str(toml)).mask == "keep"  # a pair wins over the file
    out = tmp_path / "out"
    m = build(BuildConfig(inputs=[str(p)], out=str(out), file=FileOptions(map=PAIRS)))
    assert (m.counts.records_in_trees, m.counts.records_rejected, m.counts.trees) == (2, 0, 1)


@pytest.mark.parametrize(
    ("pairs", "match"),
    [
        (["messages"], "expected KEY=VALUE"),
        (["colour=red"], "colour: Extra inputs are not permitted"),
        (["role.bot=robot"], "role.bot='robot': expected one of system, user, assistant, tool"),
        (["content= "], None),
    ],
)
def test_bad_maps_are_refused_before_reading(pairs: list[str], match: str | None) -> None:
    if match is None:  # an empty value unsets an optional key, but content must name a field
        with pytest.raises(TreeprepError, match="content"):
            parse_map(pairs)
        return
    with pytest.raises(TreeprepError, match=match.replace("(", r"\(").replace(".", r"\.")):
        BuildConfig(inputs=["x"], out="o", file=FileOptions(map=pairs))


def test_cli_map_option(tmp_path: Path) -> None:
    from treeprep.cli.app import app

    p = _custom(tmp_path)
    args = ["build", str(p), "-o", str(tmp_path / "o"), "--json"]
    for pair in PAIRS:
        args += ["--map", pair]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["records_in_trees"] == 2
    bad = CliRunner().invoke(app, ["build", str(p), "-o", str(tmp_path / "o2"), "--map", "x"])
    assert bad.exit_code == 1 and "expected KEY=VALUE" in str(bad.exception)  # main prints it


def test_field_map_is_frozen_and_picklable() -> None:
    import pickle

    fm = parse_map(PAIRS)
    assert isinstance(fm, FieldMap) and pickle.loads(pickle.dumps(fm)) == fm


def _nebius_reference(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    roles = {"system": "system", "user": "user", "ai": "assistant"}
    msgs = [
        {"role": roles[t["role"]], "content": t["text"] or t["system_prompt"] or ""}
        for t in row["trajectory"]
    ]
    targets = [i for i, t in enumerate(row["trajectory"]) if t["role"] == "ai" and t["mask"]]
    return msgs, targets


@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
def test_calls_match_apply_chat_template_qwen3() -> None:
    from transformers import AutoTokenizer  # the reference only; rendering never imports it

    from treeprep.render import Renderer

    r = Renderer.load(str(QWEN3))
    hf = AutoTokenizer.from_pretrained(str(QWEN3), local_files_only=True)
    row = json.loads(NEBIUS.read_text().splitlines()[0])
    ref, targets = _nebius_reference(row)
    calls = [c for c in _read(NEBIUS) if isinstance(c, ChatCall) and c.source_line == 1]
    assert len(calls) == len(targets) == 3
    for call, i in zip(calls, targets, strict=True):
        seq = r.render(call, group_id="g")
        full = list(hf.apply_chat_template(ref[: i + 1], tokenize=True, return_dict=False))
        prompt = list(
            hf.apply_chat_template(
                ref[:i], tokenize=True, return_dict=False, add_generation_prompt=True
            )
        )
        assert list(seq.tokens) == full
        assert seq.loss_spans[0][0] == len(prompt) and seq.loss_spans[-1][1] == len(full)
