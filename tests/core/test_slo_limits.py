"""The pool's limits derived from the tiers' SLOs: the TPOT-derived in-flight limit
(:mod:`velvetrope.core.tpot_limit`), the TTFT headroom past the saturation brake
(:mod:`velvetrope.core.headroom`), the queue's bound in time (``TierPolicy.wait_bound_s``)
and the pool's ``limit`` mode, on a ManualClock and with the simulator's engine model."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from tests.core.helpers import controller, decode_one, make_job
from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, EngineReading, PolicyConfig, Rejected, Usage
from velvetrope.core.event_rate import EventRate
from velvetrope.core.headroom import LowerTierCeiling, TierHeadroom
from velvetrope.core.job import Job
from velvetrope.core.prefill_backlog import PrefillBacklog
from velvetrope.core.reload import restart_needed
from velvetrope.core.saturation import EngineSaturation
from velvetrope.core.tpot_limit import TpotLimit

TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 1.0, "tpot_s": 0.05}},
    {"name": "standard", "slo": {"ttft_s": 5.0}},
    {"name": "batch", "slo": {"e2e_s": 120}},
]
TENANTS = [
    {"name": "acme", "tier": "interactive"},
    {"name": "globex", "tier": "standard"},
    {"name": "initech", "tier": "batch"},
]


def policy(**pool: Any) -> dict[str, Any]:
    return {
        "tiers": TIERS,
        "tenants": TENANTS,
        "queue": {"bands": "strict"},
        "pools": [{"name": "default", **pool}],
    }


# --------------------------------------------------------------------------- the TPOT limit


def _job(tier: str, band: int = 0) -> Job:
    job = make_job(tenant="t", tier=tier)
    job.band = band
    return job


def two_starts_a_second(h: TierHeadroom, tier: str = "interactive", band: int = 0) -> None:
    """Ten jobs of ``tier`` start at 0, 0.5, ... 4.5 s: 2 starts per second over a 5 s window."""
    for i in range(10):
        done = _job(tier, band=band)
        h.started(done, i * 0.5)
        h.first_token(done, i * 0.5)


def saturable(**pool: Any) -> tuple[AdmissionController, ManualClock, EngineSaturation]:
    """A controller over one engine ``e`` whose saturation rule lets the engine queue
    nothing (``max_waiting: 0``)."""
    cfg = policy(**pool)
    cfg["saturation"] = {"max_waiting": 0}
    ctl, clock = controller(cfg)
    sat = ctl.saturation("default")
    assert sat is not None
    sat.set_engines(["e"])
    return ctl, clock, sat


def eight_starts(ctl: AdmissionController, clock: ManualClock, sat: EngineSaturation) -> None:
    """Eight batch jobs dispatched to ``e`` and started, then 0.5 s: a start rate measured
    (1.6/s over 5 s), so start times can be predicted."""
    sent = [make_job(tenant="initech", tier="batch") for _ in range(8)]
    for j in sent:
        assert type(ctl.arrive(j)).__name__ == "Dispatched"
        sat.sent(j.id, "e")
        sat.observe("e", EngineReading(running=1, waiting=0, kv_usage=0.1), clock.now())
    for j in sent:
        ctl.first_token(j.id)
    clock.advance(0.5)


def feed(limit: TpotLimit, n: int, tpot: float, count: int, now: float, out: int = 11) -> float:
    """``count`` jobs of tier interactive decoding ``out`` tokens each at ``tpot`` while the
    pool holds ``n`` per engine, one after another."""
    for _ in range(count):
        now = decode_one(limit, n, tpot, out, now)
    return now


def test_the_tpot_limit_recovers_the_line_and_holds_the_batch_at_the_objective() -> None:
    limit = TpotLimit({"interactive": 0.05, "batch": None}, z=0.0, min_samples=10)
    now = 0.0
    for n in (4, 16, 32, 64):  # tpot = 10 ms + 0.5 ms per sequence, exactly
        now = feed(limit, n, 0.010 + 0.0005 * n, 5, now)
    fit = limit.fit()
    assert fit is not None
    assert fit.base_s == pytest.approx(0.010, rel=1e-3)
    assert fit.per_seq_s == pytest.approx(0.0005, rel=1e-3)
    assert fit.sd_s == pytest.approx(0.0, abs=1e-4)
    assert fit.per_prefill_token_s == 0.0  # no prompt began while one decoded
    # (50 ms - 10 ms) / 0.5 ms = 80 per engine; the job's own tier names the objective
    assert limit.per_engine("interactive") == pytest.approx(80.0, rel=1e-3)
    job = _job("interactive")
    assert limit.allows_dispatch(job, 79, 0, now)
    assert not limit.allows_dispatch(job, 80, 0, now)
    limit.engines_changed(2)  # two engines: twice the pool
    assert limit.allows_dispatch(job, 159, 0, now) and not limit.allows_dispatch(job, 160, 0, now)
    assert limit.holds == 2


def test_the_margin_is_the_measured_spread() -> None:
    tight = TpotLimit({"interactive": 0.05}, z=3.0, min_samples=10)
    now = 0.0
    for n in (4, 16, 32, 64):
        for spread in (-0.002, 0.002):  # ±2 ms around the line: σ = 2 ms
            now = feed(tight, n, 0.010 + 0.0005 * n + spread, 3, now)
    fit = tight.fit()
    assert fit is not None
    assert fit.sd_s == pytest.approx(0.002, rel=0.05)
    # (50 - 3 × 2 - 10) / 0.5 = 68
    assert tight.per_engine("interactive") == pytest.approx(68.0, rel=0.02)


def _known_limit() -> tuple[TpotLimit, float]:
    """A TPOT limit of 80 per engine for the interactive tier (1 s TTFT, 50 ms TPOT)."""
    limit = TpotLimit(
        {"interactive": 0.05, "standard": None, "batch": None},
        z=0.0,
        min_samples=10,
        ttft_by_tier={"interactive": 1.0, "standard": 5.0, "batch": None},
        share=0.5,
    )
    now = 0.0
    for n in (4, 16, 32, 64):  # tpot = 10 ms + 0.5 ms per sequence: 80 at 50 ms
        now = feed(limit, n, 0.010 + 0.0005 * n, 5, now)
    assert limit.per_engine("interactive") == pytest.approx(80.0, rel=1e-3)
    return limit, now


def test_a_top_tier_job_that_would_miss_its_ttft_waiting_passes_the_tpot_limit() -> None:
    """Over the limit (it fell with the pool past it), the lower tiers wait for the pool; a
    top-tier job waits ``share`` of its TTFT, then goes if the pool, at the rate its jobs
    end, would not fall under the limit within the TTFT it has left, while the top tier's
    own jobs are under the limit."""
    limit, now = _known_limit()
    now += 10.0  # the ends of the fit's samples have left the 5 s window: no end rate
    for _ in range(100):
        limit.started(_job("batch", band=2), now)
    for _ in range(20):
        limit.started(_job("interactive"), now)
    top = _job("interactive")
    top.arrival = now
    assert limit.ask_at(top) == pytest.approx(now + 0.5)
    assert not limit.allows_dispatch(top, 120, 0, now + 0.4)  # not half its TTFT yet
    assert limit.allows_dispatch(top, 120, 0, now + 0.5)  # 21 top-tier jobs <= 80
    assert limit.top_passes == 1 and limit.status()["top_passes"] == 1
    for _ in range(40):  # 40 jobs end at once: 8 ends per second over the window
        j = _job("batch", band=2)
        limit.started(j, now + 0.5)
        limit.ended(j, now + 0.5, 1, False)
    # 41 over the limit at 8 a second: 5.1 s, past the 0.5 s it has left: it goes
    assert limit.allows_dispatch(top, 120, 0, now + 0.5)
    # 2 over the limit: 0.25 s, within the 0.5 s it has left: it waits for the slot
    assert not limit.allows_dispatch(top, 81, 0, now + 0.5)
    assert limit.top_passes == 2
    standard = _job("standard", band=1)
    standard.arrival = now
    batch = _job("batch", band=2)
    batch.arrival = now
    for lower in (standard, batch):  # not the top band: they wait for the pool
        assert limit.ask_at(lower) is None
        assert not limit.allows_dispatch(lower, 120, 0, now + 4.0)
    assert limit.allows_dispatch(batch, 79, 0, now + 4.0)  # under the limit: anyone
    for _ in range(60):  # the top tier alone at the limit: it waits too
        limit.started(_job("interactive"), now)
    assert not limit.allows_dispatch(top, 180, 0, now + 0.9)
    assert limit.top_passes == 2


def _slow_engine_limit(objective: float) -> tuple[TpotLimit, float]:
    """A TPOT limit for the interactive tier (1 s TTFT, ``objective`` TPOT) fitted on an
    engine whose TPOT is 60 ms + 0.5 ms per sequence, then 10 s with no end (no end rate:
    the pool will not fall under the limit)."""
    limit = TpotLimit(
        {"interactive": objective, "batch": None},
        z=0.0,
        min_samples=10,
        ttft_by_tier={"interactive": 1.0, "batch": None},
        share=0.5,
    )
    now = 0.0
    for n in (4, 16, 32, 64):
        now = feed(limit, n, 0.060 + 0.0005 * n, 5, now)
    return limit, now + 10.0


def test_an_objective_no_batch_meets_does_not_hold_the_top_tier_by_its_own_count() -> None:
    """When the fit predicts the objective missed even at one per engine, the limit stands
    at 1 per engine: the lower tiers wait for it, and the top tier's pass is not held by
    its own jobs in flight (waiting buys it no TPOT, only a late first token)."""
    limit, now = _slow_engine_limit(0.05)  # over 50 ms at any batch
    fit = limit.fit()
    assert fit is not None and fit.reach(0.05, 0.0) < 1.0
    assert limit.per_engine("interactive") == 1.0
    assert limit.out_of_reach("interactive")
    for _ in range(5):
        limit.started(_job("interactive"), now)
    top = _job("interactive")
    top.arrival = now
    assert not limit.allows_dispatch(top, 5, 0, now + 0.4)  # not half its TTFT yet
    assert limit.allows_dispatch(top, 5, 0, now + 0.5)  # 6 top-tier jobs > the limit of 1
    assert limit.top_passes == 1
    assert limit.status()["out_of_reach"] is True  # interactive jobs are running
    batch = _job("batch", band=2)
    batch.arrival = now
    assert not limit.allows_dispatch(batch, 5, 0, now + 0.5)
    # an objective the fit reaches (at 8 per engine) holds the top tier once its own jobs
    # fill the limit
    reachable, then = _slow_engine_limit(0.064)
    assert reachable.per_engine("interactive") == pytest.approx(8.0, rel=1e-3)
    assert not reachable.out_of_reach("interactive")
    for _ in range(8):
        reachable.started(_job("interactive"), then)
    top.arrival = then
    assert not reachable.allows_dispatch(top, 8, 0, then + 0.5)
    assert reachable.top_passes == 0


def test_a_ramps_spread_holds_the_lower_tiers_at_a_limit_and_not_the_top_tier() -> None:
    """First samples from a ramp (prefill per step far off its proportional share: ±300·√n
    tokens at 32-96 per engine): at their own spread no batch reaches 50 ms, but with the
    spread narrowing below their batch (:mod:`velvetrope.core.tpot_fit`) the limit is
    several per engine, not 1.  The lower tiers wait for it; the top tier's pass is not
    held by its own count, the objective being out of reach at the samples' own spread."""
    a, b, c = 0.004, 3.4e-5, 1.8e-5
    limit = TpotLimit(
        {"interactive": 0.05, "batch": None},
        z=3.0,
        min_samples=10,
        ttft_by_tier={"interactive": 1.0, "batch": None},
        share=0.5,
    )
    now = 0.0
    for n in (32, 64, 96):
        for sign in (-1, 1, -1, 1):
            prompts = round((40 * n + sign * 300 * math.sqrt(n)) / 10)  # 100 tokens, 10 steps
            now = decode_one(limit, n, a + b * n + c * prompts * 10, 11, now, prompts, 100)
    fit = limit.fit()
    assert fit is not None and fit.reach_uniform(0.05, 3.0) < 1.0
    assert limit.out_of_reach("interactive")
    per = limit.per_engine("interactive")
    assert 4.0 < per < 10.0
    now += 10.0  # no end since: the pool will not fall under the limit
    for _ in range(10):  # the top tier's own jobs over the limit (its objective holds)
        limit.started(_job("interactive"), now)
    batch = _job("batch", band=2)
    batch.arrival = now
    assert limit.allows_dispatch(batch, 3, 0, now)  # under the limit (1 per engine before)
    assert not limit.allows_dispatch(batch, math.ceil(per), 0, now)
    top = _job("interactive")
    top.arrival = now
    assert limit.allows_dispatch(top, 10, 0, now + 0.5)
    assert limit.top_passes == 1
    assert not limit.allows_dispatch(batch, 10, 0, now + 0.5)


def test_the_controller_wakes_a_top_tier_job_held_by_the_tpot_limit() -> None:
    """Through the controller, with preemption off: the job held by the TPOT limit is due
    at half its TTFT (``next_deadline``), and the dispatch then lets it through."""
    cfg = policy(limit="slo", slo_limit={"preempt": False, "min_samples": 10})
    cfg["saturation"] = {"enabled": False}
    ctl, clock = controller(cfg)
    for i in range(100):  # the limit is not known yet: all go, one interactive among them
        j = make_job(
            tenant="acme" if i == 0 else "initech", tier="interactive" if i == 0 else "batch"
        )
        assert type(ctl.arrive(j)).__name__ == "Dispatched"
    limit = ctl._pools["default"].tpot_limit
    assert limit is not None
    now = 0.0
    for n in (4, 16, 32, 64):  # with the 100 held: 10 ms + 0.5 ms per sequence, as above
        now = feed(limit, n, 0.060 + 0.0005 * n, 5, now)
    assert limit.per_engine("interactive") == pytest.approx(80.0, rel=1e-3)
    clock.advance(now + 10.0)  # the samples' ends have left the end-rate window
    t0 = clock.now()
    standard = make_job(tenant="globex", tier="standard")
    top = make_job(tenant="acme", tier="interactive")
    assert type(ctl.arrive(standard)).__name__ == "Queued"  # 100 in flight, limit 80
    assert type(ctl.arrive(top)).__name__ == "Queued"
    assert ctl.next_deadline() == pytest.approx(t0 + 0.5)  # half the top tier's 1 s TTFT
    clock.advance(0.4)
    assert ctl.dispatchable() == []
    clock.advance(0.1)
    assert ctl.dispatchable() == [top]  # the standard job still waits for the pool
    status = ctl.status()["pools"]["default"]
    assert status["tpot_limit"]["top_passes"] == 1, status


def test_the_tpot_limit_binds_only_when_it_is_known() -> None:
    limit = TpotLimit({"interactive": 0.05}, min_samples=10, min_spread=4.0)
    job = _job("interactive")
    assert limit.per_engine("interactive") == math.inf  # nothing seen
    now = feed(limit, 8, 0.02, 20, 0.0)  # many samples, one batch size: no slope
    assert limit.fit() is None and limit.allows_dispatch(job, 10_000, 0, now)
    now = feed(limit, 16, 0.02, 20, now)  # decode time does not grow: no limit
    assert limit.fit() is None
    plain = TpotLimit({"batch": None}, min_samples=2)
    for n in (4, 32):
        feed(plain, n, 0.01 * n, 3, 0.0)
    assert plain.target_s() is None and plain.per_engine() == math.inf  # no TPOT objective


def test_the_objective_is_the_tightest_among_the_tiers_running() -> None:
    limit = TpotLimit({"interactive": 0.05, "standard": 0.2, "batch": None})
    assert limit.target_s() is None
    assert limit.target_s("standard") == 0.2
    std = _job("standard")
    limit.started(std, 0.0)
    assert limit.target_s() == 0.2 and limit.target_s("interactive") == 0.05
    inter = _job("interactive")
    limit.started(inter, 0.0)
    assert limit.target_s("batch") == 0.05
    limit.ended(inter, 1.0, 1, False)
    assert limit.target_s() == 0.2
    limit.retarget({"standard": 0.1})
    assert limit.target_s() == 0.1


# --------------------------------------------------------------------------- the headroom


def test_headroom_lets_a_job_start_when_the_engines_start_it_in_time() -> None:
    h = TierHeadroom({"interactive": 1.0, "batch": None}, ordered=True, share=0.5, window_s=5.0)
    assert not h.allows_dispatch(_job("interactive"), 0.0)  # no start rate measured yet
    two_starts_a_second(h, "batch", band=2)
    now = 4.5
    fresh = _job("interactive", band=0)
    fresh.arrival = now
    # 1 start ahead of it (itself) at 2/s = 0.5 s <= 0.5 × 1.0 s
    assert h.allows_dispatch(fresh, now)
    waiting = _job("interactive", band=0)
    h.started(waiting, now)  # one more top-tier job not started yet: 1.0 s > 0.5 s
    assert not h.allows_dispatch(fresh, now)
    assert not h.allows_dispatch(_job("batch", band=2), now)  # no TTFT objective: no headroom
    h.first_token(waiting, now)
    assert h.allows_dispatch(fresh, now)
    assert h.passes == 2


def test_headroom_corrects_a_prediction_that_proves_optimistic() -> None:
    h = TierHeadroom({"interactive": 1.0}, ordered=True, share=1.0, window_s=5.0)
    two_starts_a_second(h)  # a lone job is predicted to start in 0.5 s
    now = 4.5
    for _ in range(20):  # each one let through starts in 2 s, four times the prediction
        job = _job("interactive", band=0)
        job.arrival = now
        assert h.allows_dispatch(job, now) or h.bias > 1.5
        if job.id in h._passed:
            h.started(job, now)
            h.first_token(job, now + 2.0)
            h._firsts = EventRate(h.window_s)  # the last 5 s: two starts a second
            for k in range(10):
                h._firsts.add(now + 2.0 - 0.5 * (9 - k))
    assert h.bias > 1.5, h.bias
    late = _job("interactive", band=0)
    late.arrival = now
    assert not h.allows_dispatch(late, now)  # 0.5 s × bias > the 1 s it has


def test_headroom_counts_only_what_an_ordered_engine_starts_first() -> None:
    ordered = TierHeadroom({"interactive": 2.0}, ordered=True, share=1.0, window_s=1.0)
    fcfs = TierHeadroom({"interactive": 2.0}, ordered=False, share=1.0, window_s=1.0)
    for h in (ordered, fcfs):
        for _ in range(2):  # 2 starts per second
            j = _job("batch", band=2)
            h.started(j, 0.5)
            h.first_token(j, 0.5)
        for _ in range(5):  # five batch jobs waiting in the engines
            h.started(_job("batch", band=2), 0.5)
    fresh = _job("interactive", band=0)
    fresh.arrival = 1.0
    assert ordered.ahead(0) == 0 and fcfs.ahead(0) == 5
    assert ordered.allows_dispatch(fresh, 1.0)  # 1 / 2 per s = 0.5 s <= 2 s
    assert not fcfs.allows_dispatch(fresh, 1.0)  # 6 / 2 per s = 3 s > 2 s
    ended = _job("batch", band=2)
    ordered.started(ended, 1.0)
    ordered.ended(ended, 1.0)  # ended before its first token: no longer waiting
    assert ordered.ahead(2) == 5


def test_the_controller_passes_the_top_tier_past_a_saturated_pool() -> None:
    """A saturated engine holds the batch tier, the top tier still goes while the engines'
    start rate brings it in within its TTFT; with the headroom off it is held too."""
    for mode, passes in (("slo", True), ("fixed", False)):
        extra = {"max_in_flight": 64} if mode == "fixed" else {}
        ctl, clock, sat = saturable(engine_priority=True, limit=mode, **extra)
        for _ in range(8):  # eight jobs start and end in 0.8 s: 8 starts / 5 s window
            j = make_job(tenant="initech", tier="batch")
            assert type(ctl.arrive(j)).__name__ == "Dispatched"  # the pool is empty
            sat.sent(j.id, "e")
            ctl.first_token(j.id)
            clock.advance(0.1)
            ctl.complete(j.id, Usage(100, 10))
        running = make_job(tenant="initech", tier="batch")  # stays in flight
        ctl.arrive(running)
        sat.sent(running.id, "e")
        ctl.first_token(running.id)
        sat.observe("e", EngineReading(running=4, waiting=3, kv_usage=0.5), clock.now())
        held = ctl.arrive(make_job(tenant="initech", tier="batch"))
        assert type(held).__name__ == "Queued" and ctl.dispatchable() == []
        top = make_job(tenant="acme", tier="interactive")
        assert type(ctl.arrive(top)).__name__ == "Queued"  # behind the queue...
        assert (ctl.dispatchable() == [top]) is passes, mode  # ...and out first if it may


def test_the_top_band_goes_ahead_of_lower_band_work_an_ordered_engine_queues() -> None:
    ttft = {"interactive": 1.0, "standard": 5.0, "batch": None}
    ordered = TierHeadroom(ttft, ordered=True, share=0.5, window_s=5.0)
    fcfs = TierHeadroom(ttft, ordered=False, share=0.5, window_s=5.0)
    top = _job("interactive", band=0)
    top.arrival = 0.0
    assert ordered.overtakes(top, 3.0, 0.0)  # three waiting, none top-band: it goes first
    assert not fcfs.overtakes(top, 3.0, 0.0)  # an FCFS engine starts it after the three
    assert not ordered.overtakes(_job("standard", band=1), 3.0, 0.0)  # only the top band
    assert not ordered.overtakes(top, 0.0, 0.0)  # nothing waiting: nothing to go ahead of
    for _ in range(2):
        ordered.started(_job("interactive", band=0), 0.0)  # two top-band jobs not begun
    assert ordered.overtakes(top, 3.0, 0.0)  # 3 waiting - 2 of ours: one lower-band request
    ordered.started(top, 0.0)
    assert not ordered.overtakes(_job("interactive", band=0), 3.0, 0.0)  # all three ours
    assert ordered.overtakes_count == 2 and ordered.passes == 0
    no_ttft = TierHeadroom({"interactive": None}, ordered=True, share=0.5, window_s=5.0)
    assert not no_ttft.overtakes(_job("interactive", band=0), 3.0, 0.0)


def test_a_top_band_job_that_would_start_late_even_so_stays_in_the_gateway() -> None:
    h = TierHeadroom({"interactive": 1.0}, ordered=True, share=0.5, window_s=5.0)
    two_starts_a_second(h)
    ahead = [_job("interactive", band=0) for _ in range(2)]
    for j in ahead:
        h.started(j, 4.5)  # two top-band jobs not begun: it would start in 1.5 s
    late = _job("interactive", band=0)
    late.arrival = 4.5
    assert not h.overtakes(late, 10.0, 4.5)  # 1.5 s > the 1 s it has: kept
    h.first_token(ahead[0], 4.5)  # one started: now 1.0 s <= 1 s
    assert h.overtakes(late, 10.0, 4.5)


def test_the_controller_sends_the_top_tier_ahead_of_what_the_engines_queue() -> None:
    """No start measured yet, so the start-time rule lets nothing through: the top-tier job
    still goes past a saturated engine whose queue holds batch work, when the engine orders
    its queue by the tier; an FCFS engine's queue holds it."""
    for ordered in (True, False):
        ctl, clock, sat = saturable(engine_priority=ordered)
        assert sat.headroom is not None
        sent = [make_job(tenant="initech", tier="batch") for _ in range(4)]
        for j in sent:
            assert type(ctl.arrive(j)).__name__ == "Dispatched"  # slow start: 1 + max_waiting 0
            sat.sent(j.id, "e")
            sat.observe("e", EngineReading(running=1, waiting=0, kv_usage=0.1), clock.now())
        # one running, three waiting at the engine: saturated
        sat.observe("e", EngineReading(running=1, waiting=3, kv_usage=0.1), clock.now())
        held = make_job(tenant="initech", tier="batch")
        assert type(ctl.arrive(held)).__name__ == "Queued"
        top = make_job(tenant="acme", tier="interactive")
        assert type(ctl.arrive(top)).__name__ == "Queued"
        assert ctl.dispatchable() == ([top] if ordered else []), ordered
        assert ctl.status()["pools"]["default"]["headroom_overtakes"] == int(ordered)


def test_a_full_kv_cache_holds_the_start_time_headroom_but_not_the_top_tier() -> None:
    """Engines whose KV caches are full start nothing until running sequences end; an engine
    that orders its queue by the tier then starts the top-tier job before the batch work it
    queues, so that job still goes.  The start-time rule (a standard job the engines would
    start in time by the measured start rate) sends nothing to full caches."""
    for ordered in (True, False):
        ctl, clock, sat = saturable(engine_priority=ordered)
        eight_starts(ctl, clock, sat)
        std = make_job(tenant="globex", tier="standard")
        top = make_job(tenant="acme", tier="interactive")
        # the cache has room: the standard job starts in time, so it passes the brake
        sat.observe("e", EngineReading(running=1, waiting=3, kv_usage=0.1), clock.now())
        assert type(ctl.arrive(std)).__name__ == "Dispatched", ordered
        sat.sent(std.id, "e")
        # the cache is full: the standard job is held; the top-tier one goes when ordered
        sat.observe("e", EngineReading(running=1, waiting=4, kv_usage=0.99), clock.now())
        std2 = make_job(tenant="globex", tier="standard")
        assert type(ctl.arrive(std2)).__name__ == "Queued"
        assert type(ctl.arrive(top)).__name__ == "Queued"  # behind the queued standard job
        assert ctl.dispatchable() == ([top] if ordered else []), ordered
        assert ctl.status()["pools"]["default"]["headroom_overtakes"] == int(ordered)


def test_the_start_time_headroom_counts_what_was_sent_since_the_reading() -> None:
    """The start-time rule sends a job only to an engine whose KV cache has room for it by
    its last reading, counting the requests sent since and those dispatched and not yet
    sent at what a running request holds on average: one reading does not let a burst into
    a nearly full cache."""
    ctl, clock, sat = saturable(engine_priority=True)
    eight_starts(ctl, clock, sat)
    # 4 running hold 0.8 of the cache (0.2 each): room for 0.85 of one more under 0.97
    sat.observe("e", EngineReading(running=4, waiting=3, kv_usage=0.8), clock.now())
    first = make_job(tenant="globex", tier="standard")
    assert type(ctl.arrive(first)).__name__ == "Dispatched"
    sat.sent(first.id, "e")
    second = make_job(tenant="globex", tier="standard")
    assert type(ctl.arrive(second)).__name__ == "Queued"  # the first took that room
    assert ctl.status()["pools"]["default"]["headroom_passes"] == 1
    sat.observe("e", EngineReading(running=4, waiting=2, kv_usage=0.6), clock.now())
    assert ctl.dispatchable() == [second]  # a reading with room: it goes
    sat.sent(second.id, "e")
    # room for 1.54 more by this reading (0.175 each): two jobs dispatched at one instant
    # and not sent anywhere yet count, so a third waits (uncounted, a burst would all pass
    # on one reading)
    sat.observe("e", EngineReading(running=4, waiting=2, kv_usage=0.7), clock.now())
    burst = [make_job(tenant="globex", tier="standard") for _ in range(5)]
    verdicts = [type(ctl.arrive(j)).__name__ for j in burst]
    assert verdicts == ["Dispatched"] * 2 + ["Queued"] * 3, verdicts
    assert sat.pending == 2


def test_lower_bands_leave_the_kv_the_top_tiers_arrivals_need() -> None:
    """A lower-band job is held while no engine's KV cache has room for the top-band jobs
    expected within half their TTFT objective (at the rate they were dispatched) and one
    more; a top-band job is not, and without top-tier traffic there is no reserve."""
    sat = EngineSaturation("default", max_waiting=2, max_kv_usage=0.97)
    sat.headroom = TierHeadroom({"interactive": 1.0, "standard": 5.0}, ordered=True)
    sat.set_engines(["e"])
    for i in range(10):  # 2 a second over 5 s: 1 expected within 0.5 s
        top = _job("interactive", band=0)
        sat.started(top, i * 0.5)
        sat.sent(top.id, "e")
    assert sat.headroom.top_reserve(4.5) == pytest.approx(1.0)
    # 10 running hold 0.85 (0.085 each): room for 1.4 under 0.97, not the 2 kept
    sat.observe("e", EngineReading(running=10, waiting=0, kv_usage=0.85), 4.5)
    assert sat.engine_room("e", 4.5) == pytest.approx(0.12 * 10 / 0.85 + 2)  # KV room
    assert not sat.allows_dispatch(_job("standard", band=1), 10, 0, 4.5)
    assert sat.reserve_holds == 1 and sat.holds == 1
    assert sat.allows_dispatch(_job("interactive", band=0), 10, 0, 4.5)
    sat.observe("e", EngineReading(running=10, waiting=0, kv_usage=0.8), 4.6)  # room for 2.1
    assert sat.allows_dispatch(_job("standard", band=1), 10, 0, 4.6)
    later = 10.0  # no top-band dispatch for 5 s: nothing kept
    assert sat.headroom.top_reserve(later) == 0.0
    sat.observe("e", EngineReading(running=10, waiting=0, kv_usage=0.85), later)
    assert sat.allows_dispatch(_job("standard", band=1), 10, 0, later)
    assert sat.reserve_holds == 1


def test_lower_bands_wait_while_every_engines_prefill_backlog_outlasts_the_top_budget() -> None:
    """Each engine prefilled 4,000 tokens of top-tier prompts from 0.1 s to 2.1 s (2,000 a
    second); the top tier's budget is half its 1 s TTFT.  A lower-band job goes while some engine's
    backlog takes under 0.5 s, and is held once every engine's takes longer (counted in
    ``prefill_holds``); a top-band job is not; without top-tier traffic there is no budget."""
    sat = EngineSaturation("default", max_waiting=2, initial_capacity=64)
    sat.headroom = TierHeadroom({"interactive": 1.0, "standard": 5.0}, ordered=True)
    sat.backlog = PrefillBacklog(ordered=True, timed=("interactive", "standard"))
    sat.set_engines(["e0", "e1"])

    def send(tier: str, band: int, prompt: int, engine: str, now: float) -> Job:
        job = make_job(tenant="t", tier=tier, prompt=prompt)
        job.band = band
        sat.started(job, now)
        sat.sent(job.id, engine)
        return job

    for i in range(4):
        for e in ("e0", "e1"):
            top = send("interactive", 0, 1000, e, 0.5 * i)
            sat.first_token(top, 0.5 * i + 0.1)
    for e in ("e0", "e1"):
        sat.observe(e, EngineReading(running=8, waiting=0, kv_usage=0.2), 2.1)
    assert sat.headroom.top_budget_s(2.1) == pytest.approx(0.5)
    send("interactive", 0, 1500, "e0", 2.1)  # 0.75 s at e0
    send("standard", 1, 500, "e1", 2.1)  # 0.25 s at e1
    assert sat.backlog.prefill_s("e0", 2.1) == pytest.approx(0.75)
    assert sat.allows_dispatch(_job("standard", band=1), 10, 0, 2.1)  # e1 prefills it soon
    send("batch", 2, 1000, "e1", 2.1)  # e1 too: 0.75 s
    assert not sat.allows_dispatch(_job("standard", band=1), 12, 0, 2.1)
    assert not sat.allows_dispatch(_job("batch", band=2), 12, 0, 2.1)
    assert sat.prefill_holds == 2 and sat.holds == 2 and sat.reserve_holds == 0
    assert sat.allows_dispatch(_job("interactive", band=0), 12, 0, 2.1)
    assert sat.status(2.1)["e1"]["prefill_backlog_s"] == pytest.approx(0.75)
    later = 7.5  # no top-band dispatch for 5 s: no budget to keep
    for e in ("e0", "e1"):
        sat.observe(e, EngineReading(running=8, waiting=0, kv_usage=0.2), later)
    assert sat.headroom.top_budget_s(later) == math.inf
    assert sat.allows_dispatch(_job("standard", band=1), 12, 0, later)


def test_late_first_tokens_of_a_higher_tier_cap_the_tiers_below() -> None:
    ceil = LowerTierCeiling({"interactive": 1.0, "batch": None}, share=0.5, cut=0.1)
    in_flight = 50  # batch jobs running
    on_time = _job("interactive", band=0)
    on_time.arrival = 0.0
    ceil.first_token(on_time, 0.4, in_flight)  # 0.4 s <= 0.5 × 1 s: no ceiling to relax
    assert ceil.ceilings() == {} and ceil.allows_dispatch(_job("batch", band=2), 50, 0, 0.4)
    late = _job("interactive", band=0)
    late.arrival = 0.0
    ceil.first_token(late, 0.8, in_flight)  # late: 0.9 × 50 in flight
    assert ceil.ceilings() == {0: pytest.approx(45.0)}
    assert not ceil.allows_dispatch(_job("batch", band=2), 45, 0, 0.8)
    assert ceil.allows_dispatch(_job("batch", band=2), 44, 0, 0.8)
    assert ceil.allows_dispatch(_job("interactive", band=0), 49, 0, 0.8)  # its own band: no ceiling
    for _ in range(45):  # one ceiling's worth of first tokens in time: one more slot
        ok = _job("interactive", band=0)
        ok.arrival = 1.0
        ceil.first_token(ok, 1.1, in_flight)
    assert ceil.ceilings()[0] == pytest.approx(46.0, abs=0.05)
    assert ceil.holds == 1
    in_flight = 10  # 40 ended: a ceiling of 46 holds nothing any more
    ok = _job("interactive", band=0)
    ok.arrival = 2.0
    ceil.first_token(ok, 2.1, in_flight)
    assert ceil.ceilings() == {}


def test_headroom_sends_nothing_to_engines_whose_kv_cache_is_full() -> None:
    ctl, clock, sat = saturable(engine_priority=True)
    assert sat.headroom is not None
    for _ in range(8):
        j = make_job(tenant="initech", tier="batch")
        ctl.arrive(j)
        sat.sent(j.id, "e")
        ctl.first_token(j.id)
        clock.advance(0.1)
        ctl.complete(j.id, Usage(100, 10))
    running = make_job(tenant="initech", tier="batch")
    ctl.arrive(running)
    sat.sent(running.id, "e")
    ctl.first_token(running.id)
    sat.observe("e", EngineReading(running=4, waiting=0, kv_usage=0.99), clock.now())
    top = make_job(tenant="acme", tier="interactive")
    ctl.arrive(top)
    assert ctl.dispatchable() == []  # KV full: the engine could not start it
    sat.observe("e", EngineReading(running=4, waiting=3, kv_usage=0.5), clock.now())
    assert ctl.dispatchable() == [top]


# --------------------------------------------------------------------------- config


def test_the_queue_bound_in_time_comes_from_the_slo() -> None:
    cfg = PolicyConfig.model_validate(policy())
    bounds = {t.name: t.wait_bound_s for t in cfg.tiers}
    assert bounds == {"interactive": 1.0, "standard": 5.0, "batch": 120.0}
    explicit = PolicyConfig.model_validate(
        {"tiers": [{"name": "x", "max_wait_s": 3, "slo": {"ttft_s": 1}}, {"name": "y"}]}
    )
    assert [t.wait_bound_s for t in explicit.tiers] == [3.0, None]


def test_a_job_that_cannot_start_within_its_ttft_is_refused_at_arrival() -> None:
    cfg = policy(max_in_flight=1, limit="fixed", initial_drain_tokens_per_s=100.0)
    ctl, _ = controller(cfg)
    ctl.arrive(make_job(tenant="acme", tier="interactive"))  # runs
    # 200 tokens ahead at 100 tokens/s: 2 s > the 1 s TTFT
    ctl.arrive(make_job(tenant="acme", tier="interactive", prompt=100, max_tokens=100))
    late = ctl.arrive(make_job(tenant="acme", tier="interactive"))
    assert isinstance(late, Rejected) and late.reason.code == "wait_exceeds_slo"
    batch = ctl.arrive(make_job(tenant="initech", tier="batch"))  # 120 s allowed: queued
    assert type(batch).__name__ == "Queued"
    cfg["queue"] = {"bands": "strict", "wait_from_slo": False}  # no bound in time
    ctl, _ = controller(cfg)
    for _ in range(3):
        assert type(ctl.arrive(make_job(tenant="acme", tier="interactive"))).__name__ != (
            "Rejected"
        )


def test_the_limit_mode_defaults_and_its_errors() -> None:
    def mode(**pool: Any) -> str:
        return PolicyConfig.model_validate(policy(**pool)).pools[0].limit_mode

    assert mode() == "slo"
    assert mode(max_in_flight=8) == "fixed"
    assert mode(max_in_flight_per_engine=8) == "fixed"
    assert mode(adaptive={"initial": 8}) == "adaptive"
    assert mode(max_in_flight=8, limit="slo") == "slo"
    with pytest.raises(ValidationError, match="limit 'fixed' needs max_in_flight"):
        mode(limit="fixed")
    with pytest.raises(ValidationError, match="limit 'adaptive' replaces max_in_flight"):
        mode(limit="adaptive", max_in_flight=8)
    ctl, _ = controller(policy())
    assert ctl.pool_limit("default") is None  # slo: no knee-seeking limit
    ctl, _ = controller(policy(adaptive={"initial": 8}))
    assert ctl.pool_limit("default") is not None


def test_a_reload_that_switches_the_limit_mode_needs_a_restart() -> None:
    old = PolicyConfig.model_validate(policy())
    same = PolicyConfig.model_validate(policy(max_in_flight=500, limit="slo"))
    fixed = PolicyConfig.model_validate(policy(max_in_flight=500))
    margin = PolicyConfig.model_validate(policy(slo_limit={"tpot_margin_sd": 1}))
    assert restart_needed(old, same) == []
    assert restart_needed(old, fixed) == ["pool 'default': a switch of limit (slo -> fixed)"]
    assert restart_needed(old, margin) == ["pool 'default': slo_limit / engine_priority"]
