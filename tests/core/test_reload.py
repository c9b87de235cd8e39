"""A policy reload in the controller: what it applies, what it keeps, what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.helpers import arrive, store_of
from velvetrope.core import Dispatched, Outcome, PolicyConfig, Queued, Rejected, Usage
from velvetrope.core.lifecycle import JobState, Reason
from velvetrope.errors import PolicyError

from .helpers import controller, make_job


def _policy(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "queue": {"bands": "strict", "fairness": "vtc", "ordering": "fcfs"},
        "tiers": [{"name": "hi"}, {"name": "lo"}],
        "tenants": [
            {"name": "a", "tier": "hi"},
            {"name": "b", "tier": "lo", "limits": {"requests_per_minute": 6}},
        ],
        "pools": [{"name": "default", "max_in_flight": 1}],
    }
    base.update(over)
    return base


def _cfg(d: dict[str, Any]) -> PolicyConfig:
    return PolicyConfig.model_validate(d)


def test_settings_that_need_a_restart_are_refused_and_nothing_changes() -> None:
    ctl, _ = controller(_policy())
    for change in (
        {"queue": {"bands": "weighted", "fairness": "vtc", "ordering": "fcfs"}},
        {"estimator": {"quantile": 0.5}},
        {"saturation": {"max_waiting": 9}},
        {"pools": [{"name": "default"}]},  # fixed -> adaptive
    ):
        with pytest.raises(PolicyError, match="needs a restart"):
            ctl.reconfigure(_cfg(_policy(**change)))
    assert ctl.config.pools[0].max_in_flight == 1
    assert ctl.config.queue.bands == "strict"


def test_a_raised_limit_dispatches_what_waits_and_queued_jobs_keep_their_place() -> None:
    ctl, _ = controller(_policy())
    first = make_job("b", "lo")
    assert isinstance(arrive(ctl, first), Dispatched)
    waiting = [make_job("b", "lo") for _ in range(2)]
    assert all(isinstance(arrive(ctl, j), Queued) for j in waiting)
    # a new top tier in front: the waiting jobs' band is renumbered, their order kept
    d = _policy(pools=[{"name": "default", "max_in_flight": 2}])
    d["tiers"] = [{"name": "urgent"}, {"name": "hi"}, {"name": "lo"}]
    d["tenants"].append({"name": "u", "tier": "urgent"})
    assert ctl.reconfigure(_cfg(d)) == []
    assert [j.band for j in (first, *waiting)] == [2, 2, 2]
    assert ctl.dispatchable() == [waiting[0]]  # the raised limit lets one more go
    u = make_job("u", "urgent")
    assert isinstance(arrive(ctl, u), Queued)
    ctl.complete(first.id, Usage(100, 10))
    assert ctl.dispatchable() == [u]  # the new top tier goes first
    ctl.complete(u.id, Usage(100, 10))
    assert ctl.dispatchable() == [waiting[1]]
    for j in waiting:
        ctl.complete(j.id, Usage(100, 10))
    assert ctl.in_flight == 0 and ctl.queued == 0


def test_removed_tenant_tier_and_pool_reject_their_queued_jobs_and_finish_running_ones() -> None:
    d = _policy(pools=[{"name": "default", "max_in_flight": 1}, {"name": "x", "max_in_flight": 1}])
    d["routes"] = [{"pool": "x", "models": ["mx"]}]
    d["tenants"].append({"name": "c", "tier": "hi"})
    ctl, _ = controller(d)
    running = make_job("a", "hi")
    assert isinstance(arrive(ctl, running), Dispatched)
    of_a = make_job("a", "hi")
    of_c = make_job("c", "hi")
    in_x = make_job("c", "hi", model="mx")
    in_x2 = make_job("c", "hi", model="mx")
    for j in (of_a, of_c, in_x, in_x2):
        ctl.route(j)
    assert isinstance(arrive(ctl, of_a), Queued) and isinstance(arrive(ctl, of_c), Queued)
    assert isinstance(arrive(ctl, in_x), Dispatched) and isinstance(arrive(ctl, in_x2), Queued)
    new = _policy()  # tenant c, tier "hi"'s tenant a kept; pool x and its route gone
    new["tiers"] = [{"name": "lo"}]
    new["tenants"] = [{"name": "b", "tier": "lo"}]
    seen: list[Outcome] = []
    ctl.observers.append(seen.append)
    out = ctl.reconfigure(_cfg(new))
    assert {o.job.id for o in out} == {of_a.id, of_c.id, in_x2.id}
    assert all(o.reason is Reason.REMOVED_BY_RELOAD and o.state is JobState.REJECTED for o in out)
    assert [o.job.id for o in seen] == [o.job.id for o in out]  # observers hear each once
    assert ctl.queued == 0 and ctl.in_flight == 2
    assert running.band == -1  # its tier is gone: it finishes without a band
    ctl.complete(running.id, Usage(100, 10))
    ctl.complete(in_x.id, Usage(100, 10))
    assert ctl.in_flight == 0
    late = make_job("b", "lo")
    assert isinstance(arrive(ctl, late), Dispatched)


def test_bucket_levels_carry_over_raised_refill_from_the_level_lowered_clip() -> None:
    ctl, clock = controller(_policy(pools=[{"name": "default", "max_in_flight": 100}]))

    def take() -> float:
        j = make_job("b", "lo")
        d = arrive(ctl, j)
        assert not isinstance(d, Rejected), d
        ctl.complete(j.id, Usage(100, 10))
        b = store_of(ctl).buckets.get("tenant:b:req")
        assert b is not None
        return b.refill(clock.now())

    assert [take() for _ in range(3)] == [5, 4, 3]
    raised = _policy(pools=[{"name": "default", "max_in_flight": 100}])
    raised["tenants"][1]["limits"] = {"requests_per_minute": 60}
    ctl.reconfigure(_cfg(raised))
    assert take() == 2  # from the level it had, not a fresh full bucket
    clock.advance(1.0)  # refills at the new rate: 1 per second
    assert take() == 2
    lowered = _policy(pools=[{"name": "default", "max_in_flight": 100}])
    lowered["tenants"][1]["limits"] = {"requests_per_minute": 1}
    ctl.reconfigure(_cfg(lowered))
    assert take() == 0  # clipped to the new capacity of 1, then this request took it
    j = make_job("b", "lo")
    d = arrive(ctl, j)
    assert isinstance(d, Rejected) and d.reason is Reason.RATE_LIMITED


def test_a_tenants_new_weight_applies_to_its_fair_share() -> None:
    d = _policy(pools=[{"name": "default", "max_in_flight": 1}])
    d["tenants"] = [{"name": "x", "tier": "hi"}, {"name": "y", "tier": "hi"}]
    ctl, _ = controller(d)
    blocker = make_job("x", "hi")
    arrive(ctl, blocker)
    jobs = [make_job(t, "hi") for t in ("x", "y") * 4]
    for j in jobs:
        arrive(ctl, j)
    d2 = _policy(pools=[{"name": "default", "max_in_flight": 1}])
    d2["tenants"] = [{"name": "x", "tier": "hi", "weight": 3.0}, {"name": "y", "tier": "hi"}]
    ctl.reconfigure(_cfg(d2))
    order = []
    running = blocker
    while ctl.queued:
        ctl.complete(running.id, Usage(100, 100))
        (running,) = ctl.dispatchable()
        order.append(running.tenant)
    assert order[:4].count("x") == 3  # weight 3 against 1: x takes three of the first four
