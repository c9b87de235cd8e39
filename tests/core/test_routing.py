"""Routing rules, degradation and replica choice in the core (velvetrope.core.routing)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from tests.core.helpers import arrive
from velvetrope.core import (
    Dispatched,
    PolicyConfig,
    Queued,
    Reason,
    Rejected,
    Usage,
    least_loaded,
)
from velvetrope.core.capacity import PoolCapacity

from .helpers import controller, make_job

TWO_POOLS: dict[str, Any] = {
    "tiers": [{"name": "gold"}, {"name": "default"}],
    "pools": [{"name": "long"}, {"name": "short"}, {"name": "small"}],
    "routes": [
        {"name": "small-model", "pool": "small", "models": ["llama-1b"]},
        {"name": "gold-short", "pool": "short", "tiers": ["gold"], "max_predicted_output": 500},
        {"pool": "short", "max_predicted_output": 199},
    ],
}


@pytest.mark.parametrize(
    ("model", "tier", "max_tokens", "predicted", "expected"),
    [
        ("llama-1b", "default", 4000, 3000, ("small", "small-model")),  # model first
        ("big", "gold", 4000, 400, ("short", "gold-short")),
        ("big", "gold", 4000, 501, ("long", "default")),
        ("big", "default", 4000, 199, ("short", "routes[2]")),  # unnamed: its position
        ("big", "default", 4000, 200, ("long", "default")),  # no match: the first pool
        ("big", "default", 150, None, ("short", "routes[2]")),  # the estimate: min(150, 256)
        ("big", "default", 1000, None, ("long", "default")),  # the estimate: 256 (default)
    ],
)
def test_rules_match_model_tier_and_predicted_output(
    model: str, tier: str, max_tokens: int, predicted: int | None, expected: tuple[str, str]
) -> None:
    ctl, _ = controller(TWO_POOLS)
    job = make_job(tier=tier, max_tokens=max_tokens, predicted=predicted, model=model)
    routed = ctl.route(job)
    assert (routed.pool, routed.rule) == expected
    assert (job.pool, job.route, job.degraded) == (*expected, ())
    assert job.cost == job.prompt_tokens + job.reserved_output  # sized before matching
    assert isinstance(arrive(ctl, job), Dispatched)


def test_rules_see_the_estimators_learned_prediction() -> None:
    ctl, _ = controller({**TWO_POOLS, "estimator": {"min_observations": 5, "quantile": 0.5}})
    for _ in range(5):  # this tenant's answers are short
        j = make_job(tenant="terse", max_tokens=1000)
        ctl.route(j)
        assert j.pool == "long"  # no observations yet: the default 256
        arrive(ctl, j)
        ctl.complete(j.id, Usage(100, 40))
    j = make_job(tenant="terse", max_tokens=1000)
    assert ctl.route(j).pool == "short" and j.predicted_output == 40


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"routes": [{"pool": "nope"}]}, "routes\\[0\\] names unknown pool"),
        ({"routes": [{"pool": "long", "tiers": ["platinum"]}]}, "unknown tier"),
        ({"routes": [{"pool": "long", "name": "a"}, {"pool": "short", "name": "a"}]}, "unique"),
        ({"routes": [{"pool": "long", "name": "default"}]}, "not 'default'"),
        (
            {"tiers": [{"name": "gold"}, {"name": "default", "degrade": {"pool": "nope"}}]},
            "unknown pool",
        ),
        (
            {"tiers": [{"name": "gold"}, {"name": "default", "degrade": {"wait_s": 1}}]},
            "max_tokens', 'pool'",
        ),
        (
            {
                "tiers": [
                    {"name": "gold"},
                    {"name": "default", "degrade": {"max_tokens": 9, "model": "m"}},
                ]
            },
            "model",
        ),
        (
            {"pools": [{"name": "p", "max_in_flight": 4, "max_in_flight_per_engine": 2}]},
            "not both",
        ),
        (
            {
                "pools": [
                    {"name": "p", "max_tokens_in_flight": 4, "max_tokens_in_flight_per_engine": 2}
                ]
            },
            "not both",
        ),
    ],
)
def test_bad_routing_config_names_the_problem(patch: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        PolicyConfig.model_validate({**TWO_POOLS, **patch})


# -- degradation --------------------------------------------------------------------------

# One slot and a known drain rate (100 tokens/s), so predicted waits are exact: every job
# costs 100 prompt + 100 predicted output = 200 tokens = 2 s of drain.
DEGRADE: dict[str, Any] = {
    "tiers": [
        {
            "name": "default",
            "max_wait_s": 5,
            "degrade": {"wait_s": 1.5, "max_tokens": 50, "pool": "spare", "model": "small"},
        }
    ],
    "pools": [
        {"name": "main", "max_in_flight": 1, "initial_drain_tokens_per_s": 100},
        {"name": "spare", "max_in_flight": 1, "initial_drain_tokens_per_s": 100},
    ],
}


def _fill(ctl: Any, pool_jobs: int) -> None:
    """One job in flight in 'main' and ``pool_jobs - 1`` queued behind it."""
    for _ in range(pool_jobs):  # not routed: placed in the pool directly
        arrive(ctl, make_job(predicted=100, max_tokens=400, pool="main"))


def test_no_degradation_while_the_wait_is_within_wait_s() -> None:
    ctl, _ = controller(DEGRADE)
    _fill(ctl, 1)  # in flight; nothing queued: wait 0
    j = make_job(predicted=100, max_tokens=400, model="big")
    assert ctl.route(j).actions == ()
    assert (j.max_tokens, j.cost) == (400, 200)


def test_a_backed_up_pool_caps_max_tokens_and_the_claims_follow() -> None:
    cfg = {
        **DEGRADE,
        "tenants": [{"name": "t", "tier": "default", "limits": {"tokens_per_minute": 6000}}],
    }
    ctl, _ = controller(cfg)
    _fill(ctl, 2)  # one queued: 200 tokens ahead = 2 s > wait_s 1.5, < max_wait 5
    j = make_job(predicted=100, max_tokens=400, model="big")
    routed = ctl.route(j)
    assert routed == ("main", "default", ("max_tokens",))
    assert (j.max_tokens, j.predicted_output, j.cost, j.model) == (50, 50, 150, "big")
    assert [c.amount for c in ctl.claims(j) if c.kind == "tokens"] == [150.0]
    assert isinstance(arrive(ctl, j), Queued)


def test_the_cap_is_per_completion() -> None:
    ctl, _ = controller(DEGRADE)
    _fill(ctl, 2)
    j = make_job(predicted=100, max_tokens=2 * 80, n=2)  # two completions of up to 80
    assert ctl.route(j).actions == ("max_tokens",)
    assert j.max_tokens == 2 * 50
    short = make_job(predicted=40, max_tokens=2 * 40, n=2)  # already under the cap
    assert ctl.route(short).actions == ()


def test_a_job_that_would_be_rejected_falls_back_to_the_spare_pool() -> None:
    ctl, _ = controller(DEGRADE)
    _fill(ctl, 4)  # three queued: 600 tokens = 6 s > max_wait 5
    j = make_job(predicted=100, max_tokens=400, model="big")
    assert ctl.route(j) == ("spare", "default", ("max_tokens", "pool"))
    assert (j.pool, j.model, j.max_tokens) == ("spare", "small", 50)
    assert isinstance(arrive(ctl, j), Dispatched)


def test_rejected_only_when_degrading_is_not_enough() -> None:
    ctl, _ = controller(DEGRADE)
    _fill(ctl, 4)
    for _ in range(4):  # back the spare pool up too: past max_wait
        arrive(ctl, make_job(predicted=100, max_tokens=400, pool="spare"))
    j = make_job(predicted=100, max_tokens=400, model="big")
    assert ctl.route(j) == ("main", "default", ("max_tokens",))
    d = arrive(ctl, j)
    assert isinstance(d, Rejected) and d.reason is Reason.WAIT_EXCEEDS_SLO


def test_without_a_drain_rate_nothing_is_degraded() -> None:
    cfg = {**DEGRADE, "pools": [{"name": "main", "max_in_flight": 1}, {"name": "spare"}]}
    ctl, _ = controller(cfg)
    for _ in range(5):
        j = make_job(predicted=100, max_tokens=400)
        assert ctl.route(j).actions == ()
        arrive(ctl, j)


# -- capacity per engine -------------------------------------------------------------------


def test_capacity_per_engine_follows_the_live_engines() -> None:
    ctl, _ = controller(
        {
            "pools": [
                {
                    "name": "default",
                    "max_in_flight_per_engine": 2,
                    "max_tokens_in_flight_per_engine": 10_000,
                }
            ]
        }
    )
    cap = ctl.pool_capacity("default")
    assert (cap.max_in_flight, cap.max_tokens) == (2, 10_000)  # one engine until told
    cap.set_engines(0)
    first = make_job()
    assert isinstance(arrive(ctl, first), Queued)  # no engine: nothing starts, even alone
    cap.set_engines(3)
    started = ctl.dispatchable()
    jobs = [make_job() for _ in range(6)]
    started += [j for j in jobs if isinstance(arrive(ctl, j), Dispatched)]
    started += ctl.dispatchable()
    assert len(started) == 6 and ctl.queued == 1  # 3 engines x 2 slots
    cap.set_engines(2)  # one left: nothing more until in flight drops below 4
    for j in started[:2]:
        ctl.complete(j.id, Usage(100, 10))
    assert ctl.dispatchable() == []
    ctl.complete(started[2].id, Usage(100, 10))
    assert len(ctl.dispatchable()) == 1
    assert ctl.status()["pools"]["default"]["engines"] == 2


def test_fixed_capacity_ignores_the_engine_count() -> None:
    cap = PoolCapacity("p", 5, 100)
    cap.set_engines(9)
    assert (cap.max_in_flight, cap.max_tokens) == (5, 100)


# -- replica choice ------------------------------------------------------------------------


def test_least_loaded_ties_and_eligibility() -> None:
    assert least_loaded([3, 1, 1, 2]) == 1  # ties: the first in order
    assert least_loaded([3, 1, 1, 2], start=2) == 2  # ... from start, cyclically
    assert least_loaded([3, 1, 1, 2], start=3) == 1
    assert least_loaded([3, 1, 1, 2], eligible=lambda i: i != 1) == 2
    assert least_loaded([3, 1], eligible=lambda i: False) == -1
    assert least_loaded([]) == -1


def test_least_loaded_without_a_filter_picks_as_the_filtered_scan() -> None:
    """The unfiltered scan from 0 (a ``min``) picks what the general scan picks: the first
    of the smallest loads, -1 for none."""
    rng = random.Random(3)
    for _ in range(500):
        loads = [rng.randrange(4) for _ in range(rng.randrange(6))]
        assert least_loaded(loads) == least_loaded(loads, 0, lambda i: True)
