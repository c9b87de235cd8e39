"""``velvetrope simulate`` with the config's budgets: the run under its quotas, the
forecast, and, when a budget downgrades, the same run with every budget refusing instead,
to say what the top tier's SLO does either way (:mod:`velvetrope.sim.quotas`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from velvetrope.core import PolicyConfig
from velvetrope.core.quota_config import QuotaSettings
from velvetrope.engine import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.metrics import TierStats
from velvetrope.sim.quotas import (
    QuotaRun,
    apply_quotas,
    forecast,
    forecast_lines,
    refusing,
    run_lines,
)
from velvetrope.sim.result import SimResult
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["parse_start", "simulate_with_budgets"]


def parse_start(text: str | None) -> float:
    """``--start``: an ISO date or date-time (UTC unless it says), or ``None``: now."""
    if text is None:
        return datetime.now(UTC).timestamp()
    try:
        when = datetime.fromisoformat(text)
    except ValueError as e:
        raise PolicyError(f"--start: not an ISO date or date-time: {text!r}") from e
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _tiers(res: SimResult, policy: PolicyConfig, lower: set[str]) -> list[TierStats]:
    """``res``'s row of the top tier with requests, then those of the ``lower`` tiers."""
    rows = {r.tier: r for r in res.summary() if r.tier != "all"}
    names = [t.name for t in policy.tiers if t.name in rows]
    out = [rows[names[0]]] if names else []
    return out + [rows[t] for t in names[1:] if t in lower]


def _tier_lines(what: str, rows: list[TierStats]) -> list[str]:
    return [f"  {what}: {'top tier ' if i == 0 else ''}{r.tier}: {r.completed:,}/{r.offered:,} "
            f"done, goodput {r.goodput_frac:.1%}, TTFT p99 {r.ttft[2]:.3f} s, e2e p99 "
            f"{r.e2e[2]:.3f} s" for i, r in enumerate(rows)]  # fmt: skip


class _Pass:
    """The budgets of one run, applied to its workload once rescaled (``run_simulation``'s
    ``budgets``): keeps what the pass did and the workload it saw."""

    def __init__(self, settings: QuotaSettings, start: float) -> None:
        self.settings = settings
        self.start = start
        self.run = QuotaRun()
        self.seen: Sequence[TraceRequest] = ()

    def __call__(
        self, workload: Sequence[TraceRequest]
    ) -> tuple[list[TraceRequest], list[str | None]]:
        self.seen = workload
        kept, self.run = apply_quotas(workload, self.settings, self.start)
        if not kept:
            raise PolicyError("the budgets refuse every request of the workload")
        return kept, self.run.forced_tiers


def simulate_with_budgets(
    policy: PolicyConfig,
    workload: Sequence[TraceRequest],
    replicas: Any,
    profile: EngineProfile,
    base: dict[str, Any],
    settings: QuotaSettings,
    start: float,
) -> tuple[SimResult, list[str]]:
    """The run of ``workload`` under ``settings``' budgets from epoch ``start`` (on the
    workload as the run replays it: rescaled by ``--load``), and the lines to print: the
    forecast at that pace, what the budgets did, and, when any request was downgraded, the
    top tier in this run and in the same run with every budget refusing."""
    this = _Pass(settings, start)
    res = run_simulation(policy, workload, replicas, profile, budgets=this, **base)
    when = datetime.fromtimestamp(start, UTC).isoformat()
    lines = [f"budgets from {when} ({settings.time_zone}), at the run's pace:"]
    rows = forecast(this.seen, settings, start)
    lines += ["  " + x for x in forecast_lines(rows, settings.time_zone)]
    lines += run_lines(this.run, len(this.seen))
    if this.run.any_forced:
        other = _Pass(refusing(settings), start)
        lower = {tier for _, tier in this.run.downgraded}
        lines.append("downgrade instead of refuse: the top tier, and the tiers downgraded to:")
        lines += _tier_lines("downgrade (this run)", _tiers(res, policy, lower))
        try:
            res2 = run_simulation(policy, workload, replicas, profile, budgets=other, **base)
        except PolicyError as e:
            lines.append(f"  refuse: {e}")
        else:
            refused = sum(other.run.refused.values())
            lines += _tier_lines(f"refuse ({refused:,} refused)", _tiers(res2, policy, lower))
    return res, lines


def plan_budget_lines(
    config: str, trace: str, tenants: str | None, design_rps: float, start: float
) -> list[str]:
    """``velvetrope plan --config``: when each tenant's budgets (the config's quotas) run
    out if ``trace``'s requests (tenants from the trace or the ``tenants`` mix) arrive at
    ``design_rps``, from epoch ``start``."""
    from velvetrope.config import load_config
    from velvetrope.sim.inputs import prepare_workload
    from velvetrope.sim.tenant_mix import TenantMix

    settings = load_config(config).quotas
    if not settings.budgets:
        return [f"budgets: {config} has no quotas.budgets"]
    mix = TenantMix.parse(tenants) if tenants is not None else None
    workload = prepare_workload(trace, tenants=mix)
    span = len(workload) / design_rps
    when = datetime.fromtimestamp(start, UTC).isoformat()
    lines = [f"budgets from {when} ({settings.time_zone}), at {design_rps:g} req/s of {trace}:"]
    rows = forecast(workload, settings, start, span_s=span)
    return lines + ["  " + x for x in forecast_lines(rows, settings.time_zone)]
