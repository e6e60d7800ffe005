"""``group_by_prefix`` on ``treeprep train`` (issue 29 item 3): an in-memory epoch plan orders the
trees by their opening tokens, as ``treeprep pack --group-by-prefix`` does, so a micro-batch holds
trees that share their opening and the trainer's merge (:mod:`treeprep.pack.share`) feeds it once.

A build of eight agent chains, four opening with one "system prompt" and four with another, at a
budget of two trees per micro-batch and two micro-batches per step: the seeded order mixes the two
openings, the grouped one never does. The grouped plan covers the same trees, is the same for the
same seed and epoch, and a resumed run plans the same steps (losses equal to the uninterrupted
run's, exactly); each of its micro-batches, merged, has the gradients of its sequences run one by
one (the verify path, 1e-5 in float32); a resume with the other value is refused, naming it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import tiny  # noqa: E402

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import CheckpointError, TrainingError  # noqa: E402
from treeprep.trainer import verify_gradients  # noqa: E402
from treeprep.trainer.config import TrainConfig  # noqa: E402
from treeprep.trainer.data.plans import EpochPlan, make_plan  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import train  # noqa: E402

BUDGET = 300  # two trees (about 130 tokens each) per micro-batch


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(32, 127, n).tolist()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight 3-call agent chains; chains 0-3 open with prompt A, 4-7 with prompt B (40 tokens)."""
    root = tmp_path_factory.mktemp("prefix-data")
    rng = np.random.default_rng(7)
    system = {"a": _ids(rng, 40), "b": _ids(rng, 40)}
    lines = []
    for g in range(8):
        fam = "a" if g < 4 else "b"
        prompt = system[fam] + _ids(rng, 20)
        for c in range(3):
            gen = _ids(rng, int(rng.integers(8, 16)))
            lines.append(
                {
                    "group_id": f"{fam}-{g}",
                    "call_id": f"{fam}-{g}/{c}",
                    "prompt_token_ids": prompt,
                    "generation_token_ids": gen,
                }
            )
            prompt = prompt + gen + _ids(rng, int(rng.integers(5, 12)))
    (root / "logs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = root / "build"
    build(BuildConfig(inputs=[str(root / "logs.jsonl")], out=str(out)))
    return out


def _cfg(data: Path, run: Path, **kw) -> TrainConfig:
    base = dict(
        data=str(data), model="tiny-qwen3", run_dir=str(run), budget=BUDGET, steps_of=2,
        lr=3e-3, device="cpu", attn="dense", keep=None,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _micro_batches(plan: EpochPlan) -> list[list[str]]:
    """Per non-empty micro-batch, its trees' group ids, step by step."""
    return [[p.group_id for p in mb] for st in plan.steps for r in st.slots for mb in r if mb]


def _plan(data: Path, seed: int, grouped: bool) -> EpochPlan:
    reader = BuildReader(str(data))
    return make_plan(reader, budget=BUDGET, steps_of=2, seed=seed, group_by_prefix=grouped)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_plan_puts_like_openings_in_a_micro_batch(data: Path, seed: int) -> None:
    plain, grouped = _plan(data, seed, False), _plan(data, seed, True)
    pmb, gmb = _micro_batches(plain), _micro_batches(grouped)
    trees = [f"{'ab'[g // 4]}-{g}" for g in range(8)]
    assert sorted(sum(pmb, [])) == sorted(sum(gmb, [])) == trees  # the same trees
    assert all(len(mb) == 2 for mb in gmb)
    assert all(len({g[0] for g in mb}) == 1 for mb in gmb)  # one opening per micro-batch
    assert grouped.summary.group_by_prefix and not plain.summary.group_by_prefix
    assert grouped.summary.tokens_shared == 4 * 40  # each micro-batch feeds its 40 once less
    assert plain.summary.tokens_shared <= grouped.summary.tokens_shared
    assert _micro_batches(_plan(data, seed, True)) == gmb  # deterministic for a seed


def test_the_seeded_order_mixes_the_openings(data: Path) -> None:
    """Without grouping some micro-batch holds both openings (else the test above shows nothing)."""
    mixed = [mb for s in range(3) for mb in _micro_batches(_plan(data, s, False))]
    assert any(len({g[0] for g in mb}) == 2 for mb in mixed)


def test_grouped_micro_batches_have_exact_gradients(data: Path) -> None:
    reader = BuildReader(str(data))
    model = tiny()
    plan = _plan(data, 0, True)
    checked = 0
    for st in plan.steps:
        for mb in (mb for r in st.slots for mb in r if len(mb) > 1):
            rows = [reader.tree(p.shard, p.row) for p in mb]
            rep = verify_gradients(model, rows, share_prefixes=True, tol=1e-5)
            assert rep.ok, rep
            assert rep.tokens_tree < sum(len(r["input_ids"]) for r in rows)  # merged
            checked += 1
    assert checked == 4


def test_a_resumed_grouped_run_plans_the_same_steps(data: Path, tmp_path: Path) -> None:
    """Four steps are two epochs (seeds 0 and 1): the resumed run, from step 2, repeats the
    uninterrupted run's losses exactly."""
    full = train(_cfg(data, tmp_path / "full", steps=4, save_every=2, group_by_prefix=True))
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-00000002", tmp_path / "ck2")
    resumed = train(
        _cfg(data, tmp_path / "part", steps=4, resume=str(tmp_path / "ck2"), group_by_prefix=True)
    )
    assert [m.step for m in resumed.history] == [3, 4]
    assert resumed.losses == full.losses[2:]
    plain = train(_cfg(data, tmp_path / "plain", steps=4))
    assert plain.losses != full.losses  # other steps
    fed = sum(m.tokens for m in full.history)
    assert fed < sum(m.tokens for m in plain.history)  # like openings merged


@pytest.mark.parametrize(("then", "now"), [(False, True), (True, False)])
def test_a_resume_with_the_other_value_is_refused(
    data: Path, tmp_path: Path, then: bool, now: bool
) -> None:
    run = tmp_path / "run"
    train(_cfg(data, run, steps=1, group_by_prefix=then))
    with pytest.raises(CheckpointError, match=f"group_by_prefix was {then} in the checkpoint"):
        train(_cfg(data, run, steps=2, resume="auto", group_by_prefix=now))
    assert [s for s, _ in ckpt_mod.list_checkpoints(str(run))] == [1]


def test_a_plan_folder_is_not_reordered(data: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="group_by_prefix orders an in-memory plan"):
        _cfg(data, tmp_path / "run", plan=str(tmp_path), group_by_prefix=True)
