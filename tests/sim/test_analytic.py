"""The analytic mode against closed forms (small samples, generous tolerances; the 10^6-job
runs are in bench/sim_validate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from velvetrope.errors import PolicyError
from velvetrope.planner.queueing import mm1_response_mean, mmc_response_mean
from velvetrope.planner.queueing_general import mg1_response_mean, mg1_sjf_waits
from velvetrope.sim.analytic import ExponentialService, TokenService, run_analytic

# A skewed size distribution (C_s² ≈ 1.6): many short jobs, a few long ones.
SIZES = np.array([1] * 60 + [5] * 25 + [20] * 10 + [60] * 5)
TOKENS = TokenService.with_mean(SIZES, 1.0)
N = 40_000


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


def test_mm1_fcfs_matches_the_closed_form() -> None:
    res = run_analytic("fifo", ExponentialService(1.0), rho=0.6, n_jobs=N, seed=1, warmup=500)
    theory = mm1_response_mean(res.lam, 1.0)
    assert rel(res.mean_response, theory) < 0.06
    # the error is within a few batch-means standard errors
    assert abs(res.mean_response - theory) < 4 * res.response_stderr()


def test_mg1_fcfs_matches_pollaczek_khinchine() -> None:
    res = run_analytic("fifo", TOKENS, rho=0.6, n_jobs=N, seed=2, warmup=500)
    theory = mg1_response_mean(res.lam, TOKENS.mean, TOKENS.second_moment)
    assert rel(res.mean_response, theory) < 0.06


def test_sjf_matches_phipps_and_beats_fcfs() -> None:
    sjf = run_analytic("sjf", TOKENS, rho=0.7, n_jobs=N, seed=3, warmup=500)
    fifo = run_analytic("fifo", TOKENS, rho=0.7, n_jobs=N, seed=3, warmup=500)
    phipps = mg1_sjf_waits(sjf.lam, TOKENS.service_times())
    assert rel(sjf.mean_wait, phipps.wait_mean) < 0.08
    assert rel(fifo.mean_wait, phipps.fcfs_wait_mean) < 0.08
    # per size class too: short jobs wait far less than long ones, as the formula says
    for size in (1, 60):
        mine = sjf.sizes[sjf.warmup :] == size
        expected = phipps.wait_for_size(size * TOKENS.seconds_per_token)
        assert rel(float(sjf.wait[sjf.warmup :][mine].mean()), expected) < 0.12


def test_mmc_matches_erlang_c() -> None:
    res = run_analytic("fifo", ExponentialService(1.0), rho=0.7, n_jobs=N, servers=3, seed=4)
    assert rel(res.mean_response, mmc_response_mean(res.lam, 1.0, 3)) < 0.06
    # never more than c in service: starts are ordered and at most c overlap
    order = np.argsort(res.start)
    starts, ends = res.start[order], res.end[order]
    busy_at_start = [
        int(np.sum((starts[: i + 1] <= s) & (ends[: i + 1] > s)))
        for i, s in enumerate(starts[:2000])
    ]
    assert max(busy_at_start) <= 3


def test_fcfs_serves_in_arrival_order_and_sjf_does_not() -> None:
    fifo = run_analytic("fifo", TOKENS, rho=0.8, n_jobs=3000, seed=5)
    sjf = run_analytic("sjf", TOKENS, rho=0.8, n_jobs=3000, seed=5)
    assert np.all(np.diff(fifo.start) >= 0)
    assert np.any(np.diff(sjf.start) < 0)


def test_noisy_lengths_give_gains_between_fcfs_and_oracle() -> None:
    kw = {"rho": 0.8, "n_jobs": 20_000, "seed": 6, "warmup": 500}
    fifo = run_analytic("fifo", TOKENS, **kw).mean_response  # type: ignore[arg-type]
    oracle = run_analytic("sjf", TOKENS, **kw).mean_response  # type: ignore[arg-type]
    noisy = run_analytic("sjf", TOKENS, lengths="noisy:0.5", **kw).mean_response  # type: ignore[arg-type]
    assert oracle < noisy < fifo


def test_same_seed_same_run() -> None:
    a = run_analytic("sjf", TOKENS, rho=0.5, n_jobs=2000, seed=7)
    b = run_analytic("sjf", TOKENS, rho=0.5, n_jobs=2000, seed=7)
    np.testing.assert_array_equal(a.end, b.end)


def test_token_service_moments_are_exact() -> None:
    svc = TokenService([1, 3], 0.5)
    assert svc.mean == pytest.approx(1.0)
    assert svc.second_moment == pytest.approx((0.25 + 2.25) / 2)
    assert ExponentialService(2.0).second_moment == pytest.approx(8.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rho": 1.0},
        {"rho": 0.5, "n_jobs": 0},
        {"rho": 0.5, "servers": 0},
        {"rho": 0.5, "warmup": 10},
    ],
)
def test_bad_parameters_raise(kwargs: dict[str, float]) -> None:
    args = {"n_jobs": 10, **kwargs}
    with pytest.raises(PolicyError):
        run_analytic("fifo", ExponentialService(), **args)  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        TokenService([0, 1], 1.0)
