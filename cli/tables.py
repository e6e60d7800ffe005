"""The table shapes the reporting commands print: a titled two-column metric/value table, and a
titled table of columns whose first ones (names) are left-aligned and the rest (numbers) right."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,024 processes``: ``n`` (thousands separated) and ``noun`` in
    the number it takes (``plural``: default ``noun + "s"``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def normalized_label(kind: str, parser: str | None) -> str:
    """How build and stats name a kind of the manifest's ``normalized`` counts: the calls read
    back by the model's parser, the calls whose prompt had a message of several text parts
    (given to the template as ``--server`` says), or the calls the renderer normalized by ``kind``.

    >>> normalized_label("text-parts:sglang", None)  # doctest: +ELLIPSIS
    'normalized: text-parts:sglang (a message of several text parts, given to the template as ...'
    """
    from treeprep.render.response import ROUND_TRIP
    from treeprep.render.text_parts import TEXT_PARTS

    if kind == ROUND_TRIP:
        return f"calls read back by the model's parser ({parser})"
    server = kind.removeprefix(TEXT_PARTS)
    if server != kind:
        what = f"a message of several text parts, given to the template as {server} does: --server"
        return f"normalized: {kind} ({what})"
    return f"normalized: {kind}"


def metrics_table(title: str) -> Any:
    """A rich ``Table`` with a ``metric`` column and a right-aligned ``value`` column."""
    from rich.table import Table

    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    return t


def columns_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]] = (),
    *,
    left: int = 1,
    no_wrap: bool = False,
) -> Any:
    """A rich ``Table`` titled ``title`` with a header of ``columns``: the first ``left`` columns
    left-aligned (names; never wrapped with ``no_wrap``), the others right-aligned (figures);
    ``rows`` (formatted already) added in order. More rows may be added to the table it returns."""
    from rich.table import Table

    t = Table(title=title)
    for i, c in enumerate(columns):
        if i < left:
            t.add_column(c, no_wrap=no_wrap)
        else:
            t.add_column(c, justify="right")
    for row in rows:
        t.add_row(*row)
    return t
