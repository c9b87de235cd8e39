"""Sizing from a measured per-worker throughput: no engine profile, no length mix.

The second seed sizes a fleet from one number a team usually knows from a load test:
"12 req/s per worker, peak 50 req/s, ρ ≤ 0.6: 7 workers".  :func:`plan_from_throughput`
does that arithmetic (:func:`~velvetrope.planner.rules.replicas_for_utilisation`), and
with the requests in flight per worker (``concurrency``, ``K``) it adds what follows from
Little's law alone: a request holds its slot ``S = K/X`` on average, so the queue wait is
the G/D/c replay of the arrivals (:func:`~velvetrope.planner.queueing_general.gdc_waits`,
the same wait model as the full planner, :mod:`velvetrope.planner.predict`), and the queue
bound, its rule of thumb and the KEDA threshold follow as in :mod:`velvetrope.planner.sizing`.
With a p99 wait SLO the fleet grows past the utilisation bound until the SLO holds.

What it cannot do without an engine model: time to first token and end-to-end latency
(they need the service-time distribution), and the throughput at other concurrencies (so
``K`` is not searched: the measured throughput is for the ``K`` given, or for the load
test's own concurrency).

Token throughput converts to requests at the workload's mean prompt + output tokens per
request.  Units: req/s, tokens/s, seconds.  Bad values raise
:class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from velvetrope.errors import PolicyError
from velvetrope.planner.plan import P99Target
from velvetrope.planner.queueing_general import gdc_waits
from velvetrope.planner.rules import (
    SEED_KEDA_WAITING,
    queue_bound,
    queue_depth_rule_of_thumb,
    replicas_for_utilisation,
    rho_warning,
)
from velvetrope.planner.words import count

__all__ = ["MeasuredPlan", "format_measured_plan", "measured_plan_to_dict", "plan_from_throughput"]

FloatArray = NDArray[np.float64]

_P = 0.99


@dataclass(frozen=True, eq=False)
class MeasuredPlan:
    """A plan from a measured throughput (see the module docstring).

    Attributes:
        design_rps, design_rate_origin: the rate sized for and where it came from.
        per_worker_rps, per_worker_origin: ``X``, and how it was obtained.
        tier, rho_target: the target utilisation and the tier it came from.
        replicas: ``N``; ``replicas_for_rho``: what the utilisation bound alone needs.
        rho, rho_one_fewer: ``λ/(N·X)`` at ``N`` and at ``N − 1`` (None when ``N == 1``).
        concurrency: ``K``, requests in flight per worker, or None (then nothing below).
        slot_s: ``S = K/X``, the mean time a request holds its slot (Little).
        slo: the p99 wait bound sized for, or None (the utilisation bound alone).
        arrivals: a sentence naming the arrivals the wait was replayed on.
        wait_p99_s, wait_p99_one_fewer_s: the replayed p99 wait at ``N`` and ``N − 1``
            (``inf`` when overloaded, None without ``K`` or for ``N − 1 = 0``).
        queue_bound_pool, rule_queue_bound_pool, keda_threshold, seed_keda_threshold: as in
            :class:`~velvetrope.planner.plan.Plan` (the seed's KEDA 8 carries over as 8:
            the measured ``X`` is taken as the saturated throughput).
        warnings: sentences, e.g. a target ρ above 0.85.
    """

    design_rps: float
    design_rate_origin: str
    per_worker_rps: float
    per_worker_origin: str
    tier: str
    rho_target: float
    replicas: int
    replicas_for_rho: int
    rho: float
    rho_one_fewer: float | None
    concurrency: int | None = None
    slot_s: float | None = None
    slo: P99Target | None = None
    arrivals: str = ""
    wait_p99_s: float | None = None
    wait_p99_one_fewer_s: float | None = None
    queue_bound_pool: int | None = None
    rule_queue_bound_pool: int | None = None
    keda_threshold: int | None = None
    seed_keda_threshold: int | None = None
    warnings: tuple[str, ...] = ()


def _p99_wait(times: FloatArray, servers: int, slot_s: float, lam: float, full: float) -> float:
    if lam >= full:
        return math.inf
    w = np.sort(gdc_waits(times, servers, slot_s))
    return float(w[math.ceil(_P * w.size) - 1])


def plan_from_throughput(
    design_rps: float,
    per_worker_rps: float,
    *,
    rho_target: float,
    tier: str = "",
    design_rate_origin: str = "given",
    per_worker_origin: str = "given",
    concurrency: int | None = None,
    slo: P99Target | None = None,
    arrival_pattern: FloatArray | None = None,
    arrivals: str = "Poisson arrivals",
    max_replicas: int = 10_000,
) -> MeasuredPlan:
    """Size for ``design_rps`` req/s at ``per_worker_rps`` per worker and ``ρ <= rho_target``.

    With ``concurrency`` (``K``), the p99 queue wait is replayed on ``arrival_pattern``
    (arrival times at 1 req/s, scaled to the design rate; default: a seeded Poisson sample)
    and, with a ``slo`` on the wait, the fleet grows until the replayed p99 meets it.  An
    SLO on TTFT or end-to-end needs an engine model and raises
    :class:`~velvetrope.errors.PolicyError`, as does one needing more than ``max_replicas``.
    """
    lam, x = float(design_rps), float(per_worker_rps)
    n_rho = replicas_for_utilisation(lam, x, rho_target)
    if n_rho > max_replicas:
        raise PolicyError(f"the utilisation bound alone needs {n_rho} > {max_replicas} replicas")
    warnings = [w for w in (rho_warning(rho_target),) if w]
    if slo is not None and slo.metric != "wait":
        raise PolicyError(
            f"with a measured throughput only the queue wait is modelled; an SLO on "
            f"{slo.metric} needs an engine profile (drop --worker-rps/--worker-tps)"
        )
    if concurrency is None:
        if slo is not None:
            raise PolicyError("checking a wait SLO needs --concurrency (requests per worker)")
        return MeasuredPlan(
            lam, design_rate_origin, x, per_worker_origin, tier, float(rho_target), n_rho,
            n_rho, lam / (n_rho * x), lam / ((n_rho - 1) * x) if n_rho > 1 else None,
            warnings=tuple(warnings),
        )  # fmt: skip
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise PolicyError(f"concurrency must be an int >= 1 (got {concurrency!r})")
    k = concurrency
    slot = k / x
    if arrival_pattern is None:
        from velvetrope.sim import Poisson

        arrival_pattern = Poisson(1.0).times(0, count=20_000)
    times = np.asarray(arrival_pattern, dtype=np.float64) / lam
    n = n_rho
    wait = _p99_wait(times, n * k, slot, lam, n * x)
    while slo is not None and wait > slo.p99_s:
        n += 1
        if n > max_replicas:
            raise PolicyError(f"the SLO {slo} needs more than {max_replicas} replicas")
        wait = _p99_wait(times, n * k, slot, lam, n * x)
    fewer = _p99_wait(times, (n - 1) * k, slot, lam, (n - 1) * x) if n > 1 else None
    budget = slo.p99_s if slo is not None else None
    return MeasuredPlan(
        design_rps=lam,
        design_rate_origin=design_rate_origin,
        per_worker_rps=x,
        per_worker_origin=per_worker_origin,
        tier=tier,
        rho_target=float(rho_target),
        replicas=n,
        replicas_for_rho=n_rho,
        rho=lam / (n * x),
        rho_one_fewer=lam / ((n - 1) * x) if n > 1 else None,
        concurrency=k,
        slot_s=slot,
        slo=slo,
        arrivals=arrivals,
        wait_p99_s=wait,
        wait_p99_one_fewer_s=fewer,
        queue_bound_pool=None if budget is None else queue_bound(slot, budget, n * k),
        rule_queue_bound_pool=(
            None if budget is None else queue_depth_rule_of_thumb(budget, slot, n * k)
        ),
        keda_threshold=None if budget is None else max(1, math.floor(x * budget / 2.0)),
        seed_keda_threshold=SEED_KEDA_WAITING,
        warnings=tuple(warnings),
    )


def _s(x: float) -> str:
    return "∞ (overloaded)" if not math.isfinite(x) else f"{x:.3g} s"


def format_measured_plan(p: MeasuredPlan) -> list[str]:
    """The human-readable measured plan, one number per line with the reason for it."""
    lam = f"{p.design_rps:.3g}"
    out = [f"velvetrope plan: {lam} req/s at {p.per_worker_rps:.3g} req/s per worker"]
    out += [f"warning: {w}" for w in p.warnings]
    x, n = p.per_worker_rps, p.replicas
    tier = f" (tier {p.tier})" if p.tier else ""
    out += [
        "",
        f"  design rate       {lam} req/s — {p.design_rate_origin}",
        f"  per worker        {x:.3g} req/s — {p.per_worker_origin}; no engine profile used",
    ]
    rule = (
        f"ceil({lam} / ({x:.3g} × {p.rho_target:g})) = {p.replicas_for_rho}, the "
        f"usual utilisation rule at ρ ≤ {p.rho_target:g}{tier}"
    )
    if n > p.replicas_for_rho and p.slo is not None:
        rule += f"; the p99 wait meets {_s(p.slo.p99_s)} only from {n}"
    out.append(f"  replicas          {n} — {rule}")
    out.append(f"  utilisation ρ     {p.rho:.3f} — {lam} / ({n} × {x:.3g}) req/s")
    if p.rho_one_fewer is not None and n > 1:
        r = p.rho_one_fewer
        why = f"ρ {r:.3f}" + (
            " ≥ 1, overloaded"
            if r >= 1
            else f" > target {p.rho_target:g}"
            if r > p.rho_target
            else ""
        )
        if p.wait_p99_one_fewer_s is not None:
            why += f", p99 wait {_s(p.wait_p99_one_fewer_s)}"
        out.append(f"  {'at ' + count(n - 1, 'replica'):<18}{why} — why not one fewer")
    if p.concurrency is None or p.slot_s is None or p.wait_p99_s is None:
        out.append(
            "  (give --concurrency, the requests in flight per worker, for waits and bounds)"
        )
        return out
    k = p.concurrency
    out.append(
        f"  concurrency       {k} per worker (pool max_in_flight {n * k}) — a request holds "
        f"its slot {_s(p.slot_s)} on average: K/X, Little's law"
    )
    out.append(
        f"  queue wait        p99 {_s(p.wait_p99_s)} — {p.arrivals} at {lam} req/s "
        f"replayed through {n * k} slots of {_s(p.slot_s)} each (G/D/c)"
    )
    if p.slo is not None and p.queue_bound_pool is not None:
        out.append(
            f"  queue bound       {p.queue_bound_pool} in the pool — ⌊c·W_b/S⌋ = "
            f"⌊{n * k} × {_s(p.slo.p99_s)} / {_s(p.slot_s)}⌋"
        )
        out.append(
            f"    rule of thumb   {p.rule_queue_bound_pool} — the common rule (L/S) × "
            "concurrency × 1.5"
        )
        out.append(
            f"  KEDA threshold    {p.keda_threshold} queued per replica (minReplicaCount {n}) — "
            f"half the {_s(p.slo.p99_s)} wait budget at {x:.3g} req/s; the common rule's 8 on "
            f"vllm:num_requests_waiting is {p.seed_keda_threshold} on velvetrope_queue_depth"
        )
    return out


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def measured_plan_to_dict(p: MeasuredPlan) -> dict[str, Any]:
    """The measured plan as JSON data: ``schema`` 1, ``mode`` ``"measured"``, the inputs,
    the plan and, with a concurrency, the wait, the bounds and KEDA (``null`` when absent
    or infinite)."""
    return {
        "schema": 1,
        "mode": "measured",
        "inputs": {
            "design_rps": p.design_rps,
            "design_rate_origin": p.design_rate_origin,
            "per_worker_rps": p.per_worker_rps,
            "per_worker_origin": p.per_worker_origin,
            "tier": p.tier,
            "rho_target": p.rho_target,
            "concurrency_per_worker": p.concurrency,
            "slo": None if p.slo is None else {"metric": p.slo.metric, "p99_s": p.slo.p99_s},
            "arrivals": p.arrivals,
        },
        "plan": {
            "replicas": p.replicas,
            "replicas_for_rho": p.replicas_for_rho,
            "rho": p.rho,
            "rho_one_fewer": p.rho_one_fewer,
            "slot_s": p.slot_s,
            "wait_p99_s": _num(p.wait_p99_s),
            "wait_p99_one_fewer_s": _num(p.wait_p99_one_fewer_s),
        },
        "queue": {"bound_pool": p.queue_bound_pool, "rule_of_thumb": p.rule_queue_bound_pool},
        "keda": {
            "threshold_per_replica": p.keda_threshold,
            "seed_rule": {
                "vllm_num_requests_waiting": SEED_KEDA_WAITING,
                "gateway_queue_depth_per_replica": p.seed_keda_threshold,
            },
        },
        "warnings": list(p.warnings),
    }
