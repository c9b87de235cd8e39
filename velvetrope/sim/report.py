"""Reports of a simulated run: the per-tier table for a terminal, Markdown, and PNG plots.

Everything here is deterministic: numbers are formatted with fixed precision, the report
carries no wall-clock time or date, and plots are drawn with matplotlib's Agg renderer on
bare :class:`~matplotlib.figure.Figure` objects (no pyplot state, no display) and saved
without a software-version stamp, so the same run gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from velvetrope.sim.metrics import ALL, Quantiles, TierStats, slo_text
from velvetrope.sim.result import SimResult

__all__ = [
    "DEFINITIONS",
    "UPSTREAM_ERROR_NOTE",
    "fmt_ms",
    "fmt_s",
    "markdown_table",
    "report_markdown",
    "save_figure",
    "tier_table",
    "write_report",
]

DEFINITIONS = """\
- **TTFT** first token − arrival; **TPOT** (end − first token) / (output tokens − 1);
  **e2e** end − arrival; **queue wait** dispatch − arrival. Latencies are over completed
  requests; percentiles interpolate linearly.
- **Goodput**: completed *and* within the tier's SLO (TTFT, and TPOT and e2e where set; a
  one-token answer has no TPOT). Shown as a share of the tier's offered requests; rejected,
  expired, cancelled and failed requests never count.
- **Jain's index** across tenants of their served fractions (tokens of completed requests /
  tokens offered): 1 = every tenant got the same share of its demand, 1/n = one got all.
- **GPU busy**: share of the run during which a replica had a batch to run.
"""


def fmt_s(x: float) -> str:
    """Seconds, fixed precision; ``–`` for nan."""
    if math.isnan(x):
        return "–"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def fmt_ms(x: float) -> str:
    """Seconds shown in milliseconds; ``–`` for nan."""
    return "–" if math.isnan(x) else f"{x * 1000:.1f}"


def _q(q: Quantiles, f: type[str] | None = None, ms: bool = False) -> str:
    fn = fmt_ms if ms else fmt_s
    return " / ".join(fn(v) for v in q)


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def _tier_rows(rows: Sequence[TierStats]) -> list[list[str]]:
    return [
        [
            r.tier,
            slo_text(r.slo),
            f"{r.offered:,}",
            f"{r.completed:,}",
            _pct(r.goodput_frac),
            _q(r.ttft),
            _q(r.tpot, ms=True),
            _q(r.e2e),
            _q(r.queue),
            "–" if math.isnan(r.jain) else f"{r.jain:.3f}",
        ]
        for r in rows
    ]


_TIER_HEADER = [
    "tier",
    "SLO",
    "offered",
    "completed",
    "goodput",
    "TTFT p50/p90/p99 (s)",
    "TPOT p50/p90/p99 (ms)",
    "e2e p50/p90/p99 (s)",
    "queue wait p50/p90/p99 (s)",
    "Jain",
]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (``|`` in cells escaped)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [line(header), "| " + " | ".join("---" for _ in header) + " |"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _outcome_table(rows: Sequence[TierStats]) -> tuple[list[str], list[list[str]]]:
    reasons = sorted({k for r in rows for k in r.outcomes})
    header = ["tier", *reasons]
    body = [[r.tier, *(f"{r.outcomes.get(k, 0):,}" for k in reasons)] for r in rows]
    return header, body


UPSTREAM_ERROR_NOTE = (
    "the engine refused the request, as vLLM does one whose prompt and "
    "output are longer than the model's context (the profile's max_model_len), or no "
    "engine was up to take it"
)
"""What the report says of ``upstream_error``, the only way a simulated engine fails a
request (``velvetrope/sim/runner.py``)."""


def tier_table(result: SimResult) -> Table:
    """A compact per-tier table for a terminal (:mod:`rich`): p50 and p99 only, SLOs, GPU
    busy fraction and the requests not completed in the caption."""
    rows = result.summary()
    t = Table(title=f"velvetrope simulate: {result.info.label}")
    cols = ["tier", "offered", "done", "goodput", "TTFT p50", "TTFT p99", "TPOT p50 ms"]
    cols += ["e2e p50", "e2e p99", "wait p99", "Jain"]
    for h in cols:
        t.add_column(h, justify="left" if h == "tier" else "right", no_wrap=True)
    for i, r in enumerate(rows):
        t.add_row(
            r.tier,
            f"{r.offered:,}",
            f"{r.completed:,}",
            _pct(r.goodput_frac),
            fmt_s(r.ttft[0]),
            fmt_s(r.ttft[2]),
            fmt_ms(r.tpot[0]),
            fmt_s(r.e2e[0]),
            fmt_s(r.e2e[2]),
            fmt_s(r.queue[2]),
            "–" if math.isnan(r.jain) else f"{r.jain:.3f}",
            end_section=i == len(rows) - 2,
        )
    notes = [f"GPU busy {_pct(result.busy_fraction())}, span {fmt_s(result.span_s)} s (times in s)"]
    notes += [f"SLO {r.tier}: {r.slo}" for r in rows if r.slo is not None]
    lost = rows[-1].outcomes
    if lost:
        notes.append("not completed: " + ", ".join(f"{k} {v:,}" for k, v in sorted(lost.items())))
        if "upstream_error" in lost:
            notes.append(f"upstream_error: {UPSTREAM_ERROR_NOTE}")
    kinds = result.records.endpoint_counts()
    if kinds:
        said = ", ".join(f"{k} {n:,} ({d:,} done)" for k, (n, d) in kinds.items())
        notes.append(f"by endpoint: {said}")
    shadow = result.records.shadow_counts(by_endpoint=bool(kinds))
    if shadow:
        # tier decision reason (endpoint, in a mixed run) count; '-' for no reason
        said = ", ".join(
            " ".join([*k[:2], k[2] or "-", *k[3:], f"{n:,}"]) for k, n in sorted(shadow.items())
        )
        notes.append(f"shadow (enforce: false, all passed through): {said}")
    t.caption = "\n".join(notes)
    return t


def report_markdown(result: SimResult, plots: dict[str, str] | None = None) -> str:
    """The full Markdown report; ``plots`` maps a caption to an image path to link."""
    plots = plots or {}
    rows = result.summary()
    parts = ["# velvetrope simulation report", ""]
    parts.append(markdown_table(["parameter", "value"], result.info.rows()))
    parts += ["", "## Per tier", ""]
    parts.append(markdown_table(_TIER_HEADER, _tier_rows(rows)))
    overall = rows[-1]
    parts += [
        "",
        f"Goodput: {overall.goodput_rps:.3f} good requests/s over a span of "
        f"{fmt_s(result.span_s)} s (mean e2e {fmt_s(overall.e2e_mean)} s, "
        f"mean TTFT {fmt_s(overall.ttft_mean)} s).",
        "",
        "## Requests not completed, by reason",
        "",
    ]
    header, body = _outcome_table(rows)
    parts.append(
        markdown_table(header, body) if len(header) > 1 else "None: every request completed."
    )
    if "upstream_error" in overall.outcomes:
        parts += ["", f"`upstream_error`: {UPSTREAM_ERROR_NOTE}."]
    parts += ["", "## Fleet", ""]
    parts.append(
        markdown_table(
            ["pool", "replicas", "GPU busy", "engine steps", "preemptions"],
            [
                [
                    p.pool,
                    str(p.replicas),
                    _pct(p.busy_fraction),
                    f"{p.steps:,}",
                    f"{p.preemptions:,}",
                ]
                for p in result.pools
            ],
        )
    )
    parts += ["", "## Definitions", "", DEFINITIONS.rstrip()]
    if plots:
        parts += ["", "## Plots", ""]
        for caption, path in plots.items():
            parts += [f"![{caption}]({path})", ""]
        parts.pop()
    return "\n".join(parts) + "\n"


def save_figure(fig: Figure, path: Path) -> None:
    """Save ``fig`` as PNG with no software stamp, so equal figures give equal bytes."""
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})


def _ttft_cdf(result: SimResult) -> Figure:
    rec = result.records
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    ttft = rec.ttft()
    done = rec.completed
    names = [r.tier for r in result.summary() if r.tier != ALL]
    for tier in names:
        x = np.sort(ttft[done & (rec.tier == tier)])
        if x.size:
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=tier)
        slo = next(r.slo for r in result.summary() if r.tier == tier)
        if slo is not None and slo.ttft_s is not None:
            ax.axvline(slo.ttft_s, linestyle=":", linewidth=0.8, color="grey")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_title("TTFT distribution by tier (dotted: SLO)")
    ax.grid(True, alpha=0.3)
    if names:
        ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def _queue_plot(result: SimResult) -> Figure:
    t, q, f = result.samples
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    ax.plot(t, q, linewidth=0.7, label="queued")
    ax.plot(t, f, linewidth=0.7, label="in flight")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    ax.set_title("Gateway queue and in-flight requests (sampled at arrivals)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def write_report(result: SimResult, out_dir: str | Path) -> Path:
    """Write ``report.md``, ``ttft_cdf.png`` and ``queue.png`` into ``out_dir`` (created);
    return the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {"TTFT distribution by tier": "ttft_cdf.png", "Queue over time": "queue.png"}
    save_figure(_ttft_cdf(result), out_dir / "ttft_cdf.png")
    save_figure(_queue_plot(result), out_dir / "queue.png")
    path = out_dir / "report.md"
    path.write_text(report_markdown(result, plots), encoding="utf-8")
    return path
