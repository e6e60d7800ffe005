"""Checkpoints and training under attack (issue 15): a pickle payload never runs (item 1), a
truncated or flipped checkpoint file stops a resume with the file's name (20), and ``train``
refuses a build with no trainable target instead of looping (19)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hostile import rollout, write_jsonl  # noqa: E402

from treeprep.build import BuildConfig, build  # noqa: E402
from treeprep.trainer.run import checkpoint as ckpt_mod  # noqa: E402
from treeprep.trainer.run.loop import TrainConfig, TrainingError, train  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    rows = [rollout(f"g{i % 2}", [40 + i, 41, 42], [50 + i, 51], call_id=str(i)) for i in range(6)]
    write_jsonl(root / "r.jsonl", rows)
    build(BuildConfig(inputs=[str(root / "r.jsonl")], out=str(root / "build")))
    train(_cfg(root / "build", root / "run", steps=2, save_every=1))
    return root / "build", root / "run"


def _cfg(data: Path, run_dir: Path, **kw) -> TrainConfig:
    base = dict(data=str(data), model="tiny-qwen3", run_dir=str(run_dir), budget=64, lr=1e-3,
                device="cpu", attn="dense", keep=None)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _copy_ckpt(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ck"
    shutil.copytree(run_dir / "checkpoints" / "step-00000001", dst)
    return dst


class _Payload:
    def __reduce__(self):  # a pickle that would run code when loaded
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng-rank0.pt"])
def test_pickle_payload_in_a_checkpoint_never_runs(
    run: tuple[Path, Path], tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ck = _copy_ckpt(run[1], tmp_path)
    torch.save({"state": _Payload()}, ck / name)
    # re-sign the file in state.json: the attacker controls the whole folder
    st = json.loads((ck / "state.json").read_text())
    st["files"] = ckpt_mod.checksum_files(str(ck))
    (ck / "state.json").write_text(json.dumps(st))
    with pytest.raises(ckpt_mod.CheckpointError, match="cannot be loaded safely"):
        train(_cfg(run[0], tmp_path / "resumed", steps=2, resume=str(ck)))
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("name", "damage"),
    [("model/model.safetensors", "flip"), ("model/model.safetensors", "truncate"),
     ("optimizer.pt", "truncate"), ("rng-rank0.pt", "flip"), ("model/config.json", "delete")],
)  # fmt: skip
def test_damaged_checkpoint_file_is_named(
    run: tuple[Path, Path], tmp_path: Path, name: str, damage: str
) -> None:
    ck = _copy_ckpt(run[1], tmp_path)
    p = ck / name
    if damage == "delete":
        p.unlink()
    else:
        data = bytearray(p.read_bytes())
        if damage == "flip":
            data[len(data) * 2 // 3] ^= 0x01
        else:
            del data[len(data) // 2 :]
        p.write_bytes(bytes(data))
    with pytest.raises(ckpt_mod.CheckpointError, match=name.split("/")[-1]):
        ckpt_mod.open_checkpoint(str(ck))


def test_resume_from_an_intact_checkpoint_still_works(run: tuple[Path, Path], tmp_path: Path):
    ck = _copy_ckpt(run[1], tmp_path)
    res = train(_cfg(run[0], tmp_path / "resumed", steps=2, resume=str(ck)))
    full = [json.loads(x) for x in (run[1] / "metrics.jsonl").read_text().splitlines()]
    assert res.losses == [full[1]["loss"]]


def test_train_refuses_a_build_with_no_trainable_target(run: tuple[Path, Path], tmp_path: Path):
    empty = tmp_path / "empty"
    shutil.copytree(run[0], empty)
    m = json.loads((empty / "manifest.json").read_text())
    m["shards"] = []
    m["counts"].update(trees=0, sequences=0, nodes=0, tokens_tree=0, tokens_linear=0)
    (empty / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TrainingError, match="no trainable target"):
        train(_cfg(empty, tmp_path / "r", steps=3))


def _resign(ck: Path) -> None:
    st = json.loads((ck / "state.json").read_text())
    st["files"] = ckpt_mod.checksum_files(str(ck))
    (ck / "state.json").write_text(json.dumps(st))


def _zero_weights(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path))
    save_file({k: torch.zeros_like(v) for k, v in sd.items()}, str(path))


@pytest.mark.parametrize(
    "added",
    ["model/model.safetensors.index.json", "model/adapter_model.safetensors", "model/evil.bin"],
)
def test_unlisted_weights_in_a_checkpoint_are_refused(
    run: tuple[Path, Path], tmp_path: Path, added: str
) -> None:
    """Issue 26 item 13: a weights or index file that state.json does not list, added to a
    verified checkpoint, used to win over the listed model.safetensors (the index)."""
    ck = _copy_ckpt(run[1], tmp_path)
    evil = tmp_path / "evil.safetensors"
    shutil.copy(ck / "model" / "model.safetensors", evil)
    _zero_weights(evil)
    keys = json.loads((ck / "state.json").read_text())["files"]
    assert added not in keys
    if added.endswith(".index.json"):
        shutil.copy(evil, ck / "model" / "zeros.safetensors")
        from safetensors import safe_open

        with safe_open(str(evil), "pt") as f:
            wm = {k: "zeros.safetensors" for k in f.keys()}
        (ck / added).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    else:
        shutil.copy(evil, ck / added)
    with pytest.raises(ckpt_mod.CheckpointError, match=r"does not list"):
        ckpt_mod.open_checkpoint(str(ck))


def test_index_names_outside_the_model_folder_are_refused(
    run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A listed (re-signed) index whose weight_map joins ``../``: nothing outside the verified
    files is read."""
    ck = _copy_ckpt(run[1], tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(ck / "model" / "model.safetensors", outside)
    (ck / "model" / "model.safetensors").rename(ck / "model" / "shard.safetensors")
    wm = {"a": "shard.safetensors", "b": "../../outside.safetensors"}
    (ck / "model" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    _resign(ck)
    c = ckpt_mod.open_checkpoint(str(ck))
    with pytest.raises(ckpt_mod.CheckpointError, match=r"weight_map names '\.\./\.\./outside"):
        c.model_state()
    wm["b"] = "other.safetensors"  # a plain name, but not a listed file
    (ck / "model" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    _resign(ck)
    with pytest.raises(ckpt_mod.CheckpointError, match=r"'model/other.safetensors' is not among"):
        ckpt_mod.open_checkpoint(str(ck)).model_state()


def test_a_listed_sharded_index_still_loads(run: tuple[Path, Path], tmp_path: Path) -> None:
    """save_pretrained's sharded layout (an index and its shards, all listed) loads every shard."""
    from safetensors.torch import load_file, save_file

    ck = _copy_ckpt(run[1], tmp_path)
    sd = load_file(str(ck / "model" / "model.safetensors"))
    (ck / "model" / "model.safetensors").unlink()
    keys = sorted(sd)
    half = len(keys) // 2
    wm = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(ck / "model" / name))
        wm.update({k: name for k in part})
    (ck / "model" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    _resign(ck)
    got = ckpt_mod.open_checkpoint(str(ck)).model_state()
    assert sorted(got) == keys and all(torch.equal(got[k], sd[k]) for k in keys)
