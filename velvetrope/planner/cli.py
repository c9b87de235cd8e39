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
(:func:`velvetrope.planner.plan_report.plan_to_dict`, plus ``verify`` rows when asked).  Errors
(a bad file, an SLO that cannot be met) print ``velvetrope plan: error: ...`` on stderr
and exit with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from velvetrope.errors import PolicyError, VelvetropeError
from velvetrope.planner.plan_inputs import DEFAULT_SLO, measured_plan, parse_duration

if TYPE_CHECKING:
    from velvetrope.planner.features import FeatureEffect
    from velvetrope.planner.plan import Plan
    from velvetrope.planner.prediction import Metric
    from velvetrope.planner.verify import VerifyRow
    from velvetrope.planner.workload import PlanWorkload

__all__ = ["plan_command"]


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
    from velvetrope.planner.plan import P99Target
    from velvetrope.planner.plan_report import format_plan, plan_to_dict
    from velvetrope.planner.sizing import make_plan
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
            mplan = measured_plan(
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
        bound = slo_p99 if slo_p99 is not None else DEFAULT_SLO.get(tier)
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
            from velvetrope.planner.verify import verify_to_dict

            doc["verify"] = verify_to_dict(rows)
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
        from velvetrope.planner.verify import verify_lines

        for line in verify_lines(rows, verify_requests, full.design_rps, prefix_hit_rate):
            typer.echo(line)
    if written is not None:
        typer.echo("")
        typer.echo(f"plot: {written} — predicted latency vs utilisation, the plan marked")
