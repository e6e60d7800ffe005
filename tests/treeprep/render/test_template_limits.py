"""Issue 15 item 3 and issue 14 item 10: hostile templates become rejects, dates are fixed.

A template that loops forever, builds a gigantic string or recurses without end must give a
:class:`RenderError` for that record (with its reason) and leave the renderer usable; a build with
such a template rejects its records and still finishes. ``strftime_now`` reports the record's
timestamp, else ``--date``, else the documented constant.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from treeprep.build import BuildConfig, FileOptions, build
from treeprep.errors import RenderError
from treeprep.render import Renderer
from treeprep.render.dates import DEFAULT_DATE
from treeprep.render.template import ChatTemplate, RenderLimits
from treeprep.schemas import ChatCall

MSGS = [{"role": "user", "content": "hi"}]
LIMITS = RenderLimits(timeout_s=0.5, max_chars=1 << 20)

NESTED_LOOPS = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
    "{% endfor %}{% endfor %}{% endfor %}"
)
HUGE_STRING = "{{ 'x' * 3000000000 }}"
DOUBLING = (
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s | length }}"
)
MACRO_DOUBLING = (
    "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}"
    "{% endmacro %}{{ f('ab', 60) }}"
)
RECURSION = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
BIG_OUTPUT = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
POWER = "{{ 7 ** 100000000 }}"


def test_nested_loops_hit_the_time_limit() -> None:
    t = ChatTemplate(NESTED_LOOPS, limits=LIMITS)
    t0 = time.monotonic()
    with pytest.raises(RenderError, match="time limit"):
        t.render(MSGS, None, False)
    assert time.monotonic() - t0 < 5
    # the renderer is still usable afterwards, and a stale timeout never hits a later render
    ok = ChatTemplate("{{ messages[0].content }}", limits=LIMITS)
    for _ in range(50):
        assert ok.render(MSGS, None, False) == "hi"
    time.sleep(0.8)
    assert ok.render(MSGS, None, False) == "hi"


@pytest.mark.parametrize(
    "source", [HUGE_STRING, DOUBLING, MACRO_DOUBLING, BIG_OUTPUT, POWER], ids=lambda s: s[:24]
)
def test_huge_strings_hit_the_size_limit(source: str) -> None:
    with pytest.raises(RenderError, match="too large"):
        ChatTemplate(source, limits=LIMITS).render(MSGS, None, False)


def test_recursion_is_a_reject() -> None:
    with pytest.raises(RenderError, match="recursed too deeply"):
        ChatTemplate(RECURSION, limits=LIMITS).render(MSGS, None, False)


def test_syntax_error_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="does not compile"):
        ChatTemplate("{% for %}")


@pytest.mark.parametrize("source", [NESTED_LOOPS, HUGE_STRING, RECURSION])
def test_a_hostile_template_rejects_records_and_the_build_finishes(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treeprep.render import template as tm

    monkeypatch.setattr(tm, "RenderLimits", lambda: LIMITS)
    tpl = tmp_path / "evil.jinja"
    tpl.write_text(source)
    logs = tmp_path / "calls.jsonl"
    rec = {"messages": MSGS, "completion": {"role": "assistant", "content": "yo"}}
    logs.write_bytes(orjson.dumps(rec) + b"\n" + orjson.dumps(rec) + b"\n")
    # every record breaches the limits: each is a reject, and the build ends with the clean
    # "nothing to train on" error (no traceback, no hang, rejects written)
    from treeprep.errors import EmptyBuildError

    with pytest.raises(EmptyBuildError, match="2 read, 2 rejected"):
        build(
            BuildConfig(
                inputs=[str(logs)],
                out=str(tmp_path / "out"),
                file=FileOptions(chat_template=str(tpl)),
            )
        )
    rejects = [
        orjson.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_bytes().splitlines()
    ]
    assert all("chat template" in r["reason"] for r in rejects)


# ------------------------------------------------------------------------------------------------
# issue 14 item 10: deterministic dates
# ------------------------------------------------------------------------------------------------

DATED = "{{ strftime_now('%Y-%m-%d') }}|{% for m in messages %}{{ m.content }}{% endfor %}"


def _dated_renderer(tmp_path: Path, date: str | None = None) -> Renderer:
    tpl = tmp_path / "dated.jinja"
    tpl.write_text(DATED)
    return Renderer.load(None, chat_template=tpl, date=date)


def _text(r: Renderer, **kw: object) -> str:
    rec = ChatCall(
        call_id="c", messages=MSGS, completion={"role": "assistant", "content": "yo"}, **kw
    )
    return r.decode(r.render(rec, group_id="g").tokens)


def test_strftime_now_reads_the_record_then_date_then_the_constant(tmp_path: Path) -> None:
    r = _dated_renderer(tmp_path)
    assert _text(r).startswith(DEFAULT_DATE.strftime("%Y-%m-%d") + "|")
    assert _text(r, timestamp="2024-02-29T23:59:00Z").startswith("2024-02-29|")
    r2 = _dated_renderer(tmp_path, date="2023-07-01")
    assert _text(r2).startswith("2023-07-01|")
    assert _text(r2, timestamp="2024-02-29T10:00:00+02:00").startswith("2024-02-29|")
    assert r2.cache_key != r.cache_key  # a build's work is keyed by the date too


def test_strftime_now_never_reads_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            raise AssertionError("the clock was read")

    monkeypatch.setattr(dt, "datetime", Frozen)
    assert ChatTemplate(DATED).render(MSGS, None, False) == "2025-01-01|hi"


def test_bad_date_option_is_an_error() -> None:
    from treeprep.errors import TokenizerError

    with pytest.raises(TokenizerError, match="--date 'soon'"):
        Renderer.load(None, date="soon")


# ------------------------------------------------------------------------------------------------
# issue 26 item 5: a hostile template costs a build seconds, not hours
# ------------------------------------------------------------------------------------------------


def test_regression_a_hostile_template_ran_every_probe_at_the_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building a renderer ran about 600 probe renders, each to the 10 s limit (1.7 hours):
    probing now stops at the first render that breaks a limit."""
    from treeprep.render import template as tm

    monkeypatch.setattr(tm, "RenderLimits", lambda: RenderLimits(timeout_s=0.05))
    renders = []
    real = ChatTemplate._render_once

    def counted(self: ChatTemplate, variables: dict) -> tuple:
        renders.append(1)
        return real(self, variables)

    monkeypatch.setattr(ChatTemplate, "_render_once", counted)
    tpl = tmp_path / "evil.jinja"
    tpl.write_text(NESTED_LOOPS)
    r = Renderer.load(None, chat_template=tpl)
    assert len(renders) == 1 and r.incremental is None


def test_the_time_budget_fails_renders_at_once_once_spent() -> None:
    t = ChatTemplate(NESTED_LOOPS, limits=RenderLimits(timeout_s=0.05, budget_s=0.12))
    # each render runs past the 0.05 s limit (by more on a loaded machine): they are timeouts
    # until their seconds reach the 0.12 s budget, at most 3 of them
    spent_before = []
    while t.overrun_s < 0.12:
        spent_before.append(t.overrun_s)
        with pytest.raises(RenderError, match="time limit"):
            t.render(MSGS, None, False)
    n = t.overruns
    assert n == len(spent_before) <= 3 and spent_before[-1] < 0.12
    with pytest.raises(RenderError, match=rf"time budget is spent: {n} renders ran past"):
        t.render(MSGS, None, False)
    assert t.overruns == n  # refused before rendering


def test_regression_the_time_budget_was_per_process_so_workers_multiplied_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 5: each of ``--workers N`` had its own budget, so a hostile template could
    spend N budgets. One budget per build now: the renders past the time limit, the probe
    included, add up to at most one budget, plus one render per worker that was already
    running when it ran out."""
    from treeprep.errors import EmptyBuildError
    from treeprep.render import template as tm

    timeout, budget, workers = 0.2, 3.0, 2
    monkeypatch.setattr(
        tm, "RenderLimits", lambda: RenderLimits(timeout_s=timeout, budget_s=budget)
    )
    tpl = tmp_path / "evil.jinja"
    tpl.write_text(NESTED_LOOPS)
    rec = orjson.dumps({"messages": MSGS, "completion": {"role": "assistant", "content": "yo"}})
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(4):
        (logs / f"calls{i}.jsonl").write_bytes((rec + b"\n") * 12)
    out = tmp_path / "out"
    cfg = BuildConfig(
        inputs=[str(logs)], out=str(out), workers=workers, file=FileOptions(chat_template=str(tpl))
    )
    with pytest.raises(EmptyBuildError, match="48 read, 48 rejected"):
        build(cfg)
    reasons = [orjson.loads(x)["reason"] for x in (out / "rejects.jsonl").read_bytes().splitlines()]
    timed_out = sum("ran past its time limit" in r for r in reasons)
    refused = [r for r in reasons if "time budget is spent" in r]
    assert timed_out + len(refused) == 48
    # the probe's overrun is one more; before the fix each worker spent its own 3 s (about 22)
    assert 1 + timed_out <= budget / timeout + workers
    assert refused and all("per build" in r for r in refused)
