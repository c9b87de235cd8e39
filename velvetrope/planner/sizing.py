"""Sizing: the fewest replicas that meet an SLO, and the admission settings that go with them.

Inputs: a :class:`~velvetrope.planner.workload.PlanWorkload` (design rate, length mix,
arrival pattern, tenants), a :class:`~velvetrope.planner.service.ServiceCurve` for the engine, an
:class:`~velvetrope.planner.plan.P99Target` (a p99 bound on end-to-end latency, queue wait or
time to first token) and a target utilisation ρ (by tier: :data:`TIER_RHO`, 0.6 interactive,
0.85 batch).  The answer is a :class:`~velvetrope.planner.plan.Plan`.

The search (:func:`make_plan`)
------------------------------
For a per-replica concurrency ``K`` (the slots the admission core gives each replica),
``ρ = λ/(N·X(K))`` is the design rate over the fleet's throughput with every slot busy.

1. The utilisation bound gives ``N_ρ = ceil(λ/(X(K)·ρ_target))``
   (:func:`~velvetrope.planner.rules.replicas_for_utilisation` — the seed's rule: 50 req/s
   at 12 req/s per worker and ρ = 0.6 is ``ceil(6.94) = 7``).
2. If the model (:func:`velvetrope.planner.predict.predict`) says ``N_ρ`` meets the SLO,
   that is the answer and *the ρ bound binds*; otherwise *the SLO binds*: ``N`` doubles
   until the SLO is met, then bisection finds the smallest such ``N``.  This relies on the
   predicted p99 being non-increasing in ``N``, which holds because the regularised
   throughput curve is concave (spreading the same requests over more replicas only raises
   the fleet's completion rate in every state).  An SLO below what one lightly loaded
   replica can do (the p99 of the service time at concurrency 1) can never be met and
   raises :class:`~velvetrope.errors.PolicyError`, as does one needing more than
   ``max_replicas``.
3. Unless ``K`` is given, every grid concurrency up to the service curve's knee (95 % of
   the saturated throughput; beyond it a replica gains little throughput and every request
   slows down) is tried; the plan takes the fewest replicas, then the lowest predicted p99
   of the SLO metric, then the smaller ``K``.

Both monotonicity properties follow and are tested: more load never needs fewer replicas
(``N_ρ`` grows with λ and every predicted quantile grows with λ at a fixed size), and a
tighter SLO never needs fewer (the feasible sizes only shrink).

Admission settings derived from the plan
----------------------------------------
* **Queue bound per band** (:func:`~velvetrope.planner.rules.queue_bound`): ``⌊c·W_b/S⌋``
  where ``c = N·K`` slots, ``S`` the mean service time at the design point and ``W_b`` the
  part of the p99 budget ``L`` left for waiting (``L − S`` for an end-to-end SLO, ``L`` for
  a wait SLO, ``L − mean first-token service`` for TTFT).  Derivation: with every slot busy,
  a slot frees on average every ``S/c`` seconds (Little on the ``c`` slots), so the request
  at position ``Q`` starts after ``Q·S/c``; it must start within ``W_b``.  A deeper queue
  only holds requests that would miss the SLO anyway, so the band sheds them at the door
  (503 with ``Retry-After``) instead.  The seed's worked example (``S = 800 ms``, ``L = 4
  s``, concurrency 32) gives ``32·(4 − 0.8)/0.8 = 128`` by this rule, ``32·4/0.8 = 160`` if
  the whole 4 s is a *wait* budget.
* **The seed's rule of thumb** for the same bound
  (:func:`~velvetrope.planner.rules.queue_depth_rule_of_thumb`), printed next to it:
  ``⌊(L/S) × concurrency × 1.5⌋``, the 1.5 being the seed's cushion for long-tailed
  latencies; its worked example gives ``(4/0.8) × 32 × 1.5 = 240``.  It is deeper than the
  model's bound by ``1.5·L/W_b`` (1.9× in the example): it admits requests that, at the mean
  service time, start after the SLO has passed, trading those misses for fewer 503s when
  service times run short.
* **Edge token bucket per tenant** (:class:`~velvetrope.planner.plan.BucketSizing`), cost =
  prompt + output tokens: the seed's rule of thumb, refill
  ``= sustainable tok/s per GPU × GPUs × 0.7`` (the sustainable rate being
  ``X(K)·E[tokens]`` per replica) and capacity ``4 ×`` the refill (four seconds of it); and
  the model's answer, refill ``= share × ρ_target·N·X(K)·E[tokens]`` (all tenants at their
  limits load the fleet exactly to the target ρ) and capacity
  ``= min(queue bound, spare·W_b)·E[tokens]`` with ``spare = (1 − ρ)·N·X(K)`` — the largest
  burst the fleet clears within the wait budget.
* **KEDA threshold** on the gateway's queue depth (``averageValue`` per replica): ``max(1,
  ⌊X(K)·W_b/2⌋)``: scale out once the backlog per replica would take half the wait budget to
  drain, i.e. at half the queue bound, before requests start missing the SLO.  Queue depth
  is zero most of the time at ρ ≤ 0.85, so ``minReplicaCount`` should be the planned ``N``:
  KEDA then only adds replicas in a spike.
* **The seed's KEDA threshold**, 8 on ``vllm:num_requests_waiting`` per engine
  (:data:`~velvetrope.planner.rules.SEED_KEDA_WAITING`), does not carry over as a number on
  the engines: behind the gateway an engine is sent at most ``K`` requests, and dispatch is
  held while engines report a queue of their own (``gateway.saturation``), so their waiting
  count stays near 0 and the backlog sits in ``velvetrope_queue_depth`` instead.  What
  carries over is the backlog: 8 requests waiting at an engine that serves
  ``X(max_num_seqs)`` req/s drain in ``8/X(max)``; the same drain time at ``X(K)`` is
  ``max(1, round(8·X(K)/X(max)))`` queued per replica in the gateway
  (:func:`~velvetrope.planner.rules.seed_keda_equivalent`), which the plan prints next to
  its own threshold.

Units: seconds, requests per second, tokens per second.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from velvetrope.errors import PolicyError
from velvetrope.planner.plan import BucketSizing, P99Target, Plan
from velvetrope.planner.predict import predict
from velvetrope.planner.prediction import Metric, Prediction
from velvetrope.planner.rules import (
    RULE_OF_THUMB_BURST_S,
    RULE_OF_THUMB_FRACTION,
    queue_bound,
    queue_depth_rule_of_thumb,
    replicas_for_utilisation,
    rho_warning,
    seed_keda_equivalent,
)
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.workload import PlanWorkload

__all__ = [
    "TIER_RHO",
    "gpus_per_replica",
    "make_plan",
    "plan_warnings",
    "replicas_needed",
    "service_floor_p99",
]

TIER_RHO: Mapping[str, float] = {"interactive": 0.6, "batch": 0.85}
"""Default target utilisation by tier."""

KNEE_FRACTION = 0.95
"""Concurrencies are searched up to the knee where ``X`` reaches this fraction of its max."""

_P = 0.99
_EPS = 1e-9

FloatArray = NDArray[np.float64]


def gpus_per_replica(profile_name: str, description: str = "") -> int:
    """GPUs in one replica, read from a profile's name or description (``4xh100`` → 4).

    Profiles do not carry a GPU count; the built-in names spell it (``llama3-70b-4xh100``).
    Without an ``<n>x`` in either string a replica is one GPU.
    """
    for text in (profile_name, description):
        m = re.search(r"(\d+)\s*[x×]\s*[A-Za-z]", text)
        if m:
            return max(1, int(m.group(1)))
    return 1


# --------------------------------------------------------------------------- the search


def service_floor_p99(curve: ServiceCurve, metric: Metric) -> float:
    """The p99 of ``metric`` with one request per replica and no queue: no fleet does better.

    0 for ``wait``; for ``e2e`` and ``ttft`` the model's p99 at a vanishing load, where each
    replica runs at concurrency 1.
    """
    if metric == "wait":
        return 0.0
    lam = 1e-6 * curve.throughput(1)
    return predict(curve, lam, 1, 1).p99(metric)


def replicas_needed(
    curve: ServiceCurve,
    arrival_rps: float,
    concurrency: int,
    slo: P99Target,
    rho_target: float,
    *,
    arrival_scv: float = 1.0,
    arrival_pattern: FloatArray | None = None,
    max_replicas: int = 10_000,
) -> tuple[int, int, Prediction]:
    """``(N, N_ρ, prediction at N)``: the fewest replicas at ``concurrency`` slots each that
    meet ``slo`` with ``ρ <= rho_target`` (see the module docstring for the search).
    ``arrival_scv`` and ``arrival_pattern`` go to :func:`~velvetrope.planner.predict.predict`."""
    x_k = curve.throughput(concurrency)
    n_rho = replicas_for_utilisation(arrival_rps, x_k, rho_target)
    floor = service_floor_p99(curve, slo.metric)
    if slo.p99_s <= floor * (1 + 1e-9):
        raise PolicyError(
            f"the SLO {slo} cannot be met: even lightly loaded (one request per replica) the "
            f"model's p99 {slo.metric} is {floor:.3g} s, set by the service time of the "
            "longest requests; relax the SLO or cap max_tokens"
        )
    if n_rho > max_replicas:
        raise PolicyError(f"the utilisation bound alone needs {n_rho} > {max_replicas} replicas")

    def at(n: int) -> Prediction:
        return predict(
            curve, arrival_rps, n, concurrency, arrival_scv=arrival_scv,
            arrival_pattern=arrival_pattern,
        )  # fmt: skip

    first = at(n_rho)
    if first.p99(slo.metric) <= slo.p99_s:
        return n_rho, n_rho, first
    lo, hi = n_rho, n_rho
    while True:
        hi = min(2 * hi, max_replicas)
        p = at(hi)
        if p.p99(slo.metric) <= slo.p99_s:
            break
        if hi >= max_replicas:
            raise PolicyError(
                f"the SLO {slo} needs more than {max_replicas} replicas at concurrency "
                f"{concurrency} (p99 {slo.metric} {p.p99(slo.metric):.3g} s at {hi})"
            )
        lo = hi
    best = p
    while hi - lo > 1:
        mid = (lo + hi) // 2
        pm = at(mid)
        if pm.p99(slo.metric) <= slo.p99_s:
            hi, best = mid, pm
        else:
            lo = mid
    return hi, n_rho, best


BURSTY_SCV = 2.0
"""Without an arrival pattern, above this ``C_a²`` the plan warns that its wait is optimistic."""

BURST_FACTOR = 2.0
"""With a pattern, arrivals count as bursty when this many times more requests wait than
Poisson arrivals at the same load would make wait (and at least 1 % of them)."""


def plan_warnings(
    workload: PlanWorkload,
    curve: ServiceCurve,
    concurrency: int,
    at: Prediction | None = None,
    slo: P99Target | None = None,
    rho: float = 0.0,
) -> tuple[str, ...]:
    """Sentences naming inputs for which the model is known to be weak (measured against the
    simulator; see :mod:`velvetrope.planner.predict` for the figures).

    * bursty arrivals (``at`` made from an arrival pattern, and the share of requests that
      wait at least :data:`BURST_FACTOR` times the Poisson model's and 1 %): the waits are
      replayed from the arrivals and hold, but the p99 wait and time to first token were
      measured up to 20 % and 29 % low, and the end-to-end p99 up to 18 %, on the code
      trace;
    * no arrival pattern and ``C_a² > 2``: the Allen–Cunneen factor scales the conditional
      wait but keeps the Poisson probability of waiting, so the wait is optimistic;
    * an SLO on TTFT: the p99 TTFT was measured 8–27 % low on the conversation trace;
    * a target ρ above 0.85 (:func:`rho_warning`), passed as ``rho``;
    * preemptions at the chosen concurrency: the engine recomputes work, the service
      curve includes it but the spread of service times grows beyond the model's;
    * requests cut to fit ``max_model_len``: the plan sizes for the cut lengths.
    """
    out = [w for w in (rho_warning(rho),) if w]
    if at is not None and at.stable and at.wait_sample.size:
        poisson = predict(curve, at.arrival_rps, at.replicas, at.concurrency).p_wait
        if at.p_wait >= max(0.01, BURST_FACTOR * poisson):
            out.append(
                f"arrivals come in bursts ({at.p_wait:.1%} of requests wait at "
                f"{at.replicas} replicas, {poisson:.1%} would with Poisson arrivals): the "
                "waits are replayed from the arrivals, but the p99 wait, time to first "
                "token and end-to-end of such workloads were measured up to 20%, 29% and "
                "18% low; check with --verify"
            )
    elif workload.arrival_pattern is None and workload.arrival_scv > BURSTY_SCV:
        out.append(
            f"arrivals are bursty (C_a² = {workload.arrival_scv:.3g} > {BURSTY_SCV:g}): the "
            "queue-wait prediction keeps the Poisson probability of waiting and is optimistic; "
            "check with --verify"
        )
    if slo is not None and slo.metric == "ttft":
        out.append(
            "the p99 time to first token was measured 8–27% below the simulator's on the "
            "conversation trace; leave headroom or check with --verify"
        )
    # the grid point at or below the concurrency (past the grid: the last, saturated one)
    idx = int(np.searchsorted(curve.concurrency, concurrency, side="right")) - 1
    pre = float(curve.preemptions_per_request[max(idx, 0)])
    if math.isfinite(pre) and pre > 0:
        out.append(
            f"the engine preempts at concurrency {concurrency} ({pre:.2g} preemptions per "
            "request): the KV cache is the limit there"
        )
    if curve.mix.clipped:
        out.append(
            f"{curve.mix.clipped} of {len(curve.mix)} requests exceed max_model_len "
            f"{curve.profile.max_model_len} and were cut to fit"
        )
    return tuple(out)


def _wait_budget(slo: P99Target, pred: Prediction) -> float:
    if slo.metric == "wait":
        return slo.p99_s
    if slo.metric == "e2e":
        return slo.p99_s - pred.service_mean_s
    mean_first = float(pred.first_values @ pred.first_weights)
    return slo.p99_s - mean_first


def make_plan(
    workload: PlanWorkload,
    curve: ServiceCurve,
    slo: P99Target,
    *,
    tier: str = "interactive",
    rho_target: float | None = None,
    concurrency: int | None = None,
    gpus: int | None = None,
    max_replicas: int = 10_000,
) -> Plan:
    """Size a fleet for ``workload`` on ``curve``'s engine (see the module docstring).

    ``rho_target`` defaults to :data:`TIER_RHO` of ``tier`` (an unknown tier needs it);
    ``concurrency`` fixes ``K`` (default: searched); ``gpus`` is GPUs per replica (default:
    :func:`gpus_per_replica` of the profile).  Raises
    :class:`~velvetrope.errors.PolicyError` when the SLO cannot be met.
    """
    if rho_target is None:
        if tier not in TIER_RHO:
            known = ", ".join(f"{k} ({v})" for k, v in TIER_RHO.items())
            raise PolicyError(f"no default utilisation for tier {tier!r} ({known}); give rho")
        rho = TIER_RHO[tier]
    else:
        rho = float(rho_target)
    if not 0 < rho < 1:
        raise PolicyError(f"rho must be in (0, 1) (got {rho_target!r})")
    lam = workload.design_rps
    scv = workload.arrival_scv
    pattern = workload.arrival_pattern
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise PolicyError(f"concurrency must be an int >= 1 (got {concurrency!r})")
        ks = [concurrency]
    else:
        knee = curve.knee(KNEE_FRACTION)
        ks = [int(k) for k in curve.concurrency if k <= knee]
    results: list[tuple[int, int | None]] = []
    best: tuple[int, float, int, int, Prediction] | None = None
    error: PolicyError | None = None
    for k in ks:
        try:
            n, n_rho, pred = replicas_needed(
                curve, lam, k, slo, rho, arrival_scv=scv, arrival_pattern=pattern,
                max_replicas=max_replicas,
            )  # fmt: skip
        except PolicyError as exc:
            results.append((k, None))
            error = exc
            continue
        results.append((k, n))
        key = (n, pred.p99(slo.metric), k, n_rho, pred)
        if best is None or key[:3] < best[:3]:
            best = key
    if best is None:
        assert error is not None
        raise error
    n, _, k, n_rho, at = best
    one_fewer = (
        predict(curve, lam, n - 1, k, arrival_scv=scv, arrival_pattern=pattern) if n > 1 else None
    )
    x_k = curve.throughput(k)
    mix = curve.mix
    tokens = mix.mean_tokens
    budget = _wait_budget(slo, at)
    qb_pool = queue_bound(at.service_mean_s, budget, n * k)
    qb_rep = queue_bound(at.service_mean_s, budget, k)
    keda = max(1, math.floor(x_k * max(budget, 0.0) / 2.0))
    rule_pool = queue_depth_rule_of_thumb(slo.p99_s, at.service_mean_s, n * k)
    rule_rep = queue_depth_rule_of_thumb(slo.p99_s, at.service_mean_s, k)
    prof = curve.profile
    gpr = gpus if gpus is not None else gpus_per_replica(prof.name, prof.description)
    if gpr < 1:
        raise PolicyError(f"gpus per replica must be >= 1 (got {gpr})")
    sustainable_tps = n * x_k * tokens  # the whole fleet, every slot busy
    spare_rps = max(0.0, 1.0 - at.rho) * n * x_k
    burst_req = min(float(qb_pool), spare_rps * max(budget, 0.0))
    buckets = tuple(
        BucketSizing(
            tenant=t.name,
            share=t.share,
            rule_refill_tps=RULE_OF_THUMB_FRACTION * sustainable_tps,
            rule_capacity_tokens=RULE_OF_THUMB_BURST_S * RULE_OF_THUMB_FRACTION * sustainable_tps,
            model_refill_tps=t.share * rho * sustainable_tps,
            model_capacity_tokens=burst_req * tokens,
        )
        for t in workload.tenants
    )
    return Plan(
        workload=workload,
        curve=curve,
        slo=slo,
        tier=tier,
        rho_target=rho,
        replicas=n,
        gpus_per_replica=gpr,
        concurrency=k,
        replicas_for_rho=n_rho,
        binding="rho" if n == n_rho else "slo",
        candidates=tuple(results),
        at=at,
        one_fewer=one_fewer,
        per_replica_rps=x_k,
        tokens_per_request=tokens,
        wait_budget_s=budget,
        queue_bound_pool=qb_pool,
        queue_bound_per_replica=qb_rep,
        rule_queue_bound_pool=rule_pool,
        rule_queue_bound_per_replica=rule_rep,
        keda_threshold=keda,
        seed_keda_threshold=seed_keda_equivalent(x_k, curve.max_throughput_rps),
        buckets=buckets,
        warnings=plan_warnings(workload, curve, k, at, slo, rho),
    )
