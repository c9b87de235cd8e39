"""Synthetic arrival processes: when requests arrive.

Every process is a small frozen dataclass with a :attr:`mean_rate` (requests per second, in
the long run) and a ``times(seed, duration=..., count=...)`` method that returns a sorted
``float64`` array of arrival times in seconds, starting after 0:

* :class:`Poisson` — exponential gaps at rate λ (inter-arrival CV 1);
* :class:`GammaRenewal` — Gamma gaps with a chosen coefficient of variation (CV 1 is
  Poisson, CV < 1 smoother, CV > 1 burstier);
* :class:`Deterministic` — evenly spaced arrivals (CV 0), with a random phase;
* :class:`OnOff` — a square wave: Poisson at ``rate_on`` for ``on_s`` seconds, then at
  ``rate_off`` (default 0) for ``off_s`` seconds, repeating, the first on-period at 0;
* :class:`MMPP` — a two-state Markov-modulated Poisson process: Poisson at ``rates[i]`` while
  in state ``i``, exponential sojourns with means ``sojourns[i]``.

Contracts shared by all of them:

* Give exactly one of ``duration`` (all arrivals in ``[0, duration)``) or ``count`` (the first
  ``count`` arrivals).
* The same seed gives the same array.  The output is *prefix-consistent*: a shorter horizon
  with the same seed gives a prefix of a longer one, whether the horizon is a duration or a
  count, so a 60 s demo is the first minute of the hour-long run.
* Renewal and Markov-modulated processes start in their stationary regime (the first gap is a
  residual life, MMPP's first state is drawn from its stationary distribution), so the
  expected number of arrivals in ``[0, T)`` is ``mean_rate * T`` from the start.
* Bad parameters raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import numpy as np
from numpy.typing import NDArray

from velvetrope import checks
from velvetrope.errors import PolicyError
from velvetrope.sim.seeds import Seed, as_generator

__all__ = [
    "MMPP",
    "ArrivalProcess",
    "Deterministic",
    "GammaRenewal",
    "OnOff",
    "Poisson",
]

FloatArray: TypeAlias = NDArray[np.float64]
_Chunks: TypeAlias = Iterator[tuple[FloatArray, float]]

# Arrivals drawn per step of a generator.  Fixed (never derived from the horizon), which is
# what makes outputs prefix-consistent.
_CHUNK = 4096
_MAX_SEGMENTS = 1024


class ArrivalProcess(Protocol):
    """A stationary source of arrival times."""

    @property
    def mean_rate(self) -> float:
        """Long-run arrivals per second."""
        ...

    def times(
        self, seed: Seed, *, duration: float | None = None, count: int | None = None
    ) -> FloatArray:
        """Sorted arrival times in seconds: those in ``[0, duration)``, or the first ``count``."""
        ...


def _collect(chunks: _Chunks, duration: float | None, count: int | None) -> FloatArray:
    """Draw chunks until the horizon is covered, then cut to it."""
    if (duration is None) == (count is None):
        raise PolicyError("give exactly one of duration= or count=")
    if duration is not None:
        dur = checks.number("duration", duration, strict=False)
        if dur == 0.0:
            return np.empty(0, dtype=np.float64)
        parts: list[FloatArray] = []
        for times, covered in chunks:
            parts.append(times)
            if covered >= dur:
                break
        out = np.concatenate(parts)
        return out[: int(np.searchsorted(out, dur, side="left"))]
    n = checks.count("count", count)
    if n == 0:
        return np.empty(0, dtype=np.float64)
    parts = []
    total = 0
    for times, _ in chunks:
        parts.append(times)
        total += times.size
        if total >= n:
            break
    return np.concatenate(parts)[:n]


def _piecewise(
    rng: np.random.Generator, starts: FloatArray, lengths: FloatArray, rates: FloatArray
) -> FloatArray:
    """Poisson arrivals in consecutive segments ``[starts[i], starts[i] + lengths[i])`` at
    ``rates[i]``: a Poisson count per segment, placed uniformly (the order-statistics
    property), sorted."""
    counts = rng.poisson(rates * lengths)
    n = int(counts.sum())
    t = np.repeat(starts, counts) + rng.random(n) * np.repeat(lengths, counts)
    t.sort()
    return t


class _Chunked(ABC):
    """Shared ``times()``: a process supplies ``_chunks(rng)``, an endless iterator of
    ``(arrival times, covered_until)`` steps, each step's times sorted and after the last's."""

    __slots__ = ()

    @abstractmethod
    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        """The endless iterator of steps for this process."""

    def times(
        self, seed: Seed, *, duration: float | None = None, count: int | None = None
    ) -> FloatArray:
        """Sorted arrival times in seconds: those in ``[0, duration)``, or the first ``count``.

        Exactly one of ``duration`` / ``count``; the same seed gives the same array, and a
        shorter horizon gives a prefix of a longer one.
        """
        return _collect(self._chunks(as_generator(seed)), duration, count)


@dataclass(frozen=True, slots=True)
class _Rate(_Chunked):
    """A process set by its rate alone (``> 0``, per second)."""

    rate: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", checks.number("rate", self.rate))

    @property
    def mean_rate(self) -> float:
        return self.rate


@dataclass(frozen=True, slots=True)
class Poisson(_Rate):
    """Poisson arrivals at ``rate`` per second (exponential gaps, inter-arrival CV 1)."""

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        t0 = 0.0
        while True:
            t = t0 + np.cumsum(rng.exponential(1.0 / self.rate, _CHUNK))
            t0 = float(t[-1])
            yield t, t0


@dataclass(frozen=True, slots=True)
class GammaRenewal(_Chunked):
    """A renewal process with Gamma gaps: mean ``1 / rate``, coefficient of variation ``cv``.

    The gaps have shape ``k = 1 / cv²`` and scale ``1 / (rate * k)``.  ``cv = 1`` is Poisson;
    ``cv > 1`` gives bursts (many short gaps, a few very long ones).  The process starts in
    equilibrium: the first arrival is a residual life, ``U * Gamma(k + 1, scale)``.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", checks.number("rate", self.rate))
        object.__setattr__(self, "cv", checks.number("cv", self.cv))

    @property
    def mean_rate(self) -> float:
        return self.rate

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (self.rate * shape)
        t0 = float(rng.random() * rng.gamma(shape + 1.0, scale))
        first = np.array([t0])
        while True:
            t = t0 + np.cumsum(rng.gamma(shape, scale, _CHUNK))
            if first.size:
                t = np.concatenate([first, t])
                first = first[:0]
            t0 = float(t[-1])
            yield t, t0


@dataclass(frozen=True, slots=True)
class Deterministic(_Rate):
    """Evenly spaced arrivals, ``1 / rate`` apart (CV 0), the first at a uniform random phase
    in ``[0, 1 / rate)``: the D in D/M/1."""

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        gap = 1.0 / self.rate
        phase = float(rng.random()) * gap
        k = 0
        while True:
            t = phase + gap * np.arange(k, k + _CHUNK, dtype=np.float64)
            k += _CHUNK
            yield t, float(t[-1])


@dataclass(frozen=True, slots=True)
class OnOff(_Chunked):
    """A square wave of load: Poisson at ``rate_on`` for ``on_s`` seconds, then at
    ``rate_off`` for ``off_s`` seconds, repeating; the first on-period starts at 0.

    Deterministic periods (unlike :class:`MMPP`, whose sojourns are random), for spikes at
    known times.  ``mean_rate = (rate_on * on_s + rate_off * off_s) / (on_s + off_s)``.
    """

    rate_on: float
    on_s: float
    off_s: float
    rate_off: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_on", checks.number("rate_on", self.rate_on))
        object.__setattr__(self, "on_s", checks.number("on_s", self.on_s))
        object.__setattr__(self, "off_s", checks.number("off_s", self.off_s))
        object.__setattr__(self, "rate_off", checks.number("rate_off", self.rate_off, strict=False))

    @property
    def mean_rate(self) -> float:
        return (self.rate_on * self.on_s + self.rate_off * self.off_s) / (self.on_s + self.off_s)

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        period = self.on_s + self.off_s
        per_period = self.mean_rate * period
        m = int(min(_MAX_SEGMENTS, max(1, _CHUNK // max(per_period, 1.0))))
        lengths = np.tile([self.on_s, self.off_s], m)
        rates = np.tile([self.rate_on, self.rate_off], m)
        offsets = np.tile([0.0, self.on_s], m) + np.repeat(np.arange(m) * period, 2)
        t0 = 0.0
        while True:
            yield _piecewise(rng, t0 + offsets, lengths, rates), t0 + m * period
            t0 += m * period


@dataclass(frozen=True, slots=True)
class MMPP(_Chunked):
    """A two-state Markov-modulated Poisson process.

    In state ``i`` arrivals are Poisson at ``rates[i]`` (``>= 0``, not both 0); the state
    holds for an exponential time with mean ``sojourns[i]`` seconds, then flips.  The first
    state is drawn from the stationary distribution ``π_i = sojourns[i] / sum(sojourns)``,
    so ``mean_rate = π_0 * rates[0] + π_1 * rates[1]`` holds from t = 0.
    """

    rates: tuple[float, float]
    sojourns: tuple[float, float]

    def __post_init__(self) -> None:
        for name in ("rates", "sojourns"):
            pair = getattr(self, name)
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise PolicyError(f"{name} must be a pair of numbers, got {pair!r}")
        rates = (
            checks.number("rates[0]", self.rates[0], strict=False),
            checks.number("rates[1]", self.rates[1], strict=False),
        )
        if rates == (0.0, 0.0):
            raise PolicyError("MMPP rates cannot both be 0")
        object.__setattr__(self, "rates", rates)
        sojourns = (
            checks.number("sojourns[0]", self.sojourns[0]),
            checks.number("sojourns[1]", self.sojourns[1]),
        )
        object.__setattr__(self, "sojourns", sojourns)

    @property
    def stationary(self) -> tuple[float, float]:
        """The long-run fraction of time spent in each state."""
        s0, s1 = self.sojourns
        return s0 / (s0 + s1), s1 / (s0 + s1)

    @property
    def mean_rate(self) -> float:
        p0, p1 = self.stationary
        return p0 * self.rates[0] + p1 * self.rates[1]

    def _chunks(self, rng: np.random.Generator) -> _Chunks:
        cycle = self.sojourns[0] + self.sojourns[1]
        per_cycle = self.mean_rate * cycle
        m = int(min(_MAX_SEGMENTS, max(1, _CHUNK // max(per_cycle, 1.0))))
        state = 1 if rng.random() < self.stationary[1] else 0
        order = [state, 1 - state] * m
        means = np.array([self.sojourns[i] for i in order])
        rates = np.array([self.rates[i] for i in order])
        t0 = 0.0
        while True:
            lengths = rng.exponential(means)
            edges = t0 + np.concatenate(([0.0], np.cumsum(lengths)))
            yield _piecewise(rng, edges[:-1], lengths, rates), float(edges[-1])
            t0 = float(edges[-1])
