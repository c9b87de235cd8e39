"""Traffic that needs scaling: a day-shaped arrival process, and synthetic arrivals with a
trace's own request mix, named by a one-line spec (``velvetrope simulate --arrivals``).

:class:`DayCycle` is a non-homogeneous Poisson process whose rate follows a day:

``rate(t) = mean_rps × (1 + a·cos(2π·(t − peak_s)/period_s)) × spike(t)``

with ``a = (r − 1)/(r + 1)`` for a peak-to-trough ratio ``r`` (the curve's mean over a
period is ``mean_rps``; its maximum is ``r`` times its minimum, reached at ``peak_hour``
and twelve hours later), and ``spike(t)`` the product of the factors of the
:class:`Spike` s covering ``t`` (1 elsewhere).  Arrivals are drawn by thinning (Lewis and
Shedler): candidates at the curve's maximum rate, each kept with probability ``rate(t) /
max``, which is exact for any rate curve.  Like every process of
:mod:`velvetrope.sim.arrivals` it is seeded and prefix-consistent, and ``mean_rate`` is the
long-run rate (``mean_rps``: spikes are one-off events, not part of the long run).

:func:`with_mix` gives arrival times a trace's request mix: each arrival takes a whole row of
the trace, drawn uniformly with replacement (prompt and output lengths, tenant, tier,
``max_tokens``, shared prefix: everything but the time), so the correlations of the trace
are kept.

:func:`parse_arrivals` reads the spec (:data:`ARRIVAL_FORMS`).  Bad parameters raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from velvetrope import checks
from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import (
    MMPP,
    ArrivalProcess,
    Deterministic,
    FloatArray,
    GammaRenewal,
    OnOff,
    Poisson,
    _Chunked,
    _Chunks,
)
from velvetrope.sim.seeds import Seed, as_generator
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["ARRIVAL_FORMS", "DayCycle", "Spike", "parse_arrivals", "parse_spike", "with_mix"]

ARRIVAL_FORMS = (
    "trace",
    "poisson:RATE",
    "gamma:RATE:CV",
    "deterministic:RATE",
    "onoff:RATE_ON:ON_S:OFF_S[:RATE_OFF]",
    "mmpp:RATE0:RATE1:SOJOURN0_S:SOJOURN1_S",
    "day:MEAN_RPS[:PEAK_TO_TROUGH[:PEAK_HOUR]]",
)
"""The forms :func:`parse_arrivals` accepts (rates in requests per second)."""

_CHUNK = 8192


@dataclass(frozen=True, slots=True)
class Spike:
    """The rate is multiplied by ``factor`` (> 0) during ``[start_s, start_s + duration_s)``."""

    start_s: float
    duration_s: float
    factor: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "start_s", checks.number("spike start", self.start_s, strict=False)
        )
        object.__setattr__(self, "duration_s", checks.number("spike duration", self.duration_s))
        object.__setattr__(self, "factor", checks.number("spike factor", self.factor))

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class DayCycle(_Chunked):
    """A day-shaped Poisson process (see the module docstring).

    ``mean_rps`` > 0; ``peak_to_trough`` >= 1 (1: a flat day); ``peak_hour`` in [0, 24)
    hours after t = 0 of the busiest moment (scaled with ``period_s``: the period is a "day");
    ``period_s`` > 0 (86,400 s by default); ``spikes`` on top.
    """

    mean_rps: float
    peak_to_trough: float = 4.0
    peak_hour: float = 14.0
    period_s: float = 86_400.0
    spikes: tuple[Spike, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean_rps", checks.number("mean_rps", self.mean_rps))
        r = checks.number("peak_to_trough", self.peak_to_trough)
        if r < 1:
            raise PolicyError(f"peak_to_trough must be >= 1, got {r}")
        object.__setattr__(self, "peak_to_trough", r)
        h = checks.number("peak_hour", self.peak_hour, strict=False)
        if h >= 24:
            raise PolicyError(f"peak_hour must be in [0, 24), got {h}")
        object.__setattr__(self, "peak_hour", h)
        object.__setattr__(self, "period_s", checks.number("period_s", self.period_s))
        object.__setattr__(self, "spikes", tuple(self.spikes))

    @property
    def mean_rate(self) -> float:
        return self.mean_rps

    @property
    def amplitude(self) -> float:
        """``a``: the curve is ``mean × (1 + a cos(...))``."""
        r = self.peak_to_trough
        return (r - 1.0) / (r + 1.0)

    def rate(self, t: FloatArray) -> FloatArray:
        """The arrival rate (req/s) at times ``t``."""
        peak = self.peak_hour / 24.0 * self.period_s
        phase = 2.0 * np.pi * (t - peak) / self.period_s
        out = self.mean_rps * (1.0 + self.amplitude * np.cos(phase))
        for s in self.spikes:
            out = np.where((t >= s.start_s) & (t < s.end_s), out * s.factor, out)
        return np.asarray(out, dtype=np.float64)

    def max_rate(self) -> float:
        """An upper bound of :meth:`rate` (the thinning envelope)."""
        boost = 1.0
        for s in self.spikes:
            boost *= max(1.0, s.factor)
        return self.mean_rps * (1.0 + self.amplitude) * boost

    def expected_count(self, duration: float, step_s: float = 1.0) -> float:
        """The expected number of arrivals in ``[0, duration)`` (midpoint rule)."""
        n = max(1, math.ceil(duration / step_s))
        mids = (np.arange(n, dtype=np.float64) + 0.5) * (duration / n)
        return float(self.rate(mids).sum() * (duration / n))

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        top = self.max_rate()
        t0 = 0.0
        while True:
            cand = t0 + np.cumsum(rng.exponential(1.0 / top, _CHUNK))
            keep = rng.random(_CHUNK) * top < self.rate(cand)
            t0 = float(cand[-1])
            yield cand[keep], t0


def with_mix(
    times: Sequence[float] | FloatArray, requests: Sequence[TraceRequest], seed: Seed
) -> list[TraceRequest]:
    """A workload arriving at ``times`` (sorted, >= 0) whose rows are drawn uniformly with
    replacement from ``requests`` (everything but the time is copied)."""
    ts = np.asarray(times, dtype=np.float64)
    if ts.ndim != 1 or (ts.size and (ts[0] < 0 or bool(np.any(np.diff(ts) < 0)))):
        raise PolicyError("times must be a sorted one-dimensional sequence of values >= 0")
    if not requests:
        raise PolicyError("with_mix needs at least one request to draw from")
    idx = as_generator(seed).integers(0, len(requests), size=ts.size)
    return [replace(requests[i], t=t) for t, i in zip(ts.tolist(), idx.tolist(), strict=True)]


def _floats(spec: str, parts: Sequence[str], n_min: int, n_max: int) -> list[float]:
    if not n_min <= len(parts) <= n_max:
        raise PolicyError(f"bad arrivals {spec!r}: expected one of {', '.join(ARRIVAL_FORMS)}")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise PolicyError(f"bad arrivals {spec!r}: parameters must be numbers") from None


def parse_arrivals(spec: str, spikes: Sequence[Spike] = ()) -> ArrivalProcess | None:
    """The process a spec names (:data:`ARRIVAL_FORMS`), or ``None`` for ``trace`` (replay the
    trace's own times).  ``spikes`` go with ``day`` only."""
    name, _, rest = spec.strip().partition(":")
    parts = rest.split(":") if rest else []
    if spikes and name != "day":
        raise PolicyError("spikes go with day arrivals (day:MEAN_RPS); use a flat day: day:R:1")
    if name == "trace" and not parts:
        return None
    if name == "poisson":
        return Poisson(*_floats(spec, parts, 1, 1))
    if name == "deterministic":
        return Deterministic(*_floats(spec, parts, 1, 1))
    if name == "gamma":
        return GammaRenewal(*_floats(spec, parts, 2, 2))
    if name == "onoff":
        v = _floats(spec, parts, 3, 4)
        return OnOff(rate_on=v[0], on_s=v[1], off_s=v[2], rate_off=v[3] if len(v) > 3 else 0.0)
    if name == "mmpp":
        v = _floats(spec, parts, 4, 4)
        return MMPP(rates=(v[0], v[1]), sojourns=(v[2], v[3]))
    if name == "day":
        v = _floats(spec, parts, 1, 3)
        return DayCycle(
            v[0],
            v[1] if len(v) > 1 else 4.0,
            v[2] if len(v) > 2 else 14.0,
            spikes=tuple(spikes),
        )
    raise PolicyError(f"bad arrivals {spec!r}: expected one of {', '.join(ARRIVAL_FORMS)}")


def parse_spike(text: str) -> Spike:
    """``START:DURATION:FACTOR`` in seconds and a rate multiplier (``36000:1800:3``)."""
    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        start, duration, factor = (float(p) for p in parts)
    except ValueError:
        raise PolicyError(f"bad spike {text!r}: expected START_S:DURATION_S:FACTOR") from None
    return Spike(start, duration, factor)
