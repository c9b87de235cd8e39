"""The demo's PNG: TTFT by arrival for each run, the queues, and goodput by tier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from velvetrope.demo.live import RunResult
from velvetrope.demo.replay_results import ReplayOutcome
from velvetrope.demo.settings import DIRECT, DIRECT_PRIORITY, GATEWAY, RUN_LABEL
from velvetrope.demo.summary import TierSummary

__all__ = ["plot_runs"]

_RUN_COLOR = {GATEWAY: "tab:green", DIRECT: "tab:orange", DIRECT_PRIORITY: "tab:purple"}
_RUN_LINE = {DIRECT: "--", DIRECT_PRIORITY: ":"}


def plot_runs(
    report_runs: Mapping[str, RunResult],
    summaries: Sequence[TierSummary],
    path: Path,
    tiers: Sequence[str],
    window_s: float,
) -> Path:
    """Draw the runs of ``report_runs`` (in their order; the gateway's first) to ``path``:
    one TTFT-by-arrival panel per run above, the queues and goodput by tier below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(tiers, ("tab:red", "tab:blue", "tab:gray"), strict=False))
    runs = list(report_runs)
    n = len(runs)
    fig = plt.figure(figsize=(6.5 * n, 8.5))
    grid = fig.add_gridspec(2, 2 * n)
    top = [fig.add_subplot(grid[0, 2 * i : 2 * i + 2]) for i in range(n)]
    bottom = [fig.add_subplot(grid[1, :n]), fig.add_subplot(grid[1, n:])]
    ymax = 1.0
    for run in runs:
        for r in report_runs[run].replay.results:
            if r.ttft_s is not None:
                ymax = max(ymax, r.ttft_s)
            elif r.outcome is ReplayOutcome.TIMEOUT:
                ymax = max(ymax, r.elapsed_s)
    for ax, run in zip(top, runs, strict=True):
        res = report_runs[run].replay.results
        for tier in tiers:
            rs = [r for r in res if r.tier == tier]
            ok = [(r.scheduled_s, r.ttft_s) for r in rs if r.ttft_s is not None]
            ax.scatter(
                [t for t, _ in ok],
                [ttft for _, ttft in ok],
                s=6,
                color=colors.get(tier),
                label=f"{tier} TTFT",
                alpha=0.6,
            )
            cut = [r for r in rs if r.ttft_s is None and r.outcome is ReplayOutcome.TIMEOUT]
            ax.scatter(
                [r.scheduled_s for r in cut],
                [r.elapsed_s for r in cut],
                s=10,
                marker="^",
                color=colors.get(tier),
                alpha=0.6,
            )
            rej = [r for r in rs if r.outcome is ReplayOutcome.REJECTED]
            ax.scatter(
                [r.scheduled_s for r in rej],
                [0.012] * len(rej),
                s=10,
                marker="x",
                color=colors.get(tier),
                alpha=0.5,
            )
        ax.set_yscale("log")
        ax.set_ylim(0.01, ymax * 1.5)
        ax.set_xlim(0, window_s)
        ax.set_xlabel("arrival time (s)")
        ax.set_ylabel("time to first token (s, log)")
        ax.scatter([], [], s=10, marker="^", color="black", label="cut before a token (waited)")
        ax.scatter([], [], s=10, marker="x", color="black", label="rejected (drawn at the bottom)")
        ax.set_title(f"{RUN_LABEL[run]}: time to first token by arrival")
        ax.legend(loc="upper left", fontsize=7)
    ax = bottom[0]
    g = report_runs[GATEWAY].samples
    if g:
        ts = [p.t for p in g]
        bands = list(g[0].queued)
        ax.stackplot(
            ts,
            *[[p.queued.get(b, 0) for p in g] for b in bands],
            labels=[f"gateway queue: {b}" for b in bands],
            colors=[colors.get(b, "tab:green") for b in bands],
            alpha=0.5,
        )
        ax.plot(ts, [p.gateway_in_flight for p in g], color="black", label="gateway in flight")
    for run in runs[1:]:
        d = report_runs[run].samples
        if d:
            ax.plot(
                [p.t for p in d],
                [p.engine_waiting + p.engine_running for p in d],
                color=_RUN_COLOR.get(run, "tab:brown"),
                linestyle=_RUN_LINE.get(run, "-."),
                label=f"{RUN_LABEL[run]}: in the engines (run + wait)",
            )
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("requests")
    ax.set_title("queues: gateway by band vs. engines without admission")
    ax.legend(loc="upper left", fontsize=8)
    ax = bottom[1]
    width = 0.8 / n
    xs = range(len(tiers))
    for i, run in enumerate(runs):
        vals = [
            next((s.goodput_rps for s in summaries if s.run == run and s.tier == t), 0.0)
            for t in tiers
        ]
        ax.bar(
            [x + (i - (n - 1) / 2) * width for x in xs],
            vals,
            width,
            label=RUN_LABEL[run],
            color=_RUN_COLOR.get(run, "tab:brown"),
        )
    ax.set_xticks(list(xs), list(tiers))
    ax.set_ylabel("completed within SLO per second")
    ax.set_title("goodput by tier")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
