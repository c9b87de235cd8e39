"""The start-up question: a spike of ``k×`` for ``T`` seconds, new replicas ``S`` seconds from
being asked for to serving — which ``minReplicaCount``, KEDA threshold and queue bounds keep
the top tier inside its SLO, and what the lower tiers lose meanwhile.

Inputs: a sized :class:`~velvetrope.planner.plan.Plan` (its design rate ``λ``, replicas
``N``, concurrency ``K``, per-replica throughput ``X = X(K)``, wait budget ``W_b`` and mean
service time), the spike (``k``, ``T``, ``S``), the top tier's share ``f`` of requests and the
lower tiers' patience ``W_low`` (their ``max_wait_s``).  The bands are strict priority, as
in the presets.

**minReplicaCount** ``M``.  Whatever the autoscaler does, nothing new serves before ``S``
has passed, and a spike shorter than the gap never sees a new replica: the top tier must
hold on the replicas that are up.  With strict priority every freed slot goes to a waiting
top-tier request first, and with every slot busy (the lower tiers fill them) slots free at
the fleet's throughput ``M·X``: the top tier waits as in an M/M/1 queue served at ``μ =
M·X`` with arrivals ``f·k·λ``, whose p99 wait is ``ln(100ρ)/(μ(1 − ρ))`` for ``ρ = f·k·λ/μ``
(0 when ``ρ <= 0.01``).  ``M`` is the smallest count with that p99 within ``W_b``, and never
fewer than the plan's ``N`` (the day without a spike).

**Threshold** ``θ`` (``AverageValue`` on the gateway's queue depth).  The spike needs
``N_spike = ceil(k·λ/(X·ρ_target))`` replicas; KEDA asks for ``ceil(depth/θ)``, and the
depth cannot exceed the queue bounds ``Q``, so ``θ <= Q/N_spike`` or the spike can never ask
for what it needs; and ``θ <=`` the plan's threshold (scale before half the wait budget is
queued).  ``θ = max(1, min(plan threshold, ⌊Q/N_spike⌋))``.

**Queue bounds.**  Top band: the plan's ``⌊c·W_b/S⌋`` with ``c = M·K`` slots.  Lower bands
together: ``⌊(M·X − f·k·λ)·W_low⌋``, what drains within their patience from the capacity the
top tier leaves during the gap (0 if it leaves none); a deeper queue only holds requests that
would expire.

**The gap and the loss** come from a fluid timeline (1 s steps) run through the real KEDA and
HPA models (:class:`~velvetrope.sim.keda.KedaAutoscaler`): the base rate ``λ`` for a
warm-up, ``k·λ`` for ``T``, then ``λ`` until the backlog is gone; the fleet completes ``X``
per ready replica while work waits; the queue is scraped every 15 s; a replica asked for is
ready ``S`` later; one taken away stops serving at once.  The lower tiers' loss is what
overflows their bound (shed at the door, 503); the top tier's shed count should be 0.
``velvetrope plan --spike ... --verify`` checks all of it in the simulator.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from velvetrope.errors import PolicyError
from velvetrope.planner.plan import Plan
from velvetrope.planner.rules import queue_bound
from velvetrope.sim.keda import KedaAutoscaler, ScaledObject

__all__ = [
    "StartupPlan",
    "default_scaled_object",
    "format_startup",
    "plan_startup",
    "startup_to_dict",
    "top_p99_wait",
]

WARMUP_S = 300.0
"""Base-rate seconds before the spike in the timeline (fills the autoscaler's windows)."""
SCRAPE_S = 15.0


def top_p99_wait(top_rps: float, fleet_rps: float) -> float:
    """p99 wait of the top band when slots free at ``fleet_rps`` (M/M/1, see above)."""
    if fleet_rps <= 0 or top_rps >= fleet_rps:
        return math.inf
    rho = top_rps / fleet_rps
    if rho <= 0.01:
        return 0.0
    return math.log(100.0 * rho) / (fleet_rps * (1.0 - rho))


def default_scaled_object(threshold: float, min_replicas: int, max_replicas: int) -> ScaledObject:
    """KEDA on the gateway's queue depth (60 s average), polling 15 s, the HPA's default
    behaviour: the ScaledObject the plan's numbers go into unless one is given."""
    return ScaledObject(
        threshold=threshold,
        signals=("queue_depth",),
        window_s=60.0,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        polling_interval_s=15.0,
        query='sum(avg_over_time(velvetrope_queue_depth{pool="default"}[1m]))',
    )


@dataclass(frozen=True, slots=True)
class StartupPlan:
    """The answer (see the module docstring); times are seconds after the spike starts."""

    plan: Plan
    factor: float
    duration_s: float
    startup_s: float
    top_share: float
    lower_max_wait_s: float
    base_rps: float
    top_rps: float
    min_replicas: int
    top_wait_p99_s: float
    spike_replicas: int
    threshold: int
    queue_bound_top: int
    queue_bound_lower: int
    scaled_object: ScaledObject
    first_ask_s: float | None
    first_ready_s: float | None
    full_ready_s: float | None
    peak_replicas: int
    lower_offered: float
    lower_shed: float
    top_shed: float
    gpu_hours: float

    @property
    def lower_lost_fraction(self) -> float:
        return self.lower_shed / self.lower_offered if self.lower_offered > 0 else 0.0


def plan_startup(
    plan: Plan,
    *,
    factor: float,
    duration_s: float,
    startup_s: float,
    top_share: float = 0.2,
    lower_max_wait_s: float = 60.0,
    scaled_object: ScaledObject | None = None,
) -> StartupPlan:
    """Answer the start-up question for ``plan`` (see the module docstring).

    ``scaled_object``: the KEDA settings to put the numbers into (its threshold, min and max
    replicas are replaced); default :func:`default_scaled_object`.
    """
    for name, v in (("factor", factor), ("duration_s", duration_s), ("top_share", top_share)):
        if not (math.isfinite(v) and v > 0):
            raise PolicyError(f"{name} must be finite and > 0 (got {v!r})")
    if not (math.isfinite(startup_s) and startup_s >= 0):
        raise PolicyError(f"startup_s must be finite and >= 0 (got {startup_s!r})")
    if top_share > 1 or not lower_max_wait_s > 0:
        raise PolicyError("top_share must be in (0, 1] and lower_max_wait_s > 0")
    lam = plan.workload.design_rps
    x = plan.per_replica_rps
    top = top_share * factor * lam
    m = plan.replicas
    while top_p99_wait(top, m * x) > plan.wait_budget_s:
        m += 1
        if m > 10_000:
            raise PolicyError("the top tier's spike alone needs more than 10,000 replicas")
    n_spike = max(m, math.ceil(factor * lam / (x * plan.rho_target)))
    service = plan.at.service_mean_s
    q_top = queue_bound(service, max(plan.wait_budget_s, 0.0), m * plan.concurrency)
    q_low = max(0, math.floor((m * x - top) * lower_max_wait_s))
    theta = max(1, min(plan.keda_threshold, (q_top + q_low) // n_spike))
    base = scaled_object or default_scaled_object(theta, m, n_spike)
    so = replace(base, threshold=float(theta), min_replicas=m, max_replicas=max(n_spike, m))
    tl = _timeline(so, lam, factor, duration_s, startup_s, x, top_share, q_top, q_low, m, n_spike)
    tl["gpu_hours"] *= plan.gpus_per_replica
    return StartupPlan(
        plan=plan, factor=factor, duration_s=duration_s, startup_s=startup_s,
        top_share=top_share, lower_max_wait_s=lower_max_wait_s, base_rps=lam, top_rps=top,
        min_replicas=m, top_wait_p99_s=top_p99_wait(top, m * x), spike_replicas=n_spike,
        threshold=theta, queue_bound_top=q_top, queue_bound_lower=q_low, scaled_object=so,
        **tl,
    )  # fmt: skip


def _timeline(
    so: ScaledObject,
    lam: float,
    factor: float,
    duration_s: float,
    startup_s: float,
    x: float,
    f: float,
    q_top_max: int,
    q_low_max: int,
    m: int,
    n_spike: int,
) -> dict[str, Any]:
    """The fluid run (module docstring); returns the timeline fields of StartupPlan."""
    auto = KedaAutoscaler(so)
    asked = m
    starting: deque[float] = deque()
    ready = m
    q_top = q_low = 0.0
    shed_top = shed_low = offered_low = 0.0
    first_ask = first_ready = full = None
    peak = m
    replica_s = 0.0
    t = 0.0
    spike_end = WARMUP_S + duration_s
    next_scrape = 0.0
    dt = 1.0
    while True:
        if t >= next_scrape:
            auto.prometheus.record(t, q_top + q_low)
            next_scrape += SCRAPE_S
        while auto.next_at() <= t:
            want = auto.fire(auto.next_at(), asked, ready)
            if want > asked:
                if first_ask is None and t >= WARMUP_S:
                    first_ask = t - WARMUP_S
                starting.extend([t + startup_s] * (want - asked))
            elif want < asked:
                drop = asked - want
                while drop and starting:
                    starting.pop()
                    drop -= 1
                ready -= drop
            asked = want
        while starting and starting[0] <= t:
            starting.popleft()
            ready += 1
            if first_ready is None and t >= WARMUP_S:
                first_ready = t - WARMUP_S
        if full is None and ready >= n_spike and t >= WARMUP_S:
            full = t - WARMUP_S
        peak = max(peak, asked)
        replica_s += asked * dt
        rate = lam * factor if WARMUP_S <= t < spike_end else lam
        cap = ready * x * dt
        a_top, a_low = f * rate * dt, (1.0 - f) * rate * dt
        if WARMUP_S <= t < spike_end:
            offered_low += a_low
        served_top = min(q_top + a_top, cap)
        q_top += a_top - served_top
        served_low = min(q_low + a_low, cap - served_top)
        q_low += a_low - served_low
        if q_top > q_top_max:
            shed_top += q_top - q_top_max
            q_top = float(q_top_max)
        if q_low > q_low_max:
            shed_low += q_low - q_low_max
            q_low = float(q_low_max)
        t += dt
        if t >= spike_end and q_top + q_low < 1e-9 and not starting:
            break
        if t > spike_end + 86_400:
            break
    return {
        "first_ask_s": first_ask,
        "first_ready_s": first_ready,
        "full_ready_s": full,
        "peak_replicas": peak,
        "lower_offered": offered_low,
        "lower_shed": shed_low,
        "top_shed": shed_top,
        "gpu_hours": replica_s / 3600.0,
    }


def _s(x: float | None) -> str:
    if x is None:
        return "never"
    if not math.isfinite(x):
        return "∞"
    return f"{x:.3g} s"


def format_startup(sp: StartupPlan) -> list[str]:
    """The answer as lines, each number with its reason."""
    p = sp.plan
    x = p.per_replica_rps
    return [
        f"start-up: a spike of {sp.factor:g}× ({sp.factor * sp.base_rps:.3g} req/s) for "
        f"{sp.duration_s:g} s; a replica serves {sp.startup_s:g} s after it is asked for",
        f"  minReplicaCount   {sp.min_replicas} — the top tier ({sp.top_share:.0%} of "
        f"requests, {sp.top_rps:.3g} req/s in the spike) must hold on the replicas already up: "
        f"slots free at {sp.min_replicas} × {x:.3g} req/s, p99 wait {_s(sp.top_wait_p99_s)} "
        f"(M/M/1) within {_s(p.wait_budget_s)}; the plan's {p.replicas} for the day without a "
        "spike",
        f"  threshold         {sp.threshold} queued per replica — ≤ (queue bounds "
        f"{sp.queue_bound_top + sp.queue_bound_lower}) / {sp.spike_replicas} replicas the "
        f"spike needs (ρ {p.rho_target:g}), so a full queue can ask for them; ≤ the plan's "
        f"{p.keda_threshold}",
        f"  queue bounds      top band {sp.queue_bound_top} (⌊c·W_b/S⌋, c = "
        f"{sp.min_replicas}×{p.concurrency} slots); lower bands {sp.queue_bound_lower} "
        f"(what drains in their {sp.lower_max_wait_s:g} s from the "
        f"{max(0.0, sp.min_replicas * x - sp.top_rps):.3g} req/s the top tier leaves)",
        f"  the gap           first replica asked for at {_s(sp.first_ask_s)}, serving at "
        f"{_s(sp.first_ready_s)}, {sp.spike_replicas} serving at {_s(sp.full_ready_s)} "
        f"(KEDA {sp.scaled_object.describe()})",
        f"  lower tiers lose  {sp.lower_shed:,.0f} of {sp.lower_offered:,.0f} requests "
        f"({sp.lower_lost_fraction:.1%}) shed during the spike; the top tier "
        f"{sp.top_shed:,.0f}; {sp.gpu_hours:.3g} GPU-hours over the timeline (fluid model)",
    ]


def startup_to_dict(sp: StartupPlan) -> dict[str, Any]:
    """The answer as JSON-ready values."""
    return {
        "factor": sp.factor,
        "duration_s": sp.duration_s,
        "startup_s": sp.startup_s,
        "top_share": sp.top_share,
        "min_replicas": sp.min_replicas,
        "top_wait_p99_s": sp.top_wait_p99_s if math.isfinite(sp.top_wait_p99_s) else None,
        "spike_replicas": sp.spike_replicas,
        "threshold": sp.threshold,
        "queue_bound_top": sp.queue_bound_top,
        "queue_bound_lower": sp.queue_bound_lower,
        "first_ask_s": sp.first_ask_s,
        "first_ready_s": sp.first_ready_s,
        "full_ready_s": sp.full_ready_s,
        "lower_offered": sp.lower_offered,
        "lower_shed": sp.lower_shed,
        "top_shed": sp.top_shed,
    }
