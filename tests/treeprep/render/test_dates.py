"""treeprep.render.dates: what a template prints of the date, and the date a call renders with,
checked against the template's own render at the call's time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from treeprep.render.dates import parse_date, reads_date, reported_date
from treeprep.render.template import ChatTemplate

LLAMA = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}'
    '{%- set date_string = "26 Jul 2024" %}{%- endif %}{%- endif %}'
    "Today Date: {{ date_string }}|{% for m in messages %}{{ m.content }}{% endfor %}"
)
GPT_OSS = "Current date: {{ strftime_now('%Y-%m-%d') }}|{{ messages[0].content }}"


@pytest.mark.parametrize(
    ("source", "reads"),
    [
        (GPT_OSS, "day"),
        (LLAMA, "day"),
        ("{{ strftime_now('%d %b %Y %H:%M') }}", "time"),
        ("{{ strftime_now('%-d %b') }}", "time"),  # a flag: not read as a date-only directive
        ("{% set f = '%Y' %}{{ strftime_now(f) }}", "time"),
        ("{{ messages[0].content }}", "no"),
    ],
)
def test_what_a_template_reads_of_the_date(source: str, reads: str) -> None:
    assert reads_date(source) == reads


@pytest.mark.parametrize("source", [GPT_OSS, LLAMA, "{{ strftime_now('%H:%M') }}|{{ 1 }}"])
def test_the_reported_date_prints_as_the_calls_time_does(source: str) -> None:
    """Every minute of a day renders the same text as its reported date, and the reported dates
    of a day's calls are one (for a template that prints only the day)."""
    t = ChatTemplate(source)
    msgs = [{"role": "user", "content": "hi"}]
    seen = set()
    for minute in range(0, 24 * 60, 97):
        now = datetime(2025, 3, 1, minute // 60, minute % 60, 7, tzinfo=UTC)
        at = t.reported_date(now)
        seen.add(at)
        assert t.render(msgs, None, False, now=at) == t.render(msgs, None, False, now=now)
    assert (len(seen) == 1) == (reads_date(source) == "day")


def test_a_template_that_prints_no_date_renders_with_none() -> None:
    assert reported_date("no", datetime(2025, 3, 1, 10, tzinfo=UTC)) is None
    assert reported_date("day", None) is None


def test_parse_date() -> None:
    assert parse_date("2024-05-06") == datetime(2024, 5, 6, tzinfo=UTC)
    assert parse_date("2024-05-06T07:08:09.123Z") == datetime(
        2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC
    )
    assert parse_date("yesterday") is None and parse_date(None) is None
