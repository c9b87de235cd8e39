"""Argument checks shared by the closed forms of :mod:`velvetrope.planner.queueing` and
:mod:`velvetrope.planner.queueing_general`.

Each check returns the argument as a ``float`` (or an ``int`` for a server count) or raises
:class:`~velvetrope.errors.PolicyError` whose message names the parameter; :func:`stable`
refuses a utilisation ρ >= 1, for which no stationary answer exists.  The ranges are the
conventions of :mod:`velvetrope.planner.queueing`.
"""

from __future__ import annotations

import math
import numbers

from velvetrope.errors import PolicyError

__all__ = [
    "finite",
    "level",
    "mm_rates",
    "nonnegative",
    "positive",
    "second_moment",
    "servers",
    "stable",
    "time_point",
]


def finite(name: str, x: float) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{name} must be a real number (got {x!r})") from exc
    if not math.isfinite(v):
        raise PolicyError(f"{name} must be finite (got {v!r})")
    return v


def positive(name: str, x: float) -> float:
    v = finite(name, x)
    if v <= 0.0:
        raise PolicyError(f"{name} must be > 0 (got {v!r})")
    return v


def nonnegative(name: str, x: float) -> float:
    v = finite(name, x)
    if v < 0.0:
        raise PolicyError(f"{name} must be >= 0 (got {v!r})")
    return v


def time_point(name: str, t: float) -> float:
    """A time point: >= 0; +inf is allowed (every tail is 0 there)."""
    try:
        v = float(t)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{name} must be a real number (got {t!r})") from exc
    if math.isnan(v) or v < 0.0:
        raise PolicyError(f"{name} must be >= 0 (got {v!r})")
    return v


def level(name: str, p: float) -> float:
    v = finite(name, p)
    if not 0.0 <= v < 1.0:
        raise PolicyError(f"{name} must be in [0, 1) (got {v!r})")
    return v


def servers(c: int) -> int:
    if isinstance(c, bool) or not isinstance(c, numbers.Integral):
        raise PolicyError(f"c (number of servers) must be an int (got {c!r})")
    n = int(c)
    if n < 1:
        raise PolicyError(f"c (number of servers) must be >= 1 (got {n})")
    return n


def second_moment(name: str, es2: float, es: float) -> float:
    """E[S²] must be finite and at least E[S]² (Jensen), up to rounding."""
    v = positive(name, es2)
    if v < es * es * (1.0 - 1e-12):
        raise PolicyError(f"{name} (E[S²]) must be >= es² = {es * es!r} (got {v!r})")
    return v


def stable(rho: float, what: str) -> float:
    if rho >= 1.0:
        raise PolicyError(
            f"unstable queue: utilisation rho = {what} = {rho!r} >= 1; "
            "a stationary wait exists only for rho < 1"
        )
    return rho


def mm_rates(lam: float, mu: float, c: int) -> tuple[float, float, int, float]:
    """Validate an M/M/c (or G/G/c) parameter set; return (lam, mu, c, a)."""
    lam_v = positive("lam", lam)
    mu_v = positive("mu", mu)
    n = servers(c)
    a = lam_v / mu_v
    stable(a / n, f"lam/(c*mu) with lam={lam_v!r}, mu={mu_v!r}, c={n}")
    return lam_v, mu_v, n, a
