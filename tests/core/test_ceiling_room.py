"""The lower-tier ceiling relaxes a whole slot per in-time first token while the engines
plainly have room (:class:`~velvetrope.core.headroom.LowerTierCeiling`, the pool's
``_engines_have_room``): :meth:`EngineSaturation.slack`, :meth:`TpotLimit.under`, and the
pool's status, on a ManualClock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.helpers import controller, decode_one, make_job
from velvetrope.core import EngineReading, Usage
from velvetrope.core.headroom import LowerTierCeiling
from velvetrope.core.job import Job
from velvetrope.core.saturation import EngineSaturation
from velvetrope.core.tpot_limit import TpotLimit

TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 1.0}},
    {"name": "batch", "slo": {"e2e_s": 120}},
]
TENANTS = [
    {"name": "acme", "tier": "interactive"},
    {"name": "initech", "tier": "batch"},
]


def _job(tier: str, band: int, arrival: float) -> Job:
    job = make_job(tenant="t", tier=tier)
    job.band = band
    job.arrival = arrival
    return job


def _cut_to_45() -> LowerTierCeiling:
    ceil = LowerTierCeiling({"interactive": 1.0, "batch": None}, share=0.5, cut=0.1)
    ceil.first_token(_job("interactive", 0, 0.0), 0.8, 50)  # late: 0.9 × 50
    assert ceil.ceilings() == {0: pytest.approx(45.0)} and ceil.active()
    return ceil


def test_with_room_each_first_token_in_time_relaxes_the_ceiling_a_whole_slot() -> None:
    ceil = _cut_to_45()
    for i in range(3):
        ceil.first_token(_job("interactive", 0, 1.0), 1.1, 40, room=True)
        assert ceil.ceilings()[0] == pytest.approx(46.0 + i)
    assert ceil.quick_relaxes == 3
    # more in flight than the ceiling (the top tier's own jobs): one above what runs
    ceil.first_token(_job("interactive", 0, 1.0), 1.1, 60, room=True)
    assert ceil.ceilings()[0] == pytest.approx(61.0)
    # without room: one slot per ceiling's worth of first tokens, as before
    ceil.first_token(_job("interactive", 0, 2.0), 2.1, 60)
    assert ceil.ceilings()[0] == pytest.approx(61.0 + 1.0 / 61.0)
    assert ceil.quick_relaxes == 4
    # a late one still cuts, room or not
    ceil.first_token(_job("interactive", 0, 3.0), 3.9, 60, room=True)
    assert ceil.ceilings()[0] == pytest.approx(54.0)
    assert ceil.quick_relaxes == 4


def test_with_room_a_ceiling_that_holds_nothing_is_dropped() -> None:
    ceil = _cut_to_45()
    ceil.first_token(_job("interactive", 0, 1.0), 1.1, 20, room=True)  # 46 > 2 × 20
    assert ceil.ceilings() == {} and not ceil.active()


def test_slack_wants_every_engine_read_unqueued_and_well_short_of_a_full_kv_cache() -> None:
    sat = EngineSaturation("p", max_kv_usage=0.9, stale_after_s=3.0)
    assert not sat.slack(0.0, 0.75)  # no engine: nothing to go by
    sat.set_engines(["a", "b"])
    assert not sat.slack(0.0, 0.75)  # never read
    sat.observe("a", EngineReading(running=10, waiting=0, kv_usage=0.5), 0.0)
    assert not sat.slack(0.0, 0.75)  # b never read
    sat.observe("b", EngineReading(running=10, waiting=0, kv_usage=0.6), 0.0)
    assert sat.slack(0.0, 0.75)  # 0.6 < 0.75 × 0.9
    sat.observe("b", EngineReading(running=10, waiting=0, kv_usage=0.675), 1.0)
    assert not sat.slack(1.0, 0.75)  # 0.675 = 0.75 × 0.9: not under it
    sat.observe("b", EngineReading(running=10, waiting=1, kv_usage=0.1), 2.0)
    assert not sat.slack(2.0, 0.75)  # b queues
    sat.observe("b", EngineReading(running=10, waiting=0, kv_usage=0.1), 2.5)
    assert sat.slack(2.5, 0.75)
    assert not sat.slack(3.5, 0.75)  # a's reading is stale: unknown is not room
    blind = EngineSaturation("q")
    blind.set_engines(["c"])
    blind.observe("c", None, 0.0)
    assert not blind.slack(0.0, 0.75)


def test_under_compares_the_jobs_in_flight_with_a_share_of_the_tpot_limit() -> None:
    limit = TpotLimit({"interactive": 0.05, "batch": None}, z=0.0, min_samples=10)
    assert limit.under(10**6, 0.75)  # no fit yet: the limit is not known
    now = 0.0
    for n in (4, 16, 32, 64):  # tpot = 10 ms + 0.5 ms per sequence: 80 per engine at 50 ms
        for _ in range(5):
            now = decode_one(limit, n, 0.010 + 0.0005 * n, 11, now)
    limit.engines_changed(2)
    assert limit.under(10**6, 0.75)  # no job with a TPOT objective runs: no limit binds
    limit.started(make_job(tier="interactive"), now)  # one does now
    assert limit.per_engine() == pytest.approx(80.0, rel=1e-3)
    assert limit.under(119, 0.75) and not limit.under(121, 0.75)  # 0.75 × 160 = 120


def _pool_policy() -> dict[str, Any]:
    return {
        "tiers": TIERS,
        "tenants": TENANTS,
        "queue": {"bands": "strict"},
        "pools": [{"name": "default", "slo_limit": {"preempt": False}}],
        "saturation": {"max_waiting": 100, "initial_capacity": 100, "max_kv_usage": 0.9},
    }


def test_the_pool_relaxes_fast_only_while_the_engines_show_room() -> None:
    ctl, clock = controller(_pool_policy())
    sat = ctl.saturation("default")
    assert sat is not None
    sat.set_engines(["e"])
    batch = [make_job(tenant="initech", tier="batch") for _ in range(20)]
    for j in batch:
        assert type(ctl.arrive(j)).__name__ == "Dispatched"
        sat.sent(j.id, "e")
        ctl.first_token(j.id)  # running: no prompt of theirs is left to prefill
    status = ctl.status()["pools"]["default"]
    assert status["lower_tier_ceilings"] == {} and status["lower_tier_ceiling_quick_relaxes"] == 0

    def top(wait: float) -> None:
        job = make_job(tenant="acme", tier="interactive")
        assert type(ctl.arrive(job)).__name__ == "Dispatched"
        sat.sent(job.id, "e")
        clock.advance(wait)
        ctl.first_token(job.id)
        ctl.complete(job.id, Usage(10, 1))

    sat.observe("e", EngineReading(running=21, waiting=0, kv_usage=0.3), clock.now())
    top(0.9)  # late (past ½ of 1 s) with 21 in flight: the ceiling is 0.9 × 21
    assert ctl.status()["pools"]["default"]["lower_tier_ceilings"] == {"0": pytest.approx(18.9)}
    top(0.1)  # in time, the engine unqueued with its KV cache at 0.3 < 0.75 × 0.9: a slot
    assert ctl.status()["pools"]["default"]["lower_tier_ceilings"]["0"] == pytest.approx(22.0)
    sat.observe("e", EngineReading(running=19, waiting=2, kv_usage=0.3), clock.now())
    top(0.1)  # in time, but the engine queues: 1 / L
    status = ctl.status()["pools"]["default"]
    assert status["lower_tier_ceilings"]["0"] == pytest.approx(22.0 + 1.0 / 22.0)
    assert status["lower_tier_ceiling_quick_relaxes"] == 1
    # the ceiling holds the batch tier at it, whatever the engine says
    for j in batch[:5]:
        ctl.complete(j.id, Usage(10, 1))
    held = [make_job(tenant="initech", tier="batch") for _ in range(10)]
    verdicts = [type(ctl.arrive(j)).__name__ for j in held]
    assert verdicts.count("Dispatched") == 7 and verdicts.count("Queued") == 3  # 15 + 7 ≤ 22.05
