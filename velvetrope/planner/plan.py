"""A sized plan as data: the SLO it meets, its size, its admission settings.

:func:`velvetrope.planner.sizing.make_plan` makes a :class:`Plan` for a
:class:`P99Target`; :mod:`velvetrope.planner.plan_report` renders it as text and as JSON.
Units: seconds, requests per second, tokens per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from velvetrope.errors import PolicyError
from velvetrope.planner.prediction import Metric, Prediction
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.workload import PlanWorkload

__all__ = ["BucketSizing", "P99Target", "Plan"]


@dataclass(frozen=True, slots=True)
class P99Target:
    """A p99 bound: ``metric`` (``e2e``, ``wait`` or ``ttft``) at most ``p99_s`` seconds."""

    metric: Metric
    p99_s: float

    def __post_init__(self) -> None:
        if self.metric not in ("e2e", "wait", "ttft"):
            raise PolicyError(f"unknown SLO metric {self.metric!r}; known: e2e, wait, ttft")
        if not (math.isfinite(self.p99_s) and self.p99_s > 0):
            raise PolicyError(f"the SLO's p99 must be finite and > 0 s (got {self.p99_s!r})")

    def __str__(self) -> str:
        return f"p99 {self.metric} <= {self.p99_s:g} s"


@dataclass(frozen=True, slots=True)
class BucketSizing:
    """One tenant's edge token bucket (tokens = prompt + output), two ways.

    ``rule_*``: the seed's rule of thumb (refill = 0.7 × the fleet's sustainable token
    rate, capacity = 4 s of refill).  ``model_*``: the tenant's share of the token rate
    at the target ρ, and the largest burst the fleet clears within the wait budget.
    Refill in tokens per second (``× 60`` for ``tokens_per_minute``), capacity in tokens.
    """

    tenant: str
    share: float
    rule_refill_tps: float
    rule_capacity_tokens: float
    model_refill_tps: float
    model_capacity_tokens: float


@dataclass(frozen=True, eq=False)
class Plan:
    """A sized plan; :func:`~velvetrope.planner.plan_report.format_plan` explains every field.

    Attributes:
        workload, curve, slo: the inputs.
        tier: the tier sized for; ``rho_target`` its target utilisation.
        replicas: the recommended number of replicas ``N``; ``gpus = N × gpus_per_replica``.
        concurrency: slots per replica ``K`` (``max_in_flight = N·K`` for the pool).
        replicas_for_rho: ``N_ρ``, what the utilisation bound alone needs at ``K``.
        binding: ``"rho"`` if ``N == N_ρ`` (the SLO is met there), else ``"slo"``.
        candidates: ``(K, N or None)`` for every concurrency tried (None: infeasible).
        at, one_fewer: the predictions at ``N`` and ``N − 1`` (None when ``N == 1``).
        per_replica_rps: ``X(K)``; ``tokens_per_request``: mean prompt + output tokens.
        wait_budget_s: ``W_b``, the part of the p99 budget left for waiting.
        queue_bound_pool: the band's bound for the pool (``max_queued``);
        queue_bound_per_replica: the same per replica.
        rule_queue_bound_pool, rule_queue_bound_per_replica: the seed's rule of thumb for
            the same bounds (:func:`~velvetrope.planner.rules.queue_depth_rule_of_thumb`
            with ``L`` the SLO's p99).
        keda_threshold: queue depth per replica at which KEDA adds a replica.
        seed_keda_threshold: the seed's 8 on ``vllm:num_requests_waiting`` as a gateway
            queue depth per replica
            (:func:`~velvetrope.planner.rules.seed_keda_equivalent`).
        warnings: where the model is known to be weak for these inputs (see
            :func:`~velvetrope.planner.sizing.plan_warnings`), one sentence each.
        buckets: per tenant, rule of thumb and model.
    """

    workload: PlanWorkload
    curve: ServiceCurve
    slo: P99Target
    tier: str
    rho_target: float
    replicas: int
    gpus_per_replica: int
    concurrency: int
    replicas_for_rho: int
    binding: Literal["rho", "slo"]
    candidates: tuple[tuple[int, int | None], ...]
    at: Prediction
    one_fewer: Prediction | None
    per_replica_rps: float
    tokens_per_request: float
    wait_budget_s: float
    queue_bound_pool: int
    queue_bound_per_replica: int
    rule_queue_bound_pool: int
    rule_queue_bound_per_replica: int
    keda_threshold: int
    seed_keda_threshold: int
    buckets: tuple[BucketSizing, ...]
    warnings: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        """``replicas × gpus_per_replica``."""
        return self.replicas * self.gpus_per_replica

    @property
    def max_in_flight(self) -> int:
        """The pool's ``max_in_flight``: ``replicas × concurrency``."""
        return self.replicas * self.concurrency
