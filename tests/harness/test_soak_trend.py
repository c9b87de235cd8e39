"""The soak's verdict on synthetic series: the fit, the warm-up, flat against growing, the
verdict line and the sorting of outcomes.  No server, no clock: series are made up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.soak_load import Tally, client_plans
from harness.soak_report import VERDICT_RE, verdict_line
from harness.soak_trend import FLOORS, Trend, fit, verdict, warmup_cut
from velvetrope.demo.replay_results import ReplayOutcome, ReplayResult, RequestResult
from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import TraceRequest

HOUR_S = 3600.0
T = [10.0 * i for i in range(361)]  # an hour sampled every 10 s


def _series(slope_per_h: float, noise: float, base: float = 100.0, seed: int = 1) -> list[float]:
    rng = np.random.default_rng(seed)
    return [base + slope_per_h * t / HOUR_S + noise * rng.standard_normal() for t in T]


def test_the_fit_recovers_a_known_slope_and_its_interval_holds_it() -> None:
    tr = fit("rss_mb", T, _series(12.0, 0.5))
    assert tr.n == 361 and tr.span_h == pytest.approx(1.0)
    assert tr.ci[0] < 12.0 < tr.ci[1]
    assert tr.slope == pytest.approx(12.0, abs=0.5)
    assert tr.resid_std == pytest.approx(0.5, rel=0.15)
    assert tr.at(0.5) == pytest.approx(100.0 + 6.0, abs=0.2)


def test_a_leak_is_growing_and_noise_alone_is_flat() -> None:
    leak = fit("rss_mb", T, _series(12.0, 0.5))  # 12 MB an hour, far above its noise
    assert not leak.flat and leak.drift == pytest.approx(12.0, abs=0.5)
    noise = fit("rss_mb", T, _series(0.0, 3.0))
    assert noise.flat
    falling = fit("tasks", T, _series(-500.0, 1.0))  # drained: not a leak
    assert falling.ci[1] < 0 and falling.flat
    assert verdict([noise]) and not verdict([noise, leak])


def test_a_drift_within_the_noise_or_the_floor_is_flat_even_when_significant() -> None:
    # 3 MB over the hour with almost no noise: the interval excludes 0, the floor forgives it
    small = fit("rss_mb", T, _series(3.0, 0.05))
    assert small.ci[0] > 0 and small.flat
    assert small.bound == FLOORS["rss_mb"]
    # the same series, no floor: growing
    assert not fit("rss_mb", T, _series(3.0, 0.05), floor=0.0).flat
    # fds rising 4 over the hour: within its floor of 5; rising 8: not
    assert fit("fds", T, _series(4.0, 0.0, seed=2)).flat
    assert not fit("fds", T, _series(8.0, 0.0, seed=2)).flat
    # a noisy series may drift up to 3 residual std over the run
    wobbly = fit("tasks", T, _series(50.0, 20.0, seed=3))
    assert wobbly.bound == pytest.approx(3 * wobbly.resid_std) and wobbly.flat
    assert not fit("tasks", T, _series(200.0, 20.0, seed=3)).flat


def test_missing_samples_are_left_out_and_too_few_cannot_be_judged() -> None:
    ys = _series(12.0, 0.5)
    holes = [math.nan if i % 3 == 0 else y for i, y in enumerate(ys)]
    tr = fit("rss_mb", T, holes)
    assert tr.n == 240 and not tr.flat
    few = fit("rss_mb", [0.0, 10.0], [1.0, 100.0])
    assert few.n == 2 and few.flat
    with pytest.raises(ValueError, match="2 times for 1 values"):
        fit("x", [0.0, 1.0], [1.0])


def test_warmup_skips_a_tenth_at_most_five_minutes_and_leaves_enough_to_fit() -> None:
    assert warmup_cut(361, HOUR_S) == 30  # 5 minutes of 10 s samples (10 % would be 6 min)
    assert warmup_cut(61, 600.0) == 6  # 10 % of 10 minutes
    assert warmup_cut(11, 20.0) == 2  # at least 2 samples
    assert warmup_cut(4, 3.0) == 1  # but 3 must remain
    assert warmup_cut(2, 1.0) == 0
    assert warmup_cut(0, 0.0) == 0


def test_the_verdict_line_reads_back() -> None:
    trends = {n: fit(n, T, _series(0.0, 1.0)) for n in ("rss_mb", "fds", "tasks", "redis_keys")}
    line = verdict_line(1.0, trends, 0, verdict(list(trends.values())))
    m = VERDICT_RE.match(line)
    assert m is not None, line
    assert m["hours"] == "1" and m["errors"] == "0" and m["verdict"] == "flat"
    assert float(m["rss"]) == pytest.approx(trends["rss_mb"].slope, rel=1e-2)
    grown = dict(trends, fds=fit("fds", T, _series(100.0, 0.0)))
    m2 = VERDICT_RE.match(verdict_line(0.5, grown, 3, verdict(list(grown.values()))))
    assert m2 is not None and m2["verdict"] == "growing" and m2["errors"] == "3"
    assert isinstance(grown["fds"], Trend) and float(m2["fds"]) == pytest.approx(100.0)


def _result(outcome: ReplayOutcome, status: int = 200, code: str | None = None) -> RequestResult:
    r = RequestResult(0, "t", None, "u", 1, 1, 0.0, outcome=outcome, status=status)
    r.error_code = code
    return r


def test_tally_counts_admission_and_hang_ups_as_load_and_the_rest_as_errors() -> None:
    t = Tally()
    results = [
        _result(ReplayOutcome.COMPLETED),
        _result(ReplayOutcome.HUNG_UP),  # mid-stream
        _result(ReplayOutcome.HUNG_UP, 0),  # before any answer
        _result(ReplayOutcome.REJECTED, 429, "rate_limited"),
        _result(ReplayOutcome.REJECTED, 503, "wait_exceeds_slo"),
        _result(ReplayOutcome.REJECTED, 503, "state_unavailable"),
        _result(ReplayOutcome.ERROR, 502, "upstream_error"),
        _result(ReplayOutcome.FAILED, 0, "ClientOSError"),
        _result(ReplayOutcome.TIMEOUT, 200, "client_timeout"),
    ]
    t.add(ReplayResult(results, 1.0, 0.0))
    assert t.sent == 9
    assert t.answered == 7  # all but the early hang-up and the failed connection
    assert t.rejected == {"rate_limited": 1, "wait_exceeds_slo": 1}
    assert t.errors == {
        "HTTP 503 state_unavailable": 1,
        "HTTP 502 upstream_error": 1,
        "failed ClientOSError": 1,
        "timeout client_timeout": 1,
    }
    assert t.error_count == 4


def test_client_plans_draw_their_shares() -> None:
    reqs = [TraceRequest(0.01 * i, 50, 40) for i in range(4000)]
    plans = client_plans(reqs, seed=3)
    assert plans == client_plans(reqs, seed=3)  # seeded
    streams = sum(p.stream for p in plans) / len(plans)
    leaving = [p for p in plans if p.hang_up_after_s or p.hang_up_after_tokens]
    mid = [p for p in leaving if p.hang_up_after_tokens]
    assert streams == pytest.approx(0.7, abs=0.03)
    assert len(leaving) / len(plans) == pytest.approx(0.2, abs=0.02)
    assert len(mid) / len(leaving) == pytest.approx(0.5 * 0.7, abs=0.05)  # streams only
    assert all(1 <= (p.hang_up_after_tokens or 1) < 40 for p in mid)
    assert all(p.stream for p in mid)
    one_token = client_plans([TraceRequest(0.0, 5, 1)] * 200, seed=1, disconnect_share=1.0)
    assert all(p.hang_up_after_tokens is None and p.hang_up_after_s for p in one_token)
    with pytest.raises(PolicyError):
        client_plans(reqs, seed=1, stream_share=1.5)
