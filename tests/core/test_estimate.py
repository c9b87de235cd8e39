from __future__ import annotations

import random

import numpy as np
import pytest

from velvetrope.core import Job
from velvetrope.core.estimate import DrainMeter, P2Quantile, QuantileEstimator


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_p2_tracks_the_quantile_of_a_lognormal(p: float) -> None:
    rng = random.Random(7)
    xs = [rng.lognormvariate(5, 0.8) for _ in range(20_000)]
    sk = P2Quantile(p)
    for x in xs:
        sk.add(x)
    exact = float(np.quantile(xs, p))
    assert sk.value() == pytest.approx(exact, rel=0.05)


def test_p2_is_exact_on_few_values() -> None:
    sk = P2Quantile(0.5)
    assert np.isnan(sk.value())
    for x in (5, 1, 3):
        sk.add(x)
    assert sk.value() == 3


def job(tenant: str, max_tokens: int) -> Job:
    return Job("j", tenant, "default", 10, max_tokens)


def test_estimator_uses_default_then_quantile_capped_by_max_tokens() -> None:
    est = QuantileEstimator(quantile=0.5, default=256, min_observations=5)
    assert est.predict(job("a", 1000)) == 256
    assert est.predict(job("a", 100)) == 100
    for _ in range(50):
        est.observe(job("a", 1000), 40)
    assert est.predict(job("a", 1000)) == 40
    assert est.predict(job("b", 1000)) == 256  # per tenant
    assert est.predict(job("a", 10)) == 10


def test_drain_meter_counts_busy_time_only() -> None:
    m = DrainMeter(alpha=1.0, window_s=1.0)
    assert m.seconds_for(100) is None
    m.busy(0.0, 0)
    m.busy(0.5, 1)  # 0..0.5 busy (one job in flight during it)
    m.busy(10.0, 0)  # 0.5..10 idle: not counted
    m.busy(10.5, 1)  # busy again: total 1.0 s busy
    m.finished(500)
    assert m.rate == pytest.approx(500.0)
    assert m.seconds_for(1000) == pytest.approx(2.0)


def test_drain_meter_prior() -> None:
    m = DrainMeter(prior=50.0)
    assert m.seconds_for(100) == pytest.approx(2.0)
    assert m.turned_over


def test_drain_meter_turns_over_once_as_many_jobs_ended_as_were_ever_in_flight() -> None:
    """Ten jobs start at once; the first to end are the short ones, so the rate measured
    from them understates the engines.  Until ten have ended the rate predicts no wait
    longer than the busy time it was measured over."""
    m = DrainMeter(alpha=1.0, window_s=1.0)
    for n in range(10):
        m.busy(0.0, n)  # ten in flight
    m.finish(1.0, 10, 100)  # a short job: 100 tokens over 1 s busy
    assert m.rate == pytest.approx(100.0) and not m.turned_over
    assert m.trusted_for(1.0) and not m.trusted_for(120.0)
    for k in range(8):  # eight more end over the next 8 s
        m.finish(2.0 + k, 9 - k, 800)
    assert not m.turned_over  # nine of ten ended
    assert m.trusted_for(9.0) and not m.trusted_for(9.5)  # 9 s measured
    m.finish(10.0, 1, 800)  # the tenth
    assert m.turned_over and m.trusted_for(120.0)


def test_window_quantile_is_exact_over_its_window_and_follows_drift() -> None:
    from velvetrope.core.estimate import WindowQuantile

    w = WindowQuantile(0.9, window=100, refresh=1)
    for x in range(1, 101):
        w.add(x)
    assert w.value() == 91  # the 90th percentile of 1..100 (nearest rank above)
    for _ in range(100):
        w.add(1000)
    assert w.value() == 1000  # the old values left the window
    lagging = WindowQuantile(0.5, window=64, refresh=16)
    for x in range(200):
        lagging.add(x)
    exact = sorted(range(200 - 64, 200))[32]
    assert abs(lagging.value() - exact) <= 16  # lags by fewer than `refresh` observations


def test_the_estimators_sketch_is_chosen_by_config() -> None:
    from velvetrope.clock import ManualClock
    from velvetrope.core import AdmissionController, PolicyConfig
    from velvetrope.core.estimate import WindowQuantile

    for sketch, kind in (("window", WindowQuantile), ("p2", P2Quantile)):
        cfg = PolicyConfig.model_validate({"estimator": {"kind": "tenant", "sketch": sketch}})
        ctl = AdmissionController(cfg, ManualClock())
        ctl.estimator.observe(job("t", 100), 10)
        assert isinstance(ctl.estimator, QuantileEstimator)
        assert isinstance(ctl.estimator._sketches["t"], kind)
    with pytest.raises(ValueError, match="sketch"):
        QuantileEstimator(sketch="nope")


@pytest.mark.parametrize(("window", "refresh"), [(1, 1), (5, 3), (64, 8), (256, 32), (10, 16)])
def test_window_quantile_reads_the_window_of_its_last_refresh_point(
    window: int, refresh: int
) -> None:
    """Whenever it is read, the estimate is the window as it stood at the last refresh point
    (each of the first ``refresh`` observations, then every ``refresh``-th), however many
    observations came since and whether or not it was read in between."""
    from velvetrope.core.estimate import WindowQuantile

    rng = random.Random(window * 1000 + refresh)
    w = WindowQuantile(0.9, window=window, refresh=refresh)
    xs: list[int] = []
    at = 0  # observations at the last refresh point
    for _ in range(3 * window + 5 * refresh):
        x = rng.randrange(1, 5000)
        xs.append(x)
        w.add(x)
        n = len(xs)
        if n <= refresh or n % refresh == 0:
            at = n
        if rng.random() < 0.3:
            s = sorted(xs[max(0, at - window) : at])
            assert w.value() == s[min(len(s) - 1, int(0.9 * len(s)))]


def test_prompt_only_work_teaches_the_estimator_nothing() -> None:
    """An embedding or rerank job (predicted output 0, nothing reserved) completes with no
    output: the output-length estimate of its tenant's chat requests does not move."""
    from velvetrope.clock import ManualClock
    from velvetrope.core import AdmissionController, PolicyConfig, Usage

    cfg = PolicyConfig.model_validate({"estimator": {"kind": "tenant", "sketch": "window"}})
    ctl = AdmissionController(cfg, ManualClock())
    for i in range(20):
        chat = Job(f"c{i}", "t", "default", 10, 1000)
        ctl.route(chat)
        ctl.arrive(chat)
        ctl.complete(chat.id, Usage(10, 200))
    before = ctl.estimator.predict(Job("x", "t", "default", 10, 1000))
    for i in range(300):  # past 90% of the window: without the rule, p90 would be 0
        emb = Job(f"e{i}", "t", "default", 10, 1, predicted_output=0)
        emb.cost = 10  # sized as prompt-only work is, by its endpoint
        ctl.route(emb)
        ctl.arrive(emb)
        ctl.complete(emb.id, Usage(10, 0))
    assert ctl.estimator.predict(Job("y", "t", "default", 10, 1000)) == before == 200
