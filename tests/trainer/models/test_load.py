"""trainer/models/load.py: model folders. A pickled ``pytorch_model.bin`` that would run code is
refused in one line naming the file and what it asked for, and nothing of it runs (issue 41
item 5: before, the refusal was safe but ended in a ~60-line ``torch.load`` traceback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import TreeprepError  # noqa: E402
from treeprep.trainer.models.load import load_model  # noqa: E402


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _pickled_folder(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "model"
    load_model("tiny-qwen3").config.save_pretrained(folder)
    marker = tmp_path / "ran"
    torch.save({"model.embed_tokens.weight": _RunsCode(str(marker))}, folder / "pytorch_model.bin")
    return folder, marker


def test_a_pickle_that_runs_code_is_refused_in_one_line(tmp_path: Path) -> None:
    folder, marker = _pickled_folder(tmp_path)
    with pytest.raises(TreeprepError) as info:
        load_model(str(folder))
    msg = str(info.value)
    assert msg == (
        f"{folder}: refused to load pytorch_model.bin: a pickle that asks for posix.system (it "
        "could run code); nothing of it ran. Load a copy saved as safetensors "
        "(model.safetensors) from a source you trust"
    )
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not marker.exists()


def test_the_cli_prints_the_refusal_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from treeprep.build import BuildConfig, build
    from treeprep.cli.app import main

    folder, marker = _pickled_folder(tmp_path)
    rows = '{"group_id": "g", "prompt_token_ids": [1, 2], "generation_token_ids": [3]}\n'
    (tmp_path / "r.jsonl").write_text(rows)
    build(BuildConfig(inputs=[str(tmp_path / "r.jsonl")], out=str(tmp_path / "b")))
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setattr(sys, "argv", ["treeprep", "verify", str(tmp_path / "b"), "--model",
                                      str(folder)])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "refused" in x]
    assert line == f"error: {folder}: refused to load pytorch_model.bin: a pickle that asks " + (
        "for posix.system (it could run code); nothing of it ran. Load a copy saved as "
        "safetensors (model.safetensors) from a source you trust"
    )
    assert not marker.exists()


def test_a_fifo_in_a_model_folder_is_refused_before_transformers_opens_it(tmp_path: Path) -> None:
    """Issue 41 item 6: every path option opens regular files only (a FIFO would hang)."""
    folder = tmp_path / "model"
    load_model("tiny-qwen3").config.save_pretrained(folder)
    os.mkfifo(folder / "model.safetensors")
    with pytest.raises(TreeprepError, match=r"model\.safetensors: a file of the model folder is "):
        load_model(str(folder))
