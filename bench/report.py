"""How the benchmarks print a result: JSON for machines, a rich table for people.

Every benchmark measures rows of the same keys (one row per pipeline, format or engine) and
prints them one of two ways: with ``--json`` the whole result as indented JSON, else the rows as a
table with one column per key, followed by a few lines that state the ratios. One function does
that, so the benchmarks differ only in what they measure. Run as scripts (``python
bench/build.py``), the benchmarks import this module from their own folder.
"""

from __future__ import annotations

import json
from typing import Any


def print_result(
    result: Any,
    rows: list[dict[str, Any]],
    *,
    title: str,
    as_json: bool,
    notes: tuple[str, ...] = (),
) -> None:
    """``result`` as JSON (``as_json``), or ``rows`` as a titled table and then ``notes``."""
    if as_json:
        print(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console = Console()
    console.print(table)
    for note in notes:
        console.print(note)
