"""Workloads: synthesis, transforms that keep them sorted, and statistics.

A workload is a plain ``list[TraceRequest]`` (:class:`~velvetrope.sim.trace_request.TraceRequest`)
sorted by arrival time ``t``.  Recorded traces come from :mod:`velvetrope.sim.traces`,
arrival times of synthetic ones from :mod:`velvetrope.sim.arrivals`, lengths from
:mod:`velvetrope.sim.length_models`, tenants from :mod:`velvetrope.sim.tenant_mix`; this
module puts them together and works on the result:

* :func:`synthesize`, which puts arrival times, lengths and a tenant mix together;
* transforms that keep a workload sorted: :func:`rescale_time`, :func:`scale_to_rate`,
  :func:`head`, :func:`time_window`, :func:`merge`;
* :func:`trace_stats` and :func:`index_of_dispersion`.

Everything random takes a seed (:data:`~velvetrope.sim.seeds.Seed`): the same seed gives
the same workload, on every run.  Bad parameters raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from velvetrope import checks
from velvetrope.errors import PolicyError
from velvetrope.sim.length_models import LengthModel
from velvetrope.sim.seeds import Seed, as_generator
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import FloatArray, TraceRequest, request_columns

__all__ = [
    "TraceStats",
    "head",
    "index_of_dispersion",
    "merge",
    "rescale_time",
    "scale_to_rate",
    "synthesize",
    "time_window",
    "trace_stats",
]


def _check_sorted(requests: Sequence[TraceRequest], what: str) -> None:
    for i in range(1, len(requests)):
        if requests[i].t < requests[i - 1].t:
            raise PolicyError(
                f"{what}: requests must be sorted by t; request {i} at t={requests[i].t!r} "
                f"comes after t={requests[i - 1].t!r}"
            )


# --------------------------------------------------------------------------- synthesis


def synthesize(
    times: Sequence[float] | FloatArray,
    lengths: LengthModel,
    *,
    seed: Seed,
    mix: TenantMix | None = None,
    max_tokens: int | None = None,
) -> list[TraceRequest]:
    """A synthetic workload: one request per arrival time in ``times``.

    ``times`` must be finite, ``>= 0`` and non-decreasing (what the generators of
    :mod:`velvetrope.sim.arrivals` return).  Lengths come from ``lengths``, tenants and tiers
    from ``mix`` (``None``: every request is tenant ``"default"`` with no tier).  When
    ``max_tokens`` is given every request declares it, and true outputs longer than it are
    cut to it, as the engine would.  Lengths are drawn before tenants, from one generator.
    """
    ts = np.asarray(times, dtype=np.float64)
    if ts.ndim != 1:
        raise PolicyError("times must be a one-dimensional sequence")
    if ts.size and not (np.all(np.isfinite(ts)) and ts[0] >= 0.0 and np.all(np.diff(ts) >= 0)):
        raise PolicyError("times must be finite, >= 0 and non-decreasing")
    cap = None if max_tokens is None else checks.count("max_tokens", max_tokens, 1)
    rng = as_generator(seed)
    n = int(ts.size)
    prompts, outputs = lengths.sample(rng, n)
    if prompts.shape != (n,) or outputs.shape != (n,):
        raise PolicyError(f"length model returned arrays of the wrong shape for n={n}")
    if cap is not None:
        outputs = np.minimum(outputs, cap)
    if mix is None:
        labels: list[tuple[str, str | None]] = [("default", None)] * n
    else:
        labels = [(mix.entries[i][0], mix.entries[i][1]) for i in mix.draw(rng, n).tolist()]
    return [
        TraceRequest(t, p, o, tenant, tier, cap)
        for t, p, o, (tenant, tier) in zip(
            ts.tolist(), prompts.tolist(), outputs.tolist(), labels, strict=True
        )
    ]


# --------------------------------------------------------------------------- transforms


def rescale_time(requests: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """Compress (``factor > 1``) or stretch (``factor < 1``) arrivals: ``t -> t / factor``.

    ``factor`` multiplies the arrival rate: 2 doubles it.  Order, token counts and every
    other field are kept.
    """
    f = checks.number("factor", factor)
    return [replace(r, t=r.t / f) for r in requests]


def scale_to_rate(requests: Sequence[TraceRequest], target_rps: float) -> list[TraceRequest]:
    """Rescale time so that the mean arrival rate (as :func:`trace_stats` measures it) is
    ``target_rps`` requests per second."""
    target = checks.number("target_rps", target_rps)
    return rescale_time(requests, target / trace_stats(requests).mean_rps)


def head(requests: Sequence[TraceRequest], n: int) -> list[TraceRequest]:
    """The first ``n`` requests (all of them if there are fewer)."""
    return list(requests[: checks.count("n", n, 0)])


def time_window(
    requests: Sequence[TraceRequest], start: float, end: float, *, rebase: bool = True
) -> list[TraceRequest]:
    """The requests with ``start <= t < end`` of a sorted workload.

    ``0 <= start <= end``.  With ``rebase`` (the default) times are shifted by ``-start``, so
    the window starts at 0 and keeps the idle gap before its first request.
    """
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
            raise PolicyError(f"{name} must be a number, got {v!r}")
    if start < 0:
        raise PolicyError(f"start must be >= 0, got {start}")
    if end < start:
        raise PolicyError(f"end ({end}) must be >= start ({start})")
    times = [r.t for r in requests]
    lo = bisect_left(times, start)
    hi = bisect_left(times, end)
    window = requests[lo:hi]
    if not rebase or start == 0.0:
        return list(window)
    return [replace(r, t=max(r.t - start, 0.0)) for r in window]


def merge(*workloads: Sequence[TraceRequest]) -> list[TraceRequest]:
    """Interleave sorted workloads into one sorted workload (stable: ties keep argument
    order).  Each input must be sorted by ``t``."""
    for i, w in enumerate(workloads):
        _check_sorted(w, f"workload {i}")
    return list(heapq.merge(*workloads, key=lambda r: r.t))


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Summary of a workload.

    ``mean_rps = (count - 1) / span_s``: arrivals per second between the first and the last
    request.  Token rates are total tokens over the same span.  Percentiles interpolate
    linearly.  ``output_scv`` is C_s², the squared coefficient of variation of output lengths
    (variance / mean², population variance): 1 for exponential sizes, 0 for fixed.
    ``interarrival_cv`` is std / mean of the gaps between consecutive arrivals: 1 for Poisson.
    """

    count: int
    span_s: float
    mean_rps: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    prompt_mean: float
    prompt_p50: float
    prompt_p99: float
    output_mean: float
    output_p50: float
    output_p99: float
    output_scv: float
    interarrival_cv: float


def trace_stats(requests: Sequence[TraceRequest]) -> TraceStats:
    """Summarise a sorted workload of at least two requests spread over a positive span."""
    if len(requests) < 2:
        raise PolicyError(f"trace_stats needs at least 2 requests, got {len(requests)}")
    t, p, o = request_columns(requests)
    gaps = np.diff(t)
    if np.any(gaps < 0):
        raise PolicyError("trace_stats: requests must be sorted by t")
    span = float(t[-1] - t[0])
    if span <= 0.0:
        raise PolicyError("trace_stats: all requests arrive at the same time (zero span)")
    o_mean = float(o.mean())
    gap_mean = float(gaps.mean())
    p50p, p99p = np.percentile(p, [50, 99])
    p50o, p99o = np.percentile(o, [50, 99])
    return TraceStats(
        count=len(requests),
        span_s=span,
        mean_rps=(len(requests) - 1) / span,
        prompt_tokens_per_s=float(p.sum()) / span,
        output_tokens_per_s=float(o.sum()) / span,
        prompt_mean=float(p.mean()),
        prompt_p50=float(p50p),
        prompt_p99=float(p99p),
        output_mean=o_mean,
        output_p50=float(p50o),
        output_p99=float(p99o),
        output_scv=float(o.var()) / o_mean**2 if o_mean > 0 else 0.0,
        interarrival_cv=float(gaps.std()) / gap_mean,
    )


def index_of_dispersion(requests: Sequence[TraceRequest], window_s: float) -> float:
    """Variance / mean of arrival counts in consecutive windows of ``window_s`` seconds.

    Windows tile ``[0, k * window_s)`` for the largest ``k`` that fits in the workload's span
    (a partial last window is dropped).  About 1 for Poisson arrivals, above 1 for bursty ones.
    """
    w = checks.number("window_s", window_s)
    if not requests:
        raise PolicyError("index_of_dispersion needs at least one request")
    t = np.fromiter((r.t for r in requests), dtype=np.float64, count=len(requests))
    k = int(t[-1] // w)
    if k < 2:
        raise PolicyError(f"the workload spans fewer than two windows of {w} s")
    counts = np.bincount((t[t < k * w] // w).astype(np.int64), minlength=k)
    mean = float(counts.mean())
    return float(counts.var()) / mean if mean > 0 else 0.0
