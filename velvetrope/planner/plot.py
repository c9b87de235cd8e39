"""The latency-versus-utilisation plot of a plan (PNG, matplotlib's Agg backend).

At the plan's size (``N`` replicas, ``K`` slots each) the arrival rate is swept so that
``ρ = λ/(N·X(K))`` covers 0.02 … 0.98; the model's p50 and p99 of the SLO's metric (and of
end-to-end latency when the SLO is on something else) are drawn against ρ on a scale that
is logarithmic above 10 ms and linear below (so that a zero wait shows),
with the SLO bound, the target ρ and the plan's design point marked.  The figure is built
on a :class:`matplotlib.figure.Figure` with an Agg canvas, never through ``pyplot``, so no
global state or display is touched.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from velvetrope.planner.plan import Plan
from velvetrope.planner.predict import predict
from velvetrope.planner.prediction import Metric

__all__ = ["latency_curve", "plot_latency_vs_utilisation"]

_LINTHRESH_S = 0.01

_LABEL: dict[str, str] = {"e2e": "end-to-end", "wait": "queue wait", "ttft": "time to first token"}


def latency_curve(
    plan: Plan, metric: Metric, points: int = 60
) -> tuple[list[float], list[float], list[float]]:
    """``(rho, p50, p99)`` of ``metric`` at the plan's size for ``points`` loads in
    0.02 … 0.98 (seconds; lists of equal length), with the plan's arrival pattern."""
    n, k = plan.replicas, plan.concurrency
    full = n * plan.per_replica_rps
    rhos = [float(r) for r in np.linspace(0.02, 0.98, points)]
    p50: list[float] = []
    p99: list[float] = []
    for r in rhos:
        w = plan.workload
        p = predict(
            plan.curve, r * full, n, k, arrival_scv=w.arrival_scv, arrival_pattern=w.arrival_pattern
        )
        p50.append(p.quantile(metric, 0.5))
        p99.append(p.quantile(metric, 0.99))
    return rhos, p50, p99


def plot_latency_vs_utilisation(plan: Plan, path: str | Path) -> Path:
    """Write the plot to ``path`` (PNG) and return the path."""
    metric = plan.slo.metric
    metrics: list[Metric] = [metric] if metric == "e2e" else [metric, "e2e"]
    fig = Figure(figsize=(10.5, 5.0), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colours = {"e2e": "tab:blue", "wait": "tab:orange", "ttft": "tab:green"}
    for m in metrics:
        rhos, p50, p99 = latency_curve(plan, m)
        for ys, style, q in ((p99, "-", "p99"), (p50, "--", "p50")):
            pts = [(r, y) for r, y in zip(rhos, ys, strict=True) if math.isfinite(y)]
            if pts:
                ax.plot(
                    [r for r, _ in pts],
                    [y for _, y in pts],
                    style,
                    color=colours[m],
                    label=f"{q} {_LABEL[m]}",
                )
    ax.axhline(plan.slo.p99_s, color="tab:red", linewidth=1, label=f"SLO: {plan.slo}")
    ax.axvline(plan.rho_target, color="grey", linestyle=":", label=f"target ρ {plan.rho_target:g}")
    at = plan.at.p99(metric)
    ax.plot(
        [plan.at.rho],
        [at],
        "o",
        color="black",
        markersize=8,
        label=f"plan: {plan.replicas} replicas, ρ {plan.at.rho:.2f}, p99 {at:.3g} s",
    )
    # symlog: logarithmic above 10 ms, linear below, so that a zero wait is drawn (at 0).
    ax.set_yscale("symlog", linthresh=_LINTHRESH_S)
    ax.set_ylim(bottom=0.0)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("utilisation ρ = λ / (N · X(K))")
    ax.set_ylabel("seconds")
    ax.set_title(
        f"{plan.workload.name} on {plan.replicas} × {plan.curve.profile.name} "
        f"(K = {plan.concurrency} per replica): predicted latency vs utilisation",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out
