"""``treeprep train`` options reach the TrainConfig: ``--prefetch/--no-prefetch``,
``--group-by-prefix`` (flag or config-file key, off by default)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

import treeprep.cli.train_cmd as train_cmd  # noqa: E402
from treeprep.cli.app import app  # noqa: E402


class _Stop(Exception):
    pass


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str):  # noqa: ANN202
    """The TrainConfig ``treeprep train BUILD --model tiny-qwen3 ARGS`` hands to the loop."""
    seen = []

    def capture(cfg, main, *, warn_no_probe, **kw):  # type: ignore[no-untyped-def]
        seen.append(cfg)
        raise _Stop

    monkeypatch.setattr(train_cmd, "_train_with_progress", capture)
    monkeypatch.setattr(train_cmd, "_check_inputs", lambda *a: None)  # an empty folder as BUILD
    data = tmp_path / "build"
    data.mkdir()
    res = CliRunner().invoke(app, ["train", str(data), "--model", "tiny-qwen3", *args])
    assert isinstance(res.exception, _Stop), res.output
    return seen[0]


@pytest.mark.parametrize(("flag", "want"), [([], True), (["--no-prefetch"], False)])
def test_prefetch_flag_sets_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], want: bool
) -> None:
    assert _config(tmp_path, monkeypatch, *flag).prefetch is want


@pytest.mark.parametrize(
    ("flag", "config", "want"),
    [([], "", False), (["--group-by-prefix"], "", True), ([], "group_by_prefix = true\n", True)],
)
def test_group_by_prefix_flag_and_key_set_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], config: str, want: bool
) -> None:
    args = list(flag)
    if config:
        (tmp_path / "c.toml").write_text(config)
        args += ["--config", str(tmp_path / "c.toml")]
    assert _config(tmp_path, monkeypatch, *args).group_by_prefix is want
