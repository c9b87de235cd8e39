"""Shadow mode in the controller: every decision computed as if enforced, every job run."""

from __future__ import annotations

from typing import Any

from tests.core.helpers import arrive, store_of
from velvetrope.core import Dispatched, Queued, Rejected, Usage
from velvetrope.core.lifecycle import JobState

from .helpers import controller, make_job


def _policy(enforce: bool, **tenant: Any) -> dict[str, Any]:
    return {
        "tiers": [{"name": "hi"}, {"name": "lo", "max_wait_s": 5.0}],
        "tenants": [
            {"name": "a", "tier": "hi", "enforce": enforce, **tenant},
            {"name": "b", "tier": "lo"},
        ],
        "pools": [{"name": "default", "max_in_flight": 2}],
    }


def _decision(d: object) -> tuple[str, str]:
    if isinstance(d, Dispatched):
        return ("admitted", "")
    if isinstance(d, Queued):
        return ("queued", "capacity")
    assert isinstance(d, Rejected)
    return ("rejected", d.reason.code)


def test_shadow_decisions_are_what_enforcement_decides_and_every_job_runs() -> None:
    limits = {"limits": {"requests_per_minute": 0.6, "request_burst": 5}}
    roomy = {"pools": [{"name": "default", "max_in_flight": 100}]}
    shadow, _ = controller({**_policy(False, **limits), **roomy})
    enforced, _ = controller({**_policy(True, **limits), **roomy})
    said: list[tuple[str, str]] = []
    did: list[tuple[str, str]] = []
    for _ in range(12):
        j = make_job("a", "hi")
        assert isinstance(arrive(shadow, j), Dispatched) and j.state is JobState.DISPATCHED
        assert j.shadow is not None
        said.append((j.shadow, j.shadow_reason))
        did.append(_decision(arrive(enforced, make_job("a", "hi"))))
    assert did == [("admitted", "")] * 5 + [("rejected", "rate_limited")] * 7
    assert said == did  # one rule: the same decisions, the same bucket
    assert store_of(shadow).buckets.levels(0.0) == store_of(enforced).buckets.levels(0.0)
    assert shadow.in_flight == 12  # every one of them passed through


def test_shadow_work_takes_capacity_and_is_never_queued() -> None:
    ctl, _ = controller(_policy(False))
    jobs = [make_job("a", "hi") for _ in range(5)]
    assert all(isinstance(arrive(ctl, j), Dispatched) for j in jobs)
    assert [(j.shadow, j.shadow_reason) for j in jobs] == [("admitted", "")] * 2 + [
        ("queued", "capacity")
    ] * 3
    assert ctl.in_flight == 5 and ctl.queued == 0  # over max_in_flight 2: passed through
    # shadow jobs never join the queue, so queue bounds (a tenant's max_queued) cannot
    # bind them: their decisions say "queued" where enforcement might have refused
    b = make_job("b", "lo")
    assert isinstance(arrive(ctl, b), Queued)  # an enforced tenant sees the load they add
    for j in jobs:
        ctl.complete(j.id, Usage(100, 10))
    assert ctl.dispatchable() == [b]


def test_a_shadow_rejection_after_a_grant_is_charged_nothing() -> None:
    cfg = {
        "tiers": [{"name": "hi"}, {"name": "lo", "max_wait_s": 0.001}],
        "tenants": [
            {"name": "a", "tier": "lo", "enforce": False, "limits": {"tokens_per_minute": 6000}},
            {"name": "b", "tier": "hi"},
        ],
        "pools": [{"name": "default", "max_in_flight": 1, "initial_drain_tokens_per_s": 1.0}],
    }
    ctl, _ = controller(cfg)
    running = make_job("b", "hi", predicted=100)
    waiting = make_job("b", "hi", predicted=100)
    assert isinstance(arrive(ctl, running), Dispatched)
    assert isinstance(arrive(ctl, waiting), Queued)
    a = make_job("a", "lo", prompt=100, max_tokens=100, predicted=100)
    assert isinstance(arrive(ctl, a), Dispatched)  # passed through
    assert (a.shadow, a.shadow_reason) == ("rejected", "wait_exceeds_slo")  # 200 s ahead
    bucket = store_of(ctl).buckets.get("tenant:a:tok")
    assert bucket is not None
    before = bucket.level  # its 200 tokens were reserved
    ctl.complete(a.id, Usage(100, 100))
    assert bucket.level == before + 200  # refunded in full: enforcement would not have run it
