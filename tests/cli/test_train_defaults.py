"""Issue 55 item 2: every ``treeprep train`` option is declared once, and its default is its
``TrainConfig`` field's.

Over every option of the typer command, found by introspecting it (a new option is covered
without a line here): the config that ``train BUILD --model M`` builds from the defaults holds each
field's default, after the option's declared conversion (:mod:`treeprep.cli.train_options`:
``--grad-clip 0`` is the config's None, ``--no-probe`` sets ``probe``); and an option given a value
other than its default changes its field, so no option is left out of the config. The options
that set no field are named in :data:`NOT_FIELDS`, each with why.
"""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union

import pytest
import typer.main
from typer.testing import CliRunner

pytest.importorskip("torch")

import treeprep.cli.train_cmd as train_cmd  # noqa: E402
from treeprep.cli.app import app  # noqa: E402
from treeprep.trainer.config import TrainConfig  # noqa: E402

#: the options of ``train`` that set no TrainConfig field, and why
NOT_FIELDS = {
    "config": "a file of option values: it sets the other options' defaults",
    "as_json": "how the summary is printed, not what the run does",
    "dry_run": "predicts the run's memory and time instead of running it",
    "world_size": "--dry-run only: a run's world is torchrun's",
    "gpu": "--dry-run only: a run's GPU is the one it runs on",
    "gpu_memory": "--dry-run only: a run's GPU memory is its GPU's",
    "host_memory": "--dry-run only: a run's host memory is its host's",
}
#: options named otherwise than the field they set (train_options' docstring)
FIELD_OF = {"build": "data", "out": "run_dir", "warmup": "warmup_steps", "no_probe": "probe"}
#: fields without a default: the command requires them (BUILD, --model) or makes one (--out)
NO_DEFAULT = {"data", "model", "run_dir"}
#: options that need another to be given with them (the config refuses them alone)
PARTNERS = {"lora_dropout": ["--lora-r", "2"], "eval_every": ["--val-fraction", "0.1"]}


class _Stop(Exception):
    pass


def _options() -> list[Any]:
    cmd = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    return [p for p in cmd.params if p.name not in NOT_FIELDS]


def _field_defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """``config(*args)``: the TrainConfig ``train BUILD --model tiny-qwen3 ARGS`` hands to the
    loop (an empty folder as BUILD; nothing runs)."""
    seen: list[Any] = []

    def capture(cfg, main, **kw):  # type: ignore[no-untyped-def]
        seen.append(cfg)
        raise _Stop

    monkeypatch.setattr(train_cmd, "_train_with_progress", capture)
    monkeypatch.setattr(train_cmd, "_check_inputs", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    build = tmp_path / "build"
    build.mkdir()

    def run(*args: str) -> TrainConfig:
        res = CliRunner().invoke(app, ["train", str(build), "--model", "tiny-qwen3", *args])
        assert isinstance(res.exception, _Stop), (args, res.output, res.exception)
        return seen[-1]

    return run


def test_every_option_sets_a_field_or_is_named_with_why() -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    names = [p.name for p in _options()]
    assert [n for n in names if FIELD_OF.get(n or "", n) not in fields] == []
    cmd = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    assert set(NOT_FIELDS) <= {p.name for p in cmd.params}  # no stale entry


def test_every_default_is_its_fields_default(config) -> None:  # noqa: ANN001
    cfg, want = config(), _field_defaults()
    for p in _options():
        field = FIELD_OF.get(p.name or "", p.name or "")
        if field not in NO_DEFAULT:
            assert getattr(cfg, field) == want[field], (p.name, getattr(cfg, field), want[field])


def _base_type(annotation: Any) -> Any:
    """``Annotated[int | None, ...]`` -> int; ``list[str] | None`` -> list."""
    t = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if typing.get_origin(t) in (Union, UnionType):
        t = args[0]
    return typing.get_origin(t) or t


def _other_value(p: Any, tmp: Path) -> list[str]:
    """The words that give option ``p`` (of the typer command) a value other than its default;
    its type is its annotation in ``train_cmd``'s signature."""
    hint = typing.get_type_hints(train_cmd.train_cmd, include_extras=True)[p.name]
    t, d, flag = _base_type(hint), p.default, p.opts[0]
    if t is bool:
        return [p.opts[0]] if not d else [p.secondary_opts[0]]
    if isinstance(t, type) and issubclass(t, Enum):
        return [flag, next(m.value for m in t if m != d)]
    if t is Path:
        return [flag, str(tmp / p.name)]
    if t is int:
        return [flag, str(2 if d is None else d + 2)]
    if t is float:
        return [flag, str(0.5 if not d else d + 0.25)]
    if t is list:
        return [flag, "tensorboard" if p.name == "report_to" else "q_proj"]
    return [flag, "cpu" if p.name == "device" else "other"]


def test_every_option_reaches_its_field(config, tmp_path: Path) -> None:  # noqa: ANN001
    base = config()
    for p in _options():
        if p.param_type_name != "option" or p.name == "model":
            continue  # BUILD and --model: every run gives them
        field = FIELD_OF.get(p.name or "", p.name or "")
        args = [*_other_value(p, tmp_path), *PARTNERS.get(p.name or "", [])]
        assert getattr(config(*args), field) != getattr(base, field), (p.name, args)
