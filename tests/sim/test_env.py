"""The event environment: one clock, ties by time, then priority, then scheduling order."""

from __future__ import annotations

import math

import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.env import Environment, priority


def test_events_run_by_time_priority_then_sequence() -> None:
    env = Environment()
    log: list[tuple[float, str]] = []

    def rec(name: str) -> None:
        log.append((env.now, name))

    env.schedule(2.0, priority(1), rec, "b-late-class")
    env.schedule(2.0, priority(0, 5), rec, "a-rank5")
    env.schedule(2.0, priority(0, 1), rec, "a-rank1")
    env.schedule(1.0, priority(9), rec, "first")
    env.schedule(2.0, priority(1), rec, "b-second")
    env.run()
    assert log == [
        (1.0, "first"),
        (2.0, "a-rank1"),
        (2.0, "a-rank5"),
        (2.0, "b-late-class"),
        (2.0, "b-second"),
    ]


def test_callbacks_schedule_more_at_now_and_later() -> None:
    env = Environment()
    log: list[tuple[float, int]] = []

    def tick(n: int) -> None:
        log.append((env.now, n))
        if n < 3:
            env.schedule(env.now + 0.5 * n, priority(0), tick, n + 1)

    env.schedule(0.0, priority(0), tick, 0)
    env.run()
    assert log == [(0.0, 0), (0.0, 1), (0.5, 2), (1.5, 3)]
    assert env.now == 1.5 and len(env) == 0


def test_run_until_stops_before_later_events() -> None:
    env = Environment()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        env.schedule(t, priority(0), lambda _: seen.append(env.now))
    env.run(until=2.0)
    assert seen == [1.0, 2.0] and env.peek() == 3.0
    env.run(until=2.5)
    assert env.now == 2.5 and seen == [1.0, 2.0]
    env.run()
    assert seen == [1.0, 2.0, 3.0] and env.peek() == math.inf


def test_the_past_and_bad_priorities_are_refused() -> None:
    env = Environment(5.0)
    with pytest.raises(PolicyError):
        env.schedule(4.0, priority(0), print)
    with pytest.raises(PolicyError):
        env.schedule(math.nan, priority(0), print)
    with pytest.raises(PolicyError):
        priority(-1)
    with pytest.raises(PolicyError):
        priority(0, 1 << 40)
    assert priority(1, 0) > priority(0, (1 << 40) - 1)


def test_timers_go_first_at_a_time_by_index_and_move_without_leaving_stale_events() -> None:
    log: list[tuple[float, str]] = []

    def fire(k: int) -> None:
        log.append((env.now, f"timer{k}"))
        if k == 2 and len(log) == 3:
            env.timers[2] = 1.0  # set again for now: it runs again
        if k == 1:
            env.timers[0] = 1.0  # a lower index set for now goes next

    env = Environment(timers=3, on_timer=fire)
    env.schedule(1.0, priority(0), lambda _: log.append((env.now, "heap")))
    env.timers[1] = 5.0
    env.timers[1] = 1.0  # moved: nothing is left at 5.0
    env.timers[2] = 1.0
    assert env.peek() == 1.0 and len(env) == 3
    env.run()
    assert log == [
        (1.0, "timer1"),
        (1.0, "timer0"),
        (1.0, "timer2"),
        (1.0, "timer2"),
        (1.0, "heap"),
    ]
    assert env.timers == [math.inf] * 3 and env.peek() == math.inf and len(env) == 0


def test_run_until_stops_before_later_timers_and_timers_can_be_added() -> None:
    seen: list[tuple[float, int]] = []
    env = Environment(timers=1, on_timer=lambda k: seen.append((env.now, k)))
    env.timers[0] = 3.0
    env.run(until=2.0)
    assert env.now == 2.0 and seen == []
    env.timers.append(2.5)
    env.run()
    assert seen == [(2.5, 1), (3.0, 0)]


def test_a_due_timer_without_a_callback_is_refused() -> None:
    env = Environment(timers=1)
    env.timers[0] = 0.0
    with pytest.raises(PolicyError):
        env.run()
