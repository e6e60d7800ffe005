"""The ``treeprep`` command line: one thin function per command, each in its own module.

Each command module defines ``register(app)``. Every command builds a config, calls one library
function and renders the result: rich tables for people on stdout, ``--json`` for scripts,
progress and logs on stderr. A :class:`~treeprep.errors.TreeprepError` is caught here once and
becomes a clean message and exit code 1.
"""

from __future__ import annotations

import importlib
import sys

import typer

from treeprep.errors import TreeprepError

app = typer.Typer(
    name="treeprep",
    help="Agent logs to token prefix trees, and exact tree training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_COMMANDS = ("build", "stats", "export", "show", "pack", "verify", "train")
for _name in _COMMANDS:
    try:
        _mod = importlib.import_module(f"treeprep.cli.{_name}_cmd")
    except ModuleNotFoundError as _e:
        if _e.name == f"treeprep.cli.{_name}_cmd":
            continue
        raise
    _mod.register(app)


def main() -> None:
    try:
        app()
    except TreeprepError as e:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
