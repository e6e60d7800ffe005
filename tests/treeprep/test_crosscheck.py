"""The cross-check schedule (treeprep.crosscheck): short texts keep the old schedule
exactly, a growing session's checks re-render characters linear in its length, and the checks keep
coming to the end of a session however fast it grows."""

from __future__ import annotations

import random
import re

import pytest

from treeprep.crosscheck import CHECK_EVERY, CHECK_FIRST, REFERENCE_CHARS, CrossCheck
from treeprep.errors import NativeTemplateMismatch
from treeprep.render import Renderer


def _checked(lengths: list[int], c: CrossCheck | None = None) -> list[int]:
    c = c or CrossCheck()
    return [k for k, n in enumerate(lengths) if c.due(n)]


def _old_rule(n: int) -> list[int]:
    return [k for k in range(n) if k < CHECK_FIRST or k % CHECK_EVERY == 0]


def _session(n: int, u: int) -> list[int]:
    """The render lengths of a session growing by ``u`` characters a turn."""
    return [k * u for k in range(1, n + 1)]


def test_short_texts_keep_the_first_16_and_every_64th() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(0, REFERENCE_CHARS) for _ in range(5000)]
    c = CrossCheck()
    assert _checked(lengths, c) == _old_rule(5000)
    assert c.renders == 5000 and c.checks == len(_old_rule(5000))
    assert c.checked_chars == sum(lengths[k] for k in _old_rule(5000))
    assert _checked([100] * 200) == [*range(16), 64, 128, 192]


def test_a_growing_session_checks_characters_linear_in_its_length() -> None:
    u = 200
    sums = {}
    for n in (1000, 2000, 4000):
        lengths = _session(n, u)
        c = CrossCheck()
        checked = _checked(lengths, c)
        sums[n] = sum(lengths[k] for k in checked)
        assert sums[n] == c.checked_chars
        # the last text once or so, plus a bounded number of characters a render
        assert sums[n] <= 2 * (lengths[-1] + n * REFERENCE_CHARS // CHECK_EVERY)
        assert sums[n] <= n * REFERENCE_CHARS // 8
    old = {n: sum(_session(n, u)[k] for k in _old_rule(n)) for n in sums}
    assert sums[2000] < 3 * sums[1000] and sums[4000] < 3 * sums[2000]
    assert old[2000] > 3.9 * old[1000] and old[4000] > 3.9 * old[2000]


@pytest.mark.parametrize("u", [200, 1000, 5000, 50_000])
def test_checks_keep_coming_to_the_end_of_a_growing_session(u: int) -> None:
    """Each message is in every later render, so a check near the end re-renders all of them.
    The interval after a check of L characters is CHECK_EVERY * L / REFERENCE_CHARS renders,
    so the checked renders grow by at most the ratio r below: however fast the session grows
    (faster than REFERENCE_CHARS / CHECK_EVERY characters a turn included, where spacing by the
    current length alone would never check again), the last check is within r of the end."""
    n = 3000
    checked = _checked(_session(n, u))
    r = 1 + CHECK_EVERY * u / REFERENCE_CHARS
    spaced = [k for k in checked if k >= CHECK_FIRST]  # render k is (k + 1) * u long
    assert all(
        b <= max(a + CHECK_EVERY, (a + 1) * r + 1) for a, b in zip(spaced, spaced[1:], strict=False)
    )
    assert (checked[-1] + 1) * r + 1 >= n


def test_a_long_render_does_not_mute_the_short_ones_after_it() -> None:
    """A session of short calls after a long one (say, the next file) is checked every 64th
    render as before; the long render's length spaces only longer renders."""
    c = CrossCheck()
    assert _checked([100] * 64 + [50 * REFERENCE_CHARS], c) == [*range(16), 64]
    assert _checked([100] * 200, c) == [63, 127, 191]


def test_the_schedule_is_deterministic() -> None:
    rng = random.Random(1)
    lengths = [rng.randint(0, 40 * REFERENCE_CHARS) for _ in range(3000)]
    assert _checked(lengths) == _checked(lengths)


def test_bad_parameters_are_refused() -> None:
    for kw in ({"first": -1}, {"every": 0}, {"reference": 0}):
        with pytest.raises(ValueError):
            CrossCheck(**kw)


def test_a_port_bug_in_an_early_message_of_a_long_session_is_caught_late() -> None:
    """The renderer with a port that renders one message wrong in every render that holds it,
    a message that arrives after the first 16 renders and between two checks: the spaced
    checks of the long texts after it still catch it, naming the record."""
    r = Renderer.load(None)
    good = r._native
    assert good is not None
    r._native = lambda msgs, tools, gen: good(msgs, tools, gen).replace("BUG", "BUGGY")
    msgs: list[dict] = [{"role": "system", "content": "s" * 100}]
    with pytest.raises(NativeTemplateMismatch, match=r"f:(\d+)") as e:
        for k in range(1500):
            text = "BUG" if k == 500 else "x" * 400
            msgs.append({"role": "user" if k % 2 else "assistant", "content": text})
            r.render_text(msgs, None, where=f"f:{k}")
    m = re.match(r"f:(\d+):", str(e.value))
    assert m is not None
    late = int(m.group(1))
    assert 500 < late < 1500 and r._native_check.renders == late + 1
