"""Old spellings of the command line, refused with the new one.

A renamed option or value is never accepted silently under its old name (a script would keep
running with a meaning it did not ask for), nor refused with typer's bare "no such option": the
message names what to write now. :class:`~treeprep.cli.app` checks every command line against
this table before typer parses it.
"""

from __future__ import annotations

from collections.abc import Collection

#: command -> old option -> the new option
OPTIONS: dict[str, dict[str, str]] = {
    "train": {
        "--handoff": "--part-graph",
        "--tensorboard": "--report-to tensorboard",
    },
    "verify": {"--handoff": "--part-graph"},
    "export": {"--output": "--out"},
}
#: option -> old value -> the new value, in every command that has the option
VALUES: dict[str, dict[str, str]] = {
    "--cut": {"recompute": "prefix"},
}
#: command -> the option that took over its positional argument after the last one it has now
POSITIONAL: dict[str, str] = {"show": "--group"}


def refusal(
    command: str, args: list[str], valued: Collection[str] = (), arguments: int = 1
) -> str | None:
    """Why the arguments of ``command`` are refused (an old spelling, with the new one), or
    None. ``valued``: the command's options that take a value; ``arguments``: how many
    positional arguments it has."""
    options = OPTIONS.get(command, {})
    positional: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if skip or not arg.startswith("-"):
            if not skip:
                positional.append(arg)
            skip = False
            continue
        name, eq, value = arg.partition("=")
        skip = name in valued and not eq
        if name in options:
            return f"{name} was renamed: use {options[name]}"
        if name in VALUES:
            given = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            new = VALUES[name].get(given)
            if new is not None:
                return f"{name} {given} was renamed: use {name} {new}"
    if command in POSITIONAL and len(positional) > arguments:
        extra = positional[arguments]
        return f"{extra!r} is an option now: use {POSITIONAL[command]} {extra}"
    return None
