"""Property tests (hypothesis) of velvetrope.planner.queueing."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.planner import queueing as q
from velvetrope.planner import queueing_general as qg

servers = st.integers(min_value=1, max_value=400)
utilisation = st.floats(min_value=1e-3, max_value=0.999)
# A few ulps of slack where two evaluations should be ordered but may round to equal.
SLACK = 1e-12


@given(c=servers, rho=utilisation)
def test_erlang_c_is_a_probability_above_erlang_b(c: int, rho: float) -> None:
    a = rho * c
    b = q.erlang_b(c, a)
    pw = q.erlang_c(c, a)
    assert 0.0 <= b <= pw <= 1.0
    # B = C·(c − a)/(c − a·C): the inverse identity, computed independently of the code.
    assert math.isclose(b, pw * (c - a) / (c - a * pw), rel_tol=1e-9, abs_tol=1e-300)


@given(c=servers, r1=utilisation, r2=utilisation)
def test_erlang_c_increases_with_load(c: int, r1: float, r2: float) -> None:
    lo, hi = sorted((r1, r2))
    assert q.erlang_c(c, lo * c) <= q.erlang_c(c, hi * c) * (1.0 + SLACK)
    assert q.erlang_b(c, lo * c) <= q.erlang_b(c, hi * c) * (1.0 + SLACK)


@given(c=servers, extra=st.integers(min_value=1, max_value=50), frac=utilisation)
def test_erlang_c_decreases_with_servers(c: int, extra: int, frac: float) -> None:
    a = frac * c  # stable for c and for every larger server count
    assert q.erlang_c(c + extra, a) <= q.erlang_c(c, a) * (1.0 + SLACK)
    assert q.erlang_b(c + extra, a) <= q.erlang_b(c, a) * (1.0 + SLACK)


@given(
    c=servers,
    mu=st.floats(min_value=1e-3, max_value=1e3),
    r1=utilisation,
    r2=utilisation,
    p=st.floats(min_value=0.0, max_value=0.9999),
)
def test_mmc_wait_monotone_in_arrival_rate(
    c: int, mu: float, r1: float, r2: float, p: float
) -> None:
    lo, hi = sorted((r1 * c * mu, r2 * c * mu))
    assert q.mmc_wait_mean(lo, mu, c) <= q.mmc_wait_mean(hi, mu, c) * (1.0 + SLACK)
    assert q.mmc_wait_quantile(lo, mu, c, p) <= q.mmc_wait_quantile(hi, mu, c, p) * (1.0 + SLACK)
    assert qg.mg1_wait_mean_cs2(lo / c, 1.0 / mu, 0.3) <= qg.mg1_wait_mean_cs2(
        hi / c, 1.0 / mu, 0.3
    ) * (1.0 + SLACK)


@settings(max_examples=60)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=60),
    rho=st.floats(min_value=0.01, max_value=0.98),
)
def test_sjf_conservation_and_never_worse_than_fcfs(sizes: list[int], rho: float) -> None:
    arr = np.asarray(sizes, dtype=np.float64) / 4.0
    lam = rho / float(arr.mean())
    res = qg.mg1_sjf_waits(lam, arr)
    lhs = float(np.sum(lam * res.probs * res.sizes * res.waits))
    rhs = res.rho * res.residual_work / (1.0 - res.rho)
    assert math.isclose(lhs, rhs, rel_tol=1e-9)
    assert res.wait_mean <= res.fcfs_wait_mean * (1.0 + 1e-12)
    # Longer jobs never wait less.
    assert bool(np.all(np.diff(res.waits) >= 0.0))


@given(
    pw=st.floats(min_value=1e-6, max_value=1.0),
    m=st.floats(min_value=1e-6, max_value=1e6),
    p=st.floats(min_value=0.0, max_value=0.999999),
)
def test_exponential_quantile_inverts_tail(pw: float, m: float, p: float) -> None:
    x = q.exponential_wait_quantile(pw, m, p)
    if p <= 1.0 - pw:
        assert x == 0.0
    else:
        assert math.isclose(q.exponential_wait_tail(pw, m, x), 1.0 - p, rel_tol=1e-9)
