"""Running the demo: the processes, the three runs, the report (:func:`run_demo`).

Every process started is stopped (by its PID) when the demo ends, on error and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from velvetrope.config import load_config
from velvetrope.core.engine_priority import EnginePriority
from velvetrope.core.policy import PolicyConfig, SloPolicy
from velvetrope.demo.live import Monitor, RunResult, run_phase
from velvetrope.demo.plot import plot_runs
from velvetrope.demo.replay_config import ReplayConfig
from velvetrope.demo.replay_results import ReplayOutcome
from velvetrope.demo.settings import (
    DIRECT,
    DIRECT_PRIORITY,
    GATEWAY,
    RUN_LABEL,
    DemoSettings,
    read_config,
    tenant_keys,
)
from velvetrope.demo.summary import TierSummary, render_table, summarize
from velvetrope.demo.workload import Capacity, Workload, build_workload
from velvetrope.engine import load_profile
from velvetrope.errors import ConfigError, PolicyError
from velvetrope.serving import launch
from velvetrope.sim.metrics import config_slos, slo_for, slo_text
from velvetrope.sim.tenant_mix import TenantMix

__all__ = ["DemoReport", "engine_priorities", "gateway_config", "run_demo", "start_engines"]


@dataclass(frozen=True, slots=True)
class DemoReport:
    """What :func:`run_demo` measured: the table rows, the plot's path, the settings.

    ``runs``: each run done, by name, in the order run (:data:`~.settings.RUNS`; the
    engine-priority run only when the engines ran in priority mode, see ``scheduling``).
    ``pids``: the processes it started (all stopped by then).  ``problems``: what went wrong
    that the table alone would not explain (error answers, with the server's last log lines).
    ``priorities``: the ``priority`` each tier's requests carried in the engine-priority run
    (empty when there was none).  ``scheduling``: the engines' ``--scheduling``.
    """

    settings: DemoSettings
    workload_size: int
    offered_rps: float
    compression: float
    capacity: Capacity
    summaries: list[TierSummary]
    runs: Mapping[str, RunResult]
    plot_path: Path | None
    pids: list[int]
    slos: Mapping[str, SloPolicy] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    priorities: Mapping[str, int] = field(default_factory=dict)
    scheduling: str = "fcfs"

    def summary(self, run: str, tier: str) -> TierSummary:
        """The row of ``tier`` in ``run`` (a key of ``runs``: ``"gateway"``, ``"direct"``,
        ``"direct_priority"``)."""
        for s in self.summaries:
            if s.run == run and s.tier == tier:
                return s
        raise KeyError((run, tier))

    def tiers(self) -> list[str]:
        """The tiers of the table, in its order (the config's)."""
        return list(dict.fromkeys(s.tier for s in self.summaries))

    def versus(self, run: str) -> list[tuple[str, int, int]]:
        """Per tier: ``(tier, requests in SLO through the gateway, in SLO in run)``."""
        return [
            (t, self.summary(GATEWAY, t).within_slo, self.summary(run, t).within_slo)
            for t in self.tiers()
        ]

    def tokens_wasted(self, run: str) -> int:
        """Tokens streamed in ``run`` for requests that never completed (cut at the
        deadline, hung up, failed): work the engines did for nothing."""
        return self.runs[run].replay.tokens_wasted()

    def throughput(self, run: str) -> tuple[float, float]:
        """``(completed requests, completion tokens)`` per second of ``run``'s duration."""
        rr = self.runs[run].replay
        done = [r for r in rr.results if r.outcome is ReplayOutcome.COMPLETED]
        return len(done) / rr.duration_s, sum(r.tokens for r in done) / rr.duration_s


async def _all_runs(
    s: DemoSettings,
    wl: Workload,
    gateway_url: str,
    engine_urls: Sequence[str],
    keys: Mapping[str, str],
    admin_token: str | None,
    band_limits: Mapping[str, int],
    priorities: Mapping[str, int] | None,
    console: Console,
) -> dict[str, RunResult]:
    """The runs in order, the engines idle before each one after the first; the
    engine-priority run only with ``priorities`` (tier -> the body's ``priority``)."""
    bound = s.window_s + s.drain_s
    # Sockets: more than the ~1,250 requests open at once in the direct run, so that the
    # client's connection pool never queues requests itself (that would be admission).
    bounds: dict[str, Any] = {
        "deadline_s": bound,
        "request_timeout_s": bound,
        "max_connections": 4096,
    }
    runs: dict[str, RunResult] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        mon = Monitor(session, gateway_url, admin_token, engine_urls)
        plan = [
            (GATEWAY, "through the gateway", ReplayConfig((gateway_url,), keys, **bounds)),
            (
                DIRECT,
                "straight to the engines, no admission",
                ReplayConfig(tuple(engine_urls), "sk-direct", **bounds),
            ),
        ]
        if priorities is not None:
            plan.append(
                (
                    DIRECT_PRIORITY,
                    "straight to the engines, no admission, the tier as the engine's priority",
                    ReplayConfig(tuple(engine_urls), "sk-direct", priorities=priorities, **bounds),
                )
            )
        animate = s.live and console.is_terminal
        for i, (name, what, rcfg) in enumerate(plan, 1):
            if i > 1 and not await mon.wait_engines_idle(10.0):
                console.print(f"[yellow]engines still busy 10 s after run {i - 1}; going on[/]")
            title = f"run {i}/{len(plan)}: {what}"
            if not animate:
                console.print(f"{title} ...")
            live = Live(console=console, auto_refresh=False) if animate else None
            with live if live is not None else contextlib.nullcontext() as view:
                runs[name] = await run_phase(
                    name, title, wl.requests, rcfg, mon, s, band_limits, view, console
                )
    return runs


def start_engines(
    s: DemoSettings, stack: contextlib.ExitStack, scheduling: str = "fcfs"
) -> list[launch.ServerProcess]:
    """The demo's two engines (``s.profile`` at ``s.speed``, ``--scheduling scheduling``,
    then ``s.engine_args``), started in parallel; each registered in ``stack`` to be
    stopped (also those started when another failed).

    ``scheduling="priority"`` (vLLM's ``--scheduling-policy priority``) leaves a run whose
    requests carry no ``priority`` first come, first served, as ``fcfs`` would (read in
    :mod:`velvetrope.engine`): the server submits such a request with priority 0
    (``req.priority or 0``), so the waiting queue (``queues.PriorityQueue``) orders by
    ``(0, arrival, order)``, that is by arrival.  ``fcfs`` keeps every running sequence
    ahead of every waiting one in arrival order (admission from the head, new arrivals at
    the back, a preempted sequence back at the front), so the two modes pick the same
    preemption victim (the latest arrival that priority mode picks is the latest admitted
    that ``fcfs`` picks) and put it back at the same place.  The one difference: ties go by
    the model's arrival time (when the HTTP request reached the server) instead of
    submission order, so two requests parsed out of order within one step may swap.
    """
    if scheduling not in ("fcfs", "priority"):
        raise PolicyError(f"engine scheduling must be fcfs or priority, got {scheduling!r}")
    args = (
        "--speed",
        f"{s.speed:g}",
        "--profile",
        s.profile,
        "--scheduling",
        scheduling,
        *s.engine_args,
    )
    ex = ThreadPoolExecutor(2)
    futs = [ex.submit(launch.start_engine, *args) for _ in range(2)]
    try:
        wait(futs)
    finally:
        ex.shutdown(wait=True)  # after a Ctrl-C too: let the starts end so they can be stopped
        engines = []
        for f in futs:
            if not f.cancelled() and f.exception() is None:
                proc = f.result()
                stack.callback(proc.stop)
                engines.append(proc)
    for f in futs:
        err = f.exception()
        if err is not None:
            raise err
    return engines


def engine_priorities(policy: PolicyConfig) -> dict[str, int] | None:
    """The ``priority`` per tier of the engine-priority run: the tier's index in
    ``policy.tiers`` (0 = the top tier), what a user of vLLM's priority mode sends and what
    the gateway forwards (:class:`~velvetrope.core.engine_priority.EnginePriority`).
    ``None`` when no pool forwards the engine priority: the engines then run FCFS."""
    if not EnginePriority(policy).enabled:
        return None
    return {t.name: i for i, t in enumerate(policy.tiers)}


def gateway_config(
    base: Mapping[str, Any], engine_urls: Sequence[str], preset: str | None
) -> dict[str, Any]:
    """A copy of the config ``base`` on a free loopback port, every pool's upstreams being
    ``engine_urls``, with ``policy.preset`` replaced by ``preset`` unless it is ``None``."""
    cfg: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(base)))  # a deep copy
    cfg["listen"] = {**(cfg.get("listen") or {}), "host": "127.0.0.1", "port": launch.free_port()}
    pools = list((cfg.get("upstreams") or {}).keys()) or ["default"]
    cfg["upstreams"] = {p: [{"url": u} for u in engine_urls] for p in pools}
    if preset is not None:
        cfg.setdefault("policy", {})["preset"] = preset
    return cfg


def _slo_text(slo: SloPolicy, s: DemoSettings) -> str:
    run_s = s.window_s + s.drain_s
    if slo.e2e_s is not None and slo.e2e_s >= run_s:
        return f"{slo_text(slo)} (longer than a run of {run_s:g} s: any completion counts)"
    return slo_text(slo)


def run_demo(settings: DemoSettings | None = None, console: Console | None = None) -> DemoReport:
    """Run the demo (see the module docstring), print its report and return it.

    Starts two engines and the gateway on loopback, runs the workload through the gateway,
    then straight to the engines, then (engines in priority mode) straight to the engines
    with the tier as each request's ``priority``; prints the table and writes the plot to
    ``settings.out_dir / "demo.png"``.  The engines run in vLLM's priority mode when a pool
    of the config forwards the engine priority (``pools[].engine_priority``), else FCFS and
    the third run is left out (said in the output).  Every process started is stopped
    before returning, also when an error or Ctrl-C ends the demo early.
    """
    s = settings or DemoSettings()
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: do not squeeze the table
            console = Console(width=200)
    base = read_config(s.config_path)
    keys = tenant_keys(base, s.config_path)
    mix = TenantMix.parse(s.mix)
    missing = [t for t in mix.tenants if t not in keys]
    if missing:
        raise ConfigError(f"{s.config_path}: no plain API key for tenant(s) {missing}")
    policy = load_config(s.config_path).policy  # validated: errors name file and field
    tiers = [t.name for t in policy.tiers]
    band_limits = {t.name: t.max_queued or policy.queue.max_queued for t in policy.tiers}
    slots = sum(p.in_flight_ceiling for p in policy.pools)
    slo_limit = any(p.limit_mode == "slo" for p in policy.pools)
    if slo_limit:  # no slot count: at most what the engines seat
        slots = min(slots, 2 * load_profile(s.profile).max_num_seqs)
    slos: dict[str, SloPolicy] = dict(s.slos) if s.slos is not None else config_slos(policy)
    priorities = engine_priorities(policy)
    scheduling = "fcfs" if priorities is None else "priority"
    wl = build_workload(s, slots)
    cap = wl.capacity
    console.print(
        f"[bold]velvetrope demo[/]: {len(wl.requests)} requests of the {s.trace} trace "
        f"(from {s.trace_start_s:g}s, compressed {wl.compression:.1f}×) over {s.window_s:g}s: "
        f"{wl.offered_rps:.1f} req/s offered\n"
        f"  capacity (derived from the engine model, {s.profile} at speed {s.speed:g}, 2 engines):"
        f" {cap.engines_rps:.1f} req/s  → offered = {wl.offered_rps / cap.engines_rps:.2f}×;"
        + (
            f" with the gateway's limits from the SLOs (at most the engines' {slots} seats):"
            if slo_limit
            else f" with the gateway's {slots} slots ({cap.slots_per_engine} per engine):"
        )
        + f" {cap.gateway_rps:.1f} req/s\n"
        f"  SLOs (wall s at demo speed, from {'the settings' if s.slos else 'the config'}): "
        + "; ".join(f"{t}: {_slo_text(slo_for(t, slos), s)}" for t in tiers)
    )
    pids: list[int] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="velvetrope-demo-")))
        t_start = time.monotonic()
        engines = start_engines(s, stack, scheduling)
        pids += [e.pid for e in engines]
        cfg = gateway_config(base, [e.url for e in engines], s.preset)
        gw = launch.start_gateway(cfg, tmp)
        stack.callback(gw.stop, 5.0)
        pids.append(gw.pid)
        console.print(
            f"  started engines {[e.url for e in engines]} (--scheduling {scheduling}) and "
            f"gateway {gw.url} (preset {cfg.get('policy', {}).get('preset')}) "
            f"in {time.monotonic() - t_start:.1f}s"
        )
        if priorities is None:
            console.print(
                f"  no pool of {s.config_path.name} forwards the engine priority "
                "(pools[].engine_priority): the engines run FCFS and the run with the tier "
                "as the engine's priority is left out"
            )
        runs = asyncio.run(
            _all_runs(
                s,
                wl,
                gw.url,
                [e.url for e in engines],
                keys,
                cfg.get("admin_token"),
                band_limits,
                priorities,
                console,
            )
        )
        problems = _problems(runs, gw, engines)
    summaries: list[TierSummary] = []
    for tier in tiers:
        for run in runs:
            summaries += summarize(run, runs[run].replay.results, s.window_s, slos, [tier])
    plot = plot_runs(runs, summaries, s.out_dir / "demo.png", tiers, s.window_s)
    report = DemoReport(
        settings=s,
        workload_size=len(wl.requests),
        offered_rps=wl.offered_rps,
        compression=wl.compression,
        capacity=cap,
        summaries=summaries,
        runs=runs,
        plot_path=plot,
        pids=pids,
        slos=slos,
        problems=problems,
        priorities=priorities or {},
        scheduling=scheduling,
    )
    _print_report(report, console)
    return report


def _problems(
    runs: Mapping[str, RunResult],
    gateway: launch.ServerProcess,
    engines: Sequence[launch.ServerProcess],
) -> list[str]:
    """Error answers per run, by status and code, with the servers' last stderr lines."""
    out: list[str] = []
    for run in runs:
        procs = [gateway] if run == GATEWAY else list(engines)
        bad = Counter(
            (r.status, r.error_code or "")
            for r in runs[run].replay.results
            if r.outcome in (ReplayOutcome.ERROR, ReplayOutcome.FAILED)
        )
        if not bad:
            continue
        what = ", ".join(f"{n}× HTTP {st or '-'} {code}".rstrip() for (st, code), n in bad.items())
        out.append(f"{RUN_LABEL[run]} run: error answers: {what}")
        for p in procs:
            tail = [ln for ln in p.stderr_text().splitlines() if ln.strip()][-6:]
            if tail:
                out.append(f"last stderr lines of pid {p.pid}:\n    " + "\n    ".join(tail))
    return out


def _versus_line(report: DemoReport, run: str) -> str:
    """Per tier, whether the gateway got at least as many requests within SLO as ``run``."""
    name = "engines (priority)" if run == DIRECT_PRIORITY else RUN_LABEL[run]
    parts = [
        f"{tier} {g} {'≥' if g >= o else '<'} {o} {'✓' if g >= o else '✗'}"
        for tier, g, o in report.versus(run)
    ]
    return f"  in SLO, gateway vs {name}: " + ", ".join(parts)


def _print_report(report: DemoReport, console: Console) -> None:
    s = report.settings
    console.print(render_table(report.summaries, report.slos))
    width = max(len(RUN_LABEL[run]) for run in report.runs)
    for run in report.runs:
        rr = report.runs[run].replay
        rps, tps = report.throughput(run)
        good = sum(x.within_slo for x in report.summaries if x.run == run)
        console.print(
            f"  {RUN_LABEL[run]:>{width}}: {rr.duration_s:4.1f}s, completed {rps:5.1f} req/s "
            f"({tps:,.0f} tokens/s), in SLO {good}/{len(rr.results)} "
            f"= {good / s.window_s:.1f}/s; tokens generated for requests never completed: "
            f"{report.tokens_wasted(run):,}; loadgen max send lag "
            f"{rr.max_send_lag_s * 1000:.0f} ms"
        )
    if DIRECT_PRIORITY in report.runs:
        console.print(_versus_line(report, DIRECT_PRIORITY), highlight=False)
    console.print(
        "  latencies in wall seconds from send; percentiles over requests not rejected; "
        "'≥' = lower bound (requests cut at the deadline count with the time they waited)"
    )
    for line in report.problems:
        console.print(f"  [bold red]problem:[/] {escape(line)}", highlight=False)
    console.print(f"  plot: {report.plot_path}")
