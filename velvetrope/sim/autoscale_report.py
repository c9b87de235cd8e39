"""The autoscaling part of a run's report: replicas over time, GPU-hours, SLO attainment.

:func:`autoscale_rows` gives the headline numbers, :func:`autoscale_markdown` the report's
section, :func:`replicas_figure` the plot (arrivals per minute, the autoscaler's signal
against its threshold, replicas asked for and ready), and :func:`write_autoscale` appends
the section to a ``report.md`` written by :func:`velvetrope.sim.report.write_report` and
saves ``replicas.png`` next to it.

GPU-hours count each replica from the moment it is asked for until it is gone (start-up and
draining included), up to the end of the run (or the autoscaling horizon, if later); the
comparison is a fleet sized statically for the peak: the peak replica count held for the
same time.  SLO attainment per tier is the share of the tier's offered requests that
completed within the tier's SLO (goodput, :mod:`velvetrope.sim.metrics`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from velvetrope.errors import PolicyError
from velvetrope.sim.autoscale import AutoscaleTrace
from velvetrope.sim.metrics import slo_text
from velvetrope.sim.report import markdown_table, save_figure
from velvetrope.sim.result import SimResult

__all__ = ["autoscale_markdown", "autoscale_rows", "replicas_figure", "write_autoscale"]


def _trace(result: SimResult) -> AutoscaleTrace:
    if result.autoscale is None:
        raise PolicyError("this run had no autoscaled pool")
    return result.autoscale


def autoscale_rows(result: SimResult) -> list[tuple[str, str]]:
    """``(what, value)`` pairs: the autoscaler, replicas, GPU-hours, scale events."""
    tr = _trace(result)
    static = tr.peak_replicas * tr.end_s * tr.spec.gpus_per_replica / 3600.0
    ups = sum(1 for e in tr.events if e.after > e.before)
    downs = sum(1 for e in tr.events if e.after < e.before)
    mean_ready = _mean_step(tr, 2)
    return [
        ("autoscaler", tr.spec.describe()),
        ("pool", tr.pool),
        (
            "replicas",
            f"{min(a for _, a, _ in tr.samples)} to {tr.peak_replicas} asked for; "
            f"{mean_ready:.2f} ready on average over {tr.end_s / 3600:.2f} h",
        ),
        (
            "GPU-hours",
            f"{tr.gpu_hours:.2f} autoscaled vs {static:.2f} for a fleet sized statically at "
            f"the peak ({tr.peak_replicas} replicas): {tr.gpu_hours / static:.3f}×"
            if static > 0
            else f"{tr.gpu_hours:.2f}",
        ),
        ("scale events", f"{ups} up, {downs} down"),
    ]


def _mean_step(tr: AutoscaleTrace, which: int) -> float:
    t, v = tr.step_series(which)
    if t[-1] <= t[0]:
        return float(v[0])
    return float(np.sum(v[:-1] * np.diff(t)) / (t[-1] - t[0]))


def autoscale_markdown(result: SimResult, plot: str | None = None) -> str:
    """The report's ``Autoscaling`` section."""
    rows = result.summary()
    parts = ["## Autoscaling", "", markdown_table(["", "value"], autoscale_rows(result))]
    parts += ["", "SLO attainment by tier (good / offered requests):", ""]
    parts.append(
        markdown_table(
            ["tier", "SLO", "offered", "good", "attainment"],
            [
                [
                    r.tier,
                    slo_text(r.slo) or "—",
                    f"{r.offered:,}",
                    f"{r.good:,}",
                    f"{100 * r.good / r.offered:.1f}%" if r.offered else "—",
                ]
                for r in rows
            ],
        )
    )
    events = _trace(result).events
    if events:
        parts += ["", "Scale events (first 20):", ""]
        parts.append(
            markdown_table(
                ["t (s)", "by", "metric", "replicas", "reason"],
                [
                    [f"{e.at:g}", e.source, f"{e.metric:.3g}", f"{e.before} → {e.after}", e.reason]
                    for e in events[:20]
                ],
            )
        )
    if plot is not None:
        parts += ["", f"![Replicas over time]({plot})"]
    return "\n".join(parts) + "\n"


def replicas_figure(result: SimResult) -> Figure:
    """Arrivals per minute, the signal against threshold × replicas, replicas over time."""
    tr = _trace(result)
    fig = Figure(figsize=(9, 7))
    ax_rate, ax_sig, ax_rep = fig.subplots(3, 1, sharex=True)
    hours = 3600.0
    arr = result.records.arrival
    if arr.size:
        bins = np.arange(0.0, max(tr.end_s, float(arr.max())) + 60.0, 60.0)
        counts, edges = np.histogram(arr, bins=bins)
        ax_rate.plot(edges[:-1] / hours, counts / 60.0, linewidth=0.7)
    ax_rate.set_ylabel("arrivals (req/s)")
    ax_rate.set_title("Traffic, the autoscaler's signal, and replicas")
    so = tr.spec.scaled_object
    ax_sig.plot(tr.signal_t / hours, tr.signal_v, linewidth=0.6, label=" + ".join(so.signals))
    t, asked = tr.step_series(1)
    if so.metric_type == "AverageValue":
        ax_sig.step(t / hours, asked * so.threshold, where="post", linewidth=0.8,
                    linestyle="--", label="threshold × replicas")  # fmt: skip
    ax_sig.set_ylabel("signal")
    ax_sig.legend(loc="upper right", fontsize="small")
    ax_rep.step(t / hours, asked, where="post", label="asked for")
    t2, ready = tr.step_series(2)
    ax_rep.step(t2 / hours, ready, where="post", label="ready")
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("time (h)")
    ax_rep.legend(loc="upper right", fontsize="small")
    for ax in (ax_rate, ax_sig, ax_rep):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def write_autoscale(result: SimResult, out_dir: str | Path) -> Path:
    """Append the section to ``out_dir/report.md`` and write ``replicas.png``."""
    d = Path(out_dir)
    save_figure(replicas_figure(result), d / "replicas.png")
    path = d / "report.md"
    with path.open("a", encoding="utf-8") as f:
        f.write("\n" + autoscale_markdown(result, "replicas.png"))
    return path
