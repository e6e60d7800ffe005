"""Hostile option values (issue 41): every path option opens regular files only, so a FIFO
cannot hang a command (item 6); numeric options are checked by range on the command line, so
NaN, zero or a negative number is a clean usage error, never a traceback or a build where every
record is a reject (item 7)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile import good_rows, run_subprocess, write_jsonl

from treeprep.build import BuildConfig
from treeprep.errors import TreeprepError


@contextlib.contextmanager
def _no_hang(seconds: float = 10) -> Iterator[None]:
    """Fail instead of hanging: before the fix, opening the FIFO blocked for good."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"hung for {seconds} s (opened a FIFO?)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- item 6: a FIFO named by a path option is refused before it is opened ---------------------


@pytest.mark.parametrize("option", ["system_prompt", "tools", "chat_template", "map_file"])
def test_a_fifo_as_a_build_path_option_is_refused_not_a_hang(tmp_path: Path, option: str) -> None:
    logs = write_jsonl(tmp_path / "logs" / "a.jsonl", good_rows(2))
    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    flag = "--" + option.replace("_", "-")
    with _no_hang(), pytest.raises(TreeprepError) as info:
        BuildConfig(inputs=[str(logs)], out=str(tmp_path / "o"), **{option: str(fifo)})
    kind = "a named pipe (FIFO) (only regular files are read)"
    assert str(info.value) == f"{fifo}: {flag} is not a regular file: {kind}"


def test_the_cli_refuses_a_fifo_system_prompt_in_one_line(tmp_path: Path) -> None:
    logs = write_jsonl(tmp_path / "logs" / "a.jsonl", good_rows(2))
    os.mkfifo(tmp_path / "prompt.txt")
    args = ["build", str(logs), "-o", str(tmp_path / "o"), "--system-prompt"]
    res = run_subprocess([*args, str(tmp_path / "prompt.txt")], timeout=30)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "--system-prompt is not a regular file: a named pipe (FIFO)" in res.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_a_fifo_in_a_tokenizer_folder_is_refused_not_a_hang(tmp_path: Path) -> None:
    from treeprep.render.tokenizer import load_folder

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    os.mkfifo(folder / "tokenizer_config.json")
    with _no_hang(), pytest.raises(TreeprepError, match=r"tokenizer_config\.json: a file of the "):
        load_folder(folder)


def test_a_fifo_as_the_config_file_is_refused_not_a_hang(tmp_path: Path) -> None:
    from treeprep.cli import config_file

    os.mkfifo(tmp_path / "run.toml")
    with _no_hang(), pytest.raises(TreeprepError, match=r"--config is not a regular file: a named"):
        config_file.read(tmp_path / "run.toml")
