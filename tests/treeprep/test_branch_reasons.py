"""Every branch of the bundled samples is named (issue: 11 ``unknown`` branches in a build of
``sample_data``). Each sample below built alone gives each branch node the reason that says why
its calls part there, on the node that holds the calls of that branch:

* a gptme branch file (``retry``) and the expired ephemeral budget note (``elided-history``);
* a Gemini CLI ``$rewindTo`` (``retry``), and its replies sent back without their thoughts
  (``reasoning-dropped``);
* mini-swe-agent sending a reply back without its provider's reasoning (``reasoning-dropped``);
* a Codex compaction whose hinted call the renderer rejects (the next call takes the hint,
  :mod:`treeprep.build.hints`);
* sub-agent and continuation files read before their session's (Gemini CLI, OpenCode, ATIF):
  the hinted call is the branch, the session the main continuation (:mod:`treeprep.trie`);
* OpenCode's sub-agent call that deduplication drops as a copy of Crush's (the next call of the
  sub-agent takes the hint).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from treeprep.build import BuildConfig, build
from treeprep.shards import iter_trees

ROOT = Path(__file__).resolve().parents[2]
GPTME = "2025-11-06-quiet-amber-heron"
HANDOFF = "9b2f4c1e-5d7a-4e60-8c3b-2a1f0e9d7c64"
OPENCODE_SUB = "ses_5b2f0e7a1ffeHk3Wd9Px4Yc6sJ/msg_a4f10d002ffeC2"

#: sample -> group -> {reason: the call ids under the branch node it names}
CASES: dict[str, dict[str, dict[str, set[str]]]] = {
    # gptme sends a reply back with its <think> block in the text, which reaches the template as
    # sent; the completion is trained as the model wrote it, block included (the built-in
    # template prints it so), so each call goes on from the last one's trained tokens. (Made
    # reasoning, the block was written with a blank line after it where the model wrote one
    # newline, and four calls left their last reply's tokens: unknown.)
    "gptme": {
        GPTME: {
            "elided-history": {f"{GPTME}#3"},
            "retry": {f"{GPTME}/keep-underscores#2"},
        }
    },
    # Gemini CLI sends a reply back without its thoughts: the calls after g-01 (and m-01) leave
    # its completion, which keeps them
    "gemini_cli": {
        "3f9c2a1b-5d7e-4c10-9b8a-2e6f1d0c7a55": {
            "retry": {"g-06"},
            "reasoning-dropped": {"g-02", "g-03", "g-04", "g-05", "g-06"},
        }
    },
    "gemini_cli_subagents": {
        "5d0c1e2f-8a7b-4c6d-9e0f-1a2b3c4d5e6f": {
            "sub-agent": {"s-g1", "s-g2"},
            "reasoning-dropped": {"m-02"},
        }
    },
    "mini_swe_agent_wc.traj.json": {
        "demo__wc-1": {"reasoning-dropped": {"demo__wc-1:1", "demo__wc-1:2"}}
    },
    "codex": {
        "5f0c1a2e-7b3d-4e21-9a55-0d6c2b8e4f11": {
            "compaction": {f"5f0c1a2e-7b3d-4e21-9a55-0d6c2b8e4f11#{k}" for k in (4, 5)}
        }
    },
    "atif": {
        "run-7f3a#dc222679daa0": {
            "compaction": {"run-7f3a#dc222679daa0/run-7f3a-cont-1/3"},
            "sub-agent": {f"run-7f3a#dc222679daa0/run-7f3a-sub-1/{k}" for k in (3, 4)},
        },
        f"{HANDOFF}#e4ad9881396f": {
            "compaction": {f"{HANDOFF}#e4ad9881396f/{HANDOFF}-cont-1/{k}" for k in (5, 6)},
            "sub-agent": {
                f"{HANDOFF}#e4ad9881396f/{HANDOFF}-summarization-1-questions/2",
            },
        },
    },
    "opencode": {
        "ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ": {"sub-agent": {f"{OPENCODE_SUB}#{k}" for k in (0, 1)}}
    },
}


def _branches(out: Path, group: str) -> dict[str, set[str]]:
    """Each branch node's reason -> the call ids of the sequences ending under it."""
    tree = next(iter_trees(str(out), groups=[group]))
    got: dict[str, set[str]] = {}
    for v, reason in enumerate(tree.node_branch_reason):
        if reason:
            under = (tree.seq_node >= v) & (tree.seq_node <= tree.node_last[v])
            ids = {tree.seq_call_id[i] for i in under.nonzero()[0]}
            got.setdefault(reason, set()).update(ids)
    return got


@pytest.mark.parametrize("sample", sorted(CASES))
def test_each_branch_of_the_sample_is_named(
    sample: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "o"
    build(BuildConfig(inputs=[f"sample_data/{sample}"], out=str(out)))
    for group, want in CASES[sample].items():
        assert _branches(out, group) == want, group


def test_opencodes_sub_agent_call_left_out_as_a_duplicate_still_names_its_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenCode and Crush stores hold the same sub-agent call (``sqlite_samples.py`` writes
    both): built together, OpenCode's copy is dropped and the sub-agent's next call starts the
    branch."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "o"
    build(BuildConfig(inputs=["sample_data/crush", "sample_data/opencode_db"], out=str(out)))
    assert _branches(out, "ses_1") == {"sub-agent": {"ses_2/msg_06#1"}}
