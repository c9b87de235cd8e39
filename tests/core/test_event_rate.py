"""The sliding-window rates the headroom, preemption, TPOT-limit and prefill-backlog rules
measure with."""

from __future__ import annotations

import pytest

from velvetrope.core.event_rate import AmountRate, EventRate


def test_the_rate_counts_the_events_within_the_window_ending_now() -> None:
    r = EventRate(5.0)
    assert r.rate(0.0) == 0.0
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):
        r.add(t)
    assert r.rate(4.0) == pytest.approx(1.0)  # five in the last 5 s
    assert r.rate(5.5) == pytest.approx(0.8)  # 0.0 has left the window (cut at 0.5)
    assert r.rate(9.5) == 0.0  # all of them have
    r.add(10.0)
    assert r.rate(10.0) == pytest.approx(0.2)


def test_an_amount_rate_sums_the_window_and_is_not_diluted_before_a_whole_one() -> None:
    r = AmountRate(5.0)
    assert r.rate(0.0) == 0.0
    r.add(10.0, 400.0)
    assert r.rate(10.0) == pytest.approx(400.0 / 0.25)  # at least a twentieth of the window
    r.add(11.0, 600.0)
    assert r.rate(12.0) == pytest.approx(1000.0 / 2.0)  # over the 2 s since the first
    r.add(14.0, 1000.0)
    assert r.rate(15.0) == pytest.approx(2000.0 / 5.0)  # a whole window: over it
    assert r.rate(15.5) == pytest.approx(1600.0 / 5.0)  # 10.0 has left (cut at 10.5)
    assert r.rate(30.0) == 0.0  # all of it has
    r.add(31.0, 50.0)
    assert r.rate(31.0) == pytest.approx(50.0 / 5.0)  # the span counts from the first ever
