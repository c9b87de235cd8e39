"""The service curve: closed-loop measurement, the analytic form, regularisation, μ_eff."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.engine import Batcher, EngineProfile, load_profile
from velvetrope.errors import PolicyError
from velvetrope.planner.length_mix import LengthMix
from velvetrope.planner.service import concurrency_grid, effective_service, regularise_throughput
from velvetrope.planner.service_methods import (
    analytic_service_curve,
    curve_from_measurements,
    measure_service_curve,
)


def small_profile(**kw: float | int | str) -> EngineProfile:
    """An engine small enough to sweep in milliseconds (64 slots, 8k-token KV cache)."""
    base = load_profile("llama3-8b-h100").with_overrides(
        name="small",
        num_gpu_blocks=512,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=4096,
    )
    return base.with_overrides(**kw) if kw else base


def mix(n: int = 400, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompt = np.rint(rng.lognormal(np.log(300), 0.6, n)).astype(np.int64) + 1
    output = np.rint(rng.lognormal(np.log(60), 0.7, n)).astype(np.int64) + 1
    return prompt, output


def test_concurrency_grid() -> None:
    assert concurrency_grid(1) == (1,)
    assert concurrency_grid(64) == (1, 2, 4, 8, 16, 32, 64)
    assert concurrency_grid(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    with pytest.raises(PolicyError):
        concurrency_grid(0)


def test_length_mix_fits_the_engine_and_counts_iterations() -> None:
    prof = small_profile()  # budget 2048 tokens, max_model_len 4096
    m = LengthMix.fit([100, 5000, 3000, 10], [0, 10, 2000, 4095], prof)
    assert m.output.tolist() == [1, 10, 2000, 4095]  # 0 -> 1 (an engine emits a token)
    assert m.prompt.tolist() == [100, 4086, 2096, 1]  # cut so prompt + output <= 4096
    assert m.clipped == 3  # an output of 0 is prompt-only work (its prefill), not a cut
    # ceil(P / 2048) prefill iterations, the last emitting token 1, then O - 1 decodes
    assert m.first.tolist() == [1, 2, 2, 1]
    assert m.work.tolist() == [1, 11, 2001, 4095]
    assert m.mean_work == pytest.approx(np.mean([1, 11, 2001, 4095]))
    assert m.work_weights.sum() == pytest.approx(1.0)
    with pytest.raises(PolicyError):
        LengthMix.fit([0], [1], prof)
    with pytest.raises(PolicyError):
        LengthMix.fit([1, 2], [1], prof)


def test_regularise_is_the_concave_majorant_and_non_decreasing() -> None:
    n = [1, 2, 4, 8, 16]
    x = [1.0, 1.5, 3.6, 4.0, 3.8]  # a dip at 2 (noise) and a drop at 16 (preemption)
    r = regularise_throughput(n, x)
    assert r.tolist() == pytest.approx([1.0, 1.0 + 2.6 / 3, 3.6, 4.0, 4.0])
    assert np.all(r >= np.asarray(x))
    slopes = np.diff(np.concatenate(([0.0], r))) / np.diff([0, *n])
    assert np.all(np.diff(slopes) <= 1e-12)  # concave
    with pytest.raises(PolicyError):
        regularise_throughput([2, 1], [1.0, 1.0])
    with pytest.raises(PolicyError):
        regularise_throughput([1], [0.0])


def test_closed_loop_at_concurrency_one_is_exact_for_one_request_shape() -> None:
    # One (prompt, output) pair: a lone sequence's residence is the sum of its steps, which
    # the analytic form computes exactly; the closed loop must measure the same.
    prof = small_profile()
    p, o = 700, 40
    b = Batcher(prof)
    b.add("x", p, o, 0.0)
    now = 0.0
    while b.has_work:
        now = b.step(now).end
    measured = measure_service_curve(prof, [p], [o], grid=[1], min_completions=20)
    analytic = analytic_service_curve(prof, [p], [o], grid=[1])
    assert measured.residence(1) == pytest.approx(now, rel=1e-9)
    assert analytic.residence(1) == pytest.approx(now, rel=1e-9)


def test_measured_and_analytic_agree_below_the_kv_limit() -> None:
    prof = small_profile(num_gpu_blocks=20_000)  # KV never binds
    p, o = mix()
    m = measure_service_curve(prof, p, o)
    a = analytic_service_curve(prof, p, o)
    assert m.method == "closed-loop" and a.method == "analytic"
    rel = np.abs(m.raw_throughput_rps / a.raw_throughput_rps[: len(m.concurrency)] - 1.0)
    assert float(rel.max()) < 0.03, rel
    # Throughput rises with concurrency, the time in the engine too (convoys).
    assert np.all(np.diff(m.throughput_rps) >= 0)
    res = [m.residence(int(n)) for n in m.concurrency]
    assert all(b >= a_ for a_, b in itertools.pairwise(res))
    assert res[-1] > 2 * res[0]


def test_kv_exhaustion_flattens_throughput_and_preempts() -> None:
    prof = small_profile(num_gpu_blocks=128, max_model_len=2048)  # 2048 KV tokens
    p = np.full(200, 300)
    o = np.full(200, 200)
    m = measure_service_curve(prof, p, o, saturation_gain=0.0, min_completions=200)
    a = analytic_service_curve(prof, p, o)
    # A sequence needs up to 500 KV tokens: about 4-5 fit; concurrency beyond adds nothing.
    assert m.throughput(64) == pytest.approx(m.throughput(8), rel=0.05)
    assert a.throughput(64) == pytest.approx(a.throughput(8), rel=1e-12)
    assert float(np.max(m.preemptions_per_request)) > 0
    assert m.knee() <= 8


def test_sweep_stops_once_saturated() -> None:
    prof = small_profile(num_gpu_blocks=128, max_model_len=2048)
    m = measure_service_curve(prof, np.full(200, 300), np.full(200, 200), min_completions=200)
    assert m.max_concurrency < 64  # stopped early; flat beyond
    assert m.throughput(64) == m.max_throughput_rps


def test_curve_from_measurements_and_interpolation() -> None:
    prof = small_profile()
    c = curve_from_measurements(prof, [100], [10], [1, 4], [2.0, 6.0])
    assert c.method == "given"
    assert c.throughput(0) == 0.0
    assert c.throughput(2) == pytest.approx(2.0 + (6.0 - 2.0) / 3)
    assert c.throughput(100) == 6.0
    assert c.residence(0.5) == c.residence(1) == pytest.approx(0.5)
    assert c.throughput_table(4).tolist() == pytest.approx([0, 2, 2 + 4 / 3, 2 + 8 / 3, 6])
    assert c.knee(0.9) == 4
    assert math.isnan(float(c.step_s[0]))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 0.95), st.floats(0.05, 0.95))
def test_effective_service_rate_falls_as_load_rises(u1: float, u2: float) -> None:
    prof = small_profile(num_gpu_blocks=20_000)
    p, o = mix(100)
    c = analytic_service_curve(prof, p, o)
    lo, hi = sorted((u1, u2))
    a = effective_service(c, lo * c.max_throughput_rps)
    b = effective_service(c, hi * c.max_throughput_rps)
    assert c.throughput(a.concurrency) == pytest.approx(a.arrival_rps, rel=1e-9)
    assert a.service_s == pytest.approx(a.concurrency / a.arrival_rps)
    assert b.concurrency >= a.concurrency
    assert b.mu_per_slot <= a.mu_per_slot * (1 + 1e-12)


def test_effective_service_rejects_overload() -> None:
    prof = small_profile()
    c = analytic_service_curve(prof, [100], [10])
    with pytest.raises(PolicyError, match="saturated"):
        effective_service(c, c.max_throughput_rps)
    with pytest.raises(PolicyError):
        effective_service(c, 0.0)
