"""The dependency rule of STYLE.md, checked in fresh interpreters by inspecting ``sys.modules``.

schemas <- treeprep (never torch); schemas <- trainer (never polars); the cli imports the trainer
lazily.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_of(folder: str, package: str) -> list[str]:
    names = [package]
    for m in pkgutil.iter_modules([str(ROOT / folder)]):
        if m.name.startswith("_"):
            continue
        names.append(f"{package}.{m.name}")
        if m.ispkg:
            for sub in pkgutil.iter_modules([str(ROOT / folder / m.name)]):
                names.append(f"{package}.{m.name}.{sub.name}")
    return names


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(k.split('.')[0] for k in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_schemas_import_only_pydantic_and_pyarrow() -> None:
    loaded = _loaded_after_import(_modules_of("schemas", "treeprep.schemas"))
    assert not {"torch", "polars", "transformers", "typer"} & loaded


def test_pipeline_never_imports_torch() -> None:
    mods = [m for m in _modules_of("treeprep", "treeprep") if not m.endswith("__main__")]
    loaded = _loaded_after_import(mods)
    assert "torch" not in loaded


def test_trainer_never_imports_polars() -> None:
    pytest.importorskip("torch")
    mods = [m for m in _modules_of("trainer", "treeprep.trainer")]
    loaded = _loaded_after_import(mods)
    assert "torch" in loaded  # the check is real: the trainer was imported
    assert "polars" not in loaded


def test_cli_imports_trainer_lazily() -> None:
    loaded = _loaded_after_import(["treeprep.cli.app"])
    assert "torch" not in loaded


def test_package_dirs_map_under_one_namespace() -> None:
    import treeprep.cli
    import treeprep.schemas
    import treeprep.trainer

    assert Path(treeprep.schemas.__file__).parent == ROOT / "schemas"
    assert Path(treeprep.trainer.__file__).parent == ROOT / "trainer"
    assert Path(treeprep.cli.__file__).parent == ROOT / "cli"
