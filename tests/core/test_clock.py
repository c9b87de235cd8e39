from __future__ import annotations

import pytest

from velvetrope.clock import Clock, ManualClock, SystemClock


def test_manual_clock_moves_only_when_told() -> None:
    c = ManualClock(5.0)
    assert c.now() == 5.0
    assert c.advance(1.5) == 6.5
    c.set(10.0)
    assert c.now() == 10.0


def test_manual_clock_refuses_to_go_back() -> None:
    c = ManualClock(3.0)
    with pytest.raises(ValueError, match="backwards"):
        c.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        c.set(2.0)


def test_system_clock_is_monotonic_and_a_clock() -> None:
    c = SystemClock()
    a = c.now()
    b = c.now()
    assert b >= a
    assert isinstance(c, Clock)
    assert isinstance(ManualClock(), Clock)
