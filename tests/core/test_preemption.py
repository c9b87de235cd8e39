"""Making room before the first token (:mod:`velvetrope.core.preemption`), on a ManualClock:
which job is taken back and when, what becomes of it (queued again at the head of its band,
or ended 503 ``preempted``), and what is never taken back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.helpers import arrive, controller, make_job, store_of
from velvetrope.core import Dispatched, PolicyConfig, Queued, Usage
from velvetrope.core.job import Job
from velvetrope.core.lifecycle import JobState, Reason
from velvetrope.core.scheduler import Scheduler

TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 2.0}},
    {"name": "standard", "slo": {"ttft_s": 10.0}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]
TENANTS = [
    {"name": "acme", "tier": "interactive"},
    {"name": "globex", "tier": "standard", "limits": {"tokens_per_minute": 60000}},
    {"name": "initech", "tier": "batch"},
]


def policy(slots: int = 2, **slo_limit: Any) -> dict[str, Any]:
    return {
        "tiers": TIERS,
        "tenants": TENANTS,
        "queue": {"bands": "strict"},
        "saturation": {"enabled": False},
        "pools": [
            {"name": "default", "limit": "slo", "max_in_flight": slots, "slo_limit": slo_limit}
        ],
    }


def test_a_late_top_tier_job_takes_back_the_last_sent_lower_tier_job() -> None:
    ctl, clock = controller(policy(slots=2))
    running = make_job("initech", "batch")
    waiting = make_job("initech", "batch")
    for j in (running, waiting):
        assert isinstance(arrive(ctl, j), Dispatched)
        ctl.sent(j.id)
    clock.advance(0.1)
    ctl.first_token(running.id)  # streamed a token: never taken back
    top = make_job("acme", "interactive")
    assert isinstance(arrive(ctl, top), Queued)
    assert ctl.next_deadline() == pytest.approx(0.1 + 0.5 * 2.0)  # when it asks for room
    clock.advance(0.5)
    assert ctl.dispatchable() == [] and ctl.take_preempted() == []  # not late yet
    clock.advance(0.5)  # it has waited half its TTFT: it asks
    assert ctl.dispatchable() == [top]
    taken = ctl.take_preempted()
    assert [(p.job, p.outcome) for p in taken] == [(waiting, None)]
    assert waiting.state is JobState.QUEUED and waiting.preemptions == 1
    assert ctl.status()["pools"]["default"]["preemptions"] == 1
    assert ctl.in_flight == 2 and ctl.queued == 1
    # the taken-back job is first in its band when a slot frees, and is not taken twice
    later = make_job("initech", "batch")
    assert isinstance(arrive(ctl, later), Queued)
    ctl.complete(running.id, Usage(100, 100))
    assert ctl.dispatchable() == [waiting]
    ctl.sent(waiting.id)
    clock.advance(5.0)
    arrive(ctl, make_job("acme", "interactive"))
    clock.advance(1.5)  # past its ask, before its deadline
    ctl.dispatchable()
    assert ctl.take_preempted() == []  # preempted once already: it keeps its place


def test_a_job_that_can_no_longer_start_in_time_ends_preempted_and_refunded() -> None:
    ctl, clock = controller(policy(slots=1))
    victim = make_job("globex", "standard", deadline=0.5)  # its own bound: 0.5 s
    assert isinstance(arrive(ctl, victim), Dispatched)
    ctl.sent(victim.id)
    settled: list[Any] = []
    ctl.observers.append(settled.append)
    top = make_job("acme", "interactive")
    arrive(ctl, top)
    clock.advance(1.0)
    assert ctl.dispatchable() == [top]
    (p,) = ctl.take_preempted()
    assert p.job is victim and p.outcome is not None
    assert p.outcome.reason is Reason.PREEMPTED and p.outcome.reason.status == 503
    assert p.retry_after_s is not None and p.retry_after_s >= 1.0
    assert victim.state is JobState.REJECTED and ctl.job(victim.id) is None
    assert [o.job for o in settled] == [victim]
    (line,) = p.outcome.settlement.lines
    assert line == ("tenant:globex:tok", victim.cost, 0.0), line  # refunded in full
    assert store_of(ctl).buckets.levels(clock.now())["tenant:globex:tok"][0] == pytest.approx(60000)


def test_nothing_is_taken_back_that_is_unsent_of_the_same_band_or_without_a_ttft() -> None:
    ctl, clock = controller(policy(slots=2))
    unsent = make_job("initech", "batch")  # dispatched, never reported sent
    same = make_job("acme", "interactive")
    for j in (unsent, same):
        arrive(ctl, j)
    ctl.sent(same.id)
    top = make_job("acme", "interactive")
    arrive(ctl, top)
    batch = make_job("initech", "batch")  # no TTFT objective: never asks
    arrive(ctl, batch)
    clock.advance(1.5)  # past the top job's ask, before its deadline
    assert ctl.dispatchable() == [] and ctl.take_preempted() == []
    off, clock2 = controller(policy(slots=1, preempt=False))
    low = make_job("initech", "batch")
    arrive(off, low)
    off.sent(low.id)
    arrive(off, make_job("acme", "interactive"))
    clock2.advance(1.5)
    assert off.dispatchable() == [] and off.take_preempted() == []
    assert off.status()["pools"]["default"]["preemptions"] is None


def test_a_job_taken_back_into_an_idle_weighted_band_is_not_owed_its_idle_turns() -> None:
    """Weighted bands: a band that was empty while another was served starts at the busy
    bands' pass whether its first job is new or taken back from an engine, so neither
    way does it win a run of turns it sat out."""
    config = PolicyConfig.model_validate(
        {
            "tiers": [{"name": "a"}, {"name": "b"}],
            "tenants": [{"name": "x", "tier": "a"}, {"name": "y", "tier": "b"}],
            "queue": {"bands": "weighted", "ordering": "fcfs"},
        }
    )
    orders = []
    for first in ("new", "taken back"):
        sched = Scheduler(config, lambda tenant: 1.0)
        seq = iter(range(1000))

        def put(tenant: str, band: int, sched: Scheduler = sched, seq: Any = seq) -> Job:
            job = make_job(tenant, "ab"[band])
            job.seq, job.band, job.cost, job.state = next(seq), band, 100, JobState.QUEUED
            job.arrival = float(job.seq)
            sched.enqueue(job, band, 100)
            return job

        for _ in range(10):
            put("x", 0)
        for _ in range(8):  # band a is served alone for a while
            assert sched.peek() is not None
            sched.pop()
        if first == "new":
            put("y", 1)
        else:
            job = make_job("y", "b")
            job.seq, job.band, job.cost, job.state = next(seq), 1, 100, JobState.QUEUED
            job.arrival = float(job.seq)
            sched.requeue(job)
        for _ in range(3):
            put("y", 1)
        served = []
        while sched.peek() is not None:
            served.append(sched.pop().tenant)
        orders.append(served)
    assert orders[0] == orders[1] == ["x", "y", "x", "y", "y", "y"]
