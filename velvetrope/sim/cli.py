"""``velvetrope simulate``: replay a trace against a modelled fleet with the gateway's policy.

Registered in :mod:`velvetrope.cli` as ``app.command("simulate")(simulate_command)``.
A single run prints the per-tier table and writes ``report.md`` with PNG plots; with
``--sweep`` it runs every combination with a progress bar and writes ``sweep.md`` with a
latency-versus-load plot.  Wall time is printed on stdout only, never in a report.

With ``--config`` the run is the gateway's: the policy section as is (tenants, tiers, routing
rules, degradation, capacity per engine, the saturation rule) and, unless ``--replicas`` is
given, one replica per static upstream the config lists for each pool (4 for a pool listing
none).  Before running it says how routing and tiers will apply: the rules in force, and,
when the trace names no tenants and no ``--tenants`` mix is given, that every request runs
as one tenant in one tier.  With budgets in the config's ``quotas`` (from ``--start``, the
budgets' calendar), a single run applies them as the gateway would, prints when each
tenant's budgets run out at the workload's pace and, when a budget downgrades, the top
tier's SLO with refusals instead (:mod:`velvetrope.sim.quota_whatif`); a sweep ignores them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from velvetrope.errors import PolicyError, VelvetropeError

if TYPE_CHECKING:
    from velvetrope.config import GatewayConfig
    from velvetrope.core import PolicyConfig
    from velvetrope.core.quota_config import QuotaSettings
    from velvetrope.sim.autoscale import AutoscaleSpec
    from velvetrope.sim.tenant_mix import TenantMix
    from velvetrope.sim.trace_request import TraceRequest

__all__ = ["simulate_command"]


DEFAULT_REPLICAS = 4


def _policy(
    config: Path | None, tenants: TenantMix | None, replicas: int | None, preset: str | None
) -> tuple[PolicyConfig, int, int | dict[str, int]]:
    """The policy, the default ``max_tokens`` (from the config's gateway section) and the
    replicas per pool."""
    from velvetrope.sim.inputs import default_policy

    if config is None:
        n = replicas or DEFAULT_REPLICAS
        return default_policy(tenants, n, preset or "hybrid"), 1024, n
    from velvetrope.config import load_config

    gw = load_config(config)
    policy = gw.policy
    if preset is not None:
        policy = policy.model_copy(update={"preset": preset})
    return policy, gw.gateway.default_max_tokens, replicas or _config_replicas(gw)


def _budgets(config: Path | None) -> QuotaSettings | None:
    """The config's quotas when it has budgets (else ``None``)."""
    if config is None:
        return None
    from velvetrope.config import load_config

    quotas = load_config(config).quotas
    return quotas if quotas.budgets else None


def _config_replicas(gw: GatewayConfig) -> dict[str, int]:
    """One replica per static upstream listed for each pool (the default for none)."""
    out = {}
    for p in gw.policy.pools:
        static = [u for u in gw.upstreams.get(p.name, ()) if u.discovery == "static"]
        out[p.name] = len(static) or DEFAULT_REPLICAS
    return out


def describe_routing(
    policy: PolicyConfig, workload: list[TraceRequest], mix: TenantMix | None
) -> list[str]:
    """Notes on how the policy's routes and tiers apply to ``workload``."""
    from velvetrope.clock import ManualClock
    from velvetrope.core import AdmissionController

    notes = []
    if policy.routes:
        rules = "; ".join(
            f"{r.name or f'routes[{i}]'} → {r.pool}" for i, r in enumerate(policy.routes)
        )
        notes.append(f"routing: {rules}; otherwise → {policy.pools[0].name}")
    degrading = [t.name for t in policy.tiers if t.degrade is not None]
    if degrading:
        notes.append(f"degradation before rejection in tier(s): {', '.join(degrading)}")
    if mix is None and all(r.tenant == "default" and r.tier is None for r in workload):
        tier = AdmissionController(policy, ManualClock()).resolve_tier("default")
        notes.append(
            f"note: the trace names no tenants, so every request runs as tenant 'default' "
            f"in tier {tier!r}; assign a mix with --tenants"
        )
    return notes


def _autoscale_spec(
    source: str, config: Path | None, startup: str | None, horizon_s: float
) -> AutoscaleSpec:
    """``--autoscale config|FILE`` and ``--startup`` as an AutoscaleSpec."""
    from velvetrope.sim.autoscale import AutoscaleSpec
    from velvetrope.sim.replicas import StartupDelay

    if source == "config":
        from velvetrope.config import load_config

        gw = load_config(config) if config is not None else None
        if gw is None or gw.autoscale is None:
            raise PolicyError("--autoscale config needs --config with an autoscale section")
        spec = AutoscaleSpec.from_settings(gw.autoscale, horizon_s=horizon_s)
    else:
        spec = AutoscaleSpec.from_file(source, horizon_s=horizon_s)
    if startup is not None:
        spec = replace(spec, startup=StartupDelay.parse(startup))
    return spec


def simulate_command(
    config: Annotated[
        Path | None,
        typer.Option(help="Gateway config (YAML); its policy section is used as is."),
    ] = None,
    trace: Annotated[
        str, typer.Option(help="Trace: azure_conv, azure_code, or a .csv/.jsonl file.")
    ] = "azure_conv",
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1, help="Engine replicas per pool (default: the config's upstreams, else 4)."
        ),
    ] = None,
    load: Annotated[
        float | None,
        typer.Option(help="Rescale arrivals to this multiple of the fleet's capacity."),
    ] = None,
    profile: Annotated[str, typer.Option(help="Engine profile (built-in or YAML).")] = (
        "llama3-8b-h100"
    ),
    router: Annotated[
        str, typer.Option(help="least_loaded, round_robin or prefix_oracle (a yardstick).")
    ] = "least_loaded",
    lengths: Annotated[
        str, typer.Option(help="Output lengths known to the core: oracle, estimator, noisy:TAU.")
    ] = "estimator",
    engine_scheduling: Annotated[
        str,
        typer.Option(
            help="The engines' waiting queue: fcfs, or priority (vLLM's "
            "--scheduling-policy priority; a pool with engine_priority sends the tier)."
        ),
    ] = "fcfs",
    timeout: Annotated[
        float | None, typer.Option(help="Client timeout in seconds (cancel and abort).")
    ] = None,
    tenants: Annotated[
        str | None,
        typer.Option(help="Tenant mix tenant[:tier]:weight,... assigned to the trace's rows."),
    ] = None,
    slo: Annotated[
        list[str] | None,
        typer.Option(help="TIER=ttft:S[,tpot:S][,e2e:S] (TIER may be *); repeatable."),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Override the config's preset.")] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(help="KEY=V1,V2 with KEY in policy, load, lengths, replicas, router."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Sweep: local worker processes (default: one per core)."),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(help="Sweep: a Dask scheduler's address (tcp://host:8786) to run on."),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Replay only the first N rows.")] = None,
    window: Annotated[
        str | None, typer.Option(help="Replay only START:END seconds of the trace.")
    ] = None,
    arrivals: Annotated[
        str,
        typer.Option(
            help="trace (its own times), poisson:RATE, gamma:RATE:CV, deterministic:RATE, "
            "onoff:RATE_ON:ON_S:OFF_S[:RATE_OFF], mmpp:R0:R1:S0:S1 or "
            "day:MEAN_RPS[:PEAK_TO_TROUGH[:PEAK_HOUR]], with the trace's request mix."
        ),
    ] = "trace",
    spike: Annotated[
        list[str] | None,
        typer.Option(help="START_S:DURATION_S:FACTOR on top of day arrivals; repeatable."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds of synthetic arrivals (default: 86400 for day, else 3600)."),
    ] = None,
    autoscale: Annotated[
        str | None,
        typer.Option(
            help="Autoscale the first pool: 'config' (the config's autoscale section) or a "
            "KEDA ScaledObject file (deploy/keda/scaledobject.yaml)."
        ),
    ] = None,
    startup: Annotated[
        str | None,
        typer.Option(
            help="Engine start-up delay: SECONDS, LO-HI or lognormal:MEDIAN:SIGMA "
            "(default: the config's, else 120)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed: tenant mix, predictor, capacity.")] = 0,
    start: Annotated[
        str | None,
        typer.Option(help="Wall-clock time of the run's start, ISO (budgets' calendar; now)."),
    ] = None,
    system_prompt: Annotated[
        int,
        typer.Option(
            min=0, help="Tokens of a system prompt per tenant, shared (turns prefix caching on)."
        ),
    ] = 0,
    out: Annotated[Path, typer.Option(help="Directory for the report and plots.")] = Path(
        "sim-report"
    ),
) -> None:
    """Replay a trace through the gateway's admission policy on a modelled fleet."""
    # imported here so that `velvetrope --help` does not load numpy and matplotlib
    from rich.console import Console
    from rich.table import Table

    from velvetrope.core.policy import SloPolicy
    from velvetrope.engine import load_profile
    from velvetrope.sim.inputs import parse_window, prepare_workload
    from velvetrope.sim.loop import run_simulation
    from velvetrope.sim.metrics import parse_slo
    from velvetrope.sim.report import tier_table, write_report
    from velvetrope.sim.sweep import parse_sweep, run_sweep
    from velvetrope.sim.tenant_mix import TenantMix
    from velvetrope.sim.traffic import DayCycle, parse_arrivals, parse_spike

    console = Console()
    if not console.is_terminal:  # a pipe or a file: do not squeeze the table into 80 columns
        console = Console(width=160)
    try:
        mix = TenantMix.parse(tenants) if tenants is not None else None
        policy, max_tokens, reps_per_pool = _policy(config, mix, replicas, preset)
        slos: dict[str, SloPolicy] = dict(parse_slo(s) for s in (slo or []))
        process = parse_arrivals(arrivals, [parse_spike(x) for x in spike or []])
        if process is not None and load is not None:
            raise PolicyError("--load rescales a trace's times; give synthetic arrivals a rate")
        if process is not None and duration is None:
            duration = 86_400.0 if isinstance(process, DayCycle) else 3600.0
        workload = prepare_workload(
            trace,
            tenants=mix,
            seed=seed,
            limit=limit,
            window=parse_window(window) if window is not None else None,
            arrivals=process,
            duration=duration,
        )
        prof = load_profile(profile)
        if system_prompt:
            from velvetrope.sim.prefixes import with_system_prompts

            workload = with_system_prompts(workload, system_prompt)
            prof = prof.with_overrides(enable_prefix_caching=True)
        elif not prof.enable_prefix_caching and any(r.block_hashes for r in workload):
            typer.echo("the trace names its prompts' blocks (Mooncake): prefix caching on")
            prof = prof.with_overrides(enable_prefix_caching=True)
        for line in describe_routing(policy, workload, mix):
            typer.echo(line)
        base: dict[str, Any] = {
            "replicas": reps_per_pool,
            "load": load,
            "router": router,
            "engine_scheduling": engine_scheduling,
            "lengths": lengths,
            "client_timeout_s": timeout,
            "default_max_tokens": max_tokens,
            "slos": slos,
            "seed": seed,
            "label": trace
            if process is None
            else f"{trace}'s request mix at {arrivals} arrivals over {duration:g} s"
            + "".join(f", spike {x}" for x in spike or []),
        }
        t0 = time.perf_counter()
        if sweep:
            from velvetrope.cluster import sweep_executor

            with sweep_executor(workers, cluster) as executor:
                result = run_sweep(
                    policy, workload, prof, parse_sweep(sweep), base=base, executor=executor
                )
            wall = time.perf_counter() - t0
            table = Table(title=f"velvetrope simulate sweep: {trace}")
            for h in result.header():
                table.add_column(h, justify="right")
            for row in result.rows():
                table.add_row(*row)
            console.print(table)
            path = result.write_report(out)
            simulated = sum(r.span_s for _, r in result.points)
        else:
            reps = base.pop("replicas")
            if autoscale is not None:
                base["autoscale"] = _autoscale_spec(autoscale, config, startup, duration or 0.0)
            budgets = _budgets(config)
            said: list[str] = []
            if budgets is None:
                res = run_simulation(policy, workload, reps, prof, **base)
            else:
                from velvetrope.sim.quota_whatif import parse_start, simulate_with_budgets

                at = parse_start(start)
                res, said = simulate_with_budgets(policy, workload, reps, prof, base, budgets, at)
            wall = time.perf_counter() - t0
            console.print(tier_table(res))
            path = write_report(res, out)
            if said:
                for line in said:
                    typer.echo(line)
                with path.open("a", encoding="utf-8") as f:
                    f.write("\n## Budgets\n\n```text\n" + "\n".join(said) + "\n```\n")
            if res.autoscale is not None:
                from velvetrope.sim.autoscale_report import autoscale_rows, write_autoscale

                path = write_autoscale(res, out)
                for what, value in autoscale_rows(res):
                    console.print(f"{what}: {value}", highlight=False)
            simulated = res.span_s
    except VelvetropeError as exc:
        typer.echo(f"velvetrope simulate: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"report: {path}")
    typer.echo(
        f"wall: {wall:.2f} s for {simulated:.1f} simulated s "
        f"({simulated / wall if wall > 0 else float('inf'):.0f}x real time)"
    )
