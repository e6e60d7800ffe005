"""``train --config FILE``: a command's options from a TOML, YAML or JSON file, and back.

A config file is one flat table of option names and values, spelled as on the command line
without the dashes (``save-every = 50`` or ``save_every = 50``; ``build`` for the positional
BUILD). The file's values become the command's defaults (click's ``default_map``), so a flag on
the command line overrides the file, and the file overrides the built-in default. A key that is no
option of the command is refused, naming the key and the file. TOML is read with the standard
library's ``tomllib``; YAML with PyYAML (a dependency of transformers, so always installed).

:func:`dumps_toml` writes the resolved options of a run as ``RUN/config.toml``, so that
``treeprep train --config RUN/config.toml`` repeats it (:func:`write_run_config`, at the start of
a run). TOML has no null: an option that is None (its default) is left out.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from treeprep.atomic import write_atomic
from treeprep.cli import renames
from treeprep.cli.options import plain
from treeprep.errors import TreeprepError
from treeprep.io.paths import regular_file

#: the file suffixes read, and their format
FORMATS = {".toml": "TOML", ".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}


def read(path: Path) -> dict[str, Any]:
    """The table of a config file; a TreeprepError names the file and what is wrong."""
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise TreeprepError(
            f"{path}: a config file is .toml, .yaml, .yml or .json, not {path.suffix or 'none'}"
        )
    regular_file(str(path), "--config")  # a FIFO would hang the read
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TreeprepError(f"{path}: cannot read the config file ({e})") from e
    try:
        if kind == "TOML":
            data: Any = tomllib.loads(text)
        elif kind == "JSON":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # each parser's own error type; all mean "not valid <kind>"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TreeprepError(f"{path}: not valid {kind}: {first}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TreeprepError(f"{path}: a config file is one table of options, not {type(data)}")
    return data


def option_keys(
    names: Mapping[str, Iterable[str]], data: Mapping[str, Any], path: Path, command: str = ""
) -> dict[str, Any]:
    """``data``'s keys as parameter names. ``names``: parameter name -> its option spellings
    (``--save-every``); a key matches a parameter's name or one of its long options without the
    dashes, with ``-`` and ``_`` alike. An unknown key or a nested table is refused."""
    lookup: dict[str, str] = {}
    for name, opts in names.items():
        lookup[name] = name
        for o in opts:
            if o.startswith("--"):
                lookup[o[2:].replace("-", "_")] = name
    out: dict[str, Any] = {}
    for key, value in data.items():
        found = lookup.get(str(key).replace("-", "_"))
        if found is None:
            hint = renames.elsewhere(command, str(key))
            raise TreeprepError(
                f"{path}: unknown key {key!r}: "
                + (hint.split("; ", 1)[1] if hint else "not an option of this command")
            )
        if isinstance(value, dict):
            raise TreeprepError(f"{path}: {key!r} is a table; options are plain values")
        out[found] = value
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a TOML basic string


def dumps_toml(values: Mapping[str, Any], header: str = "") -> str:
    """``values`` (plain option values) as a flat TOML table, None values left out, keys in the
    command line's spelling (``save-every``)."""
    lines = [f"# {ln}" for ln in header.splitlines()]
    for k, v in values.items():
        if v is None:
            continue
        lines.append(f"{k.replace('_', '-')} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


#: options that name this invocation, not the run: not saved in ``RUN/config.toml``
NOT_SAVED = frozenset(
    {"config", "as_json", "resume", "overwrite", "dry_run", "world_size", "gpu", "gpu_memory"}
    | {"host_memory"}
)


def saved_options(options: Mapping[str, Any], run_dir: str) -> dict[str, Any]:
    """The options of a run (``train``'s, by parameter name: its context's ``params``) as
    ``RUN/config.toml`` holds them: plain values, paths absolute (so the file repeats the run from
    any folder), the resolved run folder, and none of :data:`NOT_SAVED`."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if k in NOT_SAVED:
            continue
        v = [plain(x) for x in v] if isinstance(v, list | tuple) else plain(v)
        if v and (k in ("build", "plan", "eval_data") or (k == "model" and os.path.isdir(str(v)))):
            v = os.path.abspath(str(v))
        out[k] = v
    out["out"] = os.path.abspath(run_dir)
    return out


def write_run_config(options: Mapping[str, Any], run_dir: str) -> str:
    """Write ``RUN/config.toml`` (atomically); its path."""
    path = os.path.join(run_dir, "config.toml")
    header = (
        "treeprep train options of this run; continue it: treeprep train --config FILE --resume "
        "auto; the same run in a new folder: treeprep train --config FILE -o NEW"
    )
    write_atomic(path, dumps_toml(saved_options(options, run_dir), header).encode())
    return path
