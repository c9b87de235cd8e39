"""The seeds' rules of thumb and the closed-form bounds the planner prints beside its model.

Pure arithmetic on a few numbers, no engine model, shared by the full planner
(:mod:`velvetrope.planner.sizing`) and the measured-throughput planner
(:mod:`velvetrope.planner.measured`):

* :func:`replicas_for_utilisation`: ``ceil(peak / (per-replica × ρ))``, the second seed's
  sizing rule (50 req/s at 12 req/s per worker and ρ = 0.6: 7 workers);
* :func:`queue_bound`: the deepest queue that still drains within a wait budget;
* :func:`queue_depth_rule_of_thumb`: the first seed's ``(L/S) × concurrency × 1.5``
  (its example: 240);
* the first seed's edge bucket (:data:`RULE_OF_THUMB_FRACTION`, :data:`RULE_OF_THUMB_BURST_S`);
* :func:`seed_keda_equivalent`: the seed's KEDA threshold, 8 on
  ``vllm:num_requests_waiting``, as a gateway queue depth;
* :func:`rho_warning`: the sentence for a target utilisation above 0.85.

Bad values raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math

from velvetrope.errors import PolicyError

__all__ = [
    "HIGH_RHO",
    "RULE_OF_THUMB_BURST_S",
    "RULE_OF_THUMB_FRACTION",
    "RULE_OF_THUMB_QUEUE_CUSHION",
    "SEED_KEDA_WAITING",
    "queue_bound",
    "queue_depth_rule_of_thumb",
    "replicas_for_utilisation",
    "rho_warning",
    "seed_keda_equivalent",
]

_EPS = 1e-9

RULE_OF_THUMB_FRACTION = 0.7
"""The seed's bucket refill: this fraction of the fleet's sustainable token rate."""

RULE_OF_THUMB_BURST_S = 4.0
"""The seed's bucket capacity: this many seconds of refill."""

RULE_OF_THUMB_QUEUE_CUSHION = 1.5
"""The seed's queue depth: ``(L/S) × concurrency`` times this cushion for long tails."""

SEED_KEDA_WAITING = 8
"""The seed's KEDA threshold: requests waiting per engine on ``vllm:num_requests_waiting``."""

HIGH_RHO = 0.85
"""Above this target utilisation the plan warns (the seed's batch-tier ceiling)."""


def rho_warning(rho_target: float) -> str:
    """A sentence when ``rho_target`` exceeds :data:`HIGH_RHO`, else ``""``."""
    if rho_target <= HIGH_RHO:
        return ""
    return (
        f"target ρ {rho_target:g} > {HIGH_RHO:g}: waits grow as 1/(1 − ρ), so a few percent "
        "more traffic or a slower engine multiplies them; common practice keeps ρ ≤ 0.6 for "
        "interactive traffic and ≤ 0.85 for batch"
    )


def replicas_for_utilisation(peak_rps: float, per_replica_rps: float, rho: float) -> int:
    """``ceil(peak / (per_replica × ρ))``: replicas so that the peak runs at ρ or below.

    The seed's rule: 50 req/s at 12 req/s per worker and ρ = 0.6 gives 7.  A quotient
    within 1e-9 of an integer counts as that integer (no extra replica for rounding noise).
    """
    lam, mu, r = float(peak_rps), float(per_replica_rps), float(rho)
    for name, v in (("peak_rps", lam), ("per_replica_rps", mu)):
        if not (math.isfinite(v) and v > 0):
            raise PolicyError(f"{name} must be finite and > 0 (got {v!r})")
    if not (0 < r < 1):
        raise PolicyError(f"rho must be in (0, 1) (got {rho!r})")
    return max(1, math.ceil(lam / (mu * r) - _EPS))


def queue_bound(service_s: float, wait_budget_s: float, concurrency: int) -> int:
    """``⌊concurrency · wait_budget / service⌋``: the deepest queue that still drains in time.

    With ``concurrency`` slots busy and a mean service time ``service_s``, a slot frees
    every ``service_s/concurrency`` seconds on average, so the request at position ``Q``
    starts after ``Q·service_s/concurrency``.  Bounding ``Q`` by this value means every
    admitted request can start within ``wait_budget_s``.  For an end-to-end p99 budget ``L``
    pass ``wait_budget_s = L − S``: ``(L − S)/S × concurrency``.  The seed's example
    ``S = 0.8, L = 4, concurrency 32`` gives 128 (160 if all 4 s may be spent waiting).
    A budget ``<= 0`` gives 0: every request that cannot start at once would miss it.
    """
    s, w = float(service_s), float(wait_budget_s)
    if not (math.isfinite(s) and s > 0):
        raise PolicyError(f"service_s must be finite and > 0 (got {service_s!r})")
    if not math.isfinite(w):
        raise PolicyError(f"wait_budget_s must be finite (got {wait_budget_s!r})")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise PolicyError(f"concurrency must be an int >= 1 (got {concurrency!r})")
    if w <= 0:
        return 0
    return math.floor(concurrency * w / s + _EPS)


def queue_depth_rule_of_thumb(latency_s: float, service_s: float, concurrency: int) -> int:
    """The seed's queue depth: ``⌊(L/S) × concurrency × 1.5⌋`` (``L`` the p99 latency target,
    ``S`` the mean service time); its example ``L = 4 s, S = 0.8 s``, 32 in flight, is 240.

    A rule of thumb, printed beside :func:`queue_bound` (see the module docstring for how
    they differ).  A quotient within 1e-9 of an integer counts as that integer.
    """
    lat, s = float(latency_s), float(service_s)
    for name, v in (("latency_s", lat), ("service_s", s)):
        if not (math.isfinite(v) and v > 0):
            raise PolicyError(f"{name} must be finite and > 0 (got {v!r})")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise PolicyError(f"concurrency must be an int >= 1 (got {concurrency!r})")
    return math.floor(lat / s * concurrency * RULE_OF_THUMB_QUEUE_CUSHION + _EPS)


def seed_keda_equivalent(per_replica_rps: float, saturated_rps: float) -> int:
    """Gateway queue depth per replica that drains as fast as the seed's 8 waiting requests
    at a saturated engine: ``max(1, round(8 · X(K)/X(max)))`` (see the module docstring)."""
    x, xmax = float(per_replica_rps), float(saturated_rps)
    if not (math.isfinite(x) and math.isfinite(xmax) and 0 < x <= xmax * (1 + _EPS)):
        raise PolicyError(f"need 0 < per_replica_rps <= saturated_rps (got {x!r}, {xmax!r})")
    return max(1, round(SEED_KEDA_WAITING * x / xmax))
