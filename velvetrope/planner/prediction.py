"""A fleet's predicted latency at one operating point, and its quantiles.

:class:`Prediction` is what :func:`velvetrope.planner.predict.predict` answers for one
fleet at one arrival rate (the model and its assumptions, numbered, are in
:mod:`velvetrope.planner.predict`).  Its quantiles of the queue wait, the end-to-end latency
and the time to first token average the wait's tail over the length mix:
``P(W + S > t) = mean_i P(W > t − S_i)``, inverted by bisection (assumption 6).
:func:`mixture_quantile` combines several operating points (one per minute of a trace,
say), weighting each by its arrivals.

Units: seconds, requests per second.  Bad arguments raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from velvetrope.errors import PolicyError
from velvetrope.planner.queueing import exponential_wait_quantile

__all__ = ["Metric", "Prediction", "mixture_quantile"]

FloatArray = NDArray[np.float64]
Metric = Literal["e2e", "wait", "ttft"]
_METRICS: tuple[Metric, ...] = ("e2e", "wait", "ttft")


@dataclass(frozen=True, eq=False)
class Prediction:
    """The model's answer for one fleet at one arrival rate (:mod:`velvetrope.planner.predict`).

    Rates in req/s, times in seconds.  ``rho = λ/(N·X(K))`` is the load relative to the
    fleet's throughput with every slot busy; ``stable`` is ``rho < 1`` (otherwise every
    latency is ``inf``).  ``p_wait`` is P(an arrival waits in the gateway queue);
    ``mean_concurrency`` the mean requests in service per replica; ``service_mean_s`` is
    ``E[S]`` and ``mu_per_slot = 1/E[S]`` the effective service rate of one slot — it
    falls as the load rises; ``per_iteration_s`` is ``τ = E[S]/E[w]``.  The properties
    ``wait_*``, ``e2e_*`` and ``ttft_*`` are the median and 99th percentile of the queue
    wait, the end-to-end latency and the time to first token (computed on first use).
    ``wait_sample`` holds the sorted waits of a G/D/c replay (assumption 4) when the
    prediction was made from an arrival pattern, and is empty otherwise (the wait is then
    the exponential approximation with ``p_wait`` and ``wait_mean_s``);
    ``waited_service_values`` and ``waited_first_values`` are then the service and
    first-token times of a request that waited (aligned with ``service_weights`` and
    ``first_weights``; assumption 5).
    """

    arrival_rps: float
    replicas: int
    concurrency: int
    rho: float
    stable: bool
    p_wait: float
    mean_concurrency: float
    service_mean_s: float
    mu_per_slot: float
    per_iteration_s: float
    wait_mean_s: float
    e2e_mean_s: float
    service_values: FloatArray = field(repr=False)
    service_weights: FloatArray = field(repr=False)
    first_values: FloatArray = field(repr=False)
    first_weights: FloatArray = field(repr=False)
    wait_sample: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))
    waited_service_values: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))
    waited_first_values: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))

    def quantile(self, metric: Metric, p: float) -> float:
        """The ``p``-quantile (``0 <= p < 1``) of ``metric`` under this prediction."""
        return mixture_quantile([self], [1.0], metric, p)

    def tail(self, metric: Metric, t: float) -> float:
        """``P(metric > t)`` under this prediction."""
        return _tail(self, _check_metric(metric), float(t))

    @cached_property
    def wait_p50_s(self) -> float:
        """Median queue wait (s)."""
        return self._wait_quantile(0.5)

    @cached_property
    def wait_p99_s(self) -> float:
        """99th-percentile queue wait (s)."""
        return self._wait_quantile(0.99)

    @cached_property
    def e2e_p50_s(self) -> float:
        """Median end-to-end latency (s)."""
        return self.quantile("e2e", 0.5)

    @cached_property
    def e2e_p99_s(self) -> float:
        """99th-percentile end-to-end latency (s)."""
        return self.quantile("e2e", 0.99)

    @cached_property
    def ttft_p50_s(self) -> float:
        """Median time to first token (s)."""
        return self.quantile("ttft", 0.5)

    @cached_property
    def ttft_p99_s(self) -> float:
        """99th-percentile time to first token (s)."""
        return self.quantile("ttft", 0.99)

    def p99(self, metric: Metric) -> float:
        """The 99th percentile of ``metric`` (cached per metric)."""
        m = _check_metric(metric)
        if m == "wait":
            return self.wait_p99_s
        return self.e2e_p99_s if m == "e2e" else self.ttft_p99_s

    def _wait_quantile(self, p: float) -> float:
        if self.wait_sample.size or not self.stable:
            return mixture_quantile([self], [1.0], "wait", p)
        return exponential_wait_quantile(self.p_wait, self.wait_mean_s, p)


def _check_metric(metric: str) -> Metric:
    for m in _METRICS:
        if metric == m:
            return m
    raise PolicyError(f"unknown latency metric {metric!r}; known: {', '.join(_METRICS)}")


def _wait_tail(pred: Prediction, x: FloatArray) -> FloatArray:
    """``P(W > x)`` elementwise: 1 for x < 0; else the share of the G/D/c sample above x,
    or ``π·exp(−x·π/E[W])`` without a sample."""
    sample = pred.wait_sample
    if sample.size:
        above = 1.0 - np.searchsorted(sample, x, side="right") / float(sample.size)
        return np.where(x < 0.0, 1.0, above)
    pw, wq = pred.p_wait, pred.wait_mean_s
    if pw <= 0.0 or wq <= 0.0:
        return np.where(x < 0.0, 1.0, 0.0)
    return np.where(x < 0.0, 1.0, pw * np.exp(-np.maximum(x, 0.0) * (pw / wq)))


def _tail(pred: Prediction, metric: Metric, t: float) -> float:
    if not pred.stable:
        return 1.0
    if metric == "wait":
        return float(_wait_tail(pred, np.array([t]))[0])
    if metric == "e2e":
        values, weights = pred.service_values, pred.service_weights
        waited = pred.waited_service_values
    else:
        values, weights = pred.first_values, pred.first_weights
        waited = pred.waited_first_values
    sample = pred.wait_sample
    if not sample.size:
        return float(np.dot(weights, _wait_tail(pred, t - values)))
    # P(W = 0, S > t) + P(W > 0, W + S_waited > t); P(W > max(x, 0)) = P(W > x, W > 0)
    n = float(sample.size)
    idle = (1.0 - pred.p_wait) * float(np.dot(weights, values > t))
    above = (n - np.searchsorted(sample, np.maximum(t - waited, 0.0), side="right")) / n
    return idle + float(np.dot(weights, above))


def mixture_quantile(
    predictions: Sequence[Prediction], weights: Sequence[float], metric: Metric, p: float
) -> float:
    """The ``p``-quantile of ``metric`` over a weighted mixture of operating points.

    ``P(M > t) = Σ_k w_k·P_k(M > t) / Σ_k w_k``; the smallest ``t`` with tail ``<= 1 − p``,
    found by bisection to a relative width of 1e-10.  ``inf`` if any point with a positive
    weight is unstable.  Weights >= 0, not all 0.
    """
    m = _check_metric(metric)
    q = float(p)
    if not 0.0 <= q < 1.0:
        raise PolicyError(f"p must be in [0, 1) (got {p!r})")
    if len(predictions) != len(weights) or not predictions:
        raise PolicyError("predictions and weights must be non-empty and aligned")
    w = np.asarray(weights, dtype=np.float64)
    if not bool(np.all(np.isfinite(w))) or bool(np.any(w < 0)) or float(w.sum()) <= 0:
        raise PolicyError("weights must be finite, >= 0 and not all 0")
    w = w / w.sum()
    live = [(pr, float(wk)) for pr, wk in zip(predictions, w, strict=True) if wk > 0]
    if any(not pr.stable for pr, _ in live):
        return math.inf
    target = 1.0 - q

    def tail(t: float) -> float:
        return sum(wk * _tail(pr, m, t) for pr, wk in live)

    if tail(0.0) <= target:
        return 0.0
    hi = 1e-3
    for pr, _ in live:
        extra = 0.0
        if m == "e2e":
            extra = float(
                max(np.max(pr.service_values), np.max(pr.waited_service_values, initial=0.0))
            )
        elif m == "ttft":
            extra = float(max(np.max(pr.first_values), np.max(pr.waited_first_values, initial=0.0)))
        if pr.wait_sample.size:
            extra += float(pr.wait_sample[-1])
        elif pr.p_wait > 0 and pr.wait_mean_s > 0:
            extra += pr.wait_mean_s / pr.p_wait * math.log(max(pr.p_wait / target, 1.0))
        hi = max(hi, 2.0 * extra + 1e-3)
    while tail(hi) > target:
        hi *= 2.0
    lo = 0.0
    while hi - lo > 1e-10 * hi:
        mid = 0.5 * (lo + hi)
        if tail(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi
