"""The trainer's public API (``trainer/__init__.py``) and its deprecated alias (``loss.py``).

Round 3 moved ``LossConfig`` from ``treeprep.trainer.loss`` to ``treeprep.trainer.objective.loss``
with no alias, and code written against the earlier docs broke. So: the facade's names are listed
here (one that disappears, or one added without being listed, fails), every import path the docs
ever published still resolves to the same object, and the docs and examples import only from the
facade.
"""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

#: the public API: what ``from treeprep.trainer import ...`` offers
PUBLIC = {
    # models and attention
    "PRESETS",
    "Preset",
    "TreeMask",
    "choose_backend",
    "decoder_hidden",
    "load_model",
    "tree_attention",
    "tree_logits",
    # batches and losses
    "LossConfig",
    "LossOutput",
    "TreeBatch",
    "sequence_logprobs",
    "token_logprobs",
    "tree_loss",
    # the in-memory API for online RL
    "OnlineStep",
    "Rollout",
    "build_step",
    # checks
    "VerifyReport",
    "verify_gradients",
}

#: (module, name, deprecated?) for every import path a published doc or example used
PUBLISHED = [
    ("treeprep.trainer.loss", "LossConfig", True),  # docs/training.md before round 3
    ("treeprep.trainer.objective.loss", "LossConfig", False),  # round 3's docs (now in config)
    ("treeprep.trainer.online", "Rollout", False),
    ("treeprep.trainer.online", "build_step", False),
]


def test_the_facade_exports_exactly_the_public_names() -> None:
    import treeprep.trainer as facade

    assert set(facade.__all__) == PUBLIC
    missing = [n for n in sorted(PUBLIC) if getattr(facade, n, None) is None]
    assert missing == []


@pytest.mark.parametrize("module, name, deprecated", PUBLISHED)
def test_published_import_paths_still_resolve(module: str, name: str, deprecated: bool) -> None:
    import treeprep.trainer as facade

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        obj = getattr(importlib.import_module(module), name)
    assert obj is getattr(facade, name)
    moved = [w for w in seen if issubclass(w.category, DeprecationWarning)]
    if deprecated:
        (w,) = moved
        assert f"import {name} from treeprep.trainer" in str(w.message)
        assert w.filename == __file__  # points at the caller, not at the alias module
    else:
        assert moved == []


def test_the_loss_alias_warns_only_when_a_name_is_read() -> None:
    """Importing the alias module is silent; ``from ... import`` warns; every name it held before
    the move resolves to the object at the new place; an unknown name is an AttributeError."""
    import treeprep.trainer.objective.loss as new

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old = importlib.import_module("treeprep.trainer.loss")
    with pytest.warns(DeprecationWarning, match="treeprep.trainer.objective.loss"):
        from treeprep.trainer.loss import loss_with_config
    assert loss_with_config is new.loss_with_config
    for name in old.MOVED:
        with pytest.warns(DeprecationWarning):
            assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        old.nothing  # noqa: B018


def _code_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def _trainer_imports(source: str) -> list[str]:
    """``module: names`` for each import of ``treeprep.trainer`` or a module under it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("treeprep.trainer"):
            found.append(f"{node.module}: {[a.name for a in node.names]}")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("treeprep.trainer")]
    return found


def test_docs_and_examples_import_the_trainer_from_the_facade() -> None:
    sources = {
        str(p.relative_to(ROOT)): [p.read_text(encoding="utf-8")]
        for p in sorted((ROOT / "examples").glob("*.py"))
    }
    for doc in ("docs/training.md", "README.md"):
        sources[doc] = _code_blocks((ROOT / doc).read_text(encoding="utf-8"))
    imports = {f: [i for s in blocks for i in _trainer_imports(s)] for f, blocks in sources.items()}
    assert imports["docs/training.md"] and imports["examples/grpo_loop.py"]  # the check is real
    elsewhere = [
        f"{f}: {i}"
        for f, found in imports.items()
        for i in found
        if not i.startswith("treeprep.trainer:")
    ]
    assert elsewhere == []
    names = {
        n for found in imports.values() for i in found for n in ast.literal_eval(i.split(": ")[1])
    }
    assert names <= PUBLIC


def test_the_import_check_sees_a_submodule_import() -> None:
    src = "from treeprep.trainer import Rollout\nfrom treeprep.trainer.online import build_step\n"
    assert _trainer_imports(src) == [
        "treeprep.trainer: ['Rollout']",
        "treeprep.trainer.online: ['build_step']",
    ]
