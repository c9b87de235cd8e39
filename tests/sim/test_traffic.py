"""Day-shaped arrivals, a trace's request mix on synthetic times, and the arrivals spec."""

from __future__ import annotations

import math

import numpy as np
import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import MMPP, Deterministic, GammaRenewal, OnOff, Poisson
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traffic import DayCycle, Spike, parse_arrivals, parse_spike, with_mix


def _within(count: int, expected: float, sigmas: float = 4.0) -> bool:
    return abs(count - expected) <= sigmas * math.sqrt(expected)


class TestDayCycle:
    def test_curve_has_its_mean_peak_and_trough(self) -> None:
        day = DayCycle(10.0, peak_to_trough=4.0, peak_hour=14.0)
        peak, trough = day.rate(np.array([14 * 3600.0, 2 * 3600.0]))
        assert peak == pytest.approx(16.0)  # a = 3/5: 10 x 1.6
        assert trough == pytest.approx(4.0)
        assert peak / trough == pytest.approx(4.0)
        assert day.expected_count(86_400.0) == pytest.approx(864_000.0, rel=1e-9)
        flat = DayCycle(3.0, peak_to_trough=1.0)
        assert np.all(flat.rate(np.linspace(0, 86_400, 97)) == 3.0)

    def test_arrivals_follow_the_curve(self) -> None:
        day = DayCycle(2.0, peak_to_trough=5.0, peak_hour=12.0)
        t = day.times(1, duration=86_400.0)
        assert _within(t.size, 2.0 * 86_400)
        hours = np.bincount((t // 3600).astype(int), minlength=24)
        expected = [day.expected_count(3600.0 * (h + 1)) - day.expected_count(3600.0 * h)
                    for h in range(24)]  # fmt: skip
        for got, want in zip(hours.tolist(), expected, strict=True):
            assert _within(got, want)
        assert hours[12] > 3 * hours[0]  # noon against midnight: 5:1 at the extremes

    def test_spikes_multiply_the_rate_where_they_are(self) -> None:
        day = DayCycle(4.0, peak_to_trough=1.0, spikes=(Spike(1000.0, 500.0, 3.0),))
        t = day.times(2, duration=3000.0)
        inside = int(np.count_nonzero((t >= 1000) & (t < 1500)))
        before = int(np.count_nonzero(t < 1000))
        assert _within(inside, 4.0 * 3.0 * 500)
        assert _within(before, 4.0 * 1000)
        assert day.expected_count(3000.0) == pytest.approx(4.0 * 3000 + 2 * 4.0 * 500)
        assert day.mean_rate == 4.0

    def test_seeded_and_prefix_consistent(self) -> None:
        day = DayCycle(5.0, spikes=(Spike(100.0, 50.0, 2.0),))
        a = day.times(3, duration=4000.0)
        np.testing.assert_array_equal(a, day.times(3, duration=4000.0))
        np.testing.assert_array_equal(day.times(3, duration=1000.0), a[a < 1000.0])
        np.testing.assert_array_equal(day.times(3, count=100), a[:100])
        assert not np.array_equal(a, day.times(4, duration=4000.0))

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"mean_rps": 0.0},
            {"mean_rps": 1.0, "peak_to_trough": 0.5},
            {"mean_rps": 1.0, "peak_hour": 24.0},
            {"mean_rps": 1.0, "period_s": -1.0},
        ],
    )
    def test_bad_parameters(self, kwargs: dict[str, float]) -> None:
        with pytest.raises(PolicyError):
            DayCycle(**kwargs)  # type: ignore[arg-type]


class TestWithMix:
    def test_rows_are_copied_whole(self) -> None:
        rows = [
            TraceRequest(0.0, 100, 10, "a", "gold", 50),
            TraceRequest(1.0, 7, 3, "b", None, None, "sys", 5),
        ]
        out = with_mix([0.5, 0.5, 2.0, 9.0], rows, seed=0)
        assert [r.t for r in out] == [0.5, 0.5, 2.0, 9.0]
        for r in out:
            assert any(
                (r.prompt_tokens, r.output_tokens, r.tenant, r.tier, r.max_tokens, r.prefix_id)
                == (s.prompt_tokens, s.output_tokens, s.tenant, s.tier, s.max_tokens, s.prefix_id)
                for s in rows
            )
        assert with_mix([0.5, 2.0], rows, 1) == with_mix([0.5, 2.0], rows, 1)
        many = with_mix(np.arange(2000.0), rows, 5)
        share = sum(r.tenant == "a" for r in many) / len(many)
        assert 0.45 < share < 0.55

    def test_bad_inputs(self) -> None:
        rows = [TraceRequest(0.0, 1, 1)]
        with pytest.raises(PolicyError):
            with_mix([2.0, 1.0], rows, 0)
        with pytest.raises(PolicyError):
            with_mix([1.0], [], 0)


class TestSpec:
    def test_every_form(self) -> None:
        assert parse_arrivals("trace") is None
        assert parse_arrivals("poisson:5") == Poisson(5.0)
        assert parse_arrivals("deterministic:2") == Deterministic(2.0)
        assert parse_arrivals("gamma:5:2") == GammaRenewal(5.0, 2.0)
        assert parse_arrivals("onoff:10:30:90") == OnOff(10.0, 30.0, 90.0)
        assert parse_arrivals("onoff:10:30:90:1") == OnOff(10.0, 30.0, 90.0, 1.0)
        assert parse_arrivals("mmpp:1:20:60:10") == MMPP((1.0, 20.0), (60.0, 10.0))
        assert parse_arrivals("day:3") == DayCycle(3.0)
        spike = parse_spike("36000:1800:3")
        assert spike == Spike(36000.0, 1800.0, 3.0)
        assert parse_arrivals("day:3:2:9", [spike]) == DayCycle(3.0, 2.0, 9.0, spikes=(spike,))

    @pytest.mark.parametrize(
        "spec",
        ["poisson", "poisson:x", "gamma:1", "mmpp:1:2:3", "zipf:1", "day:1:2:3:4", "trace:1"],
    )
    def test_bad_specs(self, spec: str) -> None:
        with pytest.raises(PolicyError):
            parse_arrivals(spec)

    def test_spikes_need_a_day(self) -> None:
        with pytest.raises(PolicyError, match="spikes"):
            parse_arrivals("poisson:3", [Spike(0.0, 1.0, 2.0)])
        for bad in ("1:2", "a:b:c", "0:0:2", "0:10:-1"):
            with pytest.raises(PolicyError):
                parse_spike(bad)


def test_prepare_workload_puts_the_trace_mix_on_synthetic_times() -> None:
    from velvetrope.sim.inputs import prepare_workload
    from velvetrope.sim.traces import load_trace

    rows = load_trace("azure_code")[:200]
    out = prepare_workload("azure_code", limit=200, arrivals=Poisson(2.0), duration=500.0)
    times = Poisson(2.0).times(np.random.default_rng(0), duration=500.0)
    assert [r.t for r in out] == times.tolist()
    pairs = {(r.prompt_tokens, r.output_tokens) for r in rows}
    assert all((r.prompt_tokens, r.output_tokens) in pairs for r in out)
    with pytest.raises(PolicyError, match="duration"):
        prepare_workload("azure_code", arrivals=Poisson(2.0))
    with pytest.raises(PolicyError, match="duration"):
        prepare_workload("azure_code", duration=10.0)
