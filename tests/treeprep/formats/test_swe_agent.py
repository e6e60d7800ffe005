"""swe-agent and mini-swe-agent adapters on the real trajectories and our samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeprep.errors import InputError
from treeprep.formats import detect_format
from treeprep.formats.base import ReadOptions
from treeprep.formats.mini_swe_agent import FORMAT as MINI
from treeprep.formats.swe_agent import FORMAT as SWE
from treeprep.schemas import ChatCall, Reject

ROOT = Path(__file__).resolve().parents[3]
LOGS = ROOT / ".." / "shared" / "data" / "logs"
real = pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/data is absent")


def _split(spec, path):
    items = list(spec.read(str(path), ReadOptions()))
    return [i for i in items if isinstance(i, ChatCall)], [
        i for i in items if isinstance(i, Reject)
    ]


@real
@pytest.mark.parametrize(
    ("name", "n", "exact", "elided"),
    [
        ("ctf__crypto__katy.traj", 18, False, 0),
        ("function_calling_simple.traj", 5, False, 0),
        (
            "gpt4__swe-bench-dev-easy_first_only__default__t-0.00__p-0.95__c-3.00__install-1__"
            "pydicom__pydicom-1458.traj",
            12,
            False,
            0,
        ),
        (
            "replay__marshmallow-code__marshmallow-1867__function_calling_replace__install-1__"
            "marshmallow-code__marshmallow-1867.traj",
            11,
            False,
            0,
        ),
        (
            "replay__marshmallow-code__marshmallow-1867__function_calling_replace_from_source__"
            "marshmallow-code__marshmallow-1867.traj",
            13,
            True,
            7,
        ),
    ],
)
def test_real_swe_agent(name, n, exact, elided):
    path = LOGS / "swe-agent" / name
    assert detect_format(str(path), path.read_bytes()[:65536]) is SWE
    calls, rej = _split(SWE, path)
    assert rej == [] and len(calls) == n
    assert len({c.group_id for c in calls}) == 1
    assert all(c.provenance.exact_messages is exact for c in calls)
    assert [c.branch_reason for c in calls].count("elided-history") == elided
    if exact:  # step k's prompt is step k-1's processed messages
        d = json.loads(path.read_text())
        assert [m.model_dump(exclude_none=True)["content"] for m in calls[5].messages] == [
            m["content"] for m in d["trajectory"][4]["messages"]
        ]


def test_sample_swe_agent_elides_history():
    calls, rej = _split(SWE, ROOT / "sample_data" / "swe_agent_slugify.traj")
    assert rej == [] and len(calls) == 5
    assert [c.branch_reason for c in calls] == [
        None,
        None,
        None,
        "elided-history",
        "elided-history",
    ]
    assert calls[3].messages[3].content.startswith("Old environment output")
    assert calls[0].completion.tool_calls[0].function.name == "bash"
    assert calls[2].messages[-1].tool_call_id == "call_1"


@real
@pytest.mark.parametrize(
    ("name", "n"),
    [
        ("pr854__astropy__astropy-12907.traj.json", 64),
        ("synthetic_test_fixture__github_issue.traj.json", 10),
        ("synthetic_test_fixture__local.traj.json", 2),
    ],
)
def test_real_mini_swe_agent(name, n):
    path = LOGS / "mini-swe-agent" / name
    assert detect_format(str(path), path.read_bytes()[:65536]) is MINI
    calls, rej = _split(MINI, path)
    assert rej == [] and len(calls) == n
    for a, b in zip(calls, calls[1:], strict=False):  # append-only transcript
        assert b.messages[: len(a.messages) + 1] == a.messages + [a.completion]


def test_sample_mini_swe_agent():
    calls, rej = _split(MINI, ROOT / "sample_data" / "mini_swe_agent_wc.traj.json")
    assert rej == [] and len(calls) == 3
    assert {c.group_id for c in calls} == {"demo__wc-1"}
    assert calls[0].completion.reasoning_content == "Start by reading the code."
    assert calls[1].messages[2].reasoning_content is None  # not in the transcript
    # so the next call leaves the first's tokens where the reasoning was (was unhinted)
    assert [c.branch_reason for c in calls] == [None, "reasoning-dropped", None]
    assert calls[0].model == "deepseek/deepseek-chat"


def test_bad_documents(tmp_path):
    p = tmp_path / "x.traj"
    p.write_text('{"trajectory": [')
    with pytest.raises(InputError) as e:
        list(SWE.read(str(p), ReadOptions()))
    assert e.value.file == str(p) and "malformed JSON" in e.value.reason
    q = tmp_path / "y.traj.json"
    q.write_text(
        json.dumps(
            [
                {"role": "system", "content": "s"},
                {"role": "robot", "content": "?"},
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
            ]
        )
    )
    calls, rej = _split(MINI, q)
    assert (
        len(calls) == 1 and len(rej) == 1 and "messages[1]: unknown role 'robot'" in rej[0].reason
    )


def test_a_role_that_is_not_a_string_rejects_its_call(tmp_path):
    """Regression (found by the malformed-sample fuzz): a query message whose role was a list
    reached the history converter's role count and raised TypeError, ending the file's read."""
    steps = [
        {"query": [{"role": "system", "content": "s"}, {"role": ["user"], "content": "u"}],
         "response": "r1"},
        {"query": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
         "response": "r2"},
    ]  # fmt: skip
    p = tmp_path / "z.traj"
    p.write_text(json.dumps({"trajectory": steps, "history": []}))
    calls, rej = _split(SWE, p)
    assert len(calls) == 1 and [r.reason for r in rej] == [
        "call trajectory[0]: trajectory[0].query[1].role: expected a string, got array"
    ]
