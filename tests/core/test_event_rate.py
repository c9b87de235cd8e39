"""The sliding-window event rate the headroom, preemption and TPOT-limit rules measure with."""

from __future__ import annotations

import pytest

from velvetrope.core.event_rate import EventRate


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
