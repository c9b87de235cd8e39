"""Tests of velvetrope.planner.queueing against independent computations.

References used here are computed another way than the code under test: exact rational
arithmetic (fractions.Fraction), 50-digit mpmath evaluations of the factorial-sum
formulas, textbook closed forms for special cases, numerical integration of tails,
Erlang's exact M/D/1 wait distribution, and a small discrete-event simulation of SJF.
"""

from __future__ import annotations

import heapq
import math
import sys
from fractions import Fraction

import mpmath
import numpy as np
import numpy.typing as npt
import pytest
from scipy import integrate, optimize

from velvetrope.errors import PolicyError
from velvetrope.planner import queueing as q
from velvetrope.planner import queueing_general as qg

# --------------------------------------------------------------------------- references


def erlang_c_fraction(c: int, a: Fraction) -> Fraction:
    """Erlang C by the factorial-sum formula in exact rational arithmetic."""
    terms = [a**k / math.factorial(k) for k in range(c)]
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (sum(terms, Fraction(0)) + tail)


def erlang_b_fraction(c: int, a: Fraction) -> Fraction:
    terms = [a**k / math.factorial(k) for k in range(c + 1)]
    return terms[-1] / sum(terms, Fraction(0))


def erlang_c_mpmath(c: int, a: float) -> mpmath.mpf:
    """Erlang C by the factorial-sum formula at the current mpmath precision."""
    am = mpmath.mpf(a)
    term = mpmath.mpf(1)
    total = mpmath.mpf(0)
    for k in range(c):
        total += term
        term = term * am / (k + 1)
    tail = term * c / (c - am)
    return tail / (total + tail)


def md1_wait_cdf(rho: float, t: float) -> float:
    """Exact P(Wq <= t) for M/D/1 with service time 1 (Erlang 1909; Crommelin 1932).

    ``(1 − ρ)·Σ_{k=0}^{⌊t⌋} (ρ(k − t))^k/k!·exp(−ρ(k − t))``; an alternating sum, so it
    is evaluated with 30 + ⌈t⌉ digits.
    """
    with mpmath.workdps(30 + math.ceil(t)):
        r = mpmath.mpf(rho)
        x = mpmath.mpf(t)
        total = mpmath.mpf(0)
        for k in range(math.floor(t) + 1):
            u = r * (k - x)
            total += u**k / mpmath.factorial(k) * mpmath.exp(-u)
        return float((1 - r) * total)


def simulate_sjf(
    lam: float, values: list[float], probs: list[float], n: int, seed: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Non-preemptive SJF M/G/1 by discrete-event simulation; ties served FCFS.

    Returns the service time and the wait of each of ``n`` jobs, in arrival order.
    """
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / lam, n)).tolist()
    sizes = rng.choice(np.asarray(values), p=np.asarray(probs), size=n).tolist()
    waits = [0.0] * n
    ready: list[tuple[float, int]] = []
    clock = 0.0
    nxt = 0
    for _ in range(n):
        if not ready:
            clock = max(clock, arrivals[nxt])
        while nxt < n and arrivals[nxt] <= clock:
            heapq.heappush(ready, (sizes[nxt], nxt))
            nxt += 1
        size, job = heapq.heappop(ready)
        waits[job] = clock - arrivals[job]
        clock += size
    return np.asarray(sizes), np.asarray(waits)


# --------------------------------------------------------------------------- Erlang B / C

LOADS_FRACTION = (0.03125, 0.5, 1.0, 2.25, 7.5, 19.75)


@pytest.mark.parametrize("c", range(1, 31))
def test_erlang_c_matches_exact_rational_formula(c: int) -> None:
    loads = [a for a in LOADS_FRACTION if a < c] + [c * 0.9, c * 0.99, c - 2.0**-10]
    for a in loads:
        exact = erlang_c_fraction(c, Fraction(a))
        assert q.erlang_c(c, a) == pytest.approx(float(exact), rel=1e-13, abs=0.0), (c, a)


@pytest.mark.parametrize("c", [1, 2, 3, 5, 10, 17, 30])
def test_erlang_b_matches_exact_rational_formula(c: int) -> None:
    for a in (*LOADS_FRACTION, 50.0, 300.0):
        exact = erlang_b_fraction(c, Fraction(a))
        assert q.erlang_b(c, a) == pytest.approx(float(exact), rel=1e-13, abs=0.0), (c, a)


def test_erlang_textbook_values() -> None:
    # c = 2, a = 1: B = (1/2)/(1 + 1 + 1/2) = 1/5 and C = 1/3.
    assert q.erlang_b(2, 1.0) == pytest.approx(0.2, rel=1e-15)
    assert q.erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0, rel=1e-15)
    # One server: B = a/(1 + a) and C = rho (the probability the server is busy).
    for a in (0.001, 0.3, 0.5, 0.9, 0.999):
        assert q.erlang_b(1, a) == pytest.approx(a / (1.0 + a), rel=1e-15)
        assert q.erlang_c(1, a) == pytest.approx(a, rel=1e-15)
    # No load, no blocking and no waiting.
    assert q.erlang_b(5, 0.0) == 0.0
    assert q.erlang_c(5, 0.0) == 0.0


RHO_GRID = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


def erlang_c_grid_errors() -> tuple[float, float, int]:
    """Max relative error over c = 1..200 and RHO_GRID against 50-digit mpmath.

    Returns (max relative error over normal-range references, max absolute error over
    subnormal references, number of subnormal references).
    """
    worst_rel = 0.0
    worst_abs_subnormal = 0.0
    subnormal = 0
    with mpmath.workdps(50):
        for c in range(1, 201):
            for rho in RHO_GRID:
                a = rho * c
                got = q.erlang_c(c, a)
                ref = erlang_c_mpmath(c, a)
                if ref >= sys.float_info.min:
                    worst_rel = max(worst_rel, float(abs((mpmath.mpf(got) - ref) / ref)))
                else:
                    subnormal += 1
                    worst_abs_subnormal = max(worst_abs_subnormal, float(abs(got - ref)))
    return worst_rel, worst_abs_subnormal, subnormal


def test_erlang_c_grid_against_mpmath_50_digits() -> None:
    worst_rel, worst_abs_subnormal, subnormal = erlang_c_grid_errors()
    assert worst_rel <= 1e-13  # the brief's bound is 1e-9; measured 3.2e-15
    # Subnormal answers (c near 200 at rho = 0.01) keep absolute accuracy only.
    assert subnormal < 50
    assert worst_abs_subnormal <= 1e-315


def test_erlang_c_large_c_heavy_load_no_overflow() -> None:
    for c, rho in ((500, 0.999), (2000, 0.999), (2000, 0.5)):
        a = rho * c
        got = q.erlang_c(c, a)
        with mpmath.workdps(50):
            ref = erlang_c_mpmath(c, a)
            assert 0.0 < got < 1.0
            assert float(abs((mpmath.mpf(got) - ref) / ref)) <= 1e-13, (c, rho)


# --------------------------------------------------------------------------- M/M/1, M/M/c


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.99])
def test_mm1_closed_forms(rho: float) -> None:
    mu = 4.0
    lam = rho * mu
    assert q.mm1_wait_mean(lam, mu) == pytest.approx(lam / (mu * (mu - lam)), rel=1e-12)
    assert q.mm1_response_mean(lam, mu) == pytest.approx(1.0 / (mu - lam), rel=1e-12)
    # Little: Lq = λ·Wq = ρ²/(1 − ρ).
    lq = q.littles_law_l(lam, q.mm1_wait_mean(lam, mu))
    assert lq == pytest.approx(rho * rho / (1.0 - rho), rel=1e-12)
    assert q.mm1_wait_tail(lam, mu, 0.0) == pytest.approx(rho, rel=1e-15)


@pytest.mark.parametrize("rho", [0.2, 0.7, 0.95])
def test_mm1_is_mmc_with_one_server(rho: float) -> None:
    lam, mu = rho * 3.0, 3.0
    assert q.mm1_wait_mean(lam, mu) == pytest.approx(q.mmc_wait_mean(lam, mu, 1), rel=1e-13)
    assert q.mm1_response_mean(lam, mu) == pytest.approx(q.mmc_response_mean(lam, mu, 1), rel=1e-13)
    for t in (0.0, 0.1, 1.0, 5.0):
        assert q.mm1_wait_tail(lam, mu, t) == pytest.approx(
            q.mmc_wait_tail(lam, mu, 1, t), rel=1e-12
        )
    for p in (0.0, 0.5, 0.9, 0.99, 0.999):
        assert q.mm1_wait_quantile(lam, mu, p) == pytest.approx(
            q.mmc_wait_quantile(lam, mu, 1, p), rel=1e-12, abs=1e-15
        )


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8, 0.97])
def test_mm2_closed_form(rho: float) -> None:
    # M/M/2: Lq = 2ρ³/(1 − ρ²) with ρ = λ/(2μ)  (independent of Erlang C).
    mu = 1.5
    lam = 2.0 * mu * rho
    lq = 2.0 * rho**3 / (1.0 - rho * rho)
    assert q.mmc_wait_mean(lam, mu, 2) == pytest.approx(q.littles_law_w(lq, lam), rel=1e-12)
    assert q.mmc_response_mean(lam, mu, 2) == pytest.approx(lq / lam + 1.0 / mu, rel=1e-12)


@pytest.mark.parametrize(("c", "rho"), [(1, 0.5), (4, 0.8), (32, 0.95), (200, 0.99)])
def test_mmc_tail_integrates_to_mean_and_quantile_inverts_tail(c: int, rho: float) -> None:
    mu = 0.25
    lam = rho * c * mu
    wq = q.mmc_wait_mean(lam, mu, c)
    area, _ = integrate.quad(lambda t: q.mmc_wait_tail(lam, mu, c, t), 0.0, np.inf)
    assert area == pytest.approx(wq, rel=1e-8)
    pw = q.erlang_c(c, lam / mu)
    assert q.mmc_wait_tail(lam, mu, c, 0.0) == pytest.approx(pw, rel=1e-15)
    for p in (0.5, 0.9, 0.99, 0.9999):
        x = q.mmc_wait_quantile(lam, mu, c, p)
        if p <= 1.0 - pw:
            assert x == 0.0
        else:
            assert x > 0.0
            assert q.mmc_wait_tail(lam, mu, c, x) == pytest.approx(1.0 - p, rel=1e-9)


def test_mmc_quantile_is_zero_below_the_no_wait_mass() -> None:
    # c = 2, a = 1: C = 1/3, so two thirds of the jobs do not wait.
    assert q.mmc_wait_quantile(1.0, 1.0, 2, 0.6) == 0.0
    assert q.mmc_wait_quantile(1.0, 1.0, 2, 0.7) > 0.0
    # p99 = ln(C/0.01)/(cμ − λ) = ln(100/3).
    assert q.mmc_wait_quantile(1.0, 1.0, 2, 0.99) == pytest.approx(math.log(100.0 / 3.0))


# --------------------------------------------------------------------------- Little


def test_littles_law_round_trip() -> None:
    assert q.littles_law_l(12.0, 0.25) == 3.0
    assert q.littles_law_w(3.0, 12.0) == 0.25
    assert q.littles_law_l(5.0, 0.0) == 0.0


# --------------------------------------------------------------------------- M/G/1


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.99])
def test_pollaczek_khinchine_special_cases(rho: float) -> None:
    es = 0.2
    lam = rho / es
    mm1 = q.mm1_wait_mean(lam, 1.0 / es)
    # Exponential service: E[S²] = 2·E[S]², C_s² = 1.
    assert qg.mg1_wait_mean(lam, es, 2.0 * es * es) == pytest.approx(mm1, rel=1e-12)
    assert qg.mg1_wait_mean_cs2(lam, es, 1.0) == pytest.approx(mm1, rel=1e-12)
    # Deterministic service: half the M/M/1 wait.
    assert qg.mg1_wait_mean(lam, es, es * es) == pytest.approx(mm1 / 2.0, rel=1e-12)
    assert qg.mg1_wait_mean_cs2(lam, es, 0.0) == pytest.approx(mm1 / 2.0, rel=1e-12)
    # Both forms agree for any variability.
    assert qg.mg1_wait_mean_cs2(lam, es, 3.5) == pytest.approx(
        qg.mg1_wait_mean(lam, es, 4.5 * es * es), rel=1e-12
    )
    assert qg.mg1_response_mean(lam, es, 2.0 * es * es) == pytest.approx(
        q.mm1_response_mean(lam, 1.0 / es), rel=1e-12
    )


def test_mg1_exponential_approximation_is_exact_for_mm1() -> None:
    lam, mu = 0.8, 1.0
    for t in (0.0, 0.5, 3.0, 20.0):
        assert qg.mg1_wait_tail(lam, 1.0, 2.0, t) == pytest.approx(
            q.mm1_wait_tail(lam, mu, t), rel=1e-12
        )
    for p in (0.1, 0.5, 0.99):
        assert qg.mg1_wait_quantile(lam, 1.0, 2.0, p) == pytest.approx(
            q.mm1_wait_quantile(lam, mu, p), rel=1e-12, abs=0.0
        )


def test_md1_exact_distribution_reference_is_right() -> None:
    # The reference itself: atom 1 − ρ at zero and the Pollaczek–Khinchine mean.
    rho = 0.8
    assert md1_wait_cdf(rho, 0.0) == pytest.approx(1.0 - rho, rel=1e-14)
    area, _ = integrate.quad(
        lambda t: 1.0 - md1_wait_cdf(rho, t), 0.0, 60.0, points=list(range(1, 60)), limit=200
    )
    assert area == pytest.approx(qg.mg1_wait_mean(rho, 1.0, 1.0), rel=1e-6)


@pytest.mark.parametrize(
    ("rho", "p", "rel_err"),
    [
        (0.3, 0.99, 0.285),
        (0.5, 0.99, 0.173),
        (0.8, 0.5, -0.079),
        (0.8, 0.9, 0.037),
        (0.8, 0.99, 0.058),
        (0.9, 0.99, 0.027),
        (0.95, 0.99, 0.013),
    ],
)
def test_mg1_exponential_approximation_on_md1_quantiles(
    rho: float, p: float, rel_err: float
) -> None:
    # The accuracy quoted in mg1_wait_tail's docstring, against Erlang's exact M/D/1.
    approx = qg.mg1_wait_quantile(rho, 1.0, 1.0, p)
    exact = optimize.brentq(lambda t: md1_wait_cdf(rho, t) - p, 0.0, 2.0 * approx)
    assert approx / exact - 1.0 == pytest.approx(rel_err, abs=0.001)


# --------------------------------------------------------------------------- priority / SJF


def conservation_rhs(lams: list[float], es: list[float], es2: list[float]) -> float:
    """Kleinrock's conservation law: Σ ρ_k·W_k = ρ·W0/(1 − ρ) for M/G/1."""
    rho = sum(x * s for x, s in zip(lams, es, strict=True))
    w0 = sum(x * s2 for x, s2 in zip(lams, es2, strict=True)) / 2.0
    return rho * w0 / (1.0 - rho)


def test_priority_single_class_is_pollaczek_khinchine() -> None:
    (w,) = qg.mg1_priority_wait_means([0.6], [1.2], [3.0])
    assert w == pytest.approx(qg.mg1_wait_mean(0.6, 1.2, 3.0), rel=1e-14)


def test_priority_three_classes_closed_form_and_conservation() -> None:
    lams, es, es2 = [0.1, 0.3, 0.2], [1.0, 0.5, 2.0], [2.0, 0.25, 10.0]
    w = qg.mg1_priority_wait_means(lams, es, es2)
    w0 = (0.1 * 2.0 + 0.3 * 0.25 + 0.2 * 10.0) / 2.0
    s1, s2, s3 = 0.1, 0.1 + 0.15, 0.1 + 0.15 + 0.4
    assert w == pytest.approx(
        (w0 / (1 - s1), w0 / ((1 - s1) * (1 - s2)), w0 / ((1 - s2) * (1 - s3))), rel=1e-14
    )
    assert w[0] < w[1] < w[2]
    lhs = sum(x * s * wk for x, s, wk in zip(lams, es, w, strict=True))
    assert lhs == pytest.approx(conservation_rhs(lams, es, es2), rel=1e-12)


def test_priority_zero_rate_class_sees_the_others() -> None:
    w = qg.mg1_priority_wait_means([0.0, 0.5], [1.0, 1.0], [1.0, 1.0])
    assert w[0] == pytest.approx(0.25, rel=1e-14)  # W0 = 0.25, nothing ahead of it
    assert w[1] == pytest.approx(0.5, rel=1e-14)  # = M/D/1 at rho 0.5


@pytest.mark.parametrize(("p_short", "rho"), [(0.5, 0.5), (0.9, 0.8), (0.2, 0.95)])
def test_sjf_two_point_equals_cobham_two_classes(p_short: float, rho: float) -> None:
    short, long_ = 0.5, 4.0
    n = 1000
    k = round(p_short * n)
    sizes = np.array([short] * k + [long_] * (n - k))
    mean = (k * short + (n - k) * long_) / n
    lam = rho / mean
    res = qg.mg1_sjf_waits(lam, sizes)
    w = qg.mg1_priority_wait_means(
        [lam * k / n, lam * (n - k) / n], [short, long_], [short**2, long_**2]
    )
    assert res.waits == pytest.approx(w, rel=1e-12)
    assert res.wait_mean == pytest.approx((k * w[0] + (n - k) * w[1]) / n, rel=1e-12)
    assert res.rho == pytest.approx(rho, rel=1e-12)


def test_sjf_ties_and_conservation_law() -> None:
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 6, size=500).astype(np.float64)  # many ties
    lam = 0.9 / float(sizes.mean())
    res = qg.mg1_sjf_waits(lam, sizes)
    assert res.sizes.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    # Conservation: Σ_x λ·P(x)·x·W(x) = ρ·W0/(1 − ρ); fails if ties are mishandled.
    lhs = float(np.sum(lam * res.probs * res.sizes * res.waits))
    assert lhs == pytest.approx(res.rho * res.residual_work / (1.0 - res.rho), rel=1e-12)
    # The same as Cobham with one (deterministic) class per distinct size.
    w = qg.mg1_priority_wait_means(
        (lam * res.probs).tolist(), res.sizes.tolist(), (res.sizes**2).tolist()
    )
    assert res.waits == pytest.approx(w, rel=1e-12)
    assert res.wait_mean < res.fcfs_wait_mean
    assert res.fcfs_wait_mean == pytest.approx(
        qg.mg1_wait_mean(lam, float(sizes.mean()), float(np.mean(sizes**2))), rel=1e-12
    )


def test_sjf_equal_sizes_is_fcfs_md1() -> None:
    res = qg.mg1_sjf_waits(0.7, np.full(10, 1.0))
    md1 = qg.mg1_wait_mean(0.7, 1.0, 1.0)
    assert res.wait_mean == pytest.approx(md1, rel=1e-14)
    assert res.fcfs_wait_mean == pytest.approx(md1, rel=1e-14)


def test_sjf_wait_for_size() -> None:
    res = qg.mg1_sjf_waits(0.5, [1.0, 1.0, 2.0, 3.0])
    for x, w in zip(res.sizes, res.waits, strict=True):
        assert res.wait_for_size(float(x)) == pytest.approx(float(w), rel=1e-15)
    # Between support points only the strictly shorter load counts, on both factors.
    below = float(res.load_through[1])  # sizes 1 and 2
    assert res.wait_for_size(2.5) == pytest.approx(res.residual_work / (1 - below) ** 2)
    assert res.wait_for_size(0.1) == pytest.approx(res.residual_work)
    assert res.wait_for_size(10.0) == pytest.approx(res.residual_work / (1 - res.rho) ** 2)
    assert not res.waits.flags.writeable


def test_sjf_against_simulation() -> None:
    values, probs = [0.5, 1.0, 3.0], [0.5, 0.3, 0.2]
    lam = 0.7 / float(np.dot(values, probs))
    sizes, waits = simulate_sjf(lam, values, probs, n=150_000, seed=3)
    sizes, waits = sizes[15_000:], waits[15_000:]  # drop the warm-up
    res = qg.mg1_sjf_waits(lam, np.repeat(values, [5, 3, 2]))
    for x, w in zip(res.sizes, res.waits, strict=True):
        assert float(waits[sizes == x].mean()) == pytest.approx(float(w), rel=0.06), x
    assert float(waits.mean()) == pytest.approx(res.wait_mean, rel=0.05)


# --------------------------------------------------------------------------- G/G/1, G/G/c


@pytest.mark.parametrize("rho", [0.3, 0.75, 0.98])
def test_kingman_special_cases(rho: float) -> None:
    es = 2.0
    lam = rho / es
    assert qg.gg1_wait_mean(lam, es, 1.0, 1.0) == pytest.approx(
        q.mm1_wait_mean(lam, 1.0 / es), rel=1e-12
    )
    # Poisson arrivals: Kingman is Pollaczek–Khinchine.
    for cs2 in (0.0, 0.5, 4.0):
        assert qg.gg1_wait_mean(lam, es, 1.0, cs2) == pytest.approx(
            qg.mg1_wait_mean_cs2(lam, es, cs2), rel=1e-12
        )
        assert qg.gg1_wait_mean(lam, es, 0.3, cs2) == pytest.approx(
            qg.ggc_wait_mean(lam, 1.0 / es, 1, 0.3, cs2), rel=1e-12
        )


@pytest.mark.parametrize(("c", "rho"), [(1, 0.6), (8, 0.9), (64, 0.97)])
def test_allen_cunneen_special_cases(c: int, rho: float) -> None:
    mu = 2.0
    lam = rho * c * mu
    assert qg.ggc_wait_mean(lam, mu, c, 1.0, 1.0) == pytest.approx(
        q.mmc_wait_mean(lam, mu, c), rel=1e-13
    )
    assert qg.ggc_wait_mean(lam, mu, c, 0.0, 0.5) == pytest.approx(
        q.mmc_wait_mean(lam, mu, c) / 4.0, rel=1e-13
    )
    for t in (0.0, 0.05, 0.5):
        assert qg.ggc_wait_tail(lam, mu, c, 1.0, 1.0, t) == pytest.approx(
            q.mmc_wait_tail(lam, mu, c, t), rel=1e-12
        )
    for p in (0.5, 0.95, 0.999):
        assert qg.ggc_wait_quantile(lam, mu, c, 1.0, 1.0, p) == pytest.approx(
            q.mmc_wait_quantile(lam, mu, c, p), rel=1e-12, abs=0.0
        )
    # The exponential approximation keeps E[W]: the tail integrates to the mean.
    area, _ = integrate.quad(lambda t: qg.ggc_wait_tail(lam, mu, c, 2.0, 3.0, t), 0.0, np.inf)
    assert area == pytest.approx(qg.ggc_wait_mean(lam, mu, c, 2.0, 3.0), rel=1e-8)


def test_exponential_approximation_edges() -> None:
    assert q.exponential_wait_tail(0.0, 0.0, 1.0) == 0.0
    assert q.exponential_wait_tail(0.4, 0.0, 0.0) == 0.4
    assert q.exponential_wait_tail(0.4, 0.0, 1e-9) == 0.0
    assert q.exponential_wait_tail(0.4, 2.0, math.inf) == 0.0
    assert q.exponential_wait_quantile(0.4, 0.0, 0.99) == 0.0
    assert q.exponential_wait_quantile(0.4, 2.0, 0.6) == 0.0
    # π = 0.4, m = 2: conditional mean 5, p99 = 5·ln(40).
    assert q.exponential_wait_quantile(0.4, 2.0, 0.99) == pytest.approx(5.0 * math.log(40.0))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: q.erlang_b(0, 1.0), r"c \(number of servers\) must be >= 1"),
        (lambda: q.erlang_b(2.0, 1.0), r"c \(number of servers\) must be an int"),  # type: ignore[arg-type]
        (lambda: q.erlang_b(True, 1.0), r"must be an int"),
        (lambda: q.erlang_b(3, -0.5), r"a must be >= 0"),
        (lambda: q.erlang_b(3, math.nan), r"a must be finite"),
        (lambda: q.erlang_c(3, 3.0), r"unstable queue: utilisation rho = a/c"),
        (lambda: q.mm1_wait_mean(0.0, 1.0), r"lam must be > 0"),
        (lambda: q.mm1_wait_mean(1.0, -1.0), r"mu must be > 0"),
        (lambda: q.mm1_wait_mean(1.0, 1.0), r"unstable queue"),
        (lambda: q.mm1_wait_tail(0.5, 1.0, -1.0), r"t must be >= 0"),
        (lambda: q.mm1_wait_quantile(0.5, 1.0, 1.0), r"p must be in \[0, 1\)"),
        (lambda: q.mmc_wait_mean(8.0, 1.0, 8), r"unstable queue.*c=8"),
        (lambda: q.mmc_wait_quantile(1.0, 1.0, 2, -0.1), r"p must be in"),
        (lambda: q.mmc_wait_tail(1.0, 1.0, 2, math.nan), r"t must be >= 0"),
        (lambda: qg.mg1_wait_mean(1.0, 1.0, 2.0), r"unstable queue: utilisation rho = lam\*es"),
        (lambda: qg.mg1_wait_mean(0.5, 1.0, 0.5), r"es2 \(E\[S²\]\) must be >= es²"),
        (lambda: qg.mg1_wait_mean_cs2(0.5, 1.0, -1.0), r"cs2 must be >= 0"),
        (lambda: qg.mg1_wait_quantile(0.5, 1.0, 2.0, 1.5), r"p must be in"),
        (lambda: qg.gg1_wait_mean(0.5, 2.0, 1.0, 1.0), r"unstable queue"),
        (lambda: qg.gg1_wait_mean(0.1, 2.0, -1.0, 1.0), r"ca2 must be >= 0"),
        (lambda: qg.ggc_wait_mean(1.0, 1.0, 0, 1.0, 1.0), r"c \(number of servers\)"),
        (lambda: qg.ggc_wait_tail(1.0, 1.0, 1, 1.0, 1.0, 0.0), r"unstable queue"),
        (lambda: qg.mg1_priority_wait_means([], [], []), r"at least one class"),
        (lambda: qg.mg1_priority_wait_means([0.1], [1.0, 2.0], [1.0]), r"same length"),
        (lambda: qg.mg1_priority_wait_means([0.5, 0.5], [1.0, 1.0], [1.0, 1.0]), r"unstable"),
        (lambda: qg.mg1_priority_wait_means([-0.1], [1.0], [1.0]), r"lams\[0\] must be >= 0"),
        (lambda: qg.mg1_priority_wait_means([0.1], [1.0], [0.5]), r"es2\[0\]"),
        (lambda: qg.mg1_sjf_waits(1.0, []), r"non-empty 1-D"),
        (lambda: qg.mg1_sjf_waits(1.0, [[0.1, 0.2]]), r"non-empty 1-D"),
        (lambda: qg.mg1_sjf_waits(1.0, [0.1, 0.0]), r"finite and > 0"),
        (lambda: qg.mg1_sjf_waits(1.0, [1.0, 2.0]), r"unstable"),
        (lambda: qg.mg1_sjf_waits(0.1, [1.0]).wait_for_size(0.0), r"x must be > 0"),
        (lambda: q.exponential_wait_tail(1.5, 1.0, 0.0), r"p_wait must be in \[0, 1\]"),
        (lambda: q.exponential_wait_quantile(0.5, -1.0, 0.5), r"wait_mean must be >= 0"),
        (lambda: q.littles_law_l(-1.0, 1.0), r"lam must be > 0"),
        (lambda: q.littles_law_w(-1.0, 1.0), r"l must be >= 0"),
        (lambda: q.mm1_wait_mean("fast", 1.0), r"lam must be a real number"),  # type: ignore[arg-type]
    ],
)
def test_invalid_parameters_raise_policy_error(call: object, match: str) -> None:
    assert callable(call)
    with pytest.raises(PolicyError, match=match):
        call()


# --------------------------------------------------------------------------- G/D/c replay


def gdc_heap(arrivals: npt.NDArray[np.float64], c: int, service: float) -> list[float]:
    """G/D/c by the textbook event view: each job takes the server that frees first."""
    free = [0.0] * c
    out = []
    for a in arrivals:
        start = max(float(a), heapq.heappop(free))
        out.append(start - float(a))
        heapq.heappush(free, start + service)
    return out


@pytest.mark.parametrize(("c", "service", "seed"), [(1, 0.3, 0), (3, 1.2, 1), (16, 7.0, 2)])
def test_gdc_waits_match_a_server_heap(c: int, service: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    gaps = np.where(rng.random(3000) < 0.8, rng.exponential(0.05, 3000), rng.exponential(3, 3000))
    arrivals = np.cumsum(gaps)  # bursts and lulls
    got = qg.gdc_waits(arrivals, c, service)
    ref = gdc_heap(arrivals, c, service)
    assert np.max(np.abs(got - np.array(ref))) < 1e-9
    assert 0.05 < float(np.mean(got > 0)) < 0.95  # a case where both waiting and not occur


def test_gdc_waits_small_cases() -> None:
    # two servers, service 1: a burst of four at t = 0 waits 0, 0, 1, 1
    assert qg.gdc_waits([0.0, 0.0, 0.0, 0.0], 2, 1.0).tolist() == [0.0, 0.0, 1.0, 1.0]
    # spaced wider than the service time: nobody waits (exact zeros, no rounding residue)
    assert not np.any(qg.gdc_waits(np.arange(100) * 1.1 + 1e6, 1, 1.0))
    assert qg.gdc_waits(np.zeros(0), 3, 1.0).size == 0
    for bad in (([1.0, 0.0], 1, 1.0), ([0.0], 0, 1.0), ([0.0], 1, 0.0), ([[0.0]], 1, 1.0)):
        with pytest.raises(PolicyError):
            qg.gdc_waits(*bad)
