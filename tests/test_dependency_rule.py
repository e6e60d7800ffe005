"""The dependency rule of STYLE.md, checked two ways.

schemas <- treeprep (never torch); schemas <- trainer (never polars); the cli imports the trainer
lazily. First in fresh interpreters by inspecting ``sys.modules`` (what importing really loads),
then statically: every source file is parsed with ``ast`` and every import statement is checked,
including the lazy ones inside functions (which the import-time check cannot see) and imports of
private ``_names`` across packages. ``from treeprep import trainer`` (or ``from .. import
trainer``) counts as importing ``treeprep.trainer``, and ``importlib.import_module("...")`` with a
literal name counts as an import statement. ``treeprep.errors`` and ``treeprep.modes`` are the
modules every package may use: leaves that import nothing of treeprep. Last, the same parse gives
the graph of module imports, and no module may reach itself around a loop (strongly connected
components; see ``CYCLE_SCOPE``).
"""

from __future__ import annotations

import ast
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


# --------------------------------------------------------------------------------------------
# static: every import statement, top-level or inside a function
# --------------------------------------------------------------------------------------------

#: source folder -> the package it installs as
PACKAGES = {
    "schemas": "treeprep.schemas",
    "treeprep": "treeprep",
    "trainer": "treeprep.trainer",
    "cli": "treeprep.cli",
    "trainer/objective": "treeprep.trainer.objective",
}


def _package_of(module: str) -> str:
    """The room a module belongs to: schemas, trainer, cli or (the rest of) treeprep."""
    for room in ("treeprep.schemas", "treeprep.trainer", "treeprep.cli"):
        if module == room or module.startswith(room + "."):
            return room
    return "treeprep" if module.split(".")[0] == "treeprep" else module.split(".")[0]


def _sources(folder: str, root: Path = ROOT, package: str | None = None) -> list[tuple[Path, str]]:
    """(file, the module it installs as) for every source file of ``folder``."""
    pkg = package or PACKAGES[folder]
    out = []
    for path in sorted((root / folder).rglob("*.py")):
        rel = path.relative_to(root / folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out.append((path, ".".join([pkg, *parts])))
    return out


def _imports(folder: str, root: Path = ROOT) -> list[tuple[str, int, str, list[str], bool]]:
    """(file, line, imported module, imported names, inside a function?) for every import."""
    return [imp for path, this in _sources(folder, root) for imp in _file_imports(path, this, root)]


def _file_imports(
    path: Path, this: str, root: Path = ROOT
) -> list[tuple[str, int, str, list[str], bool]]:
    """The imports of one file (module ``this``), as :func:`_imports` lists them."""
    out = []
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    func_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom | ast.Call):
                    func_lines.add(sub.lineno)
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        dynamic = _dynamic_import(node)
        if dynamic is not None:
            out.append((where, node.lineno, dynamic, [], node.lineno in func_lines))
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.append((where, node.lineno, a.name, [], node.lineno in func_lines))
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = this.split(".") if is_pkg else this.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, mod] if mod else base)
            names = [a.name for a in node.names]
            out.append((where, node.lineno, mod, names, node.lineno in func_lines))
    return out


def _dynamic_import(node: ast.AST) -> str | None:
    """The module of ``importlib.import_module("m")`` / ``import_module("m")`` /
    ``__import__("m")`` with a literal name, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    arg = node.args[0]
    if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
        return arg.value if isinstance(arg.value, str) else None
    return None


def _rooms(mod: str, names: list[str]) -> set[str]:
    """The rooms an import reaches: its module's, and for ``from pkg import name`` the room of
    ``pkg.name`` too (``from treeprep import trainer`` reaches the trainer)."""
    return {_package_of(mod), *(_package_of(f"{mod}.{n}") for n in names if mod)}


def _private(mod: str, names: list[str], own: str) -> str | None:
    """Why an import of another room's private ``_name`` (or ``_module``) is refused, or None."""
    if _top(mod) != "treeprep" or _package_of(mod) == own:
        return None
    private = [n for n in names if n.startswith("_")]
    if private or any(p.startswith("_") for p in mod.split(".")):
        return f"private names of another package: {private or mod}"
    return None


def _violations(folder: str, rule, root: Path = ROOT) -> list[str]:
    bad = []
    for where, _, mod, names, lazy in _imports(folder, root):
        why = rule(mod, names, lazy)
        if why:
            bad.append(f"{where}: {mod} {names}: {why}")
    return bad


def _top(mod: str) -> str:
    return mod.split(".")[0]


def test_static_schemas_import_nothing_of_the_other_rooms() -> None:
    def rule(mod: str, names: list[str], lazy: bool) -> str | None:
        if _top(mod) in {"torch", "polars", "transformers", "typer"}:
            return "schemas use pydantic and pyarrow only"
        if _top(mod) == "treeprep" and mod not in ("treeprep.errors", "treeprep.modes"):
            if _package_of(mod) != "treeprep.schemas":
                return "schemas import nothing from treeprep, trainer or cli"
        return None

    assert _violations("schemas", rule) == []


def _pipeline_rule(mod: str, names: list[str], lazy: bool) -> str | None:
    rooms = _rooms(mod, names)
    if _top(mod) == "torch" or "treeprep.trainer" in rooms:
        return "the pipeline never imports torch or the trainer"
    if "treeprep.cli" in rooms:
        return "the pipeline never imports the cli"
    return _private(mod, names, "treeprep")


def test_static_pipeline_never_imports_torch_or_the_trainer() -> None:
    assert _violations("treeprep", _pipeline_rule) == []


def _trainer_rule(mod: str, names: list[str], lazy: bool) -> str | None:
    if _top(mod) == "polars":
        return "the trainer never imports polars"
    if "treeprep.cli" in _rooms(mod, names):
        return "the trainer never imports the cli"
    return _private(mod, names, "treeprep.trainer")


def test_static_trainer_imports_no_polars_no_cli_and_no_private_names() -> None:
    assert _violations("trainer", _trainer_rule) == []


#: the modules of the data half the trainer may import, each with what it is there for; a ``from
#: pkg import mod`` counts as ``pkg.mod``. ``treeprep.schemas`` (the contract) is open to the
#: trainer as a whole and not listed. The first group is STYLE.md's list; each entry of the second
#: is a reach beyond it, kept because the trainer would otherwise hold a second copy.
TRAINER_REACH = {
    "treeprep.errors": "the one error family",
    "treeprep.modes": "the StrEnums every option is typed with",
    "treeprep.atomic": "checkpoints, metrics, plots and exports written to a temporary name",
    "treeprep.sequence": "the token sequence the online API and the model guard build tries of",
    "treeprep.trie": "build_tree: the online API makes its tries with the shard builder's code",
    "treeprep.treeindex": "root-to-node paths of a tree row (assembly, data/rows)",
    "treeprep.pack": "data/plans: a plan made in memory when the build has none",
    "treeprep.pack.share": "assembly: trees merged into one forest, as the planner counted them",
    "treeprep.flops": "the model shapes (PRESETS) and the planner's cost model of a loaded model",
    # beyond STYLE.md's list
    "treeprep.binpack": "data/steps: the planner's first-fit and LPT rules for the linear baseline",
    "treeprep.io.hub": "local_folder: a hub id read from the local cache, never downloaded",
    "treeprep.io.paths": "regular-file checks: a FIFO in a model or run folder cannot hang a read",
    "treeprep.locks": "run/run_lock: the run folder's flock, the same lock a build holds on OUT",
    "treeprep.render.builtin": "export: the built-in byte tokenizer's files written into the "
    "checkpoint of a build that used it (building it needs tokenizers, not a schema)",
}


def _trainer_reach(root: Path = ROOT) -> dict[str, list[str]]:
    """Each module of the data half (not schemas) the trainer imports -> where, lazily or not."""
    known = set(_module_names(("treeprep",), root))
    reach: dict[str, list[str]] = {}
    for where, _, mod, names, _ in _imports("trainer", root):
        targets = {f"{mod}.{n}" if f"{mod}.{n}" in known else mod for n in names} or {mod}
        for t in targets:
            if _package_of(t) == "treeprep":
                reach.setdefault(t, []).append(where)
    return reach


def test_static_trainer_reaches_into_the_data_half_only_by_the_allowlist() -> None:
    """A new ``treeprep.*`` import in trainer/ fails until it is listed with its reason (or its
    need moves into schemas/, as the tokenizer identity did); a listed module no longer imported
    fails too, so the list stays the trainer's real reach."""
    reach = _trainer_reach()
    assert {m: w for m, w in sorted(reach.items()) if m not in TRAINER_REACH} == {}
    assert sorted(set(TRAINER_REACH) - set(reach)) == []


def test_static_reach_check_sees_a_new_module(tmp_path: Path) -> None:
    """The checker itself: a lazy ``from pkg import module`` is the module, a name is the
    package; schemas are not the data half."""
    (tmp_path / "treeprep" / "render").mkdir(parents=True)
    for f in ("__init__.py", "errors.py", "render/__init__.py", "render/template.py"):
        (tmp_path / "treeprep" / f).write_text("")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text(
        "from treeprep.errors import TreeprepError\nfrom treeprep.schemas import shard\n\n\n"
        "def f():\n    from treeprep.render import template, sandbox_limits\n"
    )
    assert _trainer_reach(tmp_path) == {
        "treeprep.errors": ["trainer/x.py:1"],
        "treeprep.render": ["trainer/x.py:6"],
        "treeprep.render.template": ["trainer/x.py:6"],
    }


def test_static_objective_imports_nothing_of_the_run() -> None:
    """The trainer's rooms point one way: the run's loop reads the objective (the losses and the
    LM head), never the other way round (the room ladder below holds it too)."""

    def rule(mod: str, names: list[str], lazy: bool) -> str | None:
        reached = {mod, *(f"{mod}.{n}" for n in names)}
        if any(
            m == "treeprep.trainer.run" or m.startswith("treeprep.trainer.run.") for m in reached
        ):
            return "trainer/objective imports nothing of trainer/run"
        return None

    assert _violations("trainer/objective", rule) == []


def _cli_rule(mod: str, names: list[str], lazy: bool) -> str | None:
    heavy = _top(mod) in {"torch", "transformers"} or "treeprep.trainer" in _rooms(mod, names)
    if heavy and not lazy:
        return "the cli imports the trainer (and torch) only inside the commands that train"
    return _private(mod, names, "treeprep.cli")


def test_static_cli_imports_the_trainer_only_inside_commands() -> None:
    assert _violations("cli", _cli_rule) == []


def test_static_errors_is_a_leaf() -> None:
    tree = ast.parse((ROOT / "treeprep" / "errors.py").read_text(encoding="utf-8"))
    mods = [
        getattr(n, "module", None) or [a.name for a in n.names]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    assert mods == ["__future__"]


def test_static_check_sees_lazy_and_private_imports(tmp_path: Path) -> None:
    """The checker itself: a private name imported inside a function is reported (the import-
    time check misses it: the function never runs)."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text(
        "import os\n\n\ndef f():\n    from treeprep.render import _folder_sha256\n"
    )
    (bad,) = _violations("trainer", _trainer_rule, tmp_path)
    assert bad.startswith("trainer/x.py:5: treeprep.render ['_folder_sha256']: private")


@pytest.mark.parametrize(
    "folder, rule, source, why",
    [
        # the trainer reached through its package, at import time and relatively
        ("cli", _cli_rule, "from treeprep import trainer\n", "only inside the commands"),
        ("cli", _cli_rule, "from .. import trainer\n", "only inside the commands"),
        (
            "cli",
            _cli_rule,
            "import importlib\n\nm = importlib.import_module('treeprep.trainer.run.loop')\n",
            "only inside the commands",
        ),
        # private names, lazily and at import time, from every other room
        (
            "cli",
            _cli_rule,
            "def f():\n    from treeprep.trainer.objective.loss import _kl\n",
            "private names of another package: ['_kl']",
        ),
        (
            "cli",
            _cli_rule,
            "import treeprep.formats._sniff as s\n",
            "private names of another package: treeprep.formats._sniff",
        ),
        (
            "treeprep",
            _pipeline_rule,
            "def f():\n    from treeprep.schemas.shard import _shard_list\n",
            "private names of another package: ['_shard_list']",
        ),
        ("treeprep", _pipeline_rule, "def f():\n    from treeprep import cli\n", "the cli"),
        ("treeprep", _pipeline_rule, "def f():\n    from treeprep import trainer\n", "trainer"),
        ("trainer", _trainer_rule, "def f():\n    from treeprep import cli\n", "the cli"),
        ("trainer", _trainer_rule, "def f():\n    __import__('polars')\n", "polars"),
    ],
)
def test_static_check_sees_indirect_imports(
    tmp_path: Path, folder: str, rule, source: str, why: str
) -> None:
    """Each way around the rule is reported: a package's attribute, a relative import, an
    ``import_module`` call, a private name of another room (lazily or not)."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "x.py").write_text(source)
    (bad,) = _violations(folder, rule, tmp_path)
    assert why in bad


def test_static_check_allows_what_the_rule_allows(tmp_path: Path) -> None:
    """The trainer imported inside a command, a room's own private names, a public name."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text(
        "from treeprep.cli import _tables\nfrom treeprep.errors import TreeprepError\n\n\n"
        "def cmd():\n    from treeprep import trainer\n    import torch\n"
    )
    assert _violations("cli", _cli_rule, tmp_path) == []


# --------------------------------------------------------------------------------------------
# cycles: no module imports itself around a loop of others
# --------------------------------------------------------------------------------------------

#: the modules whose cycles fail the test, by prefix: the whole project
CYCLE_SCOPE = ("treeprep",)


def _import_graph(root: Path = ROOT, packages: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    """Each project module -> the project modules it imports, at the top or lazily.
    ``from pkg import name`` imports ``pkg.name`` where that is a module, else ``pkg``; importing
    a package means importing its ``__init__`` (a submodule does not import its package here)."""
    sources = [src for folder, pkg in packages.items() for src in _sources(folder, root, pkg)]
    modules = {this for _, this in sources}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path, this in sources:
        for _, _, mod, names, _ in _file_imports(path, this, root):
            targets = {f"{mod}.{n}" if f"{mod}.{n}" in modules else mod for n in names} or {mod}
            graph[this] |= {t for t in targets if t in modules and t != this}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(found)


def _cycles_within(
    scope: tuple[str, ...], root: Path = ROOT, packages: dict[str, str] = PACKAGES
) -> list[list[str]]:
    """The import cycles that hold a module under one of the ``scope`` prefixes."""

    def inside(m: str) -> bool:
        return any(m == s or m.startswith(s + ".") for s in scope)

    return [c for c in _cycles(_import_graph(root, packages)) if any(map(inside, c))]


def test_no_import_cycle() -> None:
    assert _cycles_within(CYCLE_SCOPE) == []


def test_build_package_modules_import_only_those_before_them() -> None:
    """The build package's order (see ``treeprep/build/__init__.py``): each module imports only
    the ones listed before it, so the order can be read top to bottom."""
    order = [
        "config", "curate", "hints", "workrows", "workfiles", "files", "dedup", "jobs", "out",
        "engines", "ray", "",
    ]  # fmt: skip
    names = [f"treeprep.build.{m}".rstrip(".") for m in order]
    graph = _import_graph()
    assert sorted(m for m in graph if m.startswith("treeprep.build")) == sorted(names)
    late = [
        f"{m} imports {n}"
        for i, m in enumerate(names)
        for n in sorted(graph[m])
        if n in names and names.index(n) >= i
    ]
    assert late == []


#: the trainer's rooms (a top-level module or folder of trainer/), bottom to top: see the rooms
#: in ``trainer/__init__.py``. The leaves first: ``distributed`` knows ranks, not the model;
#: ``reference`` shares no code with what it checks (so it sits below all of it)
TRAINER_ROOMS = [
    "attention", "distributed", "reference", "batch", "models", "config", "objective", "context",
    "parts", "data", "run", "online", "verify", "loss", "__init__",
]  # fmt: skip


def _trainer_room(module: str) -> str:
    """The room of a ``treeprep.trainer`` module: its first name under the trainer, or
    ``__init__`` for the facade itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def _late_trainer_imports(graph: dict[str, set[str]], rooms: list[str]) -> list[str]:
    """Each import, at the top or lazily, of a room not below the importing one."""
    return [
        f"{m} ({_trainer_room(m)}) imports {n} ({_trainer_room(n)})"
        for m in sorted(graph)
        if m.startswith("treeprep.trainer")
        for n in sorted(graph[m])
        if n.startswith("treeprep.trainer") and _trainer_room(n) != _trainer_room(m)
        and rooms.index(_trainer_room(n)) > rooms.index(_trainer_room(m))
    ]  # fmt: skip


def test_trainer_rooms_import_only_those_below_them() -> None:
    """The trainer's rooms as a ladder (issue 55): each room imports, at the top or lazily, only
    the rooms listed before it, so a room's dependencies are read downward and none is a cycle."""
    graph = _import_graph()
    rooms = {_trainer_room(m) for m in graph if m.startswith("treeprep.trainer")}
    assert sorted(rooms) == sorted(TRAINER_ROOMS)
    assert _late_trainer_imports(graph, TRAINER_ROOMS) == []


def test_trainer_room_check_reports_an_import_upward() -> None:
    """The checker itself: an import of a higher room is reported, one of a lower room is not
    (:func:`_import_graph` holds lazy imports too: the cycle check's own test)."""
    graph = {
        "treeprep.trainer.batch.tree_batch": {"treeprep.trainer.models.run"},
        "treeprep.trainer.models.run": {"treeprep.trainer.batch"},
    }
    assert _late_trainer_imports(graph, ["batch", "models"]) == [
        "treeprep.trainer.batch.tree_batch (batch) imports treeprep.trainer.models.run (models)"
    ]


def test_cycle_check_sees_lazy_relative_and_package_imports(tmp_path: Path) -> None:
    """The checker itself, on a package with two cycles: one through a module reached as a name
    of its package, a lazy relative import and a plain import; one through the package's
    ``__init__`` (a name of the package, not a module)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    sources = {
        "__init__.py": "from pkg.d import thing\n",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from .c import x\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg import VERSION\n",
        "e.py": "import os\n\nfrom pkg.a import f\nfrom . import d\n",
    }
    for name, text in sources.items():
        (pkg / name).write_text(text)
    packages = {"pkg": "pkg"}
    assert _cycles(_import_graph(tmp_path, packages)) == [
        ["pkg", "pkg.d"],
        ["pkg.a", "pkg.b", "pkg.c"],
    ]
    assert _cycles_within(("pkg.b",), tmp_path, packages) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert _cycles_within(("pkg.e",), tmp_path, packages) == []  # imports into cycles, not one
    (pkg / "c.py").write_text("import os\n")
    assert _cycles(_import_graph(tmp_path, packages)) == [["pkg", "pkg.d"]]


def _module_names(folders: tuple[str, ...], root: Path = ROOT) -> dict[str, Path]:
    names = {}
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root / folder).with_suffix("")
            names[".".join([PACKAGES[folder], *(p for p in rel.parts if p != "__init__")])] = path
    return names


def _facade_imports(folder: str, root: Path = ROOT) -> list[str]:
    """Imports of a package's facade (its ``__init__``) for a name, by a module of the folder."""
    mods = _module_names((folder,), root)
    facades = {m for m, p in mods.items() if p.name == "__init__.py"}
    bad = []
    for where, _, mod, names, _ in _imports(folder, root):
        if where.split(":")[0].endswith("__init__.py") or mod not in facades:
            continue
        attrs = [n for n in names if f"{mod}.{n}" not in mods]
        if attrs or not names:
            bad.append(f"{where}: {mod} {attrs}")
    return bad


def test_static_trainer_modules_import_the_defining_module_not_a_facade() -> None:
    """``treeprep.trainer`` and its subpackages re-export names for users; inside the trainer a
    module imports the module that defines a name (a facade import closes a cycle as soon as the
    facade re-exports the importer)."""
    assert _facade_imports("trainer") == []


def test_static_facade_check_sees_them(tmp_path: Path) -> None:
    (tmp_path / "trainer" / "sub").mkdir(parents=True)
    (tmp_path / "trainer" / "__init__.py").write_text("from treeprep.trainer.a import A\n")
    (tmp_path / "trainer" / "a.py").write_text("A = 1\n")
    (tmp_path / "trainer" / "sub" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "sub" / "c.py").write_text(
        "from treeprep.trainer import A\nfrom treeprep.trainer import a\nC = A\n"
    )
    (bad,) = _facade_imports("trainer", tmp_path)  # the name A, not the module a
    assert bad.startswith("trainer/sub/c.py:1: treeprep.trainer ['A']")


def test_every_package_is_listed_for_the_wheel() -> None:
    """pyproject lists packages by hand: a subpackage left out installs in editable mode (the
    tests pass) and is missing from a wheel (treeprep.io was, for a while)."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, package in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *rel]))
    assert found == listed
