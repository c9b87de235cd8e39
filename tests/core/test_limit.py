"""The adaptive in-flight limit, fed by hand: what each event does, its bounds, and the
controller wiring.  Convergence against the engine model is in tests/sim/test_closed_loop.py."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tests.core.helpers import controller, make_job
from velvetrope.core import Job, Usage
from velvetrope.core.lifecycle import JobState
from velvetrope.core.limit import AdaptiveLimit
from velvetrope.core.limit_policy import AdaptiveLimitPolicy
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.pool_policy import PoolPolicy


class Engine:
    """A synthetic pool driven in virtual time: every job decodes for ``decode_s``; its
    first token comes ``prefill_s`` after dispatch, plus ``per_extra_s`` for each job in
    flight beyond ``knee`` at its dispatch (an engine queue past the knee)."""

    def __init__(self, lim: AdaptiveLimit, knee: int, *, stream: bool = True) -> None:
        self.lim = lim
        self.knee = knee
        self.stream = stream
        self.now = 0.0
        self.seq = 0
        self.events: list[tuple[float, int, str, Job]] = []
        self.in_flight = 0
        self.max_value = lim.value

    def dispatch(self) -> None:
        while self.in_flight < self.lim.value:
            self.seq += 1
            job = Job(f"j{self.seq}", "t", "default", 100, 50, streamed=self.stream)
            job.dispatched_at = self.now
            self.lim.started(job, self.now)
            self.in_flight += 1
            wait = 0.05 + 0.02 * max(0, self.in_flight - self.knee)
            first = self.now + wait
            if self.stream:
                self.events.append((first, self.seq, "first", job))
            self.events.append((first + 1.0, self.seq, "end", job))
            self.events.sort(key=lambda e: (e[0], e[1]))

    def run(self, until: float) -> None:
        self.dispatch()
        while self.events and self.events[0][0] <= until:
            t, _, kind, job = self.events.pop(0)
            self.now = t
            if kind == "first":
                job.first_token_at = t
                self.lim.first_token(job, t)
            else:
                if not self.stream:
                    job.first_token_at = t
                    self.lim.first_token(job, t)
                job.state = JobState.COMPLETED
                job.usage = Usage(100, 50)
                self.in_flight -= 1
                self.lim.ended(job, t)
            self.max_value = max(self.max_value, self.lim.value)
            self.dispatch()


def limit(**kw: float) -> AdaptiveLimit:
    return AdaptiveLimit(AdaptiveLimitPolicy.model_validate(kw))


def test_admits_below_its_value_only() -> None:
    lim = limit(initial=3)
    job = make_job()
    assert lim.value == 3
    assert lim.allows_dispatch(job, 2, 0, 0.0)
    assert not lim.allows_dispatch(job, 3, 0, 0.0)


def test_it_finds_a_synthetic_knee_and_holds_it() -> None:
    eng = Engine(limit(initial=4, window_s=2, min_jobs=10), knee=60)
    eng.run(1500.0)
    assert 0.9 * 60 <= eng.lim.knee <= 1.1 * 60
    tail = [p.limit for p in eng.lim.history]
    assert 50 <= sum(tail) / len(tail) <= 70


def test_without_a_queue_it_grows_to_its_ceiling_and_never_past_it() -> None:
    eng = Engine(limit(initial=4, ceiling=40, window_s=2, min_jobs=10), knee=10_000)
    eng.run(600.0)
    assert eng.lim.value == 40
    assert eng.max_value == 40


def test_it_never_goes_below_its_floor() -> None:
    eng = Engine(limit(initial=30, floor=25, window_s=2, min_jobs=10), knee=1)
    eng.run(600.0)
    assert eng.lim.value >= 25
    assert min(p.limit for p in eng.lim.history) >= 25


def test_a_response_that_is_not_streamed_is_not_a_queue() -> None:
    # every first token arrives with the last one: 1 s "to first token", all of it work;
    # with nothing else to go by, the limit sees no queue and grows
    eng = Engine(limit(initial=4, ceiling=200, window_s=2, min_jobs=10), knee=10, stream=False)
    eng.run(400.0)
    assert all(p.queue == 0 for p in eng.lim.history)
    assert eng.lim.value == 200


def test_app_limited_windows_do_not_grow_it() -> None:
    lim = limit(initial=50, window_s=1, min_jobs=1)
    t = 0.0
    for i in range(400):  # one job at a time, never near the limit
        job = Job(f"j{i}", "t", "default", 10, 10)
        job.dispatched_at = t
        lim.started(job, t)
        job.first_token_at = t + 0.01
        lim.first_token(job, t + 0.01)
        job.state = JobState.COMPLETED
        job.usage = Usage(10, 10)
        lim.ended(job, t + 0.5)
        t += 0.5
    assert lim.history
    assert not any(p.limited for p in lim.history)
    assert lim.base <= 50


def test_rescale_moves_the_limit_by_the_fleet_factor() -> None:
    lim = limit(initial=40, ceiling=100)
    lim.rescale(2.0)
    assert lim.value == 80
    lim.rescale(0.5)
    assert lim.value == 40
    lim.rescale(10.0)
    assert lim.value == 100  # the ceiling holds
    with pytest.raises(ValueError, match="factor"):
        lim.rescale(0.0)


def test_a_pool_tells_its_limit_how_many_engines_it_has() -> None:
    ctl, _ = controller({"pools": [{"name": "default", "adaptive": {"initial": 10}}]})
    cap = ctl.pool_capacity("default")
    lim = ctl.pool_limit("default")
    assert lim is not None and lim.value == 10  # one engine until told
    cap.set_engines(4)
    assert lim.value == 40
    cap.set_engines(0)  # none live: left alone
    assert lim.value == 40
    cap.set_engines(2)
    assert lim.value == 20
    cap.set_engines(2)
    assert lim.value == 20


def test_settings_are_checked() -> None:
    with pytest.raises(ValidationError):
        AdaptiveLimitPolicy(floor=10, ceiling=5)
    with pytest.raises(ValidationError):
        AdaptiveLimitPolicy(gradient=1.5)
    with pytest.raises(ValidationError):
        AdaptiveLimitPolicy(probe_gain=1.0)


def test_a_pool_without_max_in_flight_gets_the_adaptive_limit() -> None:
    pool = PoolPolicy(name="p")
    assert pool.max_in_flight is None
    assert pool.in_flight_ceiling == pool.adaptive.ceiling
    fixed = PoolPolicy(name="p", max_in_flight=8)
    assert fixed.in_flight_ceiling == 8
    ctl, clock = controller({"pools": [{"name": "default", "adaptive": {"initial": 2}}]})
    lim = ctl.pool_limit("default")
    assert lim is not None
    jobs = [make_job() for _ in range(3)]
    decisions = [type(ctl.arrive(j)).__name__ for j in jobs]
    assert decisions == ["Dispatched", "Dispatched", "Queued"]  # the limit, not 4096 slots
    assert ctl.status()["pools"]["default"]["max_in_flight"] == 2
    clock.advance(0.1)
    ctl.first_token(jobs[0].id)
    clock.advance(1.0)
    ctl.complete(jobs[0].id, Usage(100, 10))
    assert [j.id for j in ctl.dispatchable()] == [jobs[2].id]
    ctl.cancel(jobs[1].id)
    ctl.fail(jobs[2].id)
    assert ctl.in_flight == 0
    fixed_ctl, _ = controller({"pools": [{"name": "default", "max_in_flight": 2}]})
    assert fixed_ctl.pool_limit("default") is None


def test_the_default_policy_is_adaptive() -> None:
    cfg = PolicyConfig()
    assert cfg.pools[0].max_in_flight is None
    assert not math.isnan(AdaptiveLimit(cfg.pools[0].adaptive).knee)
