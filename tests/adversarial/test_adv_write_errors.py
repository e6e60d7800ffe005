"""A full disk or a read-only OUT is one TreeprepError line naming the path and the cause
(issue 26, item 12), in the build and in the trainer's checkpoints; the data stays safe.

Before, these ended in raw tracebacks: ``OSError: [Errno 28]`` from the work files, pyarrow's
"Error writing bytes to file" (which names no path) from the shard writer, ``OSError: [Errno 30]``
from the first ``makedirs``, torch's ``inline_container.cc`` RuntimeError and safetensors'
SafetensorError from a checkpoint. The failures are simulated by monkeypatching the write calls
(the tests may run as root, where ``chmod`` does not stop a write); a tmpfs of 8 KB to 2 MB
mounted by hand gave the same messages.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from hostile import output_hashes, rollout, write_jsonl

from treeprep import atomic
from treeprep.build import BuildConfig, build
from treeprep.errors import TreeprepError


def _logs(root: Path) -> Path:
    logs = root / "logs"
    for f in range(3):
        rows = [
            rollout(f"g{f}", [1, 2, 3, f], [10 + i, 20 + f], call_id=f"{f}/{i}") for i in range(4)
        ]
        write_jsonl(logs / f"f{f}.jsonl", rows)
    return logs


def _enospc_on(monkeypatch: pytest.MonkeyPatch, what: str, out: Path) -> None:
    """Make one kind of write under ``out`` fail as a full disk does."""
    if what == "pyarrow":  # pyarrow's own message, without a path or a filename
        real = pa.OSFile

        def osfile(path, mode="r", *a, **kw):
            if "w" in mode and str(path).startswith(str(out)):
                raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28]")
            return real(path, mode, *a, **kw)

        monkeypatch.setattr(pa, "OSFile", osfile)
    elif what == "rename":  # the commit of a work file, a marker, a shard or the manifest
        real_replace = os.replace

        def replace(src, dst, *a, **kw):
            if str(dst).startswith(str(out)):
                raise OSError(errno.ENOSPC, "No space left on device", str(src))
            return real_replace(src, dst, *a, **kw)

        monkeypatch.setattr(atomic.os, "replace", replace)
    else:  # read-only OUT: the first folder a build creates
        real_makedirs = os.makedirs

        def makedirs(path, *a, **kw):
            if str(path).startswith(str(out)):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real_makedirs(path, *a, **kw)

        monkeypatch.setattr(os, "makedirs", makedirs)


@pytest.mark.parametrize(
    ("what", "cause"),
    [("pyarrow", "no space left"), ("rename", "no space left"), ("readonly", "read-only")],
)
def test_build_write_failure_is_one_line_naming_path_and_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, cause: str
) -> None:
    logs, out = _logs(tmp_path), tmp_path / "out"
    cfg = BuildConfig(inputs=[str(logs)], out=str(out))
    with monkeypatch.context() as m:
        _enospc_on(m, what, out)
        with pytest.raises(TreeprepError) as e:
            build(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(out)) and cause in msg, msg
    assert not list(out.rglob("*.tmp")), "a half-written temporary file was left behind"
    # the data stays safe: the rerun publishes what a clean build publishes
    build(cfg)
    clean = tmp_path / "clean"
    build(BuildConfig(inputs=[str(logs)], out=str(clean)))
    assert output_hashes(out) == output_hashes(clean)


def test_write_atomic_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "fsync_path", full)
    target = tmp_path / "x.json"
    with pytest.raises(TreeprepError, match=r"x\.json: cannot write: no space left .*ENOSPC"):
        atomic.write_atomic(str(target), b"{}")
    assert not target.exists() and not (tmp_path / "x.json.tmp").exists()


def test_reports_plans_and_exports_fail_as_one_line_naming_the_path(tmp_path: Path) -> None:
    """``stats --plot``, ``pack`` and ``export`` write through the same helper: a destination that
    cannot be written (here a real OS error, a file where a folder must be) is one error line."""
    from treeprep.export import export_sequences
    from treeprep.pack import PackConfig, pack
    from treeprep.stats import collect, compute_stats, write_plot

    out = tmp_path / "out"
    build(BuildConfig(inputs=[str(_logs(tmp_path))], out=str(out)))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(TreeprepError, match=r"a-file/seqs\.jsonl(\.tmp)?: cannot write"):
        export_sequences(str(out), str(blocker / "seqs.jsonl"))
    with pytest.raises(TreeprepError, match=r"a-file/stats\.html(\.tmp)?: cannot write"):
        write_plot(collect(str(out)), compute_stats(str(out)), str(blocker / "stats.html"))
    (out / "plans").write_text("not a folder")
    with pytest.raises(TreeprepError, match=r"plans/.*: cannot write"):
        pack(str(out), PackConfig(budget=64))


# -- checkpoints ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _torch_full_disk(obj, f, *a, **kw):
    """torch.save on a full disk: the file's OSError, then the zip writer's RuntimeError."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 576"
        ) from None


def _safetensors_full_disk(*a, **kw):
    raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("what", ["torch", "safetensors", "readonly"])
def test_checkpoint_write_failure_is_a_clean_error_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    from treeprep.trainer import load_model
    from treeprep.trainer.run import checkpoint as ck

    model = load_model("tiny-qwen3", vocab_size=64, attn="dense", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"

    def save(step: int) -> str:
        tmp = ck.begin_save(str(run), step, True)
        ck.save_rng(tmp, 0)
        ck.save_main(tmp, model=model, model_state=None, optimizer_state=opt.state_dict(),
                     scheduler_state={}, state={"step": step, "epoch": 0, "epoch_step": step},
                     tokenizer_dir=None)  # fmt: skip
        return ck.finish_save(str(run), tmp, step, None)

    first = save(1)
    with monkeypatch.context() as m:
        if what == "torch":
            m.setattr(torch, "save", _torch_full_disk)
        elif what == "safetensors":
            m.setattr(model, "save_pretrained", _safetensors_full_disk)
        else:
            real = os.makedirs
            m.setattr(os, "makedirs", lambda p, *a, **k: (_ for _ in ()).throw(
                OSError(errno.EROFS, "Read-only file system", str(p))) if ".tmp-" in str(p)
                else real(p, *a, **k))  # fmt: skip
        with pytest.raises(ck.CheckpointError) as e:
            save(2)
    msg = str(e.value)
    assert "\n" not in msg and str(run / "checkpoints") in msg, msg
    want = "read-only file system (EROFS)" if what == "readonly" else "no space left"
    assert want in msg, msg
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000001"]
    assert ck.open_checkpoint(str(run)).path == first
    assert json.loads((Path(first) / "state.json").read_text())["step"] == 1
