"""Budgets in what-if runs: the gateway's quota decision on a workload, and a forecast of
when each tenant's budgets run out at the workload's pace.

:func:`apply_quotas` runs the core's budget rule (:mod:`velvetrope.core.quota`) on a
workload before the simulator replays it, in virtual time (``start`` plus each request's
``t`` is its wall-clock epoch): each request's budget claims are reserved all or none in
the core's memory buckets, as the gateway's ``memory://`` store does; a denial by a spent
budget gets what :meth:`~velvetrope.core.quota.QuotaBook.exceeded` says (refused: the
request is dropped and counted; downgraded: it runs at the budget's tier, reserved again
without that budget, as the gateway does); a granted request settles at once with its true
usage (prompt and output tokens).  What this approximates: the gateway settles at a
request's end, so in the run a budget sees the requests in flight a few seconds earlier
than the gateway would (nothing over day-long windows); the run's rate buckets and queue
come after, in the controller; a downgrade's ``downgrade_to_pool`` is not applied (the
simulator routes the new tier by the policy's rules); ``cached_input`` is not modelled.

:func:`forecast` extrapolates each tenant's use (weighted or priced as its budget counts)
per second of the workload over the budgets' windows from ``start``, each window starting
full: the first moment a budget is spent, or ``None`` when the pace never spends it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple
from zoneinfo import ZoneInfo

from velvetrope.core.bucket import Denial, Grant, MemoryBuckets, settle_lines
from velvetrope.core.lifecycle import Usage
from velvetrope.core.quota import QuotaBook, window_bounds
from velvetrope.core.quota_config import ANY_TENANT, Budget, QuotaSettings
from velvetrope.sim.trace_request import TraceRequest

__all__ = ["BudgetForecast", "QuotaRun", "apply_quotas", "budget_label", "forecast"]

_MAX_WINDOWS = 400
"""How many windows ahead a forecast looks for the first one the pace spends."""


@dataclass
class QuotaRun:
    """What the budgets did to a workload: requests refused per tenant, downgraded per
    (tenant, tier), the first request's time (``t``, seconds) each budget key denied, and
    per request of the workload kept the tier a downgrade forces (``None``: its own)."""

    refused: Counter[str] = field(default_factory=Counter)
    downgraded: Counter[tuple[str, str]] = field(default_factory=Counter)
    first_denied: dict[str, float] = field(default_factory=dict)
    forced_tiers: list[str | None] = field(default_factory=list)

    @property
    def any_forced(self) -> bool:
        return any(t is not None for t in self.forced_tiers)


def apply_quotas(
    workload: Sequence[TraceRequest], settings: QuotaSettings, start: float
) -> tuple[list[TraceRequest], QuotaRun]:
    """The requests of ``workload`` (sorted by ``t``) that the budgets of ``settings`` let
    through, from epoch ``start`` on, and what they did (see the module docstring)."""
    book = QuotaBook(settings.model_copy(update={"ledger": False}))
    buckets = MemoryBuckets()
    run = QuotaRun()
    out: list[TraceRequest] = []
    for r in workload:
        now = start + r.t
        prompt, output = r.prompt_tokens, r.output_tokens
        spent: tuple[str, ...] = ()
        tier: str | None = None
        while True:
            claims = book.claims(r.tenant, r.model, prompt, output, now, spent)
            res: Grant | Denial = buckets.reserve(claims, now)
            if isinstance(res, Grant):
                break
            run.first_denied.setdefault(res.key, r.t)
            d = book.exceeded(res)
            if d is None or d.key in spent:
                break
            spent += (d.key,)
            tier = d.tier if d.tier is not None else tier
        if isinstance(res, Denial):
            run.refused[r.tenant] += 1
            continue
        lines = settle_lines(claims, prompt + output)
        buckets.settle(book.settle(r.model, claims, lines, Usage(prompt, output)), now)
        if spent:
            run.downgraded[(r.tenant, tier or "(own)")] += 1
        out.append(r)
        run.forced_tiers.append(tier)
    return out, run


class BudgetForecast(NamedTuple):
    """One tenant's budget at the workload's pace: its ``use_per_day`` (in the budget's
    unit), the ``share`` of a full window it would use (rolling: of its refill), and the
    first moment (epoch) it is spent from ``start`` on (``None``: never at this pace)."""

    tenant: str
    budget: Budget
    use_per_day: float
    share: float
    exhausted_at: float | None


def budget_label(b: Budget) -> str:
    """``day 300 tok``, ``month $50``, ``rolling 6h 5e+06 tok`` (and ``on llama-70b``)."""
    window = f"rolling {b.hours:g}h" if b.hours is not None else b.window
    size = f"${b.amount:g}" if b.unit == "usd" else f"{b.amount:g} tok"
    return f"{window} {size}" + (f" on {b.model}" if b.model is not None else "")


def forecast(
    workload: Sequence[TraceRequest],
    settings: QuotaSettings,
    start: float,
    span_s: float | None = None,
) -> list[BudgetForecast]:
    """Per tenant of ``workload`` and budget it counts against (see the module docstring);
    ``span_s`` is the seconds the workload covers (default: its first to last arrival
    times ``n / (n - 1)``, n arrivals being n mean gaps; at least 1 s)."""
    if not workload or not settings.budgets:
        return []
    book = QuotaBook(settings)
    zone = ZoneInfo(settings.time_zone)
    if span_s is None:
        n = len(workload)
        span_s = max(1.0, (workload[-1].t - workload[0].t) * n / max(1, n - 1))
    used: dict[tuple[str, int], float] = {}
    for r in workload:
        for i, b in enumerate(settings.budgets):
            if b.tenant in (r.tenant, ANY_TENANT) and b.model in (None, r.model):
                k = (r.tenant, i)
                used[k] = used.get(k, 0.0) + book.use(
                    b, r.model, r.prompt_tokens, 0, r.output_tokens
                )
    out = []
    for (tenant, i), total in sorted(used.items()):
        b = settings.budgets[i]
        rate = total / span_s
        if b.hours is not None:
            window_s = b.hours * 3600.0
            refill = b.amount / window_s
            at = start + b.amount / (rate - refill) if rate > refill else None
        else:
            _, ws, we = window_bounds(b.window, zone, start)
            window_s = we - ws
            at = _first_spent(b, zone, start, rate)
        out.append(BudgetForecast(tenant, b, rate * 86400.0, rate * window_s / b.amount, at))
    return out


def _first_spent(b: Budget, zone: ZoneInfo, start: float, rate: float) -> float | None:
    """When calendar budget ``b``, full at ``start`` and again at each window's start, is
    first spent at ``rate`` per second (``None``: not within :data:`_MAX_WINDOWS`)."""
    if rate <= 0.0:
        return None
    need = b.amount / rate
    t = start
    for _ in range(_MAX_WINDOWS):
        _, _, end = window_bounds(b.window, zone, t)
        if t + need <= end:
            return t + need
        t = end
    return None


def local_time(epoch: float, zone: str) -> str:
    """``2026-12-19 14:05`` in ``zone``."""
    return datetime.fromtimestamp(epoch, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M")


def forecast_lines(rows: Sequence[BudgetForecast], zone: str) -> list[str]:
    """The forecast as aligned text lines (a header, then one per tenant and budget)."""
    if not rows:
        return []
    table = [("tenant", "budget", "use/day", "of a window", "spent at this pace")]
    for f in rows:
        unit = "$" if f.budget.unit == "usd" else ""
        when = "never" if f.exhausted_at is None else local_time(f.exhausted_at, zone)
        table.append((f.tenant, budget_label(f.budget), f"{unit}{f.use_per_day:,.6g}",
                      f"{f.share:.0%}", when))  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def run_lines(run: QuotaRun, offered: int) -> list[str]:
    """What the budgets did in a run of ``offered`` requests."""
    refused = sum(run.refused.values())
    downgraded = sum(run.downgraded.values())
    out = [f"budgets in the run: {offered:,} offered, {refused:,} refused (quota_exceeded), "
           f"{downgraded:,} downgraded"]  # fmt: skip
    out += [f"  refused {t}: {n:,}" for t, n in sorted(run.refused.items())]
    out += [f"  downgraded {t} -> {tier}: {n:,}" for (t, tier), n in sorted(run.downgraded.items())]
    out += [f"  {k} spent at t={t:,.0f} s" for k, t in sorted(run.first_denied.items())]
    return out


def refusing(settings: QuotaSettings) -> QuotaSettings:
    """``settings`` with every budget refusing (``on_exceeded: refuse``): the what-if's
    other arm."""
    budgets = tuple(
        b.model_copy(
            update={"on_exceeded": "refuse", "downgrade_to_tier": None, "downgrade_to_pool": None}
        )
        for b in settings.budgets
    )
    return settings.model_copy(update={"budgets": budgets})
