"""Is a sampled series flat?  A least-squares slope after a warm-up, and the soak's rule.

:func:`warmup_cut` says how many leading samples a fit skips: the process's first minutes
(imports finishing, caches and pools filling, the allocator's arenas growing to the load)
say nothing about a leak.  It skips ``min(warmup_fraction × duration, warmup_cap_s)`` of
samples, at least :data:`MIN_SKIP` of them, and never so many that fewer than
:data:`MIN_FIT` remain (then it skips what it can).

:func:`fit` is ordinary least squares of ``y = a + b·t`` on what remains, with ``t`` in
hours: ``slope`` is per hour.  ``resid_std`` is the residuals' standard deviation (``n − 2``
degrees of freedom), ``ci`` the slope's 95 % confidence interval from Student's t.

**Flat within noise** (:func:`verdict`): a series is flat when either

* its slope's 95 % confidence interval reaches down to 0 (no rise the data can tell from
  noise), or
* the drift the slope implies over the fitted span, ``slope × span_h``, is at most
  ``max(3 × resid_std, floor)``: the line rises less over the whole run than the series
  wobbles around it, or less than an absolute ``floor`` that no one would call a leak
  (:data:`FLOORS`: 5 MB of RSS, 5 file descriptors, 20 asyncio tasks, 20 Redis keys,
  1 MB of Redis memory).

Else it is *growing*.  The rule is one-sided: the soak looks for what accumulates, and a
series that falls (a queue that built up while the machine was busy, then drained) is not
a leak; :meth:`Trend.describe` shows its slope all the same.

A series with fewer than :data:`MIN_FIT` samples in all cannot be judged and counts as flat
(its :class:`Trend` says ``n`` so the report shows it).  A series whose every sample is
missing (``nan``) is :data:`None` from :func:`fit`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy import stats

__all__ = ["FLOORS", "MIN_FIT", "MIN_SKIP", "Trend", "fit", "verdict", "warmup_cut"]

MIN_SKIP: Final = 2
"""Samples always skipped at the start (when enough remain)."""
MIN_FIT: Final = 3
"""Samples a fit needs (a line through two points has no residual)."""

FLOORS: Final[dict[str, float]] = {
    "rss_mb": 5.0,
    "fds": 5.0,
    "tasks": 20.0,
    "redis_keys": 20.0,
    "redis_memory_mb": 1.0,
}
"""Drift over the run below which a series is flat whatever its noise, by series name."""


@dataclass(frozen=True, slots=True)
class Trend:
    """A least-squares line through one series after its warm-up.

    ``slope`` (per hour) and ``ci`` (its 95 % interval) are in the series' unit per hour;
    ``span_h`` is the fitted time span, ``drift`` = ``slope × span_h``, ``resid_std`` the
    residuals' standard deviation, ``n`` the samples fitted, ``floor`` the absolute bound
    the rule uses and ``flat`` the verdict (see the module docstring).  The line passes
    through ``center``: the fitted samples' mean time (hours) and mean value.
    """

    name: str
    n: int
    slope: float
    ci: tuple[float, float]
    span_h: float
    resid_std: float
    floor: float
    center: tuple[float, float] = (0.0, 0.0)

    def at(self, t_h: float) -> float:
        """The fitted line's value at ``t_h`` hours."""
        return self.center[1] + self.slope * (t_h - self.center[0])

    @property
    def drift(self) -> float:
        """What the line moves over the fitted span (the series' unit)."""
        return self.slope * self.span_h

    @property
    def bound(self) -> float:
        """The drift allowed: ``max(3 × resid_std, floor)``."""
        return max(3.0 * self.resid_std, self.floor)

    @property
    def flat(self) -> bool:
        """Flat within noise: the CI reaches 0, or ``drift <= bound`` (too few samples: flat)."""
        if self.n < MIN_FIT:
            return True
        return self.ci[0] <= 0.0 or self.drift <= self.bound

    def describe(self) -> str:
        """One line: slope, interval, drift against its bound, verdict."""
        lo, hi = self.ci
        return (
            f"{self.name}: slope {self.slope:+.3g}/h (95% CI {lo:+.3g}..{hi:+.3g}), drift "
            f"{self.drift:+.3g} over {self.span_h * 60:.1f} min vs bound {self.bound:.3g} "
            f"(3 x resid std {self.resid_std:.3g}, floor {self.floor:g}), n={self.n}: "
            + ("flat" if self.flat else "growing")
        )


def warmup_cut(
    n: int, duration_s: float, warmup_fraction: float = 0.1, warmup_cap_s: float = 300.0
) -> int:
    """How many of ``n`` samples spread over ``duration_s`` the fit skips (module docstring)."""
    if n <= 0:
        return 0
    interval = duration_s / max(n - 1, 1)
    want = min(warmup_fraction * duration_s, warmup_cap_s)
    skip = max(MIN_SKIP, math.ceil(want / interval - 1e-9) if interval > 0 else 0)
    return max(0, min(skip, n - MIN_FIT))


def fit(name: str, t_s: Sequence[float], y: Sequence[float], floor: float | None = None) -> Trend:
    """The least-squares trend of ``y`` over ``t_s`` (seconds), every sample given fitted
    (cut the warm-up first: :func:`warmup_cut`).

    Samples whose value is ``nan`` (not measured) are left out.  ``floor`` defaults to
    :data:`FLOORS` ``[name]`` (0 when the name has none).  Raises ValueError when ``t_s``
    and ``y`` differ in length.
    """
    if len(t_s) != len(y):
        raise ValueError(f"{name}: {len(t_s)} times for {len(y)} values")
    floor = FLOORS.get(name, 0.0) if floor is None else floor
    t = np.asarray(t_s, dtype=float) / 3600.0
    v = np.asarray(y, dtype=float)
    keep = ~np.isnan(v)
    t, v = t[keep], v[keep]
    n = len(t)
    if n < MIN_FIT:
        return Trend(name, n, 0.0, (-math.inf, math.inf), 0.0, 0.0, floor)
    tm = float(t.mean())
    sxx = float(((t - tm) ** 2).sum())
    vm = float(v.mean())
    if sxx == 0.0:
        return Trend(name, n, 0.0, (-math.inf, math.inf), 0.0, float(v.std()), floor, (tm, vm))
    slope = float(((t - tm) * (v - vm)).sum() / sxx)
    resid = v - (vm + slope * (t - tm))
    resid_std = math.sqrt(float((resid**2).sum()) / (n - 2))
    half = float(stats.t.ppf(0.975, n - 2)) * resid_std / math.sqrt(sxx)
    span_h = float(t[-1] - t[0])
    ci = (slope - half, slope + half)
    return Trend(name, n, slope, ci, span_h, resid_std, floor, (tm, vm))


def verdict(trends: Sequence[Trend]) -> bool:
    """True when every trend is flat."""
    return all(tr.flat for tr in trends)
