"""A scripted admission scenario through the core, printed decision by decision.

Three tenants on three tiers share one pool of 4 slots under the ``hybrid`` preset; a
burst arrives, the pool drains in virtual time, and every decision and terminal outcome is
printed.  It runs in milliseconds and needs no server: ``velvetrope scenario``.
"""

from __future__ import annotations

import heapq
import random

from rich.console import Console
from rich.table import Table

from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Dispatched,
    Job,
    Outcome,
    PolicyConfig,
    Queued,
    Rejected,
    Usage,
)
from velvetrope.store.memory import MemoryStore

__all__ = ["SCENARIO_POLICY", "run_scenario"]

SCENARIO_POLICY = {
    "preset": "hybrid",
    "queue": {"max_queued": 12},
    "tiers": [
        {"name": "interactive", "max_wait_s": 20},
        {"name": "standard", "max_wait_s": 60},
        {"name": "batch"},
    ],
    "tenants": [
        {"name": "acme", "tier": "interactive", "limits": {"tokens_per_minute": 40_000}},
        {"name": "globex", "tier": "standard", "max_queued": 5},
        {"name": "initech", "tier": "batch", "limits": {"tokens_per_minute": 6_000}},
    ],
    "pools": [{"name": "default", "max_in_flight": 4, "initial_drain_tokens_per_s": 400}],
}

TPOT_S = 0.02  # virtual seconds per output token


def run_scenario(console: Console | None = None, seed: int = 7, n: int = 30) -> list[Outcome]:
    """Run the scenario, print it, and return every terminal outcome in order."""
    console = console or Console()
    clock = ManualClock()
    outcomes: list[Outcome] = []
    store = MemoryStore(clock)  # the buckets, settled as the gateway settles them
    ctl = AdmissionController(
        PolicyConfig.model_validate(SCENARIO_POLICY),
        clock,
        observers=[outcomes.append, store.settle],
    )
    rng = random.Random(seed)
    tenants = ["acme", "globex", "initech"]
    arrivals = []
    for i in range(n):
        tenant = tenants[rng.randrange(3)]
        out = int(rng.lognormvariate(4.5, 0.8))
        job = Job(
            id=f"req-{i:02d}",
            tenant=tenant,
            tier=ctl.resolve_tier(tenant),
            prompt_tokens=rng.randrange(50, 1500),
            max_tokens=max(out, 1) * 2,
            predicted_output=max(out, 1),
        )
        arrivals.append((round(i * 0.15, 3), job))
    table = Table(title="velvetrope: decisions through the admission core (virtual time)")
    for col in ("t (s)", "request", "tenant", "tier", "event", "detail"):
        table.add_column(col)
    running: list[tuple[float, str]] = []
    i = 0

    def start(job: Job) -> None:
        heapq.heappush(running, (clock.now() + (job.predicted_output or 1) * TPOT_S, job.id))
        table.add_row(
            f"{clock.now():.2f}",
            job.id,
            job.tenant,
            job.tier,
            "[green]dispatch",
            f"waited {job.queue_s:.2f}s",
        )

    while i < len(arrivals) or running:
        t_arr = arrivals[i][0] if i < len(arrivals) else float("inf")
        t_done = running[0][0] if running else float("inf")
        clock.set(max(clock.now(), min(t_arr, t_done)))
        if t_done <= t_arr:
            _, jid = heapq.heappop(running)
            live = ctl.job(jid)
            assert live is not None
            ctl.complete(jid, Usage(live.prompt_tokens, live.predicted_output or 1))
        else:
            job = arrivals[i][1]
            i += 1
            d = store.arrive(ctl, job)
            if isinstance(d, Dispatched):
                start(job)
            elif isinstance(d, Queued):
                eta = "?" if d.eta_s is None else f"{d.eta_s:.2f}s"
                table.add_row(
                    f"{clock.now():.2f}",
                    job.id,
                    job.tenant,
                    job.tier,
                    "[yellow]queue",
                    f"{d.position} ahead, eta {eta}",
                )
            else:
                assert isinstance(d, Rejected)
                retry = "-" if d.retry_after_s is None else f"{d.retry_after_s:.1f}s"
                table.add_row(
                    f"{clock.now():.2f}",
                    job.id,
                    job.tenant,
                    job.tier,
                    f"[red]{d.status} {d.reason.code}",
                    f"retry after {retry}",
                )
        for job in ctl.dispatchable():
            start(job)
        for o in ctl.tick():
            table.add_row(
                f"{clock.now():.2f}",
                o.job.id,
                o.job.tenant,
                o.job.tier,
                f"[red]{o.reason.code}",
                "",
            )
    console.print(table)
    summary = Table(title="outcomes")
    summary.add_column("outcome")
    summary.add_column("count", justify="right")
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.reason.code] = counts.get(o.reason.code, 0) + 1
    for k, v in sorted(counts.items()):
        summary.add_row(k, str(v))
    console.print(summary)
    console.print(f"in flight at the end: {ctl.in_flight}, queued: {ctl.queued}")
    return outcomes
