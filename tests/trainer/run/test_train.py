"""``treeprep train``: the loop, exact resume, atomic checkpoints, refusals, tree == linear.

Every test trains a tiny Qwen3-shaped preset (hidden 64, vocabulary 265: the built-in byte
tokenizer's) on a build made from generated token rollouts: GRPO groups (one prompt, several
samples, larger than the budget, so the planner cuts them and parts recompute their prefix) and
agent chains (each call's prompt extends the previous call).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.errors import ShardError, TreeprepError  # noqa: E402
from treeprep.trainer.data.plans import make_plan  # noqa: E402
from treeprep.trainer.data.reader import BuildReader  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import TrainConfig, TrainingError, train  # noqa: E402

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
QWEN3 = DATA / "tokenizers" / "qwen3"
BUDGET = 160


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(32, 127, n).tolist()


def write_rollouts(path: Path, seed: int = 0) -> None:
    """GRPO groups of 4 samples (about 260 tree tokens, paths under 110) and 4-call agent chains."""
    rng = np.random.default_rng(seed)
    lines = []
    for g in range(3):
        prompt = _ids(rng, 50)
        for k in range(4):
            n = int(rng.integers(25, 55))
            lines.append(
                {
                    "group_id": f"grpo-{g}",
                    "call_id": f"grpo-{g}/{k}",
                    "trajectory_id": f"grpo-{g}/{k}",
                    "prompt_token_ids": prompt,
                    "generation_token_ids": _ids(rng, n),
                    "generation_log_probs": (-rng.random(n)).round(3).tolist(),
                    "reward": float(rng.random()),
                }
            )
    for a in range(3):
        prompt = _ids(rng, 30)
        for c in range(4):
            gen = _ids(rng, int(rng.integers(8, 16)))
            lines.append(
                {
                    "group_id": f"agent-{a}",
                    "call_id": f"agent-{a}/{c}",
                    "prompt_token_ids": prompt,
                    "generation_token_ids": gen,
                }
            )
            prompt = prompt + gen + _ids(rng, int(rng.integers(5, 12)))
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train-data")
    write_rollouts(root / "rollouts.jsonl")
    out = root / "build"
    build(BuildConfig(inputs=[str(root / "rollouts.jsonl")], out=str(out)))
    return out


def cfg(data: Path, run: Path, **kw) -> TrainConfig:
    base = dict(
        data=str(data),
        model="tiny-qwen3",
        run_dir=str(run),
        budget=BUDGET,
        steps_of=2,
        lr=3e-3,
        warmup_steps=2,
        device="cpu",
        attn="dense",
        keep=None,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("cut", ["handoff", "prefix"])
def test_plan_cuts_trees_and_covers_every_sequence_once(data: Path, cut: str) -> None:
    reader = BuildReader(str(data))
    plan = make_plan(reader, budget=BUDGET, steps_of=2, cut=cut)
    assert plan.summary.split_trees >= 1  # hand-off rows / recomputed prefixes are exercised
    seen: dict[str, list[int]] = {}
    for st in plan.steps:
        for p in st.parts:
            seen.setdefault(p.group_id, []).extend(p.seqs)
            if p.handoff_cuts:
                assert cut == "handoff" and p.prefix_tokens == 0
                assert max(np.diff(p.handoff_cuts)) <= BUDGET < p.tokens
            else:
                assert p.tokens + p.prefix_tokens <= BUDGET
    for shard in reader.shard_names:
        t = reader.table(shard)
        for r in range(t.num_rows):
            tree = reader.tree(shard, r)
            assert sorted(seen[tree["group_id"]]) == list(range(len(tree["seq_node"])))


@pytest.mark.parametrize("cut", ["handoff", "prefix"])
def test_tree_layout_trains_like_linear_layout(data: Path, tmp_path: Path, cut: str) -> None:
    """Every step's loss and the weights after 3 SGD steps equal the linear baseline's: the
    restored weights and the step-global normalization hold across hand-off parts (or cut trees
    with recomputed prefixes) and micro-batches."""
    runs = {}
    for layout in ("tree", "linear"):
        runs[layout] = train(
            cfg(
                data,
                tmp_path / layout,
                layout=layout,
                cut=cut,
                steps=3,
                optimizer="sgd",
                lr=0.5,
                norm="sequence-mean",
            )  # fmt: skip
        )
    lt, ll = runs["tree"].losses, runs["linear"].losses
    np.testing.assert_allclose(lt, ll, rtol=2e-6)
    assert lt[0] != lt[1]  # the steps hold different data, and the weights moved
    tree_tok = sum(m.tokens for m in runs["tree"].history)
    lin_tok = sum(m.tokens for m in runs["linear"].history)
    assert tree_tok < lin_tok
    assert sum(m.tokens_linear for m in runs["tree"].history) == lin_tok
    a = ckpt_mod.open_checkpoint(str(tmp_path / "tree")).model_state()
    b = ckpt_mod.open_checkpoint(str(tmp_path / "linear")).model_state()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_resume_gives_identical_losses(data: Path, tmp_path: Path) -> None:
    full = train(cfg(data, tmp_path / "full", steps=7, save_every=3))
    assert [c[0] for c in ckpt_mod.list_checkpoints(str(tmp_path / "full"))] == [3, 6, 7]
    part = tmp_path / "part"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-00000003", tmp_path / "ck3")
    resumed = train(cfg(data, part, steps=7, resume=str(tmp_path / "ck3")))
    assert [m.step for m in resumed.history] == [4, 5, 6, 7]
    assert resumed.losses == full.losses[3:]  # exactly, not approximately
    assert [m.lr for m in resumed.history] == [m.lr for m in full.history[3:]]
    assert [m.grad_norm for m in resumed.history] == [m.grad_norm for m in full.history[3:]]
    a = ckpt_mod.open_checkpoint(str(tmp_path / "full")).model_state()
    b = ckpt_mod.open_checkpoint(str(part)).model_state()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_from_run_folder_and_metrics_log(data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(cfg(data, run, steps=2, save_every=2))
    res = train(cfg(data, run, steps=4, resume=str(run)))
    assert [m.step for m in res.history] == [3, 4]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    for x in lines:
        assert x["tokens_linear"] > x["tokens"] > 0
        assert x["linear_tokens_per_s"] > x["tokens_per_s"] > 0
        assert np.isfinite([x["loss"], x["lr"], x["grad_norm"]]).all()


def test_checkpoint_loads_in_transformers(data: Path, tmp_path: Path) -> None:
    import transformers as tf

    from treeprep.trainer import load_model, tree_logits
    from treeprep.trainer.batch import TreeBatch

    res = train(cfg(data, tmp_path / "run", steps=2))
    mdir = ckpt_mod.open_checkpoint(res.checkpoint).model_dir
    plain = tf.AutoModelForCausalLM.from_pretrained(mdir)  # no treeprep registration needed
    assert plain.config._attn_implementation != "treeprep"
    init = load_model("tiny-qwen3", vocab_size=plain.config.vocab_size)
    moved = [k for k, v in init.state_dict().items() if not torch.equal(v, plain.state_dict()[k])]
    assert moved  # the checkpoint holds the trained weights, not the initial ones
    # plain transformers on one path equals treeprep's tree attention on the same weights
    ids = list(range(40, 90))
    row = {
        "group_id": "g", "input_ids": ids, "node_parent": [-1], "node_offset": [0],
        "node_length": [len(ids)], "node_depth": [0], "node_last": [0], "seq_node": [0],
        "seq_count": [1], "seq_loss_spans": [[1, len(ids)]], "seq_logprobs": [None],
        "seq_advantage": [None], "seq_reward": [None],
    }  # fmt: skip
    with torch.no_grad():
        ref = plain(torch.tensor([ids])).logits[0]
        ours = tree_logits(load_model(mdir, attn="dense"), TreeBatch.from_trees([row]))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_crash_mid_save_never_leaves_a_whole_looking_checkpoint(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    train(cfg(data, run, steps=2, save_every=2))
    real = ckpt_mod.torch.save

    def dying_save(obj, f, *a, **kw):  # the optimizer file is written, then the crash
        real(obj, f, *a, **kw)
        if str(getattr(f, "name", f)).endswith("scheduler.pt"):  # a path or an open file
            raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(ckpt_mod.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train(cfg(data, run, steps=4, save_every=2, resume=str(run)))
    monkeypatch.undo()
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == [".tmp-step-00000004", "step-00000002"]
    assert ckpt_mod.latest_checkpoint(str(run)).endswith("step-00000002")
    with pytest.raises(ckpt_mod.CheckpointError, match="not a whole checkpoint"):
        ckpt_mod.open_checkpoint(str(run / "checkpoints" / ".tmp-step-00000004"))
    res = train(cfg(data, run, steps=4, save_every=2, resume=str(run)))
    assert [m.step for m in res.history] == [3, 4]
    assert sorted(os.listdir(run / "checkpoints")) == ["step-00000002", "step-00000004"]


def test_nan_stops_before_the_update(data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"step \d+ .*stopped before the update"):
        train(cfg(data, run, steps=6, optimizer="sgd", lr=1e30, grad_clip=None, warmup_steps=0))
    assert ckpt_mod.list_checkpoints(str(run)) == []
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(np.isfinite(json.loads(x)["loss"]) for x in lines)


def test_refuses_other_schema_version(data: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["schema_version"] = 99
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match="schema version 99.*rebuild"):
        train(cfg(bad, tmp_path / "run", steps=1))
    # a shard whose own metadata disagrees is refused too
    import pyarrow as pa
    import pyarrow.ipc as ipc

    bad2 = tmp_path / "bad2"
    shutil.copytree(data, bad2)
    shard = bad2 / json.loads((bad2 / "manifest.json").read_text())["shards"][0]["path"]
    with pa.memory_map(str(shard), "r") as src:
        t = ipc.open_file(src).read_all()
    t = t.replace_schema_metadata({b"treeprep.schema_version": b"1"})
    with pa.OSFile(str(shard), "wb") as sink, ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    # the manifest vouches for the rewritten shard (else its sha256 check refuses it first)
    import hashlib

    m2 = json.loads((bad2 / "manifest.json").read_text())
    m2["shards"][0].update(
        bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest()
    )
    (bad2 / "manifest.json").write_text(json.dumps(m2))
    with pytest.raises(ShardError, match="shard schema version 1"):
        train(cfg(bad2, tmp_path / "run2", steps=1))


@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data is absent")
def test_refuses_shards_of_another_tokenizer(data: Path, tmp_path: Path) -> None:
    from treeprep.render import Renderer
    from treeprep.trainer import load_model
    from treeprep.trainer.data.reader import tokenizer_sha256

    mdir = tmp_path / "model"
    load_model("tiny-qwen3", vocab_size=151936).save_pretrained(mdir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3 / f, mdir / f)
    # the model folder's identity is exactly the one a build with that tokenizer records, by
    # content and (for manifests written before that) by the files' bytes
    ident = Renderer.load(str(mdir)).identity_by_content()
    assert tokenizer_sha256(str(mdir)) == ident.content_sha256
    assert tokenizer_sha256(str(mdir), by_content=False) == ident.sha256
    # a build of the built-in byte tokenizer is refused, with the reason
    with pytest.raises(ShardError, match="byte tokenizer, which only suits the tiny.*--tokenizer"):
        train(cfg(data, tmp_path / "run", model=str(mdir), steps=1))


def test_refuses_token_ids_outside_the_vocabulary(data: Path, tmp_path: Path) -> None:
    from treeprep.trainer import load_model

    mdir = tmp_path / "model"
    load_model("tiny-qwen3", vocab_size=100).save_pretrained(mdir)
    with pytest.raises(ShardError, match="outside the model's vocabulary"):
        train(cfg(data, tmp_path / "run", model=str(mdir), steps=1))


def test_plan_folder_from_pack_runs_like_the_in_memory_plan(data: Path, tmp_path: Path) -> None:
    from treeprep.pack import PackConfig, pack

    plan_dir, _ = pack(str(data), PackConfig(budget=BUDGET, steps_of=2, model="qwen3-0.6b"))
    a = train(cfg(data, tmp_path / "a", plan=plan_dir, epochs=1))
    b = train(cfg(data, tmp_path / "b", epochs=1))
    assert a.plan_source == plan_dir and b.plan_source == "in memory"
    # the rank cost model differs, the steps' contents do not: same losses
    assert len(a.history) == len(b.history)
    np.testing.assert_allclose(a.losses, b.losses, rtol=1e-6)
    other = tmp_path / "other"
    shutil.copytree(data, other)
    (other / "manifest.json").write_text((other / "manifest.json").read_text() + " ")
    with pytest.raises(ShardError, match="another build"):
        train(cfg(other, tmp_path / "c", plan=plan_dir, steps=1))


def test_bad_config_is_refused(data: Path, tmp_path: Path) -> None:
    with pytest.raises(TreeprepError, match="steps or epochs"):
        cfg(data, tmp_path, steps=2, epochs=1)
    with pytest.raises(TreeprepError, match="optimizer"):
        cfg(data, tmp_path, optimizer="lion")
    assert cfg(data, tmp_path).prefetch is True  # the default


def test_cli_train_json_and_activation_checkpointing(data: Path, tmp_path: Path) -> None:
    from treeprep.cli.app import app

    run = tmp_path / "run"
    args = ["train", str(data), "--model", "tiny-qwen3", "--steps", "3", "--out", str(run),
            "--budget", str(BUDGET), "--steps-of", "2", "--device", "cpu", "--attn", "dense",
            "--optimizer", "sgd", "--lr", "0.5", "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args + ["--activation-checkpointing"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{") :])
    assert out["steps"] == 3 and out["tokens_linear"] > out["tokens"]
    ref = train(cfg(data, tmp_path / "ref", steps=3, optimizer="sgd", lr=0.5, warmup_steps=0))
    got = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(got, ref.losses, rtol=1e-6)  # recomputation changes nothing
    bad = CliRunner().invoke(app, ["train", str(tmp_path / "nope"), "--model", "tiny-qwen3"])
    assert bad.exit_code != 0


def test_rl_step_metrics_in_float64(tmp_path: Path) -> None:
    """Issue 16: per-step RL metrics in metrics.jsonl; --precision float64 trains in float64.
    Agent groups hold two sampled chains each, the reward on a chain's last call only."""
    rng = np.random.default_rng(4)
    lines = []
    for g in range(4):
        prompt = _ids(rng, 20)
        for k in range(2):
            p = prompt
            for c in range(3):
                gen = _ids(rng, int(rng.integers(6, 12)))
                rec = {
                    "group_id": f"agent-{g}",
                    "trajectory_id": f"agent-{g}/{k}",
                    "call_id": f"agent-{g}/{k}/{c}",
                    "prompt_token_ids": p,
                    "generation_token_ids": gen,
                    "generation_log_probs": (-rng.random(len(gen))).round(3).tolist(),
                }
                if c == 2:
                    rec["reward"] = float(k)
                lines.append(rec)
                p = p + gen + _ids(rng, 4)
    src = tmp_path / "agents.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = tmp_path / "build"
    build(BuildConfig(inputs=[str(src)], out=str(data)))
    run = tmp_path / "rl"
    res = train(
        cfg(
            data,
            run,
            steps=2,
            loss="grpo",
            norm="trajectory-mean",
            adv_norm="rloo",
            clip_eps=0.1,
            clip_eps_high=0.3,
            entropy_coef=0.01,
            precision="float64",
            save_final=False,
        )  # fmt: skip
    )
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and len(res.history) == 2
    for m in lines:
        for k in ("clip_frac", "approx_kl", "entropy", "entropy_term", "adv_mean", "adv_std"):
            assert k in m and np.isfinite(m[k]), k
        assert 0.0 <= m["clip_frac"] <= 1.0
        assert m["adv_min"] <= m["adv_mean"] <= m["adv_max"]
        assert m["entropy"] > 0
        # rloo over two trajectories per group, rewards 0 and 1: every call carries +-1
        assert m["adv_min"] == pytest.approx(-1.0) and m["adv_max"] == pytest.approx(1.0)
    cfgd = json.loads((run / "config.json").read_text())
    assert cfgd["precision"] == "float64" and cfgd["adv_norm"] == "rloo"


def test_tampered_plans_are_refused(data: Path, tmp_path: Path) -> None:
    """A plan file must describe this build exactly (issue 15 item 2): a part repeated, a shard
    from elsewhere, or a micro-batch over the budget are refused before any training."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from treeprep.pack import PackConfig, pack
    from treeprep.trainer.data.plans import load_plan

    out = tmp_path / "build"
    shutil.copytree(data, out)
    plan_dir, _ = pack(str(out), PackConfig(budget=BUDGET, steps_of=2))
    reader = BuildReader(str(out))
    load_plan(reader, plan_dir)  # the untampered plan loads
    path = Path(plan_dir) / "plan.arrow"
    good = path.read_bytes()
    table = ipc.open_file(pa.BufferReader(good)).read_all()  # in memory: the file is rewritten

    def write(t: pa.Table) -> None:
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, t.schema) as w:
            w.write_table(t)

    ordinary = [i for i, c in enumerate(table.column("handoff_cuts").to_pylist()) if not c]
    write(pa.concat_tables([table, table.take([ordinary[0]])]))  # one part twice
    with pytest.raises(ShardError, match="exactly once|over the budget"):
        load_plan(reader, plan_dir)
    shards = table.column("shard").to_pylist()
    shards[0] = "../elsewhere.arrow"
    write(table.set_column(table.schema.get_field_index("shard"), "shard", pa.array(shards)))
    with pytest.raises(ShardError, match="not part of this build"):
        load_plan(reader, plan_dir)
    path.write_bytes(good)
    load_plan(reader, plan_dir)


def _prefetch_threads() -> list:
    import threading

    from treeprep.trainer.data.prefetch import THREAD_NAME

    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def test_prefetch_is_bit_identical_to_building_batches_inline(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 12: with prefetch the step batches are built in the background thread, one step
    ahead; losses, metrics and weights equal those of the inline run bit for bit, across an epoch
    boundary (4 steps; the plan has 3), and no thread is left when train() returns."""
    import threading

    from treeprep.trainer.data import prefetch as prefetch_mod
    from treeprep.trainer.data import steps as data_mod

    built_in: dict[bool, list[str]] = {True: [], False: []}
    real = data_mod.step_batches
    runs = {}
    for prefetch in (True, False):

        def spy(*a, _p=prefetch, **kw):
            built_in[_p].append(threading.current_thread().name)
            return real(*a, **kw)

        monkeypatch.setattr(data_mod, "step_batches", spy)
        runs[prefetch] = train(cfg(data, tmp_path / str(prefetch), steps=4, prefetch=prefetch))
        assert not _prefetch_threads()
    assert built_in[True] == [prefetch_mod.THREAD_NAME] * 4
    assert built_in[False] == ["MainThread"] * 4
    on, off = runs[True].history, runs[False].history
    assert [m.epoch for m in on] == [0, 0, 0, 1]
    keys = ("loss", "lr", "grad_norm", "tokens", "tokens_linear", "targets", "micro_batches")
    for a, b in zip(on, off, strict=True):
        assert all(getattr(a, k) == getattr(b, k) for k in keys)
        assert a.extra == b.extra
    wa = ckpt_mod.open_checkpoint(str(tmp_path / "True")).model_state()
    wb = ckpt_mod.open_checkpoint(str(tmp_path / "False")).model_state()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("prefetch", [True, False])
def test_error_building_a_batch_surfaces_from_train(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefetch: bool
) -> None:
    """An error raised while the second step's batches are built (in the prefetch thread, or
    inline) comes out of train() as itself, after the first step; no thread is left, and none is
    left either when the step itself fails while the next batches are being built."""
    from treeprep.trainer.data import steps as data_mod

    real = data_mod.step_batches
    calls: list[int] = []

    def failing(reader, sp, **kw):
        calls.append(sp.index)
        if len(calls) == 2:
            raise ShardError(f"part-00000.arrow: row 7 is damaged (plan step {sp.index})")
        return real(reader, sp, **kw)

    monkeypatch.setattr(data_mod, "step_batches", failing)
    run = tmp_path / "run"
    with pytest.raises(ShardError, match=r"^part-00000.arrow: row 7 is damaged \(plan step 1\)$"):
        train(cfg(data, run, steps=3, prefetch=prefetch))
    assert calls == [0, 1]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert not _prefetch_threads()
    monkeypatch.undo()
    with pytest.raises(TrainingError, match="stopped before the update"):
        train(cfg(data, tmp_path / "nan", steps=3, optimizer="sgd", lr=1e30, grad_clip=None,
                  warmup_steps=0, prefetch=prefetch))  # fmt: skip
    assert not _prefetch_threads()


def test_an_unwritable_run_folder_is_one_error_line(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 12 for the run folder's own files: config.json and metrics.jsonl."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(TreeprepError, match=r"a-file/run: cannot write: .*Not a directory"):
        train(cfg(data, blocker / "run", steps=1))
    # a full disk on the metrics log (after config.json was written)
    real = open

    def full(path, mode="r", *a, **kw):  # noqa: ANN001, ANN202
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(28, "No space left on device")
        return real(path, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", full)
    with pytest.raises(TreeprepError, match=r"metrics\.jsonl: cannot write: no space left.*ENOSPC"):
        train(cfg(data, tmp_path / "run", steps=1))
