"""Workloads: the request record, lengths, tenant mixes, transforms and statistics."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import Deterministic, Poisson
from velvetrope.sim.length_models import (
    Empirical,
    Exponential,
    Fixed,
    IndependentLengths,
    LogNormal,
    TraceLengths,
)
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import (
    head,
    index_of_dispersion,
    merge,
    rescale_time,
    scale_to_rate,
    synthesize,
    time_window,
    trace_stats,
)


def _trace(times: list[float]) -> list[TraceRequest]:
    return [TraceRequest(t, 100 + i, 10 + i, max_tokens=64) for i, t in enumerate(times)]


# --------------------------------------------------------------------------- the record


def test_record_normalises_numpy_scalars() -> None:
    r = TraceRequest(np.float64(1.5), np.int64(3), np.int32(0), "a", "t1", np.int64(4))  # type: ignore[arg-type]
    assert (type(r.t), type(r.prompt_tokens), type(r.output_tokens)) == (float, int, int)
    assert type(r.max_tokens) is int
    assert TraceRequest(2, 1, 1).t == 2.0
    assert type(TraceRequest(2, 1, 1).t) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.t = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"t": -1.0},
        {"t": math.nan},
        {"t": math.inf},
        {"t": "1"},
        {"t": True},
        {"t": 10**400},
        {"prompt_tokens": 0},
        {"prompt_tokens": 1.0},
        {"prompt_tokens": True},
        {"output_tokens": -1},
        {"tenant": ""},
        {"tier": ""},
        {"max_tokens": 0},
        {"max_tokens": 5},  # below output_tokens
    ],
)
def test_record_rejects(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"t": 0.0, "prompt_tokens": 10, "output_tokens": 8}
    fields.update(kwargs)
    with pytest.raises(PolicyError):
        TraceRequest(**fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- lengths


def test_fixed() -> None:
    assert Fixed(7).sample(np.random.default_rng(0), 3).tolist() == [7, 7, 7]
    with pytest.raises(PolicyError):
        Fixed(0)


def test_exponential_mean_and_bounds() -> None:
    x = Exponential(200.0).sample(np.random.default_rng(1), 200_000)
    assert x.dtype == np.int64
    assert x.min() >= 1
    assert x.mean() == pytest.approx(200.0, rel=0.02)
    assert x.var() / x.mean() ** 2 == pytest.approx(1 - 1 / 200, rel=0.05)
    y = Exponential(200.0, lo=50, hi=300).sample(np.random.default_rng(1), 10_000)
    assert (y.min(), y.max()) == (50, 300)
    for bad in ({"mean": 0.5}, {"mean": math.nan}, {"mean": 10.0, "lo": 5, "hi": 4}):
        with pytest.raises(PolicyError):
            Exponential(**bad)  # type: ignore[arg-type]


def test_lognormal_from_percentiles() -> None:
    d = LogNormal.from_percentiles(1020, 4142)
    assert (d.p50, d.p99) == pytest.approx((1020, 4142))
    x = d.sample(np.random.default_rng(2), 200_000)
    p50, p99 = np.percentile(x, [50, 99])
    assert p50 == pytest.approx(1020, rel=0.02)
    assert p99 == pytest.approx(4142, rel=0.05)
    capped = LogNormal.from_percentiles(100, 10_000, hi=2048).sample(
        np.random.default_rng(2), 10**4
    )
    assert capped.max() == 2048
    assert (
        LogNormal.from_percentiles(64, 64).sample(np.random.default_rng(0), 5).tolist() == [64] * 5
    )
    with pytest.raises(PolicyError):
        LogNormal.from_percentiles(100, 50)
    with pytest.raises(PolicyError):
        LogNormal(0.0, -1.0)


def test_empirical_and_trace_lengths_resample_what_they_saw() -> None:
    trace = [TraceRequest(0.0, p, o) for p, o in [(10, 1), (20, 2), (30, 3), (40, 0)]]
    rng = np.random.default_rng(3)
    e = Empirical.outputs_of(trace)
    assert e.values == (1, 2, 3)
    x = e.sample(rng, 30_000)
    assert set(x.tolist()) == {1, 2, 3}
    assert np.bincount(x)[1:] / x.size == pytest.approx([1 / 3] * 3, abs=0.02)
    assert set(Empirical.prompts_of(trace).sample(rng, 1000).tolist()) == {10, 20, 30, 40}
    p, o = TraceLengths(trace).sample(rng, 1000)
    assert set(zip(p.tolist(), o.tolist(), strict=True)) == {(10, 1), (20, 2), (30, 3), (40, 0)}
    with pytest.raises(PolicyError):
        Empirical([])
    with pytest.raises(PolicyError):
        TraceLengths([])


# --------------------------------------------------------------------------- tenants

MIX = "gold:tier-1:0.2,silver:tier-2:0.3,bronze:tier-3:0.5"


def test_tenant_mix_parse_and_str() -> None:
    mix = TenantMix.parse(MIX)
    assert mix == TenantMix(
        [("gold", "tier-1", 2), ("silver", "tier-2", 3), ("bronze", "tier-3", 5)]
    )
    assert mix.tenants == ("gold", "silver", "bronze")
    assert mix.shares() == pytest.approx({"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    assert TenantMix.parse(str(mix)) == mix
    assert TenantMix.parse(" batch : 1 , online:tier-1:3").entries == (
        ("batch", None, 0.25),
        ("online", "tier-1", 0.75),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty tenant mix"),
        ("gold", "expected tenant"),
        ("gold:tier-1:x", "bad weight 'x'"),
        ("gold::0.5", "expected tenant"),
        ("a:b:c:1", "expected tenant"),
        ("gold:0.5,", "expected tenant"),
        ("gold:0.5,gold:0.5", "appears twice"),
        ("gold:0", "weight of 'gold' must be finite and > 0"),
        ("gold:-1", "> 0"),
        ("gold:nan", "> 0"),
        ("gold:inf", "> 0"),
    ],
)
def test_tenant_mix_parse_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        TenantMix.parse(text)


def test_tenant_mix_proportions_are_seeded() -> None:
    mix = TenantMix.parse(MIX)
    base = [TraceRequest(i * 0.01, 5, 3, max_tokens=9) for i in range(50_000)]
    out = mix.assign(base, seed=42)
    assert out == mix.assign(base, seed=42)
    assert out != mix.assign(base, seed=43)
    counts = dict.fromkeys(mix.tenants, 0)
    for r in out:
        counts[r.tenant] += 1
        assert r.tier == {"gold": "tier-1", "silver": "tier-2", "bronze": "tier-3"}[r.tenant]
    assert counts["gold"] / len(out) == pytest.approx(0.2, abs=0.01)
    assert counts["silver"] / len(out) == pytest.approx(0.3, abs=0.01)
    assert counts["bronze"] / len(out) == pytest.approx(0.5, abs=0.01)
    assert [(r.t, r.prompt_tokens, r.output_tokens, r.max_tokens) for r in out] == [
        (r.t, r.prompt_tokens, r.output_tokens, r.max_tokens) for r in base
    ]


# --------------------------------------------------------------------------- synthesis


def test_synthesize_is_seeded_and_caps_outputs() -> None:
    times = Poisson(10.0).times(5, duration=100.0)
    lengths = IndependentLengths(LogNormal.from_percentiles(500, 3000), Exponential(300.0))
    mix = TenantMix.parse(MIX)
    a = synthesize(times, lengths, seed=9, mix=mix, max_tokens=256)
    assert a == synthesize(times, lengths, seed=9, mix=mix, max_tokens=256)
    assert len(a) == times.size
    assert [r.t for r in a] == times.tolist()
    assert all(r.max_tokens == 256 and r.output_tokens <= 256 for r in a)
    assert max(r.output_tokens for r in a) == 256  # the cap bites for a mean of 300
    assert {r.tenant for r in a} == {"gold", "silver", "bronze"}
    plain = synthesize(times, lengths, seed=9)
    assert all(r.tenant == "default" and r.tier is None and r.max_tokens is None for r in plain)
    assert synthesize([], lengths, seed=1) == []
    with pytest.raises(PolicyError):
        synthesize([2.0, 1.0], lengths, seed=1)
    with pytest.raises(PolicyError):
        synthesize([math.nan], lengths, seed=1)


# --------------------------------------------------------------------------- transforms


def test_rescale_time_doubles_rate() -> None:
    trace = synthesize(
        Poisson(4.0).times(1, count=2000), IndependentLengths(Fixed(9), Exponential(50.0)), seed=1
    )
    fast = rescale_time(trace, 2.0)
    assert trace_stats(fast).mean_rps == pytest.approx(2 * trace_stats(trace).mean_rps)
    assert [r.t * 2 for r in fast] == pytest.approx([r.t for r in trace])
    assert [(r.prompt_tokens, r.output_tokens) for r in fast] == [
        (r.prompt_tokens, r.output_tokens) for r in trace
    ]
    assert np.all(np.diff([r.t for r in fast]) >= 0)
    slow = rescale_time(trace, 0.5)
    assert trace_stats(slow).mean_rps == pytest.approx(trace_stats(trace).mean_rps / 2)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(PolicyError):
            rescale_time(trace, bad)


def test_scale_to_rate() -> None:
    trace = _trace([0.0, 1.0, 3.0, 4.0, 10.0])
    assert trace_stats(scale_to_rate(trace, 8.0)).mean_rps == pytest.approx(8.0)
    with pytest.raises(PolicyError):
        scale_to_rate(trace[:1], 8.0)


def test_head_and_time_window() -> None:
    trace = _trace([0.0, 1.0, 2.0, 2.0, 3.5, 7.0])
    assert head(trace, 2) == trace[:2]
    assert head(trace, 100) == trace
    assert head(trace, 0) == []
    w = time_window(trace, 1.5, 3.5)
    assert [r.t for r in w] == [0.5, 0.5]
    assert [r.prompt_tokens for r in w] == [102, 103]
    assert time_window(trace, 1.5, 3.5, rebase=False) == trace[2:4]
    assert time_window(trace, 0.0, 100.0) == trace
    assert time_window(trace, 8.0, 9.0) == []
    with pytest.raises(PolicyError):
        time_window(trace, 3.0, 2.0)
    with pytest.raises(PolicyError):
        time_window(trace, -1.0, 2.0)
    with pytest.raises(PolicyError):
        head(trace, -1)


def test_merge_is_sorted_and_stable() -> None:
    a = [TraceRequest(t, 1, 1, "a") for t in (0.0, 1.0, 2.0)]
    b = [TraceRequest(t, 1, 1, "b") for t in (0.5, 1.0, 5.0)]
    out = merge(a, b)
    assert [(r.t, r.tenant) for r in out] == [
        (0.0, "a"), (0.5, "b"), (1.0, "a"), (1.0, "b"), (2.0, "a"), (5.0, "b"),
    ]  # fmt: skip
    with pytest.raises(PolicyError, match="workload 1"):
        merge(a, list(reversed(b)))


# --------------------------------------------------------------------------- statistics


def test_trace_stats_by_hand() -> None:
    trace = [
        TraceRequest(0.0, 100, 10),
        TraceRequest(1.0, 200, 30),
        TraceRequest(2.0, 300, 20),
        TraceRequest(4.0, 400, 40),
    ]
    s = trace_stats(trace)
    assert (s.count, s.span_s, s.mean_rps) == (4, 4.0, 0.75)
    assert (s.prompt_tokens_per_s, s.output_tokens_per_s) == (250.0, 25.0)
    assert (s.prompt_mean, s.prompt_p50, s.output_mean, s.output_p50) == (250.0, 250.0, 25.0, 25.0)
    assert s.prompt_p99 == pytest.approx(397.0)
    assert s.output_scv == pytest.approx(125.0 / 625.0)
    gaps = np.array([1.0, 1.0, 2.0])
    assert s.interarrival_cv == pytest.approx(gaps.std() / gaps.mean())


@pytest.mark.parametrize(
    "trace",
    [[], [TraceRequest(0.0, 1, 1)], [TraceRequest(1.0, 1, 1), TraceRequest(1.0, 1, 1)],
     [TraceRequest(1.0, 1, 1), TraceRequest(0.0, 1, 1)]],
)  # fmt: skip
def test_trace_stats_rejects(trace: list[TraceRequest]) -> None:
    with pytest.raises(PolicyError):
        trace_stats(trace)


def test_index_of_dispersion() -> None:
    lengths = IndependentLengths(Fixed(1), Fixed(1))
    poisson = synthesize(Poisson(20.0).times(3, duration=2000.0), lengths, seed=0)
    assert index_of_dispersion(poisson, 1.0) == pytest.approx(1.0, abs=0.1)
    even = synthesize(Deterministic(20.0).times(3, duration=2000.0), lengths, seed=0)
    assert index_of_dispersion(even, 1.0) < 0.01
    with pytest.raises(PolicyError):
        index_of_dispersion(even, 5000.0)
