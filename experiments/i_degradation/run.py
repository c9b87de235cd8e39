"""(i) Degradation before rejection against plain rejection, at 1.5× the fleet's capacity.

Claim (seed article): under pressure, degrade (a smaller ``max_tokens``, a smaller model)
before rejecting, so more users get an answer.

Setup: study (f)'s overload, policy D (``hybrid``, 64 in flight per replica, bounded tier
bands, ``max_wait_s`` shedding: interactive 0.8 s, standard 2.5 s, batch 25 s) on the whole
Azure conversation trace with its tenants (20% interactive, 30% standard, 50% batch), 4
replicas of the Llama-3-8B/H100 engine model, offered at 1.5× their saturation throughput;
output lengths known to the core only through its own estimator.  Degradation is the core
rule (:mod:`velvetrope.core.routing`): a tier's ``degrade`` caps ``max_tokens`` when the
predicted wait in its pool exceeds ``wait_s``; the request is still rejected when the wait
exceeds ``max_wait_s``.  The engine generates the true length up to the cap.

Compared: plain rejection (f's D) against caps of 128 and 256 tokens on the standard and
batch tiers, triggered at 10%, 50% and 90% of each tier's ``max_wait_s`` (the interactive
tier is never degraded: its wait stays far below its 0.8 s), then the 128-token cap at ½
``max_wait_s`` across load.  Goodput counts requests completed within their tier's SLO
(a capped answer counts: it arrived in time); *full goodput* counts only those whose answer
the cap did not cut (a capped request whose true answer fits under the cap loses nothing).

Run from the repository root: ``.venv/bin/python -m experiments.i_degradation.run`` (about
a minute on 2 cores).  Writes ``REPORT.md`` and PNGs next to this file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from experiments.common import (
    PROFILE_NAME,
    Progress,
    Report,
    engine_profile,
    f1,
    make_policy,
    pct,
    save_plot,
)
from experiments.f_overload.run import MIX, REPLICAS, SHEDDING, SLOTS, TENANTS, TIERS
from velvetrope.core import PolicyConfig
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.metrics import goodput_mask
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace

OUT = Path(__file__).resolve().parent
TRACE = "azure_conv"
LOAD = 1.5
CAPS = (128, 256)
TRIGGERS = (0.1, 0.5, 0.9)
DEGRADED_TIERS = ("standard", "batch")
MAIN = (128, 0.5)
LOADS = (1.0, 1.5, 2.0)
TOP = "interactive"
SEED = 23


def policy(cap: int | None, trigger: float) -> PolicyConfig:
    """Study (f)'s policy D, with ``DEGRADED_TIERS`` capped at ``cap`` tokens once the
    predicted wait exceeds ``trigger`` × their ``max_wait_s`` (``cap`` None: no degrading)."""
    tiers: list[dict[str, Any]] = []
    for t in TIERS:
        shed = SHEDDING[t["name"]]
        tier = {**t, **shed}
        if cap is not None and t["name"] in DEGRADED_TIERS:
            tier["degrade"] = {"wait_s": trigger * shed["max_wait_s"], "max_tokens": cap}
        tiers.append(tier)
    total = sum(int(s["max_queued"]) for s in SHEDDING.values())
    return make_policy(
        "hybrid", max_in_flight=SLOTS * REPLICAS, max_queued=total, tiers=tiers, tenants=TENANTS
    )


@dataclass(frozen=True)
class Row:
    """One run: goodput (capped answers in time count), full goodput (answers the cap cut do
    not), the top tier's attainment, output tokens delivered and cut, the share of completed
    answers cut short, and the share of requests not completed."""

    label: str
    goodput: float
    good_rps: float
    full_goodput: float
    top: float
    tiers: dict[str, float]
    tokens: float
    cut: float
    degraded: float
    rejected: float


def one(
    workload: Sequence[TraceRequest],
    cap: int | None,
    trigger: float,
    load: float,
    progress: Progress | None,
) -> Row:
    label = "rejection only" if cap is None else f"cap {cap} at {trigger:g} × max_wait"
    res = run_simulation(
        policy(cap, trigger), workload, REPLICAS, engine_profile(), load=load, seed=SEED
    )
    rec = res.records
    good = goodput_mask(rec, res.slos)
    assert rec.degraded is not None
    done = rec.completed
    true = np.asarray([max(1, r.output_tokens) for r in workload], dtype=np.float64)
    deg = (rec.degraded != "") & (rec.output < true)  # the cap cut this answer
    span = float(rec.arrival[-1] - rec.arrival[0])
    row = Row(
        label=label,
        goodput=float(good.mean()),
        good_rps=float(good.sum()) / span,
        full_goodput=float((good & ~deg).mean()),
        top=float(good[rec.tier == TOP].mean()),
        tiers={t["name"]: float(good[rec.tier == t["name"]].mean()) for t in TIERS},
        tokens=float(rec.output[done].sum()),
        cut=float((true - rec.output)[done & deg].sum()),
        degraded=float((done & deg).sum() / max(1, done.sum())),
        rejected=float((~done).mean()),
    )
    if progress is not None:
        progress.step(f"{label} at {load}×: goodput {100 * row.goodput:.1f}%")
    return row


def main() -> None:
    workload = TenantMix.parse(MIX).assign(load_trace(TRACE), SEED)
    progress = Progress("i", 1 + len(CAPS) * len(TRIGGERS) + 2 * (len(LOADS) - 1))
    base = one(workload, None, 0.0, LOAD, progress)
    grid = {
        (cap, trig): one(workload, cap, trig, LOAD, progress) for cap in CAPS for trig in TRIGGERS
    }
    sweep: dict[str, list[Row]] = {"reject": [], "degrade": []}
    for load in LOADS:
        sweep["reject"].append(base if load == LOAD else one(workload, None, 0.0, load, progress))
        sweep["degrade"].append(
            grid[MAIN] if load == LOAD else one(workload, *MAIN, load, progress)
        )
    progress.finish()
    write(base, grid, sweep, workload)


# --------------------------------------------------------------------------- report


def write(
    base: Row,
    grid: Mapping[tuple[int, float], Row],
    sweep: Mapping[str, list[Row]],
    workload: Sequence[TraceRequest],
) -> None:
    n = len(workload)
    out = np.asarray([r.output_tokens for r in workload], dtype=np.float64)
    long_share = float((out > MAIN[0]).mean())
    long_tokens = float(out[out > MAIN[0]].sum() / out.sum())
    main = grid[MAIN]
    best = max(grid.values(), key=lambda r: r.goodput)
    gain = main.goodput - base.goodput
    tokens_ratio = main.tokens / base.tokens
    verdict = (
        "Reproduced"
        if gain >= 0.05 and main.top >= base.top - 0.005
        else "Partly reproduced"
        if gain > 0
        else "Not reproduced"
    )
    r = Report("(i) Degradation before rejection")
    r.verdict = (
        f"**Verdict: {verdict}, at a price in tokens.** At {LOAD}× capacity, capping "
        f"`max_tokens` at {MAIN[0]} for the standard and batch tiers once their predicted wait "
        f"passes half their `max_wait_s` raises goodput from {pct(base.goodput)} to "
        f"{pct(main.goodput)} of offered requests ({f1(base.good_rps)} → "
        f"{f1(main.good_rps)} good req/s; rejections {pct(base.rejected)} → "
        f"{pct(main.rejected)}), with the {TOP} tier at {pct(base.top)} → {pct(main.top)} of "
        f"its SLO (it is never degraded: its wait stays below its trigger). The fleet "
        f"delivers {pct(tokens_ratio, 0)} of the output tokens it delivers with plain "
        f"rejection ({base.tokens / 1e6:.2f}M → {main.tokens / 1e6:.2f}M): "
        f"{pct(main.degraded, 0)} of the completed answers are cut short, "
        f"{main.cut / 1e6:.2f}M tokens cut from them, and {pct(main.full_goodput)} of "
        f"requests get their full answer in time (against {pct(base.full_goodput)}). "
        f"Degrading earlier and harder serves more requests still (best: {best.label}, "
        f"{pct(best.goodput)} goodput, {pct(best.tokens / base.tokens, 0)} of the tokens). "
        f"Under overload a capped answer takes the GPU time of a rejected request: more users "
        f"answered, shorter answers, and the operator chooses the exchange rate with `wait_s` "
        f"and `max_tokens`."
    )
    r.h2("Setup")
    r.bullets(
        [
            f"Trace: the whole `{TRACE}` ({n:,} requests), tenants by the mix `{MIX}` "
            f"(seed {SEED}); arrivals rescaled to load × the saturation throughput of "
            f"{REPLICAS} replicas at the engines' own limit (the simulator's `load=`).",
            f"Fleet: {REPLICAS} × `{PROFILE_NAME}`, least-loaded routing; gateway: study (f)'s "
            f"policy D: `hybrid`, {SLOTS} in flight per replica, "
            + "; ".join(
                f"{k}: max_wait {v['max_wait_s']:g} s, band bound {v['max_queued']}"
                for k, v in SHEDDING.items()
            )
            + ".",
            "SLOs: "
            + "; ".join(
                f"{t['name']}: "
                + ", ".join(
                    f"{k.removesuffix('_s').upper()} ≤ {v:g} s" for k, v in t["slo"].items()
                )
                for t in TIERS
            )
            + ". Output lengths known to the core only through its estimator.",
            "Degraded: " + ", ".join(DEGRADED_TIERS) + ". A capped request's engine stops at "
            "the cap; its bucket reservation is sized for the cap.",
        ]
    )
    r.h2(f"At {LOAD}× capacity")
    rows = [_row_cells(base)] + [_row_cells(grid[k]) for k in sorted(grid)]
    r.table(
        [
            "gateway",
            "goodput",
            "good req/s",
            "full goodput",
            *(f"{t['name']} goodput" for t in TIERS),
            "output tokens delivered",
            "tokens cut",
            "completed answers cut",
            "not completed",
        ],
        rows,
    )
    r.para(
        "Goodput: share of offered requests completed within their tier's SLO, capped "
        "answers included; full goodput: only those the cap did not cut. Tokens: output "
        "tokens of completed requests, and what the caps cut from them (true length − "
        "delivered). Answers cut: completed answers shorter than their true length."
    )
    r.image("goodput and tokens by cap and trigger", "tradeoff.png")
    r.h2("Load")
    rows = []
    for i, load in enumerate(LOADS):
        a, b = sweep["reject"][i], sweep["degrade"][i]
        rows.append(
            [
                f"{load:g}×",
                pct(a.goodput),
                pct(b.goodput),
                pct(a.top),
                pct(b.top),
                f"{a.tokens / 1e6:.2f}M",
                f"{b.tokens / 1e6:.2f}M",
                pct(b.degraded, 0),
            ]
        )
    r.table(
        [
            "load",
            "reject: goodput",
            f"degrade ({MAIN[0]} at {MAIN[1]:g}): goodput",
            f"reject: {TOP}",
            f"degrade: {TOP}",
            "reject: tokens",
            "degrade: tokens",
            "degrade: answers cut",
        ],
        rows,
    )
    r.h2("Reading the results")
    r.bullets(
        [
            "Rejection by predicted wait already keeps the fleet on requests that meet their "
            "SLO (study f). What it cannot do is serve more of them: each admitted request "
            "costs its full length in GPU time.",
            f"A cap shortens the long answers ({pct(long_share, 0)} of this trace's answers "
            f"are longer than {MAIN[0]} tokens, and they hold {pct(long_tokens, 0)} of the "
            "output tokens), so the same GPU time serves more requests: the queue drains "
            "faster and fewer requests are shed at arrival or expire in the queue.",
            "The cap does not shorten the capped request's own wait (the work ahead of it is "
            "unchanged); it shortens everyone's after it. That is why it triggers below "
            "`max_wait_s`: a cap at the rejection threshold would come too late to help.",
            "The price is in the answers: tokens delivered fall, and many answers of the "
            "degraded tiers are cut short. Whether a 128-token answer is worth more than a 503 is "
            f"the product's call; the header `x-velvetrope-degraded: max_tokens={MAIN[0]}` "
            "tells the client what happened, and `velvetrope_degraded_total` counts it.",
            "The top tier pays nothing either way: its band is served first and its predicted "
            "wait never reaches its trigger.",
        ]
    )
    r.h2("Reproduce")
    r.para("`.venv/bin/python -m experiments.i_degradation.run` (deterministic; about a minute).")
    r.write(OUT)

    fig = Figure(figsize=(7.5, 4.3))
    ax = fig.subplots()
    ax.scatter([base.tokens / 1e6], [100 * base.goodput], marker="s", s=60, label=base.label)
    for cap, marker in zip(CAPS, ("o", "^"), strict=True):
        xs = [grid[(cap, t)].tokens / 1e6 for t in TRIGGERS]
        ys = [100 * grid[(cap, t)].goodput for t in TRIGGERS]
        ax.plot(xs, ys, marker + "-", label=f"cap {cap}, trigger {', '.join(map(str, TRIGGERS))}")
        for t, x, y in zip(TRIGGERS, xs, ys, strict=True):
            ax.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("output tokens delivered (millions)")
    ax.set_ylabel("goodput (% of offered requests)")
    ax.set_title(f"More answers or longer answers, at {LOAD}× capacity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    save_plot(fig, OUT / "tradeoff.png")


def _row_cells(row: Row) -> list[str]:
    return [
        row.label,
        f"**{pct(row.goodput)}**",
        f1(row.good_rps),
        pct(row.full_goodput),
        *(pct(row.tiers[t["name"]]) for t in TIERS),
        f"{row.tokens / 1e6:.2f}M",
        f"{row.cut / 1e6:.2f}M",
        pct(row.degraded, 0),
        pct(row.rejected),
    ]


if __name__ == "__main__":
    main()
