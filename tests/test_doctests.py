"""Every docstring example in the package runs, and is true.

pytest's own ``--doctest-modules`` imports a file by its path (``trainer/run/loop.py`` as
``trainer.loop``), which is not the name the package installs it under
(``treeprep.trainer.run.loop``:
the four code folders map into one namespace, see pyproject's ``package-dir``), so it would load
every module twice under two names. This test imports each module by its installed name instead
and runs its examples with the standard library's doctest runner, one test per module that has
any, so the README's test command runs them all.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the package it installs as (pyproject's package-dir)
FOLDERS = {
    "treeprep": "treeprep",
    "schemas": "treeprep.schemas",
    "trainer": "treeprep.trainer",
    "cli": "treeprep.cli",
}


def _modules_with_examples() -> list[str]:
    names = []
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "__main__.py" or ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts]
            parts = [p for p in parts if p != "__init__"]
            names.append(".".join([package, *parts]))
    return names


MODULES = _modules_with_examples()


def test_the_package_has_examples_to_run() -> None:
    """The scan is real: a package without a single example would make the tests below vacuous."""
    assert len(MODULES) >= 5


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    if name.startswith("treeprep.trainer"):
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(module, name)
    assert sum(len(t.examples) for t in tests) > 0, f"{name} mentions >>> but has no example"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
