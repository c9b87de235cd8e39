"""``velvetrope plan``: how many replicas, and which admission settings, for a workload.

Registered in :mod:`velvetrope.cli` as ``app.command("plan")(plan_command)``::

    velvetrope plan --profile llama3-70b-4xh100 --trace azure_conv --peak-rps 50 \\
        --slo-p99 4s --tier interactive
    velvetrope plan --workload workload.yaml --json --plot plan.png --verify
    velvetrope plan --worker-rps 12 --peak-rps 50 --tier interactive        # no profile
    velvetrope plan --worker-tps 24000 --trace azure_conv --concurrency 32  # tokens/s
    velvetrope plan --trace azure_conv --prefix-hit-rate 0.3 \\
        --spec-tokens 4 --spec-accepted-per-step 2.3 --verify

With speculative decoding (``--spec-tokens`` with ``--spec-acceptance`` or the measured
``--spec-accepted-per-step``) or prefix caching (``--prefix-hit-rate``), either service
model sizes with them, ``--verify`` simulates them, and the plan ends with how each changes
the service time: mean, coefficient of variation and p99, with and without
(:mod:`velvetrope.planner.features`).

The output explains every number in one line; ``--json`` prints the same plan as JSON
(:func:`velvetrope.planner.sizing.plan_to_dict`, plus ``verify`` rows when asked).  Errors
(a bad file, an SLO that cannot be met) print ``velvetrope plan: error: ...`` on stderr
and exit with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from velvetrope.errors import PolicyError, VelvetropeError
from velvetrope.planner.words import count

if TYPE_CHECKING:
    from velvetrope.planner.features import FeatureEffect
    from velvetrope.planner.measured import MeasuredPlan
    from velvetrope.planner.prediction import Metric
    from velvetrope.planner.sizing import Plan
    from velvetrope.planner.verify import VerifyRow
    from velvetrope.planner.workload import PlanWorkload

__all__ = ["format_plan", "parse_duration", "plan_command"]

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|m|h)?\s*")

_DEFAULT_SLO = {"interactive": "4s", "batch": "60s"}


def parse_duration(text: str) -> float:
    """``"4s"``, ``"800ms"``, ``"1.5m"``, ``"2h"`` or a bare number of seconds → seconds (> 0)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise PolicyError(f"bad duration {text!r}: expected a number with ms, s, m or h")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not (math.isfinite(value) and value > 0):
        raise PolicyError(f"bad duration {text!r}: must be > 0")
    return value


def _s(x: float) -> str:
    """Seconds, readably (``inf`` for an overloaded fleet)."""
    if not math.isfinite(x):
        return "∞ (overloaded)"
    if x == 0:
        return "0 s"
    if x < 1:
        return f"{x * 1000:.0f} ms" if x >= 0.01 else f"{x * 1000:.2g} ms"
    return f"{x:.3g} s"


def _n(x: float) -> str:
    """A rate or count with three significant figures and thousands separators."""
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _bucket(refill_tps: float, capacity: float) -> str:
    return f"refill {_n(refill_tps)} tok/s ({_n(refill_tps * 60)}/min), capacity {_n(capacity)}"


def format_plan(plan: Plan) -> list[str]:
    """The human-readable plan, one number per line with the reason for it."""
    from velvetrope.planner.rules import RULE_OF_THUMB_FRACTION, SEED_KEDA_WAITING
    from velvetrope.planner.sizing import KNEE_FRACTION

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


def _startup_lines(
    plan: Plan,
    spike: float | None,
    duration: str,
    startup: str,
    top_share: float,
    lower_max_wait: str,
    scaled_object: Path | None,
    as_json: bool,
    verify: bool,
    seed: int,
) -> list[str] | None:
    """``plan --spike``: the start-up question's answer, as lines (or one JSON line), and
    with ``verify`` its check in the simulator."""
    if spike is None:
        return None
    from velvetrope.planner.startup import format_startup, plan_startup, startup_to_dict
    from velvetrope.sim.keda import load_scaled_object

    sp = plan_startup(
        plan, factor=spike, duration_s=parse_duration(duration),
        startup_s=0.0 if startup.strip() in ("0", "0s") else parse_duration(startup),
        top_share=top_share, lower_max_wait_s=parse_duration(lower_max_wait),
        scaled_object=None if scaled_object is None else load_scaled_object(scaled_object),
    )  # fmt: skip
    check = None
    if verify:
        from velvetrope.planner.startup_verify import verify_startup

        check = verify_startup(sp, seed)
    if as_json:
        doc = startup_to_dict(sp)
        if check is not None:
            doc["verify"] = {
                k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                for k, v in dataclasses.asdict(check).items()
            }
        return [json.dumps(doc, allow_nan=False)]
    return ["", *format_startup(sp), *(check.lines() if check is not None else [])]


def _verify_dict(rows: list[VerifyRow]) -> list[dict[str, Any]]:
    from velvetrope.planner.features import predicted_service

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    out = []
    for r in rows:
        p, s = r.predicted, r.simulated
        mean, cv = predicted_service(p)
        out.append(
            {
                "replicas": s.replicas,
                "completed_fraction": s.completed_fraction,
                "service_mean_s": {
                    "predicted": finite(mean),
                    "simulated": finite(s.service_mean_s),
                },
                "service_cv": {"predicted": finite(cv), "simulated": finite(s.service_cv)},
                **{
                    f"{m}_p99_s": {
                        "predicted": p.p99(m) if math.isfinite(p.p99(m)) else None,
                        "simulated": s.p99(m),
                    }
                    for m in ("wait", "ttft", "e2e")
                },
            }
        )
    return out


def _measured_plan(
    *,
    worker_rps: float | None,
    worker_tps: float | None,
    tokens_per_request: float | None,
    peak_rps: float | None,
    wl: PlanWorkload | None,
    tier: str,
    rho: float | None,
    concurrency: int | None,
    slo_p99: str | None,
    slo_metric: Metric,
) -> MeasuredPlan:
    """``plan --worker-rps/--worker-tps``: the measured-throughput planner's inputs resolved."""
    from velvetrope.planner.measured import plan_from_throughput
    from velvetrope.planner.sizing import TIER_RHO, P99Target

    if (worker_rps is None) == (worker_tps is None):
        raise PolicyError("give one of --worker-rps and --worker-tps, not both")
    if peak_rps is not None:
        lam, lam_origin = peak_rps, "given with --peak-rps"
    elif wl is not None:
        lam, lam_origin = wl.design_rps, wl.design_rate_origin
    else:
        raise PolicyError("give --peak-rps (or a --trace or --workload to take it from)")
    if worker_rps is not None:
        x, x_origin = worker_rps, "measured, given with --worker-rps"
    else:
        assert worker_tps is not None
        if not (math.isfinite(worker_tps) and worker_tps > 0):
            raise PolicyError(f"--worker-tps must be > 0 (got {worker_tps!r})")
        if tokens_per_request is not None:
            tok, tok_origin = tokens_per_request, "--tokens-per-request"
        elif wl is not None:
            tok, tok_origin = wl.mean_tokens, f"the mean prompt + output of {wl.source}"
        else:
            raise PolicyError("--worker-tps needs --tokens-per-request (or a --trace/--workload)")
        if not (math.isfinite(tok) and tok > 0):
            raise PolicyError(f"--tokens-per-request must be > 0 (got {tok!r})")
        x = worker_tps / tok
        x_origin = (
            f"measured {_n(worker_tps)} tok/s per worker (--worker-tps) / {_n(tok)} tokens per "
            f"request ({tok_origin})"
        )
    if rho is None:
        if tier not in TIER_RHO:
            raise PolicyError(f"no default utilisation for tier {tier!r}; give --rho")
        rho = TIER_RHO[tier]
    bound = slo_p99 if slo_p99 is not None else None
    if bound is None and concurrency is not None:
        bound = _DEFAULT_SLO.get(tier)
    slo = None if bound is None else P99Target(slo_metric, parse_duration(bound))
    arrivals = "Poisson arrivals" if wl is None else f"the arrivals of {wl.source}"
    return plan_from_throughput(
        lam, x, rho_target=rho, tier=tier, design_rate_origin=lam_origin,
        per_worker_origin=x_origin, concurrency=concurrency, slo=slo,
        arrival_pattern=None if wl is None else wl.arrival_pattern, arrivals=arrivals,
    )  # fmt: skip


def _budget_lines(
    config: str, trace: str | None, tenants: str | None, rps: float, start: str | None
) -> None:
    """Print :func:`~velvetrope.sim.quota_whatif.plan_budget_lines` (errors exit 2)."""
    from velvetrope.sim.quota_whatif import parse_start, plan_budget_lines

    try:
        if trace is None:
            raise PolicyError("--config's budgets need --trace (whose requests they count)")
        lines = plan_budget_lines(config, trace, tenants, rps, parse_start(start))
    except (VelvetropeError, OSError) as exc:
        typer.echo(f"velvetrope plan: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo("")
    for line in lines:
        typer.echo(line)


def plan_command(
    profile: Annotated[
        str | None,
        typer.Option(help="Engine profile: a built-in name or a YAML file [llama3-8b-h100]."),
    ] = None,
    trace: Annotated[
        str | None,
        typer.Option(help="Size for a trace: azure_conv, azure_code, or a .csv/.jsonl file."),
    ] = None,
    workload: Annotated[
        Path | None,
        typer.Option(help="Size for a workload YAML (prompt/output p50/p99, p99 1-min rate)."),
    ] = None,
    peak_rps: Annotated[
        float | None,
        typer.Option(help="Design arrival rate in req/s (default: the p99 one-minute rate)."),
    ] = None,
    slo_p99: Annotated[
        str | None,
        typer.Option(help="The p99 bound, e.g. 4s or 800ms (default: 4s interactive, 60s batch)."),
    ] = None,
    slo_metric: Annotated[
        str, typer.Option(help="What the p99 bounds: wait (queue), ttft or e2e.")
    ] = "wait",
    tier: Annotated[
        str, typer.Option(help="Tier: interactive (ρ 0.6) or batch (ρ 0.85); others need --rho.")
    ] = "interactive",
    rho: Annotated[
        float | None, typer.Option(help="Target utilisation, overriding the tier's.")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Requests in flight per replica (default: searched)."),
    ] = None,
    gpus_per_replica: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs per replica (default: from the profile name, e.g. 4xh100)."),
    ] = None,
    service_model: Annotated[
        str, typer.Option(help="closed-loop (batcher runs) or analytic (step-time formula).")
    ] = "closed-loop",
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write the latency-vs-utilisation plot (PNG) here.")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(help="Simulate the plan and one replica fewer; print predicted vs simulated."),
    ] = False,
    verify_requests: Annotated[
        int, typer.Option(min=100, help="Requests per --verify run.")
    ] = 20_000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of --verify's workload.")] = 0,
    worker_rps: Annotated[
        float | None,
        typer.Option(help="Measured req/s per worker: no engine profile needed."),
    ] = None,
    worker_tps: Annotated[
        float | None,
        typer.Option(help="Measured tokens/s per worker (prompt + output)."),
    ] = None,
    tokens_per_request: Annotated[
        float | None,
        typer.Option(help="Mean prompt + output tokens, to turn --worker-tps into req/s."),
    ] = None,
    spec_tokens: Annotated[
        int, typer.Option(min=0, help="Speculative decoding: draft tokens per step (0: off).")
    ] = 0,
    spec_acceptance: Annotated[
        float | None,
        typer.Option(help="Speculative decoding: per-token acceptance rate [0.7]."),
    ] = None,
    spec_accepted_per_step: Annotated[
        float | None,
        typer.Option(
            help="Speculative decoding: measured tokens per verification step (vLLM's mean "
            "acceptance length), 1 to --spec-tokens + 1; instead of --spec-acceptance."
        ),
    ] = None,
    spec_draft_ms: Annotated[
        float, typer.Option(help="Speculative decoding: draft model ms per draft token.")
    ] = 0.0,
    prefix_hit_rate: Annotated[
        float, typer.Option(help="Share of prompt tokens served from the prefix cache.")
    ] = 0.0,
    spike: Annotated[
        float | None,
        typer.Option(help="Start-up question: a spike of this many times the design rate."),
    ] = None,
    spike_duration: Annotated[str, typer.Option(help="How long the spike lasts.")] = "10m",
    startup: Annotated[
        str, typer.Option(help="From asking for a replica to its serving (model load).")
    ] = "120s",
    top_share: Annotated[
        float, typer.Option(help="Share of requests in the top tier (the one sized for).")
    ] = 0.2,
    lower_max_wait: Annotated[
        str, typer.Option(help="The lower tiers' max wait (their max_wait_s).")
    ] = "60s",
    scaled_object: Annotated[
        Path | None,
        typer.Option(help="A KEDA ScaledObject file whose other settings the answer keeps."),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(help="Gateway config: with --trace, when its budgets run out at this rate."),
    ] = None,
    tenants: Annotated[
        str | None, typer.Option(help="With --config: tenant mix tenant[:tier]:weight,...")
    ] = None,
    start: Annotated[
        str | None, typer.Option(help="With --config: the budgets' start, ISO (default: now).")
    ] = None,
) -> None:
    """Size a fleet for a workload and an SLO, and derive the admission settings.

    With --worker-rps or --worker-tps (a measured throughput per worker) no engine profile
    is needed: the usual utilisation rule, and with --concurrency the queue wait."""
    from velvetrope.engine import load_profile
    from velvetrope.planner.engine_options import (
        describe,
        prefix_caching_profile,
        with_speculation,
    )
    from velvetrope.planner.features import build_curve, effects_of, feature_settings
    from velvetrope.planner.sizing import P99Target, make_plan, plan_to_dict
    from velvetrope.planner.workload import load_workload, workload_from_trace

    measured = worker_rps is not None or worker_tps is not None
    try:
        if trace is not None and workload is not None:
            raise PolicyError("give exactly one of --trace and --workload")
        if trace is None and workload is None and not measured:
            raise PolicyError("give exactly one of --trace and --workload")
        if slo_metric not in ("wait", "ttft", "e2e"):
            raise PolicyError(f"--slo-metric must be wait, ttft or e2e (got {slo_metric!r})")
        if service_model not in ("closed-loop", "analytic"):
            raise PolicyError(
                f"--service-model must be closed-loop or analytic (got {service_model!r})"
            )
        if measured:
            given = [
                name
                for name, v in (
                    ("--profile", profile), ("--verify", verify or None), ("--plot", plot),
                    ("--gpus-per-replica", gpus_per_replica),
                )
                if v is not None
            ]  # fmt: skip
            if given:
                raise PolicyError(f"{', '.join(given)} need an engine model, not --worker-rps/tps")
        elif tokens_per_request is not None:
            raise PolicyError("--tokens-per-request goes with --worker-tps")
        wl: PlanWorkload | None = None
        features: str | None = None
        if not measured:
            base = load_profile(profile if profile is not None else "llama3-8b-h100")
            spec_only = with_speculation(
                base, spec_tokens, spec_acceptance, spec_draft_ms,
                accepted_per_step=spec_accepted_per_step,
            )  # fmt: skip
            prof = prefix_caching_profile(spec_only, prefix_hit_rate)
            features = describe(prof, prefix_hit_rate)
        if trace is not None:
            wl = workload_from_trace(trace, design_rps=peak_rps)
        elif workload is not None:
            wl = load_workload(workload)
            if peak_rps is not None:
                origin = f"given with --peak-rps ({workload} says {wl.design_rps:g} req/s)"
                wl = wl.with_design_rate(peak_rps, origin)
        metric: Metric = (
            "wait" if slo_metric == "wait" else "ttft" if slo_metric == "ttft" else "e2e"
        )
        if measured:
            mplan = _measured_plan(
                worker_rps=worker_rps, worker_tps=worker_tps,
                tokens_per_request=tokens_per_request, peak_rps=peak_rps, wl=wl, tier=tier,
                rho=rho, concurrency=concurrency, slo_p99=slo_p99, slo_metric=metric,
            )  # fmt: skip
        else:
            assert wl is not None
    except (VelvetropeError, OSError) as exc:
        typer.echo(f"velvetrope plan: error: {exc}", err=True)
        raise typer.Exit(2) from None
    if measured:
        from velvetrope.planner.measured import format_measured_plan, measured_plan_to_dict

        if json_out:
            typer.echo(json.dumps(measured_plan_to_dict(mplan), indent=2, allow_nan=False))
        else:
            for line in format_measured_plan(mplan):
                typer.echo(line)
        return
    assert wl is not None
    full: PlanWorkload = wl
    try:
        bound = slo_p99 if slo_p99 is not None else _DEFAULT_SLO.get(tier)
        if bound is None:
            raise PolicyError(f"give --slo-p99 (no default for tier {tier!r})")
        slo = P99Target(metric, parse_duration(bound))
        curve = build_curve(prof, full.prompt, full.output, service_model, prefix_hit_rate)
        plan = make_plan(
            full, curve, slo, tier=tier, rho_target=rho, concurrency=concurrency,
            gpus=gpus_per_replica,
        )  # fmt: skip
        effects: list[FeatureEffect] = []
        if features:
            effects = effects_of(
                plan, base, spec_only, prefix_hit_rate, service_model,
                lambda c: make_plan(
                    full, c, slo, tier=tier, rho_target=rho, concurrency=concurrency,
                    gpus=gpus_per_replica,
                ),
            )  # fmt: skip
        start_lines = _startup_lines(
            plan, spike, spike_duration, startup, top_share, lower_max_wait, scaled_object,
            json_out, verify, seed,
        )  # fmt: skip
        rows: list[VerifyRow] | None = None
        if verify:
            from velvetrope.planner.verify import verify_plan

            rows = verify_plan(plan, requests=verify_requests, seed=seed)
        written = None
        if plot is not None:
            from velvetrope.planner.plot import plot_latency_vs_utilisation

            written = plot_latency_vs_utilisation(plan, plot)
    except (VelvetropeError, OSError) as exc:
        typer.echo(f"velvetrope plan: error: {exc}", err=True)
        raise typer.Exit(2) from None

    if json_out:
        doc = plan_to_dict(plan)
        if start_lines is not None:
            doc["startup"] = json.loads(start_lines[0])
        if rows is not None:
            doc["verify"] = _verify_dict(rows)
        if written is not None:
            doc["plot"] = str(written)
        if features:
            doc["engine_features"] = features
            doc["engine_feature_settings"] = feature_settings(prof, prefix_hit_rate)
            doc["engine_feature_effects"] = [e.to_dict() for e in effects]
        typer.echo(json.dumps(doc, indent=2, allow_nan=False))
        return
    for line in format_plan(plan):
        typer.echo(line)
    if config is not None:
        _budget_lines(config, trace, tenants, full.design_rps, start)
    if features:
        typer.echo("")
        typer.echo(f"engine features: {features}")
        typer.echo(
            "  service time without → with (the model, on the plan's fleet at the design rate):"
        )
        for e in effects:
            typer.echo(f"  {e.line()}")
    for line in start_lines or []:
        typer.echo(line)
    if rows is not None:
        typer.echo("")
        typer.echo(
            f"verify: simulated {verify_requests:,} requests at {_n(full.design_rps)} req/s "
            "(stationary, FCFS, first 10% left out) with the real admission core and batchers"
            + (
                f"; every prompt's first {prefix_hit_rate:.0%} one shared prefix"
                if prefix_hit_rate > 0
                else ""
            )
        )
        head = f"  {'replicas':<9} {'metric':<7} {'predicted p99':>14} {'simulated p99':>14}"
        typer.echo(f"{head}  error")
        for r in rows:
            for m in ("wait", "ttft", "e2e"):
                p, s = r.predicted.p99(m), r.simulated.p99(m)
                err = (
                    f"{(p - s) / s:+.1%}"
                    if math.isfinite(p) and math.isfinite(s) and s > 0
                    else "—"
                )
                typer.echo(f"  {r.simulated.replicas:<9} {m:<7} {_s(p):>14} {_s(s):>14}  {err}")
        from velvetrope.planner.features import predicted_service

        for r in rows:
            mean, cv = predicted_service(r.predicted)
            sim = r.simulated
            typer.echo(
                f"  service time at {sim.replicas} replicas: predicted mean {_s(mean)}, CV "
                f"{cv:.2f}; simulated mean {_s(sim.service_mean_s)}, CV {sim.service_cv:.2f}"
            )
    if written is not None:
        typer.echo("")
        typer.echo(f"plot: {written} — predicted latency vs utilisation, the plan marked")
