"""A :class:`~velvetrope.planner.plan.Plan` as text and as JSON.

:func:`format_plan` is ``velvetrope plan``'s output, one number per line with the reason for
it; :func:`plan_to_dict` the same plan as plain JSON data (``velvetrope plan --json``).
"""

from __future__ import annotations

import math
from typing import Any

from velvetrope.planner.plan import Plan
from velvetrope.planner.prediction import Prediction
from velvetrope.planner.rules import RULE_OF_THUMB_FRACTION, SEED_KEDA_WAITING
from velvetrope.planner.sizing import KNEE_FRACTION
from velvetrope.planner.words import count
from velvetrope.planner.words import figure as _n
from velvetrope.planner.words import seconds as _s

__all__ = ["format_plan", "plan_to_dict"]


def _bucket(refill_tps: float, capacity: float) -> str:
    return f"refill {_n(refill_tps)} tok/s ({_n(refill_tps * 60)}/min), capacity {_n(capacity)}"


def format_plan(plan: Plan) -> list[str]:
    """The human-readable plan, one number per line with the reason for it."""
    w, c, at = plan.workload, plan.curve, plan.at
    slo = plan.slo
    k, n = plan.concurrency, plan.replicas
    knee = c.knee(KNEE_FRACTION)
    tried = [kk for kk, _ in plan.candidates]
    out: list[str] = []
    add = out.append
    add(f"velvetrope plan: {w.name} on {c.profile.name}, tier {plan.tier}, SLO {slo}")
    add("")
    add("workload")
    add(f"  design rate       {_n(w.design_rps)} req/s — {w.design_rate_origin}")
    add(
        f"  lengths           prompt p50 {_n(w.prompt_p50)} / p99 {_n(w.prompt_p99)}, output "
        f"p50 {_n(w.output_p50)} / p99 {_n(w.output_p99)} tokens; {_n(plan.tokens_per_request)} "
        f"tokens per request on average ({w.source})"
    )
    prompt_only = int((w.output == 0).sum())
    if prompt_only:
        add(
            f"  prompt-only       {prompt_only:,} of {len(w.output):,} requests have no output "
            "(embeddings, rerank): each costs its prefill only"
        )
    whole = (
        ""
        if w.whole_trace_scv is None
        else f" inside minutes, {w.whole_trace_scv:.3g} over the whole trace"
    )
    if w.arrival_pattern is not None:
        how = (
            "the queue wait replays the arrivals at the design rate through the "
            f"{plan.max_in_flight} slots, each held R({k}) = {_s(c.residence(k))} (G/D/c)"
        )
    else:
        how = "the Allen–Cunneen factor on the queue wait is their mean"
    add(
        f"  variability       C_a² {w.arrival_scv:.3g} (inter-arrival{whole}), C_s² "
        f"{c.mix.work_scv:.3g} (iterations per request): {how}"
    )
    add("")
    method = {
        "closed-loop": "closed-loop runs of the engine model's batcher",
        "analytic": "the profile's step-time formula",
        "given": "throughputs measured elsewhere",
    }[c.method]
    r1 = c.residence(1)
    add(f"service ({method}, concurrency 1…{c.max_concurrency})")
    add(
        f"  per replica       {_n(plan.per_replica_rps)} req/s — X({k}), the throughput with {k} "
        f"requests in flight (saturates at {_n(c.max_throughput_rps)} req/s; knee at {knee})"
    )
    add(
        f"  effective μ       {at.mu_per_slot:.3g} /s per slot — 1/E[S]: "
        f"{_s(at.service_mean_s)} in the engine at the design load vs {_s(r1)} alone; μ falls "
        "as ρ rises (longer batches, slower iterations)"
    )
    add("")
    add("plan")
    if plan.binding == "rho":
        why = (
            f"ρ ≤ {plan.rho_target:g} binds: ceil({_n(w.design_rps)} / ({_n(plan.per_replica_rps)} "
            f"× {plan.rho_target:g})) = {plan.replicas_for_rho}, and the SLO holds there"
        )
    else:
        why = (
            f"the SLO binds: ρ ≤ {plan.rho_target:g} alone needs {plan.replicas_for_rho}, but "
            f"the predicted p99 {slo.metric} meets {_s(slo.p99_s)} only from {n}"
        )
    add(f"  replicas          {n} — fewest meeting the SLO at ρ ≤ {plan.rho_target:g}; {why}")
    add(
        f"  GPUs              {plan.gpus} — {count(n, 'replica')} × "
        f"{count(plan.gpus_per_replica, 'GPU')} per replica"
    )
    add(
        f"  concurrency       {k} per replica (pool max_in_flight {plan.max_in_flight}) — the "
        f"fewest replicas among concurrencies {tried[0]}…{tried[-1]} (up to the knee)"
    )
    rate = _n(plan.per_replica_rps)
    add(f"  utilisation ρ     {at.rho:.3f} — {_n(w.design_rps)} / ({n} × {rate}) req/s")
    add(
        f"  in service        {at.mean_concurrency:.3g} per replica on average — Little: λ·E[S] / N"
    )
    add("")
    here_n, fewer_n = f"at {count(n, 'replica')}", f"at {count(n - 1, 'replica')}" if n > 1 else ""
    add(f"predicted latency   {here_n:<25} {fewer_n}".rstrip())
    fewer = plan.one_fewer
    for label, metric in (("queue wait", "wait"), ("time to first", "ttft"), ("end-to-end", "e2e")):
        a50 = getattr(at, f"{metric}_p50_s")
        a99 = getattr(at, f"{metric}_p99_s")
        here = f"p50 {_s(a50)} / p99 {_s(a99)}"
        if fewer is None:
            there = "—"
        else:
            b50 = getattr(fewer, f"{metric}_p50_s")
            b99 = getattr(fewer, f"{metric}_p99_s")
            there = f"p50 {_s(b50)} / p99 {_s(b99)}"
        add(f"  {label:<16}  {here:<25} {there}")
    if fewer is not None:
        if not fewer.stable:
            verdict = f"overloaded: ρ {fewer.rho:.3f} ≥ 1, the queue grows without bound"
        else:
            got = fewer.p99(slo.metric)
            over_rho = fewer.rho > plan.rho_target
            verdict = "; ".join(
                part
                for part in (
                    f"ρ {fewer.rho:.3f} > target {plan.rho_target:g}" if over_rho else "",
                    f"p99 {slo.metric} {_s(got)} > {_s(slo.p99_s)}" if got > slo.p99_s else "",
                )
                if part
            )
        add(f"  {fewer_n:<18}{verdict} — why not one fewer")
    add("")
    add("admission settings")
    add(
        f"  queue bound       {plan.queue_bound_pool} for band {plan.tier!r} in the pool "
        f"({plan.queue_bound_per_replica} per replica) — ⌊c·W_b/S⌋ = ⌊{plan.max_in_flight} × "
        f"{_s(plan.wait_budget_s)} / {_s(at.service_mean_s)}⌋: a request deeper than this could "
        f"not start within the {_s(plan.wait_budget_s)} left for waiting"
    )
    add(
        f"    rule of thumb   {plan.rule_queue_bound_pool} in the pool "
        f"({plan.rule_queue_bound_per_replica} per replica) — the common rule (L/S) × "
        f"concurrency × 1.5 = ({_s(slo.p99_s)} / {_s(at.service_mean_s)}) × "
        f"{plan.max_in_flight} × 1.5, the "
        "1.5 a cushion for long-tailed latencies: deeper, so fewer 503s but some admitted "
        "requests start too late for the SLO"
    )
    per_gpu = plan.per_replica_rps * plan.tokens_per_request / plan.gpus_per_replica
    for b in plan.buckets:
        add(f"  bucket {b.tenant!r} (share {b.share:.2f}), tokens = prompt + output:")
        rule = _bucket(b.rule_refill_tps, b.rule_capacity_tokens)
        add(
            f"    rule of thumb   {rule} — {RULE_OF_THUMB_FRACTION:g} × {_n(per_gpu)} tok/s "
            f"per GPU × {plan.gpus} GPUs; capacity 4 × refill"
        )
        model = _bucket(b.model_refill_tps, b.model_capacity_tokens)
        add(
            f"    model           {model} — share × ρ {plan.rho_target:g} × fleet tokens/s "
            "(all tenants at their limit load the fleet to the target ρ); capacity = the "
            "burst the spare capacity clears within the wait budget"
        )
    add(
        f"  KEDA threshold    {plan.keda_threshold} queued per replica (minReplicaCount {n}) — "
        f"scale out when the backlog would take half of the {_s(max(plan.wait_budget_s, 0.0))} "
        f"wait budget to drain at {_n(plan.per_replica_rps)} req/s per replica"
    )
    drain = SEED_KEDA_WAITING / c.max_throughput_rps
    add(
        f"    rule of thumb   {plan.seed_keda_threshold} queued per replica — the common rule "
        f"scales at "
        f"{SEED_KEDA_WAITING} on vllm:num_requests_waiting, but behind the gateway engines "
        "hardly queue (dispatch goes only into free slots), so scale on the gateway's "
        f"velvetrope_queue_depth: {SEED_KEDA_WAITING} waiting at a saturated engine drain in "
        f"{_s(drain)} at {_n(c.max_throughput_rps)} req/s, as {plan.seed_keda_threshold} do at "
        f"{_n(plan.per_replica_rps)} req/s"
    )
    out[1:1] = [f"warning: {w}" for w in plan.warnings]
    return out


# --------------------------------------------------------------------------- JSON


def _num(x: float) -> float | None:
    """JSON has no infinity: an unstable (infinite) latency is written as null."""
    return float(x) if math.isfinite(x) else None


def _prediction_dict(p: Prediction) -> dict[str, Any]:
    return {
        "replicas": p.replicas,
        "rho": p.rho,
        "stable": p.stable,
        "p_wait": p.p_wait,
        "mean_concurrency_per_replica": p.mean_concurrency,
        "service_mean_s": _num(p.service_mean_s),
        "mu_per_slot": p.mu_per_slot,
        "wait_p50_s": _num(p.wait_p50_s),
        "wait_p99_s": _num(p.wait_p99_s),
        "ttft_p50_s": _num(p.ttft_p50_s),
        "ttft_p99_s": _num(p.ttft_p99_s),
        "e2e_p50_s": _num(p.e2e_p50_s),
        "e2e_p99_s": _num(p.e2e_p99_s),
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON data (schema version 1).

    Top-level keys: ``schema`` (1), ``inputs``, ``service``, ``plan``, ``latency``,
    ``queue``, ``buckets``, ``warnings`` (sentences), ``keda``.  Times in seconds, rates in
    req/s, token rates in tokens/s; a latency that does not exist (an overloaded fleet at
    one replica fewer) is ``null``.  :func:`velvetrope.planner.cli.plan_command` adds
    ``verify`` when asked.
    """
    w = plan.workload
    c = plan.curve
    return {
        "schema": 1,
        "inputs": {
            "profile": c.profile.name,
            "workload": w.name,
            "workload_source": w.source,
            "design_rps": w.design_rps,
            "design_rate_origin": w.design_rate_origin,
            "mean_rps": w.mean_rps,
            "arrival_scv": w.arrival_scv,
            "arrival_scv_whole_trace": w.whole_trace_scv,
            "wait_model": "gdc-replay" if w.arrival_pattern is not None else "allen-cunneen",
            "prompt_tokens": {"p50": w.prompt_p50, "p99": w.prompt_p99},
            "output_tokens": {"p50": w.output_p50, "p99": w.output_p99},
            "tier": plan.tier,
            "rho_target": plan.rho_target,
            "slo": {"metric": plan.slo.metric, "p99_s": plan.slo.p99_s},
        },
        "service": {
            "method": c.method,
            "concurrency": [int(n) for n in c.concurrency],
            "throughput_rps": [float(x) for x in c.throughput_rps],
            "residence_s": [
                float(n) / float(x) for n, x in zip(c.concurrency, c.throughput_rps, strict=True)
            ],
            "max_throughput_rps": c.max_throughput_rps,
            "knee_concurrency": c.knee(KNEE_FRACTION),
            "service_scv": c.mix.work_scv,
        },
        "plan": {
            "replicas": plan.replicas,
            "gpus_per_replica": plan.gpus_per_replica,
            "gpus": plan.gpus,
            "concurrency_per_replica": plan.concurrency,
            "max_in_flight": plan.max_in_flight,
            "rho": plan.at.rho,
            "binding": plan.binding,
            "replicas_for_rho": plan.replicas_for_rho,
            "per_replica_rps": plan.per_replica_rps,
            "candidates": [{"concurrency": k, "replicas": n} for k, n in plan.candidates],
        },
        "latency": {
            "at": _prediction_dict(plan.at),
            "one_fewer": None if plan.one_fewer is None else _prediction_dict(plan.one_fewer),
        },
        "queue": {
            "wait_budget_s": plan.wait_budget_s,
            "bound_pool": plan.queue_bound_pool,
            "bound_per_replica": plan.queue_bound_per_replica,
            "rule_of_thumb": {
                "bound_pool": plan.rule_queue_bound_pool,
                "bound_per_replica": plan.rule_queue_bound_per_replica,
                "formula": "(L/S) * concurrency * 1.5",
            },
        },
        "buckets": [
            {
                "tenant": b.tenant,
                "share": b.share,
                "rule_of_thumb": {
                    "refill_tokens_per_s": b.rule_refill_tps,
                    "capacity_tokens": b.rule_capacity_tokens,
                },
                "model": {
                    "refill_tokens_per_s": b.model_refill_tps,
                    "capacity_tokens": b.model_capacity_tokens,
                },
            }
            for b in plan.buckets
        ],
        "warnings": list(plan.warnings),
        "keda": {
            "metric": "queue depth (requests queued in the gateway)",
            "threshold_per_replica": plan.keda_threshold,
            "seed_rule": {
                "vllm_num_requests_waiting": SEED_KEDA_WAITING,
                "gateway_queue_depth_per_replica": plan.seed_keda_threshold,
            },
            "min_replicas": plan.replicas,
        },
    }
