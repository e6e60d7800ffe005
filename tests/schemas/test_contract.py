"""schemas/: the records and manifest paths refuse what the contract forbids, with the reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from treeprep.schemas import TokenRollout
from treeprep.schemas.manifest import check_relative_path


@pytest.mark.parametrize("path", ["shards/part-00000.arrow", "a", "rejects.jsonl"])
def test_relative_paths_inside_the_build_pass_unchanged(path: str) -> None:
    assert check_relative_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "/abs/x", "../x", "a/../b", "a//b", "./a", "a\\b", "C:/x", "a\0b", "a/"]
)
def test_paths_leaving_the_build_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="not a relative path inside the build folder"):
        check_relative_path(path)


def _rollout(**kw) -> TokenRollout:
    base = {"call_id": "c", "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4, 5]}
    return TokenRollout(**{**base, **kw})


def test_a_token_rollout_keeps_its_fields() -> None:
    r = _rollout(generation_log_probs=[-0.1, -0.2, -0.3], reward=1.0)
    assert r.generation_token_ids == [3, 4, 5] and r.reward == 1.0 and r.agent_id == "main"


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"prompt_token_ids": [], "generation_token_ids": []}, "at least one token"),
        ({"prompt_token_ids": [1, -2]}, "non-negative"),
        ({"generation_log_probs": [-0.1]}, "generation_log_probs has 1 entries"),
        ({"ref_log_probs": [-0.1, -0.2]}, "ref_log_probs has 2 entries"),
    ],
)
def test_bad_token_rollouts_are_refused_with_the_reason(kw: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        _rollout(**kw)
