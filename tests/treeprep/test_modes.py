"""treeprep/modes.py: one check per mode, naming the field and the choices; members are strings."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from treeprep import modes
from treeprep.modes import Cut, Loss, Mode, Norm, PartGraph, coerce_modes


def test_a_member_is_its_string() -> None:
    assert Norm.token_mean == "token-mean" and str(Norm.token_mean) == "token-mean"
    assert f"{Loss.gspo}" == "gspo" and repr(Loss.gspo) == "'gspo'"
    assert json.dumps({"cut": Cut.prefix}) == '{"cut": "prefix"}'
    assert Norm.choices() == ("sum", "sequence-mean", "token-mean", "trajectory-mean")


def test_of_names_the_field_and_the_choices() -> None:
    assert Loss.of("ppo", "loss") is Loss.ppo
    assert Loss.of(Loss.ppo, "loss") is Loss.ppo
    with pytest.raises(
        KeyError, match=r"^\"x: loss 'dpo'; expected one of sft, ppo, grpo, gspo\"$"
    ):
        Loss.of("dpo", "loss", KeyError, "x: ")
    with pytest.raises(ValueError, match="^cut 'recompute'; expected one of handoff, prefix$"):
        Cut.of("recompute", "cut")


@dataclass(frozen=True)
class _Config:
    name: str
    graph: PartGraph = PartGraph.recompute
    norm: Norm | None = None


def test_coerce_modes_sets_every_mode_field_even_of_a_frozen_dataclass() -> None:
    c = _Config("n", "keep", "sum")  # type: ignore[arg-type]
    coerce_modes(c)
    assert c.graph is PartGraph.keep and c.norm is Norm.sum and c.name == "n"
    c = _Config("n")
    coerce_modes(c)
    assert c.norm is None
    with pytest.raises(ValueError, match="^graph 'drop'; expected one of recompute, keep$"):
        coerce_modes(_Config("n", "drop"))  # type: ignore[arg-type]


def test_every_mode_is_a_mode_and_modes_imports_only_the_standard_library() -> None:
    found = [v for v in vars(modes).values() if isinstance(v, type) and issubclass(v, Mode)]
    assert len(found) >= 16 and all(len(m.choices()) >= 2 for m in found if m is not Mode)
    tree = ast.parse(Path(modes.__file__).read_text(encoding="utf-8"))
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= {"__future__", "dataclasses", "enum", "typing"}
