"""(a) Mean latency: SJF vs FIFO on the same load.

Claim (seed article): shortest-job-first cuts mean latency by 60–70% against FIFO.
Queueing theory (non-preemptive SJF on M/G/1, Phipps, against Pollaczek–Khinchine) predicts
about 33% on the Azure conversation trace's output lengths and about 59% on the code trace's,
at ρ = 0.8 with exact (oracle) lengths.

Three layers, each with the gateway's real admission core making every decision:

1. the closed forms on each trace's output-length distribution (ρ = 0.8, and a curve over ρ);
2. the simulator's analytic mode (one server, no batching, service ∝ output tokens,
   Poisson arrivals): fifo vs sjf with the oracle, noisy predictors of Kendall τ and the
   core's own estimator;
3. the batched fleet: 4 replicas of the Llama-3-8B/H100 engine model with continuous
   batching, the gateway capping in-flight requests at 64 per replica, ρ = 0.8 of that
   capped capacity, each trace replayed in full (recorded arrivals, time-rescaled) and with
   Poisson arrivals; plus a bridge from one to many slots per replica.

Run from the repository root: ``.venv/bin/python -m experiments.a_mean_latency.run``
(about 2 minutes on 2 cores).  Writes ``REPORT.md`` and PNGs next to this file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray
from scipy.stats import kendalltau

from experiments.common import (
    PROFILE_NAME,
    Progress,
    Report,
    at_load,
    capacity_at,
    engine_profile,
    f2,
    f3,
    make_policy,
    mean_of,
    pct,
    poisson_workload,
    save_plot,
)
from velvetrope.engine import EngineProfile
from velvetrope.planner.queueing_general import mg1_sjf_waits
from velvetrope.sim.analytic import TokenService, run_analytic
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace

OUT = Path(__file__).resolve().parent
TRACES = ("azure_conv", "azure_code")
RHO = 0.8
TAUS = (0.9, 0.7, 0.5, 0.3)
KNOWLEDGE: tuple[tuple[str, str], ...] = (
    ("fifo", "oracle"),
    ("sjf", "oracle"),
    *(("sjf", f"noisy:{t:g}") for t in TAUS),
    ("sjf", "estimator"),
)
ANALYTIC_JOBS = 200_000
ANALYTIC_WARMUP = 5_000
FLEET_REPLICAS = 4
FLEET_SLOTS = 64
BRIDGE_SLOTS = (1, 2, 4, 16, 64)
BRIDGE_JOBS = 10_000
SEED = 7

FloatArray = NDArray[np.float64]


def label(preset: str, lengths: str) -> str:
    return "fifo" if preset == "fifo" else f"sjf, {lengths}"


def output_sizes(trace: Sequence[TraceRequest]) -> NDArray[np.int64]:
    """Output lengths as job sizes (a 0-token row generates one token, as in the simulator)."""
    return np.asarray([max(1, r.output_tokens) for r in trace], dtype=np.int64)


def theory_means(sizes: NDArray[np.int64], rho: float) -> tuple[float, float]:
    """M/G/1 mean response time (service scaled to mean 1): (FCFS by P-K, SJF by Phipps)."""
    s = sizes.astype(np.float64) / float(sizes.mean())
    w = mg1_sjf_waits(rho, s)
    return w.fcfs_wait_mean + 1.0, w.wait_mean + 1.0


def theory_reduction(sizes: NDArray[np.int64], rho: float) -> float:
    """``1 − E[T_sjf] / E[T_fcfs]`` on M/G/1 at utilisation ``rho``."""
    fcfs, sjf = theory_means(sizes, rho)
    return 1.0 - sjf / fcfs


@dataclass(frozen=True)
class AnalyticRow:
    label: str
    mean: float
    stderr: float


def analytic_rows(
    sizes: NDArray[np.int64], *, n_jobs: int, warmup: int, seed: int, progress: Progress | None
) -> list[AnalyticRow]:
    """One server, no batching, Poisson arrivals at ρ = RHO, each knowledge of KNOWLEDGE."""
    service = TokenService.with_mean(sizes, 1.0)
    rows = []
    for preset, lengths in KNOWLEDGE:
        res = run_analytic(
            preset,
            service,
            rho=RHO,
            n_jobs=n_jobs,
            warmup=warmup,
            seed=seed,
            lengths=lengths,
        )
        rows.append(AnalyticRow(label(preset, lengths), res.mean_response, res.response_stderr()))
        if progress is not None:
            progress.step(f"analytic {label(preset, lengths)}: {res.mean_response:.3f}")
    return rows


@dataclass(frozen=True)
class FleetRow:
    label: str
    e2e: float
    ttft: float
    queue: float
    tau: float


def fleet_rows(
    workload: Sequence[TraceRequest],
    profile: EngineProfile,
    *,
    replicas: int,
    slots: int,
    knowledge: Sequence[tuple[str, str]] = KNOWLEDGE,
    progress: Progress | None = None,
    what: str = "",
) -> list[FleetRow]:
    """Replay ``workload`` (already at its load) through each policy/knowledge pair."""
    rows = []
    for preset, lengths in knowledge:
        cfg = make_policy(preset, max_in_flight=slots * replicas)
        res = run_simulation(cfg, workload, replicas, profile, lengths=lengths, seed=SEED)
        rec = res.records
        done = rec.completed
        tau = math.nan
        if preset == "sjf":
            tau = float(kendalltau(rec.predicted[done], rec.output[done]).statistic)
        row = FleetRow(
            label(preset, lengths),
            mean_of(rec.e2e()[done]),
            mean_of(rec.ttft()[done]),
            mean_of(rec.queue_wait()[done]),
            tau,
        )
        rows.append(row)
        if progress is not None:
            progress.step(f"fleet {what} {row.label}: mean e2e {row.e2e:.3f} s")
    return rows


def reduction(base: float, x: float) -> float:
    return 1.0 - x / base


def bridge(
    trace: Sequence[TraceRequest], profile: EngineProfile, progress: Progress
) -> list[tuple[int, float, float, float]]:
    """One replica, Poisson arrivals with the trace's lengths, ρ = RHO of the capacity at
    each slot cap: ``(slots, fifo e2e, sjf e2e, fifo queue wait)``."""
    base = poisson_workload(trace, BRIDGE_JOBS, SEED)
    out = []
    for slots in BRIDGE_SLOTS:
        wl = at_load(base, RHO, capacity_at(profile, trace, 1, slots))
        rows = fleet_rows(
            wl,
            profile,
            replicas=1,
            slots=slots,
            knowledge=(("fifo", "oracle"), ("sjf", "oracle")),
        )
        out.append((slots, rows[0].e2e, rows[1].e2e, rows[0].queue))
        progress.step(f"bridge slots={slots}: fifo {rows[0].e2e:.3f} s, sjf {rows[1].e2e:.3f} s")
    return out


def main() -> None:
    profile = engine_profile()
    traces = {name: load_trace(name) for name in TRACES}
    n_steps = len(TRACES) * (2 * len(KNOWLEDGE) + len(KNOWLEDGE) + len(BRIDGE_SLOTS))
    progress = Progress("a", n_steps)

    theory: dict[str, tuple[float, float]] = {}
    analytic: dict[str, list[AnalyticRow]] = {}
    fleet: dict[tuple[str, str], list[FleetRow]] = {}
    caps: dict[str, float] = {}
    bridges: dict[str, list[tuple[int, float, float, float]]] = {}
    for name, trace in traces.items():
        sizes = output_sizes(trace)
        theory[name] = theory_means(sizes, RHO)
        analytic[name] = analytic_rows(
            sizes, n_jobs=ANALYTIC_JOBS, warmup=ANALYTIC_WARMUP, seed=SEED, progress=progress
        )
        cap = capacity_at(profile, trace, FLEET_REPLICAS, FLEET_SLOTS)
        caps[name] = cap.rps
        replay = at_load(trace, RHO, cap)
        poisson = at_load(poisson_workload(trace, len(trace), SEED), RHO, cap)
        for arrivals, wl in (("trace", replay), ("poisson", poisson)):
            fleet[(name, arrivals)] = fleet_rows(
                wl,
                profile,
                replicas=FLEET_REPLICAS,
                slots=FLEET_SLOTS,
                progress=progress,
                what=f"{name}/{arrivals}",
            )
        bridges[name] = bridge(trace, profile, progress)
    progress.finish()
    write(traces, theory, analytic, fleet, caps, bridges)


# --------------------------------------------------------------------------- report


def write(
    traces: dict[str, list[TraceRequest]],
    theory: dict[str, tuple[float, float]],
    analytic: dict[str, list[AnalyticRow]],
    fleet: dict[tuple[str, str], list[FleetRow]],
    caps: dict[str, float],
    bridges: dict[str, list[tuple[int, float, float, float]]],
) -> None:
    conv, code = TRACES
    th = {n: reduction(*theory[n]) for n in TRACES}
    an = {n: reduction(analytic[n][0].mean, analytic[n][1].mean) for n in TRACES}
    fl = {k: reduction(rows[0].e2e, rows[1].e2e) for k, rows in fleet.items()}
    best_fleet = max(fl.values())
    theory_ok = all(abs(an[n] - th[n]) < 0.03 for n in TRACES)
    if best_fleet >= 0.55:
        verdict = "Reproduced"
    elif best_fleet >= 0.3:
        verdict = "Partly reproduced"
    else:
        verdict = "Not reproduced"
    rho_60 = {n: rho_for_reduction(output_sizes(traces[n]), 0.6) for n in TRACES}
    swings = {n: minute_swing(traces[n]) for n in TRACES}
    bn = {n: {b[0]: reduction(b[1], b[2]) for b in bridges[n]} for n in TRACES}
    b1 = {n: bn[n][1] for n in TRACES}

    r = Report("(a) Mean latency: SJF vs FIFO")
    r.verdict = (
        f"**Verdict: {verdict}** for a batched fleet; the queueing-theory figures are "
        f"{'reproduced' if theory_ok else 'only approximately reproduced'} in the "
        f"single-server mode. With exact (oracle) lengths at ρ = {RHO}, SJF cuts mean "
        f"end-to-end latency on 4 continuously batching replicas by "
        f"{pct(fl[(conv, 'trace')])} on the conversation trace and "
        f"{pct(fl[(code, 'trace')])} on the code trace (recorded, bursty arrivals), and by "
        f"{pct(fl[(conv, 'poisson')])} / {pct(fl[(code, 'poisson')])} with Poisson arrivals, "
        f"against the article's 60–70%. One server without batching behaves as theory says: "
        f"Phipps vs Pollaczek–Khinchine predicts {pct(th[conv])} (conv) and {pct(th[code])} "
        f"(code), the analytic mode measures {pct(an[conv])} and {pct(an[code])}, and a "
        f"replica limited to one request at a time gives {pct(b1[conv])} and {pct(b1[code])}. "
        f"Even in theory 60% needs ρ ≈ {f2(rho_60[conv])} on conv (ρ ≈ {f2(rho_60[code])} "
        f"on code). Batching is why the fleet keeps so little: with {FLEET_SLOTS} slots per "
        f"replica the gateway queue that SJF reorders holds a small share of latency (none "
        f"with Poisson arrivals at ρ = {RHO}); on one replica the gain falls from the one-slot "
        f"figure to {pct(bn[conv][16])} / {pct(bn[code][16])} at 16 slots and "
        f"{pct(bn[conv][64])} / {pct(bn[code][64])} at 64. A real deployment keeps less "
        f"than the oracle: a predictor with Kendall τ = 0.5 keeps "
        f"{keep(fleet, analytic, conv, code, 'noisy:0.5')}; the "
        f"core's per-tenant p90 estimator keeps nothing on these single-tenant traces."
    )

    r.h2("Claim and method")
    r.para(
        "Claim: SJF lowers mean latency by 60–70% against FIFO. The brief's theory: about 33% "
        "(conversation) and 59% (code) at ρ = 0.8 with oracle lengths. Three layers, each "
        "driving the gateway's real `AdmissionController` (presets `fifo` and `sjf`, "
        "unbounded queue, no buckets, no shedding):"
    )
    r.bullets(
        [
            "**Theory**: `mg1_sjf_waits` (Phipps, non-preemptive SJF) against its "
            "Pollaczek–Khinchine FCFS mean, on each trace's output-length distribution "
            "(service ∝ output tokens, a 0-token row counts as 1), mean response = wait + "
            "service.",
            f"**Analytic mode** (`run_analytic`): one server, no batching, Poisson arrivals "
            f"at ρ = {RHO}, service = output tokens × a constant (mean 1 s), "
            f"{ANALYTIC_JOBS:,} jobs per case (first {ANALYTIC_WARMUP:,} dropped), seed "
            f"{SEED} for every case (common random numbers: every policy sees the same "
            "arrivals and sizes); ± is the batch-means standard error.",
            f"**Batched fleet** (`run_simulation`): {FLEET_REPLICAS} replicas of "
            f"`{PROFILE_NAME}` (continuous batching, chunked prefill, paged KV cache), "
            f"least-loaded routing, gateway pool `max_in_flight` = {FLEET_SLOTS} per replica "
            f"(the simulator's default), ρ = {RHO} of the fleet's saturation throughput *at "
            f"that cap* (conv {caps[conv]:.1f} req/s, code {caps[code]:.1f} req/s for "
            f"{FLEET_REPLICAS} replicas). Whole traces: conv {len(traces[conv]):,} requests, "
            f"code {len(traces[code]):,}, replayed with their recorded arrival pattern "
            "(rescaled in time), and again with Poisson arrivals and (prompt, output) pairs "
            "resampled from the trace (same count). Latency = end-to-end of completed "
            "requests (one conv request exceeds the 8,192-token context and fails in every "
            "run).",
            "**Length knowledge**: `oracle` (true output length), `noisy:τ` (a predictor "
            "with Kendall rank correlation τ to the truth and the same marginal; the "
            "measured τ is shown), `estimator` (the core's per-tenant running p90 of "
            "observed outputs, capped at `max_tokens`; the traces have a single tenant and "
            "no declared `max_tokens`, so it predicts nearly the same number for everyone).",
        ]
    )

    r.h2("1. Theory against the analytic mode (one server, no batching)")
    rows = []
    for n in TRACES:
        f_, s_ = theory[n]
        rows.append(
            [
                n,
                f3(f_),
                f3(s_),
                pct(th[n]),
                f"{f3(analytic[n][0].mean)} ± {f3(analytic[n][0].stderr)}",
                f"{f3(analytic[n][1].mean)} ± {f3(analytic[n][1].stderr)}",
                pct(an[n]),
            ]
        )
    r.table(
        [
            "trace",
            "P-K FCFS E[T]",
            "Phipps SJF E[T]",
            "theory reduction",
            "sim fifo E[T]",
            "sim sjf (oracle) E[T]",
            "sim reduction",
        ],
        rows,
    )
    r.para(
        f"Mean response in units of the mean service time, ρ = {RHO}. Output-length "
        f"C_s² is {scv(output_sizes(traces[conv])):.2f} (conv) and "
        f"{scv(output_sizes(traces[code])):.2f} (code): the more variable the sizes, the more "
        "SJF gains. For the reduction to reach 60% the conversation trace needs "
        f"ρ ≈ {f2(rho_60[conv])}, the code trace ρ ≈ {f2(rho_60[code])} (see the plot)."
    )
    r.image("theory vs measurements", "reduction_vs_rho.png")

    r.h2("2. How much of the gain each kind of length knowledge keeps")
    for n in TRACES:
        r.h3(n)
        base_a = analytic[n][0].mean
        base_t = fleet[(n, "trace")][0]
        base_p = fleet[(n, "poisson")][0]
        rows = []
        for i, a in enumerate(analytic[n]):
            ft = fleet[(n, "trace")][i]
            fp = fleet[(n, "poisson")][i]
            rows.append(
                [
                    a.label,
                    f3(ft.tau) if not math.isnan(ft.tau) else "–",
                    f3(a.mean),
                    pct(reduction(base_a, a.mean)),
                    f2(ft.e2e),
                    f2(ft.ttft),
                    pct(reduction(base_t.e2e, ft.e2e)),
                    f2(fp.e2e),
                    pct(reduction(base_p.e2e, fp.e2e)),
                ]
            )
        r.table(
            [
                "policy, lengths",
                "measured τ",
                "1 server E[T]",
                "1 server gain",
                "fleet, trace arrivals: mean e2e (s)",
                "mean TTFT (s)",
                "gain",
                "fleet, Poisson: mean e2e (s)",
                "gain",
            ],
            rows,
        )
        r.para(
            f"FIFO's mean queue wait is {f2(base_t.queue)} s of its {f2(base_t.e2e)} s mean "
            f"end-to-end latency with recorded arrivals ({f2(base_p.queue)} s of "
            f"{f2(base_p.e2e)} s with Poisson arrivals): that queue wait is all a gateway "
            "ordering can remove, so it bounds SJF's gain in the fleet at "
            f"{pct(base_t.queue / base_t.e2e)} ({pct(base_p.queue / base_p.e2e)})."
        )
    r.image("gain by length knowledge", "gain_by_knowledge.png")

    r.h2("3. From one slot to a batch: where the gain goes")
    r.para(
        f"One replica, Poisson arrivals with each trace's (prompt, output) pairs "
        f"({BRIDGE_JOBS:,} requests), oracle SJF vs FIFO at ρ = {RHO} of the capacity at each "
        "slot cap (`max_in_flight` per replica). With one slot the replica is a single "
        "non-batching server whose service time is prefill + decode at batch size 1."
    )
    rows = []
    for n in TRACES:
        for slots, fe, se, fq in bridges[n]:
            rows.append([n, str(slots), f2(fe), f2(se), pct(reduction(fe, se)), f2(fq)])
    r.table(
        [
            "trace",
            "slots / replica",
            "fifo mean e2e (s)",
            "sjf mean e2e (s)",
            "gain",
            "fifo mean queue wait (s)",
        ],
        rows,
    )
    r.image("gain vs slots per replica", "gain_vs_slots.png")

    r.h2("Why the batched fleet keeps so little")
    r.bullets(
        [
            "SJF reorders the gateway queue, nothing else. In M/G/1 the queue wait is "
            f"most of the response time at ρ = {RHO} (P-K: wait = "
            f"{pct(1 - 1 / theory[conv][0])} of E[T] on conv), so reordering it pays. A "
            f"replica with {FLEET_SLOTS} slots is a many-server queue: at the same ρ a new "
            "request rarely waits, and its latency is mostly its own decode time, which "
            "ordering does not touch (see the queue-wait bound under each table).",
            "Inside the batch there is no order to choose: every running sequence advances "
            "one token per iteration, which is processor sharing, whose mean response is "
            "insensitive to the order of arrivals. Longer jobs slow everyone a little (bigger "
            "batch, more KV to read) whatever the queue discipline.",
            "Service is not proportional to output length in an engine: each request also "
            "pays its prefill (conv: 1,155 prompt tokens on average, code: 2,048 against 28 "
            "output tokens), so output-length SJF sorts by a partial proxy of the work; on "
            "the code trace it is mostly prefill. With one slot per replica the gain is "
            f"close to the M/G/1 figure anyway ({pct(b1[conv])} conv, {pct(b1[code])} code, "
            f"{BRIDGE_JOBS:,} requests, so a few points of sampling noise): the queue wait "
            "dominates there, and it is ordered by output length.",
            f"Recorded arrivals are burstier than Poisson: per minute, conv's rate ranges "
            f"from {f2(swings[conv][0])}× to {f2(swings[conv][1])}× its mean and code's from "
            f"{f2(swings[code][0])}× to {f2(swings[code][1])}×. At a mean ρ of {RHO} the "
            "busiest minutes are overloads, which build real queues, and only there does SJF "
            "find something to reorder: every fleet gain above comes from those bursts "
            "(with Poisson arrivals the queue stays empty and SJF changes nothing).",
            "What a real deployment keeps: with a learned predictor the gain falls with τ "
            "(table 2). The core's per-tenant p90 estimator gives every request of a tenant "
            "the same guess, so on a single-tenant trace `sjf` with it is FIFO ordered by a "
            "slowly drifting number (its measured τ, "
            f"{f3(fleet[(conv, 'trace')][-1].tau)} on conv and "
            f"{f3(fleet[(code, 'trace')][-1].tau)} on code, comes only from that drift); it "
            "lands within noise of FIFO or slightly worse (requests that arrive while the "
            "estimate dips jump the queue regardless of their size).",
        ]
    )
    r.h2("Reproduce")
    r.para(
        "`.venv/bin/python -m experiments.a_mean_latency.run` (deterministic: fixed seeds; "
        "about 2 minutes)."
    )
    r.write(OUT)
    plots(traces, analytic, fleet, bridges, th, an, fl)


def keep(
    fleet: dict[tuple[str, str], list[FleetRow]],
    analytic: dict[str, list[AnalyticRow]],
    conv: str,
    code: str,
    lengths: str,
) -> str:
    """What share of the oracle's gain a predictor keeps, one server and fleet, per trace."""
    i = [a.label for a in analytic[conv]].index(f"sjf, {lengths}")
    parts = []
    for n in (conv, code):
        a = analytic[n]
        one = reduction(a[0].mean, a[i].mean) / reduction(a[0].mean, a[1].mean)
        t = fleet[(n, "trace")]
        flt = reduction(t[0].e2e, t[i].e2e) / reduction(t[0].e2e, t[1].e2e)
        parts.append(f"{pct(one, 0)} (one server) / {pct(flt, 0)} (fleet) of it on {n}")
    return ", ".join(parts)


def minute_swing(trace: Sequence[TraceRequest]) -> tuple[float, float]:
    """Lowest and highest per-minute arrival count over the mean (full minutes only)."""
    t = np.asarray([r.t for r in trace])
    full = int(t[-1] // 60)
    counts = np.bincount((t[t < full * 60] // 60).astype(np.int64), minlength=full)
    return float(counts.min() / counts.mean()), float(counts.max() / counts.mean())


def scv(sizes: NDArray[np.int64]) -> float:
    x = sizes.astype(np.float64)
    return float(x.var() / x.mean() ** 2)


def rho_for_reduction(sizes: NDArray[np.int64], target: float) -> float:
    """The smallest ρ on a 0.005 grid where M/G/1 SJF's reduction reaches ``target``."""
    for rho in np.arange(0.5, 0.9951, 0.005):
        if theory_reduction(sizes, float(rho)) >= target:
            return float(rho)
    return math.nan


def plots(
    traces: dict[str, list[TraceRequest]],
    analytic: dict[str, list[AnalyticRow]],
    fleet: dict[tuple[str, str], list[FleetRow]],
    bridges: dict[str, list[tuple[int, float, float, float]]],
    th: dict[str, float],
    an: dict[str, float],
    fl: dict[tuple[str, str], float],
) -> None:
    colors = {"azure_conv": "tab:blue", "azure_code": "tab:orange"}
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    rhos = np.arange(0.3, 0.981, 0.01)
    for n in TRACES:
        sizes = output_sizes(traces[n])
        red = [100 * theory_reduction(sizes, float(x)) for x in rhos]
        ax.plot(rhos, red, color=colors[n], label=f"{n}: M/G/1 theory")
        ax.plot([RHO], [100 * an[n]], "o", color=colors[n], label=f"{n}: analytic mode")
        ax.plot(
            [RHO],
            [100 * fl[(n, "trace")]],
            "s",
            color=colors[n],
            mfc="none",
            label=f"{n}: batched fleet (trace arrivals)",
        )
        ax.plot(
            [RHO],
            [100 * fl[(n, "poisson")]],
            "^",
            color=colors[n],
            mfc="none",
            label=f"{n}: batched fleet (Poisson)",
        )
    ax.axhspan(60, 70, color="grey", alpha=0.15, label="article's claim (60–70%)")
    ax.set_xlabel("utilisation ρ")
    ax.set_ylabel("mean latency reduction of SJF vs FIFO (%)")
    ax.set_title("SJF's gain: theory, one server, batched fleet (oracle lengths)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    save_plot(fig, OUT / "reduction_vs_rho.png")

    fig = Figure(figsize=(9, 4.2))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, n in zip(axes, TRACES, strict=True):
        labels = [a.label.replace("sjf, ", "") for a in analytic[n][1:]]
        x = np.arange(len(labels))
        base = analytic[n][0].mean
        a_red = [100 * reduction(base, a.mean) for a in analytic[n][1:]]
        t_rows = fleet[(n, "trace")]
        p_rows = fleet[(n, "poisson")]
        t_red = [100 * reduction(t_rows[0].e2e, f.e2e) for f in t_rows[1:]]
        p_red = [100 * reduction(p_rows[0].e2e, f.e2e) for f in p_rows[1:]]
        w = 0.27
        ax.bar(x - w, a_red, w, label="one server (analytic)")
        ax.bar(x, t_red, w, label="fleet, trace arrivals")
        ax.bar(x + w, p_red, w, label="fleet, Poisson")
        ax.set_xticks(x, labels, rotation=30, fontsize=8)
        ax.set_title(n)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("mean latency reduction vs FIFO (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"SJF's gain by length knowledge, ρ = {RHO}")
    save_plot(fig, OUT / "gain_by_knowledge.png")

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for n in TRACES:
        xs = [b[0] for b in bridges[n]]
        ys = [100 * reduction(b[1], b[2]) for b in bridges[n]]
        ax.plot(xs, ys, "o-", color=colors[n], label=f"{n}: one replica")
        ax.axhline(
            100 * th[n], color=colors[n], linestyle="--", linewidth=0.8, label=f"{n}: M/G/1 theory"
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("gateway slots per replica (max_in_flight)")
    ax.set_ylabel("mean e2e reduction of SJF vs FIFO (%)")
    ax.set_title(f"SJF's gain shrinks as the batch grows (ρ = {RHO}, oracle)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_plot(fig, OUT / "gain_vs_slots.png")


if __name__ == "__main__":
    main()
