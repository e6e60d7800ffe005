"""The ``treeprep`` command line: one thin function per command, each in its own module.

Commands are registered here, explicitly, one line each (a missing module is an import error, not
a command that silently disappears). Every command builds a config, calls one library function and
renders the result: rich tables for people on stdout, ``--json`` for scripts, progress and logs on
stderr. A :class:`~treeprep.errors.TreeprepError` is caught here once and becomes a clean message
and exit code 1. Mode options are the StrEnums of :mod:`treeprep.modes` so typer lists and checks
their choices; one grammar (:mod:`treeprep.cli.options`): ``BUILD`` positional, ``-o/--out`` for
what a command writes, all else named. Old spellings are refused with the new ones
(:mod:`treeprep.cli.renames`). The trainer and torch are imported inside the commands that
train, never here.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from treeprep.cli import renames
from treeprep.cli.build_cmd import build_cmd
from treeprep.cli.export_cmd import export_cmd
from treeprep.cli.export_model_cmd import export_model_cmd
from treeprep.cli.pack_cmd import pack_cmd
from treeprep.cli.rejects_cmd import rejects_cmd
from treeprep.cli.show_cmd import show_cmd
from treeprep.cli.stats_cmd import stats_cmd
from treeprep.cli.train_cmd import train_cmd
from treeprep.cli.verify_cmd import verify_cmd
from treeprep.errors import TreeprepError


class _Commands(TyperGroup):
    """The commands, refusing old spellings (:mod:`treeprep.cli.renames`) before typer parses."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        cmd = self.get_command(ctx, args[0]) if args else None
        if cmd is not None:
            params = cmd.params
            valued = {
                o
                for p in params
                if p.param_type_name == "option" and not getattr(p, "is_flag", False)
                for o in p.opts
            }
            arguments = sum(p.param_type_name == "argument" for p in params)
            known = {o for p in params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
            if why := renames.refusal(args[0], args[1:], valued, arguments, known):
                raise typer.BadParameter(why, ctx)  # a usage error: exit code 2
        return super().parse_args(ctx, args)


app = typer.Typer(
    name="treeprep",
    cls=_Commands,
    help="Agent logs to token prefix trees, and exact tree training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("build")(build_cmd)
app.command("stats")(stats_cmd)
app.command("export")(export_cmd)
app.command("rejects")(rejects_cmd)
app.command("show")(show_cmd)
app.command("pack")(pack_cmd)
app.command("verify")(verify_cmd)
app.command("train")(train_cmd)
app.command("export-model")(export_model_cmd)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"treeprep {version('treeprep')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Agent logs to token prefix trees, and exact tree training."""


def main() -> None:
    try:
        app()
    except TreeprepError as e:
        from rich.console import Console
        from rich.markup import escape

        # escaped: a message's brackets (pip install -e ".[wandb]") are text, not markup
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
