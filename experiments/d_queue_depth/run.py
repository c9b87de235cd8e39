"""(d) Queue depth: what bounding the queue does to the tail of admitted requests, and to
how many are turned away.

Claim (seed article): under continuous batching, cutting the queue depth from 200 to 40
takes p99 latency from 6 s to 1.8 s.

Two knobs of the gateway, each swept on the whole Azure conversation trace (recorded
arrivals, time-rescaled) through preset ``fifo`` on 4 replicas of the Llama-3-8B/H100 engine
model:

1. the gateway queue bound ``queue.max_queued`` ∈ {200, 160, 120, 80, 40} (and unbounded),
   with ``max_in_flight`` = 64 per replica, at ρ = 0.9, 1.0 and 1.2 of the fleet's capacity
   at that cap;
2. the in-flight bound ``max_in_flight`` per replica ∈ {200, 120, 80, 40} (the depth of the
   engines' own batches and waiting lines), with the gateway queue bounded at 200, at the
   same offered rates.

Every request that is not admitted is rejected at arrival with ``queue_full`` (no
``max_wait`` shedding, no buckets, no client timeouts).  Latencies are of completed
requests; the rejection rate and the goodput (TTFT ≤ 2 s and TPOT ≤ 100 ms, the
simulator's default SLO, counted over *all* offered requests) show what the bound costs.

Run from the repository root: ``.venv/bin/python -m experiments.d_queue_depth.run`` (about
1.5 minutes on 2 cores).  Writes ``REPORT.md`` and PNGs next to this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.common import (
    PROFILE_NAME,
    UNBOUNDED,
    Progress,
    Report,
    at_load,
    capacity_at,
    engine_profile,
    f1,
    f2,
    make_policy,
    pct,
    pctl,
    save_plot,
)
from velvetrope.engine import EngineProfile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.metrics import DEFAULT_SLO, goodput_mask
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace

OUT = Path(__file__).resolve().parent
TRACE = "azure_conv"
REPLICAS = 4
SLOTS = 64
LOADS = (0.9, 1.0, 1.2)
DEPTHS: tuple[int | None, ...] = (None, 200, 160, 120, 80, 40)
IN_FLIGHT = (200, 120, 80, 40)
IN_FLIGHT_QUEUE = 200
SEED = 5


@dataclass(frozen=True)
class Row:
    """One run: the bound, then the tail of admitted requests and what was turned away."""

    load: float
    max_queued: int | None
    slots: int
    ttft_p99: float
    wait_p99: float
    e2e_p99: float
    tpot_p99: float
    e2e_p50: float
    rejected: float
    goodput: float
    throughput: float


def one_run(
    workload: Sequence[TraceRequest],
    profile: EngineProfile,
    *,
    load: float,
    max_queued: int | None,
    slots: int,
) -> Row:
    cfg = make_policy(
        "fifo",
        max_in_flight=slots * REPLICAS,
        max_queued=UNBOUNDED if max_queued is None else max_queued,
    )
    res = run_simulation(cfg, workload, REPLICAS, profile, lengths="oracle", seed=SEED)
    rec = res.records
    done = rec.completed
    good = goodput_mask(rec, {"*": DEFAULT_SLO})
    rejected = float(np.mean(rec.state == "rejected"))
    return Row(
        load=load,
        max_queued=max_queued,
        slots=slots,
        ttft_p99=pctl(rec.ttft()[done], 99),
        wait_p99=pctl(rec.queue_wait()[done], 99),
        e2e_p99=pctl(rec.e2e()[done], 99),
        tpot_p99=pctl(rec.tpot()[done], 99),
        e2e_p50=pctl(rec.e2e()[done], 50),
        rejected=rejected,
        goodput=float(good.mean()),
        throughput=float(done.sum()) / res.span_s,
    )


def depth_label(d: int | None) -> str:
    return "unbounded" if d is None else str(d)


def main() -> None:
    profile = engine_profile()
    trace = load_trace(TRACE)
    cap = capacity_at(profile, trace, REPLICAS, SLOTS)
    progress = Progress("d", len(LOADS) * (len(DEPTHS) + len(IN_FLIGHT)))
    depth_rows: dict[float, list[Row]] = {}
    flight_rows: dict[float, list[Row]] = {}
    for load in LOADS:
        wl = at_load(trace, load, cap)
        depth_rows[load] = []
        for d in DEPTHS:
            row = one_run(wl, profile, load=load, max_queued=d, slots=SLOTS)
            depth_rows[load].append(row)
            progress.step(
                f"ρ={load} max_queued={depth_label(d)}: p99 TTFT {row.ttft_p99:.2f} s, "
                f"rejected {100 * row.rejected:.1f}%"
            )
        flight_rows[load] = []
        for s in IN_FLIGHT:
            row = one_run(wl, profile, load=load, max_queued=IN_FLIGHT_QUEUE, slots=s)
            flight_rows[load].append(row)
            progress.step(
                f"ρ={load} max_in_flight={s}/replica: p99 e2e {row.e2e_p99:.2f} s, "
                f"rejected {100 * row.rejected:.1f}%"
            )
    progress.finish()
    write(depth_rows, flight_rows, cap.rps, len(trace))


# --------------------------------------------------------------------------- report


def by_depth(rows: Sequence[Row], d: int | None) -> Row:
    return next(r for r in rows if r.max_queued == d)


def write(
    depth_rows: dict[float, list[Row]],
    flight_rows: dict[float, list[Row]],
    cap_rps: float,
    n: int,
) -> None:
    pairs = {load: (by_depth(rows, 200), by_depth(rows, 40)) for load, rows in depth_rows.items()}
    ttft_ratio = {load: a.ttft_p99 / b.ttft_p99 for load, (a, b) in pairs.items()}
    e2e_ratio = {load: a.e2e_p99 / b.e2e_p99 for load, (a, b) in pairs.items()}
    claim_ratio = 6.0 / 1.8
    hits = [load for load, x in ttft_ratio.items() if x >= 0.75 * claim_ratio]
    e2e_hits = [load for load, x in e2e_ratio.items() if x >= 0.75 * claim_ratio]
    if hits and e2e_hits:
        verdict = "Reproduced"
    elif hits:
        verdict = "Partly reproduced"
    else:
        verdict = "Not reproduced"
    lo, mid, hi = LOADS

    def pair_text(load: float) -> str:
        a, b = pairs[load]
        return (
            f"at ρ = {load}, p99 TTFT {f2(a.ttft_p99)} s → {f2(b.ttft_p99)} s "
            f"({f1(ttft_ratio[load])}×), p99 e2e {f2(a.e2e_p99)} s → {f2(b.e2e_p99)} s, "
            f"rejected {pct(a.rejected)} → {pct(b.rejected)}, goodput {pct(a.goodput)} → "
            f"{pct(b.goodput)}"
        )

    f_lo = flight_rows[mid]
    r = Report("(d) Queue depth: the tail of the admitted against the share turned away")
    r.verdict = (
        f"**Verdict: {verdict}**: the ratio holds for time to first token, not for "
        f"end-to-end latency, and our absolute values are lower. "
        f"Cutting the gateway queue from 200 to 40 requests (64 in flight per replica): "
        f"{pair_text(lo)}; {pair_text(mid)}; {pair_text(hi)}. The article's 6 s → 1.8 s "
        f"(3.3×) matches the ratio of the TTFT (and queue-wait) tail: a bounded FIFO bounds "
        f"the wait of "
        f"whoever gets in at about depth ÷ drain rate. The end-to-end p99 barely moves, "
        f"because it is mostly decode time of the longest answers, which no queue bound "
        f"shortens. The price is small: the shorter queue rejects a little more at every "
        f"load (a shorter buffer absorbs less of each burst) while the fleet stays as busy, "
        f"so goodput rises with the shorter queue here. Bounding the engines' batches "
        f"instead (in flight per replica 200 → 40 at ρ = {mid}) does the opposite: p99 e2e "
        f"{f2(f_lo[0].e2e_p99)} s → {f2(f_lo[-1].e2e_p99)} s (faster decode in smaller "
        f"batches) but p99 TTFT {f2(f_lo[0].ttft_p99)} s → {f2(f_lo[-1].ttft_p99)} s, "
        f"rejections {pct(f_lo[0].rejected)} → {pct(f_lo[-1].rejected)} and goodput "
        f"{pct(f_lo[0].goodput)} → {pct(f_lo[-1].goodput)}, as capacity falls with the batch "
        f"size."
    )
    r.h2("Setup")
    r.bullets(
        [
            f"Trace: the whole `{TRACE}` ({n:,} requests), recorded arrival pattern rescaled "
            f"to ρ × {cap_rps:.1f} req/s, the saturation throughput of {REPLICAS} replicas "
            f"held at {SLOTS} requests each; ρ ∈ {{{', '.join(map(str, LOADS))}}}. The same "
            "offered rates are used for the in-flight sweep.",
            f"Fleet: {REPLICAS} × `{PROFILE_NAME}` (continuous batching, max_num_seqs 1024, "
            "chunked prefill at 8,192 tokens per step), least-loaded routing.",
            "Gateway: preset `fifo`, no buckets, no `max_wait` shedding, no client "
            "timeouts; a request that finds the queue full is rejected at once "
            "(`queue_full`, 503).",
            "Latency percentiles are over completed (admitted) requests. Rejected = share "
            "of offered requests. Goodput = share of *offered* requests completed with "
            f"{DEFAULT_SLO} (the simulator's default SLO). Throughput = completions per "
            "second of the run (first arrival to last completion).",
        ]
    )
    r.h2("1. Gateway queue bound (64 in flight per replica)")
    for load, rows in depth_rows.items():
        r.h3(f"ρ = {load}")
        r.table(
            [
                "max_queued",
                "p99 TTFT (s)",
                "p99 queue wait (s)",
                "p99 e2e (s)",
                "p50 e2e (s)",
                "p99 TPOT (ms)",
                "rejected",
                "goodput",
                "completions/s",
            ],
            [
                [
                    depth_label(x.max_queued),
                    f2(x.ttft_p99),
                    f2(x.wait_p99),
                    f2(x.e2e_p99),
                    f2(x.e2e_p50),
                    f1(1000 * x.tpot_p99),
                    pct(x.rejected),
                    pct(x.goodput),
                    f1(x.throughput),
                ]
                for x in rows
            ],
        )
    r.image("queue bound", "queue_bound.png")
    r.h2(f"2. In-flight bound per replica (gateway queue bounded at {IN_FLIGHT_QUEUE})")
    for load, rows in flight_rows.items():
        r.h3(f"ρ = {load} (of the 64-slot capacity)")
        r.table(
            [
                "max_in_flight / replica",
                "p99 TTFT (s)",
                "p99 e2e (s)",
                "p50 e2e (s)",
                "p99 TPOT (ms)",
                "rejected",
                "goodput",
                "completions/s",
            ],
            [
                [
                    str(x.slots),
                    f2(x.ttft_p99),
                    f2(x.e2e_p99),
                    f2(x.e2e_p50),
                    f1(1000 * x.tpot_p99),
                    pct(x.rejected),
                    pct(x.goodput),
                    f1(x.throughput),
                ]
                for x in rows
            ],
        )
    r.image("in-flight bound", "in_flight_bound.png")
    r.h2("Reading the results")
    r.bullets(
        [
            "A FIFO queue of depth D in front of a fleet that completes μ requests per second "
            "holds an admitted request at most about D/μ seconds: here μ is about "
            f"{cap_rps:.0f} req/s, so 200 places are ~{200 / cap_rps:.1f} s and 40 are "
            f"~{40 / cap_rps:.1f} s of wait. That is the TTFT tail the bound controls.",
            "The e2e tail is mostly the decode of the longest answers (hundreds of tokens at "
            "tens of ms each); a queue bound removes only the wait it contains, so the e2e "
            "p99 moves by a few seconds at most.",
            "Rejections: under overload (ρ > 1) the excess must be shed whatever the depth; "
            "the depth decides only how long the admitted wait. Below saturation a deeper "
            "queue absorbs bursts that a shallow one rejects: that is the real cost of a "
            "short queue, visible at the lowest load.",
            "The in-flight bound is the other lever: fewer sequences per batch make each "
            "decode step faster (lower TPOT and e2e) but lower the fleet's throughput, so "
            "more requests wait or are turned away.",
        ]
    )
    r.h2("Reproduce")
    r.para(
        "`.venv/bin/python -m experiments.d_queue_depth.run` (deterministic; about 1.5 minutes)."
    )
    r.write(OUT)

    fig = Figure(figsize=(10, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for load, rows in depth_rows.items():
        bounded = [x for x in rows if x.max_queued is not None]
        xs = [x.max_queued or 0 for x in bounded]
        (line,) = ax1.plot(xs, [x.ttft_p99 for x in bounded], "o-", label=f"ρ = {load}: TTFT")
        ax1.plot(
            xs,
            [x.e2e_p99 for x in bounded],
            "s--",
            color=line.get_color(),
            label=f"ρ = {load}: e2e",
        )
        ax2.plot(xs, [100 * x.rejected for x in bounded], "o-", label=f"ρ = {load}")
    ax1.set_xlabel("gateway max_queued")
    ax1.set_ylabel("p99 of admitted requests (s)")
    ax1.set_yscale("log")
    ax1.invert_xaxis()
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.set_xlabel("gateway max_queued")
    ax2.set_ylabel("rejected (% of offered)")
    ax2.invert_xaxis()
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("Queue bound 200 → 40: the admitted wait less, a few more are turned away")
    save_plot(fig, OUT / "queue_bound.png")

    fig = Figure(figsize=(10, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for load, rows in flight_rows.items():
        xs = [x.slots for x in rows]
        (line,) = ax1.plot(xs, [x.ttft_p99 for x in rows], "o-", label=f"ρ = {load}: TTFT")
        ax1.plot(
            xs, [x.e2e_p99 for x in rows], "s--", color=line.get_color(), label=f"ρ = {load}: e2e"
        )
        ax2.plot(xs, [100 * x.rejected for x in rows], "o-", label=f"ρ = {load}")
    ax1.set_xlabel("max_in_flight per replica")
    ax1.set_ylabel("p99 of admitted requests (s)")
    ax1.set_yscale("log")
    ax1.invert_xaxis()
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.set_xlabel("max_in_flight per replica")
    ax2.set_ylabel("rejected (% of offered)")
    ax2.invert_xaxis()
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("In-flight bound 200 → 40: faster decode, longer waits, more rejections")
    save_plot(fig, OUT / "in_flight_bound.png")


if __name__ == "__main__":
    main()
