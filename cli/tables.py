"""The one table shape the reporting commands print: a titled two-column metric/value table."""

from __future__ import annotations

from typing import Any


def metrics_table(title: str) -> Any:
    """A rich ``Table`` with a ``metric`` column and a right-aligned ``value`` column."""
    from rich.table import Table

    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    return t
