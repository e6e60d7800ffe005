"""Issue 29 item 4: the plan's ``tokens_shared`` is what the trainer's merge saves, micro-batch by
micro-batch (not a lower bound from each tree's opening).

Random builds: GRPO groups and agent chains, most opening with one of two "system prompts", some
groups sharing a whole first turn (so trees share past their first branch), at budgets that put
several trees in a micro-batch and run the largest as hand-off parts. For every micro-batch, the
packer's count (:func:`treeprep.pack.openings.shared_per_slot`) equals the tokens the trainer's
assembly (:func:`treeprep.trainer.data.steps.step_batches`) feeds less with ``share_prefixes``
than without, and the plan's ``tokens_shared`` is their sum.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.pack import load_forest  # noqa: E402
from treeprep.pack.openings import shared_per_slot  # noqa: E402
from treeprep.trainer.data.plans import make_plan  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402
from treeprep.trainer.data.steps import step_batches  # noqa: E402


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(32, 127, n).tolist()


def _logs(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    system = [_ids(rng, int(rng.integers(30, 60))) for _ in range(2)]
    turn = _ids(rng, 12)  # a first user turn some groups share: sharing past a branch
    lines = []
    for g in range(int(rng.integers(8, 14))):
        sys_ = system[g % 2] if g % 5 else []
        first = turn if g % 4 in (0, 1) else _ids(rng, 12)
        if g % 2:  # a GRPO group: samples branch right after the prompt
            prompt = sys_ + first
            for k in range(int(rng.integers(2, 5))):
                gen = first[:4] + _ids(rng, int(rng.integers(4, 30))) if k % 2 else _ids(rng, 9)
                lines.append({"group_id": f"g{g}", "call_id": f"g{g}/{k}",
                              "prompt_token_ids": prompt, "generation_token_ids": gen,
                              "reward": float(rng.random())})  # fmt: skip
            continue
        prompt = sys_ + first
        for c in range(int(rng.integers(1, 5))):
            gen = _ids(rng, int(rng.integers(4, 20)))
            lines.append({"group_id": f"g{g}", "call_id": f"g{g}/{c}",
                          "prompt_token_ids": prompt, "generation_token_ids": gen})  # fmt: skip
            prompt = prompt + gen + _ids(rng, int(rng.integers(3, 9)))
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize(("seed", "budget"), [(0, 100), (1, 160), (2, 250), (1, 400), (4, 160)])
def test_pack_counts_what_the_assembly_merges(tmp_path: Path, seed: int, budget: int) -> None:
    _logs(tmp_path / "logs.jsonl", seed)
    out = tmp_path / "build"
    build(BuildConfig(inputs=[str(tmp_path / "logs.jsonl")], out=str(out)))
    reader = BuildReader(str(out))
    forest = load_forest(str(out))
    where = zip(forest.tree_shard, forest.tree_row, strict=True)
    index = {(forest.shard_names[s], int(r)): t for t, (s, r) in enumerate(where)}
    plan = make_plan(reader, budget=budget, world_size=2, steps_of=2, seed=seed)
    trees, slots, saved = [], [], []
    for st in plan.steps:
        plain = step_batches(reader, st, ranks=[0, 1], budget=budget, share_prefixes=False)
        merged = step_batches(reader, st, ranks=[0, 1], budget=budget)
        for r, rank in enumerate(st.slots):
            for m, mb in enumerate(rank):
                if not mb or mb[0].handoff_cuts:
                    continue
                trees += [index[(p.shard, p.row)] for p in mb]
                slots += [len(saved)] * len(mb)
                saved.append(plain[r][m].num_tokens - merged[r][m].num_tokens)
    counted = shared_per_slot(forest, np.array(trees), np.array(slots))
    assert counted.tolist() == saved
    assert plan.summary.tokens_shared == sum(saved) > 0
    assert plan.summary.handoff_trees or budget > 100  # at 100, hand-off rows are in the mix
