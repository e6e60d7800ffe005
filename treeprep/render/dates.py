"""The date a chat template prints.

A fixed date
------------
``strftime_now`` does not read the clock: a template that prints the date (gpt-oss, Llama 3.1)
gets the date passed to :meth:`~treeprep.render.template.ChatTemplate.render` (the record's
timestamp, else ``--date``, else :data:`DEFAULT_DATE`), so a build gives the same bytes on any day.

The same date for a session's calls
-----------------------------------
A session's calls are minutes apart, and the caches of renders (incremental rendering, the
previous turn's ids) are keyed by the date they render with: keyed by each call's time, no call
found the text of the one before. A template is read once for what its ``strftime_now`` calls
print (:func:`reads_date`), and a call renders with :func:`reported_date`: midnight of its day
where every format reads only the date, so the text is the same and the keys match.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

__all__ = ["DEFAULT_DATE", "parse_date", "reads_date", "reported_date", "strftime_at"]

#: the date ``strftime_now`` reports when the record has no timestamp and no ``--date`` is given
DEFAULT_DATE = datetime(2025, 1, 1, tzinfo=UTC)

#: what a template's ``strftime_now`` calls read of the date
Reads = Literal["no", "day", "time"]

#: strftime directives that read only the date (and ``%%``): what they print at midnight is what
#: they print all day
_DATE_ONLY = frozenset("aAbBCdDeFgGhjmuUVwWxyY%")
#: ``strftime_now is defined`` (Llama 3.1 tests it before the call): no call
_DEFINED_TEST = re.compile(r"strftime_now\s+is\s+(?:not\s+)?defined")
_LITERAL_FORMAT = re.compile(r"""strftime_now\s*\(\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\)""")


def reads_date(source: str) -> Reads:
    """What a template's ``strftime_now`` calls read of the date: "no" (never called), "day"
    (only literal formats of date-only directives), "time" (anything else).

    >>> reads_date("{{ strftime_now('%Y-%m-%d') }}"), reads_date("{{ strftime_now('%H') }}")
    ('day', 'time')
    >>> reads_date("{% set f = '%d' %}{{ strftime_now(f) }}"), reads_date("{{ messages }}")
    ('time', 'no')
    """
    calls = len(re.findall(r"strftime_now", _DEFINED_TEST.sub("", source)))
    if not calls:
        return "no"
    formats = [a or b for a, b in _LITERAL_FORMAT.findall(source)]
    if len(formats) != calls:
        return "time"  # a format that is not a literal, or the function passed around
    for fmt in formats:
        directives = re.findall(r"%(.)", fmt.replace("%%", ""))
        if not set(directives) <= _DATE_ONLY or fmt.replace("%%", "").endswith("%"):
            return "time"
    return "day"


def reported_date(reads: Reads, now: datetime | None) -> datetime | None:
    """A date a template that ``reads`` so prints as it prints ``now``: midnight of ``now``'s
    day where it reads only the day, None where it never calls ``strftime_now``, else ``now``."""
    if now is None or reads == "time":
        return now
    if reads == "no":
        return None
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def strftime_at(now: datetime) -> Callable[[str], str]:
    """The ``strftime_now`` a template renders with: ``now`` formatted, never the clock."""

    def strftime_now(fmt: str) -> str:
        return now.strftime(fmt)

    return strftime_now


def parse_date(value: str | None) -> datetime | None:
    """A record's timestamp or ``--date`` as a datetime (ISO 8601, a trailing ``Z`` allowed; a
    naive time is taken as UTC), None when absent or unreadable."""
    if not value or not isinstance(value, str):
        return None
    s = value.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        d = datetime.fromisoformat(s)
    except ValueError:
        return None
    return d if d.tzinfo is not None else d.replace(tzinfo=UTC)
