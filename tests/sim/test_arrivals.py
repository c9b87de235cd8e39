"""Synthetic arrival processes: repeatability, horizons, and their statistics (fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import (
    MMPP,
    ArrivalProcess,
    Deterministic,
    GammaRenewal,
    OnOff,
    Poisson,
)

PROCESSES: list[ArrivalProcess] = [
    Poisson(20.0),
    GammaRenewal(20.0, 0.5),
    GammaRenewal(20.0, 4.0),
    Deterministic(20.0),
    OnOff(rate_on=50.0, on_s=3.0, off_s=7.0, rate_off=2.0),
    MMPP(rates=(5.0, 80.0), sojourns=(8.0, 2.0)),
]
IDS = ["poisson", "gamma-cv0.5", "gamma-cv4", "deterministic", "onoff", "mmpp"]


def _cv(x: np.ndarray) -> float:
    gaps = np.diff(x)
    return float(gaps.std() / gaps.mean())


@pytest.mark.parametrize("proc", PROCESSES, ids=IDS)
class TestEveryProcess:
    def test_same_seed_same_array(self, proc: ArrivalProcess) -> None:
        a = proc.times(7, duration=300.0)
        b = proc.times(7, duration=300.0)
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, proc.times(8, duration=300.0))

    def test_generator_seed_is_shared(self, proc: ArrivalProcess) -> None:
        rng = np.random.default_rng(3)
        first = proc.times(rng, count=100)
        second = proc.times(rng, count=100)
        assert not np.array_equal(first, second)
        np.testing.assert_array_equal(first, proc.times(np.random.default_rng(3), count=100))

    def test_sorted_within_horizon(self, proc: ArrivalProcess) -> None:
        t = proc.times(1, duration=500.0)
        assert t.size > 0
        assert t[0] >= 0.0
        assert t[-1] < 500.0
        assert np.all(np.diff(t) >= 0.0)

    def test_count_is_exact(self, proc: ArrivalProcess) -> None:
        for n in (0, 1, 4095, 4096, 4097, 10_000):
            assert proc.times(2, count=n).shape == (n,)
        assert proc.times(2, count=np.int64(7)).shape == (7,)  # type: ignore[arg-type]

    def test_prefix_consistent(self, proc: ArrivalProcess) -> None:
        long = proc.times(5, duration=2000.0)
        short = proc.times(5, duration=150.0)
        np.testing.assert_array_equal(short, long[: short.size])
        assert short.size == np.searchsorted(long, 150.0)
        np.testing.assert_array_equal(proc.times(5, count=short.size), short)

    def test_zero_horizon(self, proc: ArrivalProcess) -> None:
        assert proc.times(0, duration=0.0).size == 0
        assert proc.times(0, count=0).size == 0

    @pytest.mark.parametrize(
        "kwargs",
        [{}, {"duration": 1.0, "count": 1}, {"duration": -1.0}, {"duration": math.inf},
         {"count": -1}, {"count": 1.5}, {"count": True}],
    )  # fmt: skip
    def test_bad_horizon(self, proc: ArrivalProcess, kwargs: dict[str, float]) -> None:
        with pytest.raises(PolicyError):
            proc.times(0, **kwargs)  # type: ignore[arg-type]


def test_poisson_rate_and_cv() -> None:
    t = Poisson(50.0).times(11, duration=2000.0)
    assert t.size / 2000.0 == pytest.approx(50.0, rel=0.02)
    assert _cv(t) == pytest.approx(1.0, abs=0.02)
    counts = np.bincount(t.astype(np.int64))
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv_is_as_requested(cv: float) -> None:
    t = GammaRenewal(20.0, cv).times(13, count=200_000)
    assert (t.size - 1) / (t[-1] - t[0]) == pytest.approx(20.0, rel=0.05)
    assert _cv(t) == pytest.approx(cv, rel=0.1)


def test_gamma_cv1_is_poisson_like() -> None:
    t = GammaRenewal(10.0, 1.0).times(4, count=100_000)
    assert _cv(t) == pytest.approx(1.0, abs=0.02)


def test_gamma_starts_in_equilibrium() -> None:
    # Stationary renewal: the first arrival is a residual life, mean (1 + cv²) / (2 λ) = 5 s
    # here, where an ordinary renewal process would give 1 / λ = 1 s.
    proc = GammaRenewal(1.0, 3.0)
    firsts = np.array([proc.times(seed, count=1)[0] for seed in range(2000)])
    assert firsts.mean() == pytest.approx(5.0, rel=0.12)


def test_deterministic_is_evenly_spaced() -> None:
    t = Deterministic(4.0).times(9, count=10_000)
    np.testing.assert_allclose(np.diff(t), 0.25, rtol=1e-9)
    assert 0.0 <= t[0] < 0.25


def test_onoff_follows_its_square_wave() -> None:
    proc = OnOff(rate_on=40.0, on_s=2.0, off_s=8.0)
    assert proc.mean_rate == pytest.approx(8.0)
    t = proc.times(21, duration=5000.0)
    phase = t % 10.0
    assert np.all(phase < 2.0)  # nothing while off
    assert t.size / 5000.0 == pytest.approx(8.0, rel=0.03)


def test_onoff_background_rate() -> None:
    t = OnOff(rate_on=40.0, on_s=2.0, off_s=8.0, rate_off=5.0).times(22, duration=5000.0)
    off = np.count_nonzero(t % 10.0 >= 2.0)
    assert off / (5000.0 * 0.8) == pytest.approx(5.0, rel=0.05)


def test_mmpp_mean_rate_is_stationary_rate() -> None:
    proc = MMPP(rates=(2.0, 30.0), sojourns=(20.0, 5.0))
    assert proc.stationary == pytest.approx((0.8, 0.2))
    assert proc.mean_rate == pytest.approx(7.6)
    t = proc.times(31, duration=40_000.0)
    assert t.size / 40_000.0 == pytest.approx(7.6, rel=0.08)
    # Modulation makes it bursty: counts over 1 s are over-dispersed, gaps have CV > 1.
    counts = np.bincount(t.astype(np.int64))
    assert counts.var() / counts.mean() > 3.0
    assert _cv(t) > 1.3


def test_mmpp_with_equal_rates_is_poisson() -> None:
    t = MMPP(rates=(10.0, 10.0), sojourns=(1.0, 3.0)).times(5, duration=10_000.0)
    assert t.size / 10_000.0 == pytest.approx(10.0, rel=0.02)
    assert _cv(t) == pytest.approx(1.0, abs=0.02)


def test_mmpp_horizon_inside_a_long_sojourn() -> None:
    # One sojourn holds many arrivals past the horizon; the cut keeps exactly those before it.
    proc = MMPP(rates=(1000.0, 0.0), sojourns=(100.0, 100.0))
    t = proc.times(1, duration=10.0)
    assert np.all(t < 10.0)
    np.testing.assert_array_equal(t, proc.times(1, duration=1000.0)[: t.size])


@pytest.mark.parametrize(
    "make",
    [
        lambda: Poisson(0.0),
        lambda: Poisson(-1.0),
        lambda: Poisson(math.nan),
        lambda: Poisson(math.inf),
        lambda: Poisson(True),
        lambda: GammaRenewal(1.0, 0.0),
        lambda: GammaRenewal(1.0, -2.0),
        lambda: Deterministic(0.0),
        lambda: OnOff(1.0, 0.0, 1.0),
        lambda: OnOff(1.0, 1.0, 1.0, rate_off=-1.0),
        lambda: MMPP((0.0, 0.0), (1.0, 1.0)),
        lambda: MMPP((1.0, 2.0), (0.0, 1.0)),
        lambda: MMPP((1.0,), (1.0, 1.0)),  # type: ignore[arg-type]
    ],
)
def test_bad_parameters(make: object) -> None:
    assert callable(make)
    with pytest.raises(PolicyError):
        make()


def test_bad_seed() -> None:
    with pytest.raises(PolicyError):
        Poisson(1.0).times(-1, count=1)
    with pytest.raises(PolicyError):
        Poisson(1.0).times("x", count=1)  # type: ignore[arg-type]
