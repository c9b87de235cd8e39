from __future__ import annotations

import math

import pytest

from tests.core.helpers import arrive, store_of
from velvetrope.core import (
    AdmissionController,
    Denial,
    Dispatched,
    Grant,
    JobState,
    PolicyConfig,
    Queued,
    Reason,
    Rejected,
    Usage,
)
from velvetrope.errors import LifecycleError, PolicyError, UnknownJobError

from .helpers import controller, make_job

ONE_SLOT = {"pools": [{"name": "default", "max_in_flight": 1}]}


def test_admits_at_once_when_idle_then_queues() -> None:
    ctl, _ = controller(ONE_SLOT)
    a = make_job()
    assert isinstance(arrive(ctl, a), Dispatched)
    assert a.state is JobState.DISPATCHED
    b = make_job()
    d = arrive(ctl, b)
    assert isinstance(d, Queued)
    assert d.position == 0
    assert ctl.dispatchable() == []
    ctl.complete(a.id, Usage(100, 50))
    assert ctl.dispatchable() == [b]
    assert b.state is JobState.DISPATCHED
    ctl.complete(b.id, Usage(100, 50))
    assert ctl.in_flight == 0 and ctl.queued == 0


def test_tenant_over_its_token_limit_gets_429_with_retry_after() -> None:
    cfg = {
        "tenants": [{"name": "acme", "tier": "default", "limits": {"tokens_per_minute": 600}}],
    }
    ctl, clock = controller(cfg)
    # cost = prompt 100 + predicted 200 = 300; 600 tokens/min = 10 tokens/s
    j1 = make_job("acme", predicted=200)
    j2 = make_job("acme", predicted=200)
    assert isinstance(arrive(ctl, j1), Dispatched)
    assert isinstance(arrive(ctl, j2), Dispatched)
    j3 = make_job("acme", predicted=200)
    d = arrive(ctl, j3)
    assert isinstance(d, Rejected)
    assert d.reason is Reason.RATE_LIMITED and d.status == 429
    assert d.retry_after_s == pytest.approx(30.0)
    assert {s.key for s in d.snapshots} == {"tenant:acme:tok"}
    # settle j1 with only 150 tokens used: 150 refunded
    ctl.complete(j1.id, Usage(100, 50))
    assert store_of(ctl).levels()["tenant:acme:tok"][0] == pytest.approx(150)
    clock.advance(15)  # 150 + 150 refilled = 300
    assert isinstance(arrive(ctl, make_job("acme", predicted=200)), Dispatched)


def test_request_larger_than_the_bucket_is_refused_for_good() -> None:
    cfg = {"tenants": [{"name": "a", "tier": "default", "limits": {"tokens_per_minute": 100}}]}
    ctl, _ = controller(cfg)
    d = arrive(ctl, make_job("a", prompt=500, predicted=10))
    assert isinstance(d, Rejected)
    assert d.reason is Reason.REQUEST_TOO_LARGE and d.retry_after_s is None


def test_request_per_minute_bucket() -> None:
    cfg = {"tenants": [{"name": "a", "tier": "default", "limits": {"requests_per_minute": 2}}]}
    ctl, _ = controller(cfg)
    assert not isinstance(arrive(ctl, make_job("a")), Rejected)
    assert not isinstance(arrive(ctl, make_job("a")), Rejected)
    d = arrive(ctl, make_job("a"))
    assert isinstance(d, Rejected) and d.reason is Reason.RATE_LIMITED
    assert d.retry_after_s == pytest.approx(30.0)


def test_global_and_band_and_tenant_bounds() -> None:
    cfg = {
        "pools": [{"name": "default", "max_in_flight": 1}],
        "queue": {"max_queued": 3},
        "tiers": [{"name": "hi", "max_queued": 2}, {"name": "lo"}],
        "tenants": [{"name": "greedy", "tier": "lo", "max_queued": 1}],
    }
    ctl, _ = controller(cfg)
    assert isinstance(arrive(ctl, make_job("x", "hi")), Dispatched)
    assert isinstance(arrive(ctl, make_job("x", "hi")), Queued)
    assert isinstance(arrive(ctl, make_job("x", "hi")), Queued)
    d = arrive(ctl, make_job("x", "hi"))
    assert isinstance(d, Rejected) and d.reason is Reason.QUEUE_FULL and d.status == 503
    assert isinstance(arrive(ctl, make_job("greedy", "lo")), Queued)
    d = arrive(ctl, make_job("greedy", "lo"))
    assert isinstance(d, Rejected) and d.reason is Reason.TENANT_QUEUE_FULL and d.status == 429
    assert ctl.queued == 3
    d = arrive(ctl, make_job("other", "lo"))
    assert isinstance(d, Rejected) and d.reason is Reason.QUEUE_FULL
    assert d.retry_after_s is not None and d.retry_after_s >= 1.0


def test_rejection_after_grant_refunds_the_reservation() -> None:
    cfg = {
        "pools": [{"name": "default", "max_in_flight": 1}],
        "queue": {"max_queued": 0},
        "tenants": [{"name": "a", "tier": "default", "limits": {"tokens_per_minute": 6000}}],
    }
    ctl, _ = controller(cfg)
    arrive(ctl, make_job("a", predicted=100))
    before = store_of(ctl).levels()["tenant:a:tok"][0]
    d = arrive(ctl, make_job("a", predicted=100))
    assert isinstance(d, Rejected) and d.reason is Reason.QUEUE_FULL
    assert store_of(ctl).levels()["tenant:a:tok"][0] == pytest.approx(before)


def test_predicted_wait_beyond_max_wait_is_shed_with_retry_after() -> None:
    cfg = {
        "pools": [{"name": "default", "max_in_flight": 1, "initial_drain_tokens_per_s": 100}],
        "tiers": [{"name": "default", "max_wait_s": 5}],
    }
    ctl, _ = controller(cfg)
    arrive(ctl, make_job(prompt=100, predicted=100))  # dispatched
    # each queued job is 200 tokens = 2 s of drain at 100 tok/s
    for _ in range(3):
        assert isinstance(arrive(ctl, make_job(prompt=100, predicted=100)), Queued)
    d = arrive(ctl, make_job(prompt=100, predicted=100))
    assert isinstance(d, Rejected)
    assert d.reason is Reason.WAIT_EXCEEDS_SLO and d.status == 503
    assert d.retry_after_s == pytest.approx(1.0)  # predicted 6 s vs 5 s allowed


def test_queued_jobs_expire_at_their_deadline() -> None:
    cfg = {**ONE_SLOT, "tiers": [{"name": "default", "max_wait_s": 10}]}
    ctl, clock = controller(cfg)
    arrive(ctl, make_job())
    late = make_job(deadline=4.0)
    arrive(ctl, late)
    patient = make_job()
    arrive(ctl, patient)
    assert ctl.next_deadline() == 4.0
    clock.set(4.0)
    out = ctl.tick()
    assert [o.job for o in out] == [late]
    assert out[0].reason is Reason.EXPIRED and late.state is JobState.EXPIRED
    clock.set(10.0)
    assert ctl.dispatchable() == []  # expiry happens inside dispatchable too
    assert patient.state is JobState.EXPIRED
    assert [o.job for o in ctl.tick()] == [patient]
    assert ctl.queued == 0


def test_cancel_queued_and_dispatched() -> None:
    cfg = {
        **ONE_SLOT,
        "tenants": [{"name": "a", "tier": "default", "limits": {"tokens_per_minute": 6000}}],
    }
    ctl, _ = controller(cfg)
    a = make_job("a", predicted=100)
    b = make_job("a", predicted=100)
    arrive(ctl, a)
    arrive(ctl, b)
    assert store_of(ctl).levels()["tenant:a:tok"][0] == pytest.approx(6000 - 400)
    out = ctl.cancel(b.id)
    assert out.reason is Reason.CANCELLED and b.state is JobState.CANCELLED
    assert store_of(ctl).levels()["tenant:a:tok"][0] == pytest.approx(6000 - 200)
    out = ctl.cancel(a.id, Usage(100, 30))
    assert store_of(ctl).levels()["tenant:a:tok"][0] == pytest.approx(6000 - 130)
    assert ctl.in_flight == 0 and ctl.queued == 0
    with pytest.raises(UnknownJobError):
        ctl.cancel(a.id)


def test_illegal_transitions_raise() -> None:
    ctl, _ = controller(ONE_SLOT)
    a = make_job()
    arrive(ctl, a)
    b = make_job()
    arrive(ctl, b)
    with pytest.raises(LifecycleError):
        ctl.complete(b.id, Usage(1, 1))  # queued, not dispatched
    with pytest.raises(LifecycleError):
        arrive(ctl, a)  # already dispatched
    with pytest.raises(LifecycleError):
        a.move(JobState.EXPIRED)  # only a queued job expires
    ctl.complete(a.id, Usage(1, 1))
    with pytest.raises(UnknownJobError):
        ctl.complete(a.id, Usage(1, 1))


def test_draining_rejects_new_work_but_finishes_old() -> None:
    ctl, _ = controller(ONE_SLOT)
    a = make_job()
    b = make_job()
    arrive(ctl, a)
    arrive(ctl, b)
    ctl.start_draining()
    d = arrive(ctl, make_job())
    assert isinstance(d, Rejected) and d.reason is Reason.DRAINING and d.status == 503
    ctl.complete(a.id, Usage(1, 1))
    assert ctl.dispatchable() == [b]


def test_priority_comes_only_from_tenant_config() -> None:
    cfg = {
        "tiers": [{"name": "gold"}, {"name": "silver"}, {"name": "bronze"}],
        "tenants": [
            {"name": "vip", "tier": "silver", "allowed_tiers": ["gold"]},
            {"name": "pleb", "tier": "bronze"},
        ],
    }
    ctl, _ = controller(cfg)
    assert ctl.resolve_tier("pleb", "gold") == "bronze"
    assert ctl.resolve_tier("vip", "gold") == "gold"
    assert ctl.resolve_tier("vip", None) == "silver"
    assert ctl.resolve_tier("stranger", "gold") == "bronze"


def test_unknown_tier_or_pool_and_bad_sizes() -> None:
    ctl, _ = controller()
    with pytest.raises(PolicyError, match="tier"):
        arrive(ctl, make_job(tier="nope"))
    with pytest.raises(PolicyError, match="pool"):
        arrive(ctl, make_job(pool="nope"))
    with pytest.raises(PolicyError, match="max_tokens"):
        arrive(ctl, make_job(max_tokens=0))


def test_the_stores_grant_is_taken_and_settlements_returned() -> None:
    cfg = PolicyConfig.model_validate(
        {"tenants": [{"name": "a", "tier": "default", "limits": {"tokens_per_minute": 600}}]}
    )
    from velvetrope.clock import ManualClock

    ctl = AdmissionController(cfg, ManualClock())
    j = make_job("a", predicted=50)
    claims = ctl.claims(j)
    assert [(c.key, c.amount) for c in claims] == [("tenant:a:tok", 150)]
    assert [(c.kind, c.owner) for c in claims] == [("tokens", "tenant")]
    with pytest.raises(PolicyError, match="reservation"):
        ctl.arrive(make_job("a", predicted=50))
    assert isinstance(ctl.arrive(j, Grant(tuple(claims))), Dispatched)
    out = ctl.complete(j.id, Usage(100, 20))
    assert out.settlement.lines == (("tenant:a:tok", 150.0, 120.0),)


def test_a_stores_denial_runs_the_same_lifecycle_as_an_in_memory_one() -> None:
    cfg = PolicyConfig.model_validate(
        {"tenants": [{"name": "a", "tier": "default", "limits": {"tokens_per_minute": 600}}]}
    )
    from velvetrope.clock import ManualClock

    seen: list[Reason] = []
    ctl = AdmissionController(cfg, ManualClock())
    ctl.observers.append(lambda o: seen.append(o.reason))
    j = make_job("a", predicted=50)
    ctl.claims(j)
    r = ctl.arrive(j, Denial(2.5, "tenant:a:tok"))
    assert isinstance(r, Rejected)
    assert (r.reason, r.retry_after_s, r.status) == (Reason.RATE_LIMITED, 2.5, 429)
    big = make_job("a", predicted=50)
    ctl.claims(big)
    r2 = ctl.arrive(big, Denial(math.inf, "tenant:a:tok"))
    assert isinstance(r2, Rejected)
    assert (r2.reason, r2.retry_after_s) == (Reason.REQUEST_TOO_LARGE, None)
    assert seen == [Reason.RATE_LIMITED, Reason.REQUEST_TOO_LARGE]
    assert j.state is JobState.REJECTED and not ctl.status()["queued"]


def test_observers_see_every_terminal_outcome_once() -> None:
    seen: list[tuple[str, Reason]] = []
    ctl, _ = controller({**ONE_SLOT, "queue": {"max_queued": 1}})
    ctl.observers.append(lambda o: seen.append((o.job.id, o.reason)))
    a, b, c = make_job(), make_job(), make_job()
    arrive(ctl, a)
    arrive(ctl, b)
    arrive(ctl, c)  # rejected: queue full
    ctl.cancel(b.id)
    ctl.complete(a.id, Usage(1, 1))
    assert seen == [(c.id, Reason.QUEUE_FULL), (b.id, Reason.CANCELLED), (a.id, Reason.COMPLETED)]


def test_token_budget_in_flight() -> None:
    cfg = {"pools": [{"name": "default", "max_in_flight": 10, "max_tokens_in_flight": 500}]}
    ctl, _ = controller(cfg)
    a, b, c = (make_job(prompt=100, predicted=100) for _ in range(3))
    assert isinstance(arrive(ctl, a), Dispatched)
    assert isinstance(arrive(ctl, b), Dispatched)
    assert isinstance(arrive(ctl, c), Queued)  # 600 > 500
    ctl.complete(a.id, Usage(100, 100))
    assert ctl.dispatchable() == [c]
    big = make_job(prompt=5000, predicted=100)
    ctl.complete(b.id, Usage(100, 100))
    ctl.complete(c.id, Usage(100, 100))
    assert isinstance(arrive(ctl, big), Dispatched)  # a lone job always fits


def test_status_reports_queue_and_in_flight() -> None:
    cfg = {**ONE_SLOT, "tiers": [{"name": "hi"}, {"name": "lo"}]}
    ctl, _ = controller(cfg)
    arrive(ctl, make_job("a", "hi"))
    arrive(ctl, make_job("a", "lo"))
    arrive(ctl, make_job("b", "lo"))
    st = ctl.status()
    assert st["queued"] == 2 and st["in_flight"] == 1
    assert st["pools"]["default"]["bands"]["lo"]["queued"] == 2
    assert st["tenants_queued"] == {"a": 1, "b": 1}


def test_weighted_bands_predict_the_wait_from_their_own_share() -> None:
    cfg = {
        "preset": "hybrid",
        "pools": [{"name": "default", "max_in_flight": 1, "initial_drain_tokens_per_s": 100}],
        "tiers": [
            {"name": "top", "weight": 3, "max_wait_s": 10},
            {"name": "low", "weight": 1, "max_wait_s": 5},
        ],
    }
    ctl, _ = controller(cfg)
    arrive(ctl, make_job("x", "low", prompt=100, predicted=100))  # runs
    for _ in range(10):  # 2,000 tokens of low-band work: 20 s at the full rate
        arrive(ctl, make_job("x", "low", prompt=100, predicted=100))
    # the top band is empty: a top job is not stuck behind the low band's backlog
    d = arrive(ctl, make_job("t", "top", prompt=100, predicted=100))
    assert isinstance(d, Queued)
    assert d.eta_s == pytest.approx(0.0)
    # 2 top jobs queued (400 tokens) drain at 3/4 of the rate: 400 / 75 tok/s
    arrive(ctl, make_job("t", "top", prompt=100, predicted=100))
    d = arrive(ctl, make_job("t", "top", prompt=100, predicted=100))
    assert isinstance(d, Queued)
    assert d.eta_s == pytest.approx(400 / 75)
    # a low job waits for its own band at a quarter of the rate: shed (2,000 / 25 = 80 s)
    d = arrive(ctl, make_job("x", "low", prompt=100, predicted=100))
    assert isinstance(d, Rejected)
    assert d.reason is Reason.WAIT_EXCEEDS_SLO


def test_job_queue_is_a_deque_until_a_key_arrives_out_of_order() -> None:
    from velvetrope.core.jobheap import JobHeap

    q = JobHeap()
    jobs = [make_job() for _ in range(6)]
    for i, j in enumerate(jobs):
        j.seq = i + 1
        j.state = JobState.QUEUED
    for j, key in zip(jobs[:4], (1.0, 2.0, 2.0, 5.0), strict=True):
        q.push(key, j)
    assert not q.is_heap
    q.push(3.0, jobs[4])  # out of order: becomes a heap, order still right
    assert q.is_heap
    q.push(0.5, jobs[5])
    jobs[1].state = JobState.CANCELLED
    q.discard(jobs[1])
    order = []
    while (j := q.peek()) is not None:
        order.append(q.pop())
        j.state = JobState.DISPATCHED
    assert order == [jobs[5], jobs[0], jobs[2], jobs[4], jobs[3]]
    assert len(q) == 0


def test_a_small_top_band_does_not_inflate_a_lower_bands_wait() -> None:
    cfg = {
        "preset": "hybrid",
        "tiers": [{"name": "interactive"}, {"name": "batch", "max_wait_s": 5.0}],
        "pools": [{"name": "default", "max_in_flight": 1, "initial_drain_tokens_per_s": 1000}],
    }
    ctl, _ = controller(cfg)
    arrive(ctl, make_job("b", "batch", prompt=0, predicted=100))  # runs
    for _ in range(5):  # 500 batch tokens queued
        arrive(ctl, make_job("b", "batch", prompt=0, predicted=100))
    arrive(ctl, make_job("i", "interactive", prompt=0, predicted=100))  # one small top job
    d = arrive(ctl, make_job("b", "batch", prompt=0, predicted=100))
    assert isinstance(d, Queued)  # the whole queue is 600 tokens: 0.6 s at 1,000 tok/s
    assert d.eta_s == pytest.approx(0.6)
