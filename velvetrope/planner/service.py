"""The effective service rate of one engine replica, derived from the engine model.

A continuous-batching engine is not one server with a fixed rate μ.  Every iteration
advances every running sequence by one token, so more concurrency means more requests
finished per second, but each iteration also takes longer (more decodes, more KV-cache
reads, more prefill chunks squeezed in): throughput rises and flattens while the time
each request spends in the engine keeps growing.  Long generations make every iteration
longer for everyone (convoys), and when the KV cache runs out the engine preempts and
throughput stops rising at all.

The service curve
-----------------
:class:`ServiceCurve` holds, for a given :class:`~velvetrope.engine.EngineProfile` and length
mix (:class:`~velvetrope.planner.length_mix.LengthMix`), the throughput ``X(n)``
(requests/s) and the mean residence ``R(n) = n / X(n)`` (seconds a request spends in the
engine, by Little's law) at a fixed concurrency ``n``, on the grid
``n ∈ {1, 2, 4, …, max_num_seqs}`` (:func:`concurrency_grid`).
:mod:`velvetrope.planner.service_methods` gets it three ways: the real batcher in a closed
loop (the default), the profile's step-time formula, or throughputs measured elsewhere.

Measured curves are *regularised*: ``X`` is replaced by the least concave majorant of the
points ``(0, 0), (n, X(n))`` and then made non-decreasing (a flat top), which removes
sampling noise without moving a well-measured point by more than the noise.  A concave
``X`` with ``X(0) = 0`` makes ``R(n)`` non-decreasing, the property the queueing model
(:mod:`velvetrope.planner.predict`) and the sizing search rely on.  Between grid points
``X`` is interpolated linearly (which keeps it concave) and beyond the grid it is flat.

A replica as a queue (the modelling assumption)
-----------------------------------------------
A replica running ``n`` requests behaves like ``n`` *virtual servers*, each serving its
request at the rate ``1/R(n)`` that the concurrency implies: the replica completes
requests at the load-dependent rate ``X(n) = n/R(n)``.  This is the flow-equivalent
server (Chandy, Herzog & Woo, "Parametric analysis of queuing networks", IBM J. Res. Dev.
19, 1975): the engine, measured at each fixed population, replaced by one state-dependent
server.  It is exact for product-form networks and an approximation here; the simulator
checks it.  Because ``R(n)`` grows with ``n``, the *effective* per-request service rate
``μ_eff = 1/R(n)`` falls as the offered load (and so the concurrency) rises — the seed's
observation, made quantitative by :func:`effective_service`.

A request's own service time is taken proportional to its iterations:
``S_i = w_i · τ`` with ``τ = R(n)/E[w]`` the mean time per iteration at the operating
point: under continuous batching every running sequence advances exactly one iteration at
a time, so requests differ in how many iterations they need, not in how fast they go.

Units: seconds, requests per second, tokens.  Bad arguments raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from velvetrope.engine.profile import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.planner.length_mix import LengthMix

__all__ = [
    "EffectiveService",
    "ServiceCurve",
    "concurrency_grid",
    "effective_service",
    "regularise_throughput",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Method = Literal["closed-loop", "analytic", "given"]


def concurrency_grid(max_num_seqs: int) -> tuple[int, ...]:
    """``(1, 2, 4, …)`` up to and including ``max_num_seqs`` (appended if not a power of 2)."""
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise PolicyError(f"max_num_seqs must be an int >= 1 (got {max_num_seqs!r})")
    grid = [1 << k for k in range(max_num_seqs.bit_length()) if 1 << k <= max_num_seqs]
    if grid[-1] != max_num_seqs:
        grid.append(max_num_seqs)
    return tuple(grid)


# --------------------------------------------------------------------------- the curve


def regularise_throughput(
    concurrency: Sequence[int] | IntArray, throughput: Sequence[float] | FloatArray
) -> FloatArray:
    """The least concave majorant of ``(0, 0), (n_i, X_i)`` at the ``n_i``, then made flat
    after its maximum (running max).  ``concurrency`` strictly increasing, ``X_i > 0``."""
    n = np.asarray(concurrency, dtype=np.float64)
    x = np.asarray(throughput, dtype=np.float64)
    if n.ndim != 1 or n.shape != x.shape or n.size == 0:
        raise PolicyError("concurrency and throughput must be aligned, non-empty 1-D arrays")
    if not bool(np.all(np.diff(n) > 0)) or n[0] <= 0:
        raise PolicyError("concurrency must be strictly increasing and > 0")
    if not bool(np.all(np.isfinite(x))) or not bool(np.all(x > 0)):
        raise PolicyError("throughput must be finite and > 0")
    pts = [(0.0, 0.0), *zip(n.tolist(), x.tolist(), strict=True)]
    hull: list[tuple[float, float]] = []
    for p in pts:  # upper hull, monotone chain
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    hx = np.array([h[0] for h in hull])
    hy = np.array([h[1] for h in hull])
    out = np.interp(n, hx, hy)
    return np.maximum.accumulate(np.maximum(out, x))


@dataclass(frozen=True, eq=False)
class ServiceCurve:
    """Throughput and residence versus concurrency for one engine and one length mix.

    ``concurrency`` is the grid; ``throughput_rps`` the regularised ``X(n)`` (req/s);
    ``raw_throughput_rps`` what was measured or computed before regularisation;
    ``step_s`` the mean iteration time at each ``n`` (s); ``preemptions_per_request``
    the preemptions per completed request (0 for the analytic method); ``mix`` the fitted
    length mix; ``method`` how it was obtained (``given``:
    :func:`~velvetrope.planner.service_methods.curve_from_measurements`, whose step times
    and preemptions are unknown, ``nan``).  See the module docstring.
    """

    profile: EngineProfile
    mix: LengthMix
    method: Method
    concurrency: IntArray
    throughput_rps: FloatArray
    raw_throughput_rps: FloatArray
    step_s: FloatArray
    preemptions_per_request: FloatArray

    def __post_init__(self) -> None:
        for a in (
            self.concurrency,
            self.throughput_rps,
            self.raw_throughput_rps,
            self.step_s,
            self.preemptions_per_request,
        ):
            a.setflags(write=False)

    @property
    def max_concurrency(self) -> int:
        """The largest concurrency on the grid (the profile's ``max_num_seqs``)."""
        return int(self.concurrency[-1])

    @property
    def max_throughput_rps(self) -> float:
        """The saturated throughput ``max_n X(n)`` (req/s)."""
        return float(self.throughput_rps[-1])

    def throughput(self, n: float) -> float:
        """``X(n)`` in req/s at (real) concurrency ``n >= 0``; 0 at 0, flat past the grid."""
        v = float(n)
        if not (math.isfinite(v) and v >= 0):
            raise PolicyError(f"concurrency must be finite and >= 0 (got {n!r})")
        xs = np.concatenate(([0.0], self.concurrency.astype(np.float64)))
        ys = np.concatenate(([0.0], self.throughput_rps))
        return float(np.interp(v, xs, ys))

    def throughput_table(self, k: int) -> FloatArray:
        """``[X(0), X(1), …, X(k)]`` at the integers (req/s), for the queueing model."""
        xs = np.concatenate(([0.0], self.concurrency.astype(np.float64)))
        ys = np.concatenate(([0.0], self.throughput_rps))
        return np.interp(np.arange(k + 1, dtype=np.float64), xs, ys)

    def residence(self, n: float) -> float:
        """``R(n) = n/X(n)``: mean seconds a request spends in the engine at concurrency
        ``n > 0`` (``R(1)`` for ``n <= 1``)."""
        v = max(float(n), 1.0)
        return v / self.throughput(v)

    def knee(self, fraction: float = 0.95) -> int:
        """The smallest grid concurrency whose throughput reaches ``fraction`` of the max.

        Past it a replica gains under ``1 − fraction`` in throughput while every request's
        residence keeps growing, so the planner does not consider larger concurrencies
        unless told to.
        """
        f = float(fraction)
        if not 0 < f <= 1:
            raise PolicyError(f"fraction must be in (0, 1] (got {fraction!r})")
        target = f * self.max_throughput_rps
        idx = int(np.argmax(self.throughput_rps >= target * (1 - 1e-12)))
        return int(self.concurrency[idx])

    def per_iteration_s(self, n: float) -> float:
        """``τ(n) = R(n)/E[w]``: mean seconds per iteration a request experiences at ``n``."""
        return self.residence(n) / self.mix.mean_work


# --------------------------------------------------------------------------- mean field


@dataclass(frozen=True, slots=True)
class EffectiveService:
    """The operating point of one replica offered ``arrival_rps`` (mean-field).

    ``concurrency`` solves ``X(n) = λ``; ``service_s = R(n) = n/λ`` is the mean time a
    request spends in the engine there and ``mu_per_slot = 1/service_s`` the effective
    service rate of one of the ``n`` virtual servers.
    """

    arrival_rps: float
    concurrency: float
    service_s: float
    mu_per_slot: float
    utilisation: float


def effective_service(curve: ServiceCurve, arrival_rps: float) -> EffectiveService:
    """Where a replica settles when offered ``arrival_rps`` req/s (no queueing, mean field).

    The concurrency the load implies is the ``n`` with ``X(n) = λ`` (Little: ``n = λ·R(n)``),
    found by inverting the piecewise-linear, non-decreasing ``X``.  Since ``R`` grows with
    ``n``, ``mu_per_slot`` falls as ``λ`` rises: the seed's "effective μ falls as ρ rises".
    ``utilisation`` is ``λ / max X``.  Raises :class:`~velvetrope.errors.PolicyError` when
    ``λ >= max X`` (no stationary operating point: the engine's own queue grows).
    """
    lam = float(arrival_rps)
    if not (math.isfinite(lam) and lam > 0):
        raise PolicyError(f"arrival_rps must be finite and > 0 (got {arrival_rps!r})")
    xmax = curve.max_throughput_rps
    if lam >= xmax:
        raise PolicyError(
            f"{lam:g} req/s is at or beyond the replica's saturated throughput {xmax:g} req/s"
        )
    xs = np.concatenate(([0.0], curve.concurrency.astype(np.float64)))
    ys = np.concatenate(([0.0], curve.throughput_rps))
    i = int(np.searchsorted(ys, lam, side="left"))  # ys[i-1] < lam <= ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    n = float(x0 + (x1 - x0) * (lam - y0) / (y1 - y0))
    s = n / lam
    return EffectiveService(lam, n, s, 1.0 / s, lam / xmax)
