"""The demo's table: one row per tier and run, with goodput against the tier's SLO.

Latencies are wall seconds from send.  Percentiles are over the requests that were not
turned away; a request cut at the deadline counts with the time it had waited, and a
percentile that lands on or above such a request is printed as a lower bound (``≥``).
Whether a request met its SLO is the simulator's definition
(:func:`velvetrope.sim.metrics.within_slo`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from rich.table import Table

from velvetrope.core.policy import SloPolicy
from velvetrope.demo.replay_results import ReplayOutcome, RequestResult
from velvetrope.demo.settings import RUN_LABEL
from velvetrope.sim.metrics import slo_for, slo_text, within_slo

__all__ = ["Percentile", "TierSummary", "render_table", "slo_met", "summarize"]

_FAILED = (ReplayOutcome.ERROR, ReplayOutcome.FAILED)


@dataclass(frozen=True, slots=True)
class Percentile:
    """A latency percentile; ``lower_bound`` when requests cut before the moment count."""

    value: float | None
    lower_bound: bool = False

    def __str__(self) -> str:
        if self.value is None:
            return "-"
        return f"{'≥' if self.lower_bound else ''}{self.value:.2f}"


@dataclass(frozen=True, slots=True)
class TierSummary:
    """One tier in one run (see :func:`summarize`)."""

    run: str
    tier: str
    requests: int
    completed: int
    rejected: Mapping[str, int]
    cut: int
    errors: int
    ttft_p50: Percentile
    ttft_p99: Percentile
    e2e_p50: Percentile
    e2e_p99: Percentile
    within_slo: int
    goodput_rps: float

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


def _count_within(rs: Sequence[RequestResult], slo: SloPolicy) -> int:
    """How many of ``rs`` completed within ``slo``: the simulator's
    :func:`~velvetrope.sim.metrics.within_slo` on their TTFT, TPOT = (e2e − TTFT) /
    (tokens − 1) (``nan`` for a one-token answer, which has no TPOT) and e2e."""
    times: list[tuple[float, float, float]] = []
    for r in rs:
        if r.outcome is ReplayOutcome.COMPLETED and r.ttft_s is not None and r.e2e_s is not None:
            tpot = r.tpot_s
            times.append((r.ttft_s, math.nan if tpot is None else tpot, r.e2e_s))
    if not times:
        return 0
    ttft, tpot_a, e2e = (np.array(col, dtype=np.float64) for col in zip(*times, strict=True))
    return int(within_slo(slo, ttft, tpot_a, e2e).sum())


def slo_met(r: RequestResult, slo: SloPolicy) -> bool:
    """Whether ``r`` completed within ``slo``, with the simulator's definitions
    (:func:`velvetrope.sim.metrics.within_slo`), each bound checked only when set."""
    return _count_within([r], slo) == 1


def _percentile(values: Sequence[tuple[float, bool]], q: float) -> Percentile:
    """Nearest-rank percentile of ``(value, censored)``; censored values are lower bounds."""
    if not values:
        return Percentile(None)
    ordered = sorted(values)
    k = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    v = ordered[k][0]
    bound = any(c for _, c in ordered[: k + 1])
    return Percentile(v, bound)


def summarize(
    run: str,
    results: Sequence[RequestResult],
    window_s: float,
    slos: Mapping[str, SloPolicy],
    tiers: Sequence[str],
) -> list[TierSummary]:
    """One :class:`TierSummary` per tier of ``tiers`` for the requests of one run.

    Latency percentiles are over requests not turned away (429/503) and not failed with
    another status: completed ones with their times, cut ones with the time they waited
    (censored).  Goodput is the number that met their tier's SLO over ``window_s``.
    """
    out: list[TierSummary] = []
    for tier in tiers:
        rs = [r for r in results if r.tier == tier]
        ttft: list[tuple[float, bool]] = []
        e2e: list[tuple[float, bool]] = []
        for r in rs:
            if r.outcome is ReplayOutcome.COMPLETED and r.e2e_s is not None:
                ttft.append((r.ttft_s if r.ttft_s is not None else r.e2e_s, False))
                e2e.append((r.e2e_s, False))
            elif r.outcome is ReplayOutcome.TIMEOUT and r.error_code != "not_sent":
                ttft.append((r.ttft_s, False) if r.ttft_s is not None else (r.elapsed_s, True))
                e2e.append((r.elapsed_s, True))
        rejected = Counter(
            r.error_code or str(r.status) for r in rs if r.outcome is ReplayOutcome.REJECTED
        )
        good = _count_within(rs, slo_for(tier, slos))
        out.append(
            TierSummary(
                run=run,
                tier=tier,
                requests=len(rs),
                completed=sum(1 for r in rs if r.outcome is ReplayOutcome.COMPLETED),
                rejected=dict(rejected.most_common()),
                cut=sum(1 for r in rs if r.outcome is ReplayOutcome.TIMEOUT),
                errors=sum(
                    1 for r in rs if r.outcome in (ReplayOutcome.ERROR, ReplayOutcome.FAILED)
                ),
                ttft_p50=_percentile(ttft, 50),
                ttft_p99=_percentile(ttft, 99),
                e2e_p50=_percentile(e2e, 50),
                e2e_p99=_percentile(e2e, 99),
                within_slo=good,
                goodput_rps=good / window_s,
            )
        )
    return out


def render_table(summaries: Sequence[TierSummary], slos: Mapping[str, SloPolicy]) -> Table:
    """The final table: one row per tier and run."""
    table = Table(
        title="velvetrope demo: the same overload through the gateway and straight to the engines",
        title_justify="left",
        show_lines=False,
    )
    for name, justify in (
        ("tier / SLO", "left"),
        ("run", "left"),
        ("reqs", "right"),
        ("done", "right"),
        ("TTFT p50", "right"),
        ("TTFT p99", "right"),
        ("e2e p50", "right"),
        ("e2e p99", "right"),
        ("rejected (reason)", "left"),
        ("cut", "right"),
        ("in SLO", "right"),
        ("goodput/s", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last_tier = None
    for s in summaries:
        first = s.tier != last_tier
        if first and last_tier is not None:
            table.add_section()
        last_tier = s.tier
        reasons = ", ".join(f"{k} {v}" for k, v in s.rejected.items())
        rejected = f"{s.rejected_total}" + (f" ({reasons})" if reasons else "")
        label = f"{s.tier}\n{slo_text(slo_for(s.tier, slos))}" if first else ""
        table.add_row(
            label,
            RUN_LABEL.get(s.run, s.run),
            str(s.requests),
            str(s.completed),
            str(s.ttft_p50),
            str(s.ttft_p99),
            str(s.e2e_p50),
            str(s.e2e_p99),
            rejected,
            f"{s.cut} +{s.errors} err" if s.errors else str(s.cut),
            str(s.within_slo),
            f"{s.goodput_rps:.2f}",
        )
    return table
