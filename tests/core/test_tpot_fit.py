"""The TPOT limit's fit (:mod:`velvetrope.core.tpot_fit`): time per output token against the
batch and the prefill sharing its steps, told apart; and :class:`TpotLimit` measuring the
prefill from the pool's own first tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from tests.core.helpers import decode_one
from velvetrope.core.tpot_fit import TpotFit, TpotSamples
from velvetrope.core.tpot_limit import TpotLimit

A, B, C = 0.004, 3.4e-5, 1.8e-5
"""Step base, cost per sequence and per prefill token (the demo's engine at 3× speed)."""


def samples(points: Sequence[tuple[float, float]], noise: float = 0.0) -> TpotSamples:
    s = TpotSamples(half_life=10_000, min_samples=10, min_spread=4.0)
    for i, (n, p) in enumerate(points):
        s.add(n, p, A + B * n + C * p + (noise if i % 2 else -noise))
    return s


# Bursts: the batch and the prefill rise together (p ≈ 40·n + a burst's extra), as they do
# when a burst of long prompts arrives: correlated, not collinear.
BURSTY = [(n, 40.0 * n + extra) for n in (5, 10, 20, 40, 60, 80) for extra in (0.0, 300.0, 900.0)]


def test_the_fit_tells_the_prefill_from_the_batch() -> None:
    fit = samples(BURSTY).solve()
    assert fit is not None
    assert fit.per_seq_s == pytest.approx(B, rel=1e-6)
    assert fit.per_prefill_token_s == pytest.approx(C, rel=1e-6)
    assert fit.base_s == pytest.approx(A, abs=1e-9)
    assert fit.sd_s == pytest.approx(0.0, abs=1e-7)
    mean_n = sum(n for n, _ in BURSTY) / len(BURSTY)
    mean_p = sum(p for _, p in BURSTY) / len(BURSTY)
    assert fit.prefill_per_seq == pytest.approx(mean_p / mean_n, rel=1e-3)  # weighted means
    assert fit.prefill_max == max(p for _, p in BURSTY)


def test_the_limit_lets_the_prefill_grow_with_the_batch() -> None:
    fit = samples(BURSTY).solve()
    assert fit is not None
    r = fit.prefill_per_seq
    # proportional: A + (B + C·r)·n = τ, while r·n is within the most prefill seen
    proportional = (0.06 - A) / (B + C * r)
    assert r * proportional < fit.prefill_max
    assert fit.per_engine(0.06, z=0.0) == pytest.approx(proportional, rel=1e-6)
    # past it the prefill stays at its most: the batch's own cost decides
    saturated = (0.1 - A - C * fit.prefill_max) / B
    assert r * saturated > fit.prefill_max
    assert fit.per_engine(0.1, z=0.0) == pytest.approx(saturated, rel=1e-6)
    # the proportional line's margin is the spread of the samples around it (each one's
    # prefill off its proportional share); the saturated line's, the fit's own (none here)
    assert fit.line_sd_s > 0.0
    assert fit.per_engine(0.06, z=1.0) == pytest.approx(
        (0.06 - fit.line_sd_s - A) / (B + C * r), rel=1e-6
    )
    assert fit.per_engine(0.1, z=3.0) == pytest.approx(saturated, rel=1e-6)
    # a line through the same samples on n alone charges each sequence for the bursts' prefill
    alone = TpotSamples(half_life=10_000, min_samples=10, min_spread=4.0)
    for n, p in BURSTY:
        alone.add(n, 0.0, A + B * n + C * p)
    line = alone.solve()
    assert line is not None and line.per_prefill_token_s == 0.0
    assert line.per_engine(0.1, z=3.0) < 0.5 * fit.per_engine(0.1, z=3.0)


def test_a_prefill_bound_engine_is_not_held_for_its_prefill() -> None:
    # the engine prefills at most 2,048 tokens a step and the objective holds even then:
    # the limit is where the decode's own cost reaches it, with the prefill at its most
    points = [(n, min(2048.0, 200.0 * n + extra)) for n in (2, 4, 8, 12, 16) for extra in (0, 500)]
    fit = samples(points).solve()
    assert fit is not None
    assert fit.prefill_max == 2048.0
    assert fit.per_engine(0.08, z=0.0) == pytest.approx((0.08 - A - C * 2048) / B, rel=1e-6)


def test_a_decode_cost_too_small_to_measure_is_taken_as_zero() -> None:
    s = TpotSamples(half_life=10_000, min_samples=10, min_spread=4.0)
    for n, p in BURSTY:  # the TPOT falls a little with the batch: the prefill is all there is
        s.add(n, p, A + C * p - 1e-6 * n)
    fit = s.solve()
    assert fit is not None
    assert fit.per_seq_s == 0.0
    assert fit.per_prefill_token_s == pytest.approx(C, rel=0.05)
    assert fit.sd_s > 0.0  # what b = 0 leaves unexplained
    # no batch costs the objective while the most prefill seen keeps within it
    assert fit.per_engine(0.1, z=3.0) == math.inf
    # a 30 ms objective, which the most prefill seen exceeds: the proportional line bounds it
    assert fit.per_engine(0.03, z=0.0) == pytest.approx(
        (0.03 - fit.base_s) / (fit.per_prefill_token_s * fit.prefill_per_seq), rel=1e-6
    )


def test_without_a_spread_of_prefill_the_fit_is_the_line_on_the_batch() -> None:
    s = samples([(n, 0.0) for n in (4, 8, 16, 32) for _ in range(3)])
    fit = s.solve()
    assert fit is not None
    assert fit.per_prefill_token_s == 0.0 and fit.line_sd_s == fit.sd_s
    assert fit.per_seq_s == pytest.approx(B) and fit.base_s == pytest.approx(A)
    collinear = samples([(n, 100.0 * n) for n in (4, 8, 16, 32) for _ in range(3)]).solve()
    assert collinear is not None and collinear.per_prefill_token_s == 0.0
    assert collinear.per_seq_s == pytest.approx(B + 100.0 * C)


def test_the_margin_is_the_spread_of_each_prediction() -> None:
    fit = samples(BURSTY, noise=0.002).solve()
    assert fit is not None
    assert fit.sd_s == pytest.approx(0.002, rel=0.1)
    # the proportional line leaves out where each sample's prefill was: a wider spread
    assert fit.line_sd_s > fit.sd_s
    exact = TpotFit(
        base_s=fit.base_s,
        per_seq_s=fit.per_seq_s,
        sd_s=0.0,
        per_prefill_token_s=fit.per_prefill_token_s,
        prefill_per_seq=fit.prefill_per_seq,
        prefill_max=fit.prefill_max,
        line_sd_s=0.0,
    )
    assert fit.per_engine(0.1, z=3.0) < exact.per_engine(0.1, z=3.0)
    assert fit.per_engine(0.1, z=0.0) == pytest.approx(exact.per_engine(0.1, z=0.0), rel=0.05)


def test_the_limit_measures_the_prefill_from_the_first_tokens_in_a_decode() -> None:
    """Through :class:`TpotLimit`'s events: each sample's prefill is the prompt tokens of the
    pool's jobs whose first token came while it decoded, per engine, per decode step."""
    limit = TpotLimit({"interactive": 0.1}, z=0.0, min_samples=10)
    limit.engines_changed(2)
    now = 0.0
    out = 11  # ten decode steps
    for n in (2, 4, 8, 16, 32):
        for prompts in (0, 1, 3):  # how many 2,000-token prompts begin during the decode
            p = prompts * 2000 / 2 / (out - 1)  # per engine, per decode step
            now = decode_one(limit, 2 * n, A + B * n + C * p, out, now, prompts)  # n per engine
    fit = limit.fit()
    assert fit is not None and limit.samples == 15
    assert fit.per_prefill_token_s == pytest.approx(C, rel=0.02)
    assert fit.per_seq_s == pytest.approx(B, rel=0.05)
    status = limit.status()
    assert status["tpot_per_prefill_token_s"] == fit.per_prefill_token_s
    assert status["prefill_max_per_step"] == pytest.approx(300.0)


def test_a_sample_weighs_its_decode_steps_up_to_32() -> None:
    """A long decode's TPOT is a mean over more steps: it weighs its steps (up to 32), so a
    slow 200-token answer moves the fit as 32 one-step samples would, not 200, nor 1."""
    limit = TpotLimit({"interactive": 0.1}, z=0.0, min_samples=4)
    reference = TpotSamples(half_life=200.0, min_samples=4, min_spread=4.0)
    now = 0.0
    for n, out, tpot in [(4, 11, 0.012), (8, 11, 0.014), (16, 11, 0.018), (32, 201, 0.040)]:
        now = decode_one(limit, n, tpot, out, now)
        reference.add(float(n), 0.0, tpot, min(out - 1, 32))
    fit, expected = limit.fit(), reference.solve()
    assert fit is not None and expected is not None
    assert fit.per_seq_s == pytest.approx(expected.per_seq_s, rel=1e-9)
    assert fit.base_s == pytest.approx(expected.base_s, rel=1e-9)
    unweighted = TpotSamples(half_life=200.0, min_samples=4, min_spread=4.0)
    for n, tpot in [(4, 0.012), (8, 0.014), (16, 0.018), (32, 0.040)]:
        unweighted.add(float(n), 0.0, tpot)
    plain = unweighted.solve()
    assert plain is not None and plain.per_seq_s < fit.per_seq_s


# The prefill off its proportional share by ±d·√n: about n prompts arrive while one of a
# batch of n decodes, so the deviation's variance grows with the batch.
D = 300.0
GROWING = [(n, 40.0 * n + s * D * math.sqrt(n)) for n in (4, 16, 64) for s in (-1, 1, -1, 1)]


def test_the_prefill_spread_grows_with_the_batch_and_narrows_below_the_samples() -> None:
    fit = samples(GROWING).solve()
    assert fit is not None
    assert fit.per_prefill_token_s == pytest.approx(C, rel=1e-6)
    assert fit.prefill_per_seq == pytest.approx(40.0, rel=1e-4)  # (weights decay a little)
    assert fit.prefill_var_per_seq == pytest.approx(D * D, rel=1e-3)  # k² = mean((p − r·n)²/n)
    # the batch at which the prediction plus z spreads that grow as √n reaches the objective
    z, target = 3.0, 0.03
    n = fit.reach(target, z)
    slope = fit.per_seq_s + C * fit.prefill_per_seq
    spread = math.hypot(fit.sd_s, C * D * math.sqrt(n))
    assert fit.base_s + slope * n + z * spread == pytest.approx(target, rel=1e-9)
    # below the samples' batch it is narrower than their own spread, which alone would
    # leave a smaller batch (the larger of the two is the limit)
    assert fit.reach_uniform(target, z) < n


def test_a_ramps_spread_does_not_put_every_batch_out_of_reach() -> None:
    """A cold start's first samples carry far more prefill per step than the steady state:
    around the proportional line their spread alone exceeds the objective (out of reach at
    the samples' own spread, at any batch), while the spread that narrows below the samples'
    batch leaves a limit of several per engine."""
    ramp = [(n, 40.0 * n + s * D * math.sqrt(n)) for n in (32, 64, 96) for s in (-1, 1, -1, 1)]
    fit = samples(ramp).solve()
    assert fit is not None
    z, target = 3.0, 0.05
    assert fit.reach_uniform(target, z) < 1.0
    assert fit.per_engine(target, z) > 4.0
    # nowhere below the limit does the prediction plus its spread exceed the objective
    n = fit.per_engine(target, z)
    slope = fit.per_seq_s + C * fit.prefill_per_seq
    k2 = fit.prefill_var_per_seq
    for m in (1.0, n / 2, n):
        spread = math.sqrt(fit.sd_s**2 + C * C * k2 * m)
        assert fit.base_s + slope * m + z * spread <= target + 1e-12
