"""(c) Split pools: short and long completions on separate GPUs vs one shared pool.

Claim (seed article): routing short and long completions to two pools gives short requests a
6× better p99 for about 12% more GPUs.

Setup: the first 8,000 requests of the Azure conversation trace (about 24 minutes of
recorded arrivals, time-rescaled), a fixed offered rate (0.8 × the capacity of 8 replicas),
FIFO at the gateway, the Llama-3-8B/H100 engine model.  A request is *short* when its true
output is at most 256 tokens (routing by the true length is the split's best case).  Shared:
N replicas in one pool.  Split: a replicas for short requests, b for long ones.

Two gateway regimes: in-flight capped at 64 per replica (the simulator's default; requests
beyond it wait in the gateway's FIFO queue) and uncapped (up to the engine's own
``max_num_seqs`` = 1024, so everything goes straight into the engines' batches).

Pools do not interact (each has its own queue and replicas, and the global queue bound is
unbounded), so a split (a, b) is measured as the short requests alone on a replicas and the
long ones alone on b replicas; one combined two-pool run checks that this gives identical
numbers.

Run from the repository root: ``.venv/bin/python -m experiments.c_split_pools.run`` (about
1.5 minutes on 2 cores).  Writes ``REPORT.md`` and PNGs next to this file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from experiments.common import (
    PROFILE_NAME,
    Progress,
    Report,
    at_load,
    capacity_at,
    engine_profile,
    f2,
    make_policy,
    pct,
    pctl,
    save_plot,
)
from velvetrope.engine import EngineProfile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import SimResult
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace
from velvetrope.sim.workload import head

OUT = Path(__file__).resolve().parent
TRACE = "azure_conv"
N_REQUESTS = 8_000
SHORT_MAX_TOKENS = 256
BASE_REPLICAS = 8
LOAD = 0.8
SHARED_N = tuple(range(6, 15))
SHORT_A = tuple(range(2, 11))
LONG_B = tuple(range(2, 11))
REGIMES: tuple[tuple[str, int], ...] = (
    ("capped at 64 per replica", 64),
    ("capped at 16 per replica", 16),
    ("uncapped", 1024),
)
LONG_TTFT_P99_MAX = 5.0
LONG_E2E_P99_MAX = 15.0
SHORT_TARGETS = (("p99 TTFT", "ttft", 0.5), ("p99 TTFT", "ttft", 0.25), ("p99 e2e", "e2e", 2.5))
SEED = 3


@dataclass(frozen=True)
class Tail:
    """p99 TTFT and e2e of one class of requests (completed ones)."""

    ttft: float
    e2e: float

    def get(self, metric: str) -> float:
        return self.ttft if metric == "ttft" else self.e2e


def tails(res: SimResult, mask: NDArray[np.bool_] | None = None) -> Tail:
    rec = res.records
    sel = rec.completed if mask is None else rec.completed & mask
    return Tail(pctl(rec.ttft()[sel], 99), pctl(rec.e2e()[sel], 99))


def long_ok(t: Tail) -> bool:
    """The bound long requests must keep in any layout that counts."""
    return t.ttft <= LONG_TTFT_P99_MAX and t.e2e <= LONG_E2E_P99_MAX


def run(
    workload: Sequence[TraceRequest], replicas: int, slots: int, profile: EngineProfile
) -> SimResult:
    cfg = make_policy("fifo", max_in_flight=slots * replicas)
    return run_simulation(cfg, workload, replicas, profile, lengths="oracle", seed=SEED)


def is_short(r: TraceRequest) -> bool:
    return r.output_tokens <= SHORT_MAX_TOKENS


@dataclass(frozen=True)
class Grid:
    """Measurements of one regime: shared N → (short, long); short pool a; long pool b."""

    shared: dict[int, tuple[Tail, Tail]]
    short: dict[int, Tail]
    long: dict[int, Tail]

    def best_split(self, total: int, metric: str) -> tuple[int, int] | None:
        """The (a, b) with a + b = total that minimises the short p99 ``metric`` while the
        long pool keeps within :func:`long_ok`; None if no split qualifies."""
        best: tuple[float, int, int] | None = None
        for a in self.short:
            b = total - a
            if b not in self.long or not long_ok(self.long[b]):
                continue
            v = self.short[a].get(metric)
            if best is None or v < best[0]:
                best = (v, a, b)
        return None if best is None else (best[1], best[2])

    def shared_ok(self, n: int) -> bool:
        return long_ok(self.shared[n][1])

    def gpus_for(self, metric: str, target: float) -> tuple[int | None, int | None]:
        """Fewest GPUs (shared, split) meeting short p99 ``metric`` ≤ target and the long
        constraint, within the measured grid."""
        shared = next(
            (
                n
                for n in sorted(self.shared)
                if self.shared_ok(n) and self.shared[n][0].get(metric) <= target
            ),
            None,
        )
        split = None
        for total in range(min(self.short) + min(self.long), max(self.short) + max(self.long) + 1):
            ab = self.best_split(total, metric)
            if ab is not None and self.short[ab[0]].get(metric) <= target:
                split = total
                break
        return shared, split


def measure(
    workload: Sequence[TraceRequest], slots: int, profile: EngineProfile, progress: Progress
) -> Grid:
    short_wl = [r for r in workload if is_short(r)]
    long_wl = [r for r in workload if not is_short(r)]
    mask = np.asarray([is_short(r) for r in workload])
    shared = {}
    for n in SHARED_N:
        res = run(workload, n, slots, profile)
        shared[n] = (tails(res, mask), tails(res, ~mask))
        progress.step(
            f"slots={slots} shared {n}: short p99 TTFT {shared[n][0].ttft:.2f} s, "
            f"e2e {shared[n][0].e2e:.2f} s"
        )
    short = {}
    for a in SHORT_A:
        short[a] = tails(run(short_wl, a, slots, profile))
        progress.step(f"slots={slots} short pool {a}: p99 TTFT {short[a].ttft:.2f} s")
    long = {}
    for b in LONG_B:
        long[b] = tails(run(long_wl, b, slots, profile))
        progress.step(f"slots={slots} long pool {b}: p99 TTFT {long[b].ttft:.2f} s")
    return Grid(shared, short, long)


def combined_check(
    workload: Sequence[TraceRequest], a: int, b: int, slots: int, profile: EngineProfile
) -> tuple[Tail, Tail]:
    """One real two-pool run, routed by the core's rule on the predicted output (the true
    length here: oracle lengths): (short, long) tails."""
    cfg = make_policy(
        "fifo",
        max_in_flight=0,
        pools=[
            {"name": "short", "max_in_flight": slots * a},
            {"name": "long", "max_in_flight": slots * b},
        ],
        routes=[{"pool": "short", "max_predicted_output": SHORT_MAX_TOKENS}, {"pool": "long"}],
    )
    res = run_simulation(
        cfg, workload, {"short": a, "long": b}, profile, lengths="oracle", seed=SEED
    )
    mask = np.asarray([is_short(r) for r in workload])
    return tails(res, mask), tails(res, ~mask)


def main() -> None:
    profile = engine_profile()
    trace = head(load_trace(TRACE), N_REQUESTS)
    cap = capacity_at(profile, trace, BASE_REPLICAS, REGIMES[0][1])
    workload = at_load(trace, LOAD, cap)
    progress = Progress("c", len(REGIMES) * (len(SHARED_N) + len(SHORT_A) + len(LONG_B)) + 1)
    grids = {slots: measure(workload, slots, profile, progress) for _, slots in REGIMES}
    check_ab = (5, 4)
    check = combined_check(workload, *check_ab, REGIMES[0][1], profile)
    g0 = grids[REGIMES[0][1]]
    separate = (g0.short[check_ab[0]], g0.long[check_ab[1]])
    progress.step(f"combined two-pool run {check_ab}: equal to separate runs: {check == separate}")
    progress.finish()
    write(grids, workload, LOAD * cap.rps, check_ab, check, separate)


# --------------------------------------------------------------------------- report


def ratio(x: float, y: float) -> float:
    return x / y if y > 0 else math.nan


def write(
    grids: dict[int, Grid],
    workload: Sequence[TraceRequest],
    rate: float,
    check_ab: tuple[int, int],
    check: tuple[Tail, Tail],
    separate: tuple[Tail, Tail],
) -> None:
    n_short = sum(1 for r in workload if is_short(r))
    share_tokens = sum(r.output_tokens for r in workload if is_short(r)) / sum(
        r.output_tokens for r in workload
    )
    base = BASE_REPLICAS
    plus = math.ceil(base * 1.12)

    # the claim at the baseline: shared `base` GPUs vs the best split with `plus` GPUs
    claim: dict[int, tuple[float, float, tuple[int, int] | None]] = {}
    for _, slots in REGIMES:
        g = grids[slots]
        ab = g.best_split(plus, "ttft")
        sh = g.shared[base][0]
        if ab is None:
            claim[slots] = (math.nan, math.nan, None)
        else:
            sp = g.short[ab[0]]
            claim[slots] = (ratio(sh.ttft, sp.ttft), ratio(sh.e2e, sp.e2e), ab)
    best_ratio = (
        max(max(c[0], c[1]) for c in claim.values() if not math.isnan(c[0]))
        if any(not math.isnan(c[0]) for c in claim.values())
        else math.nan
    )
    equal_better = {
        slots: [
            n
            for n in SHARED_N
            if (ab := grids[slots].best_split(n, "ttft")) is not None
            and grids[slots].short[ab[0]].ttft < grids[slots].shared[n][0].ttft
            and grids[slots].shared_ok(n)
        ]
        for _, slots in REGIMES
    }
    verdict = (
        "Reproduced"
        if best_ratio >= 5
        else "Partly reproduced"
        if best_ratio >= 2
        else "Not reproduced"
    )

    s64 = REGIMES[0][1]
    r = Report("(c) Split pools: short and long completions apart")
    c64 = claim[s64]

    def claim_text(c: tuple[float, float, tuple[int, int] | None], slots: int) -> str:
        g = grids[slots]
        if c[2] is None:
            return f"no split of {plus} GPUs keeps the long requests within their bound"
        a, b = c[2]
        sh = g.shared[base][0]
        sp = g.short[a]
        return (
            f"short p99 TTFT {f2(sh.ttft)} s → {f2(sp.ttft)} s ({f2(c[0])}×) and p99 e2e "
            f"{f2(sh.e2e)} s → {f2(sp.e2e)} s ({f2(c[1])}×) with {a} + {b} GPUs"
        )

    tgt = {
        (name, metric, t): {slots: grids[slots].gpus_for(metric, t) for _, slots in REGIMES}
        for name, metric, t in SHORT_TARGETS
    }

    def claim_ratio(slots: int) -> str:
        c = claim[slots]
        return "no qualifying split" if c[2] is None else f"{f2(c[0])}× / {f2(c[1])}×"

    def needs(metric: str, t: float) -> str:
        by = tgt[next(k for k in tgt if k[1] == metric and k[2] == t)]
        out = []
        for label, slots in REGIMES:
            sh, sp = by[slots]
            a = f">{max(SHARED_N)}" if sh is None else str(sh)
            b = "none" if sp is None else str(sp)
            out.append(
                f"{a} vs {b} ({label.replace('capped at ', '').replace(' per replica', '')})"
            )
        return ", ".join(out)

    wins = {slots: ", ".join(map(str, v)) for slots, v in equal_better.items()}
    win_text = (
        "at no size in any regime"
        if not any(wins.values())
        else "at: " + "; ".join(f"{wins[sl] or 'no size'} ({lb})" for lb, sl in REGIMES)
    )
    r.verdict = (
        f"**Verdict: {verdict}.** With the gateway capped at 64 requests per replica, going "
        f"from {base} shared GPUs to {plus} split GPUs (+{pct(plus / base - 1, 0)}) takes "
        f"short requests from {claim_text(c64, s64)}: worse, not 6× better. Across the "
        f"three gateway regimes the ratio (shared {base} / best split {plus}, p99 TTFT / "
        f"p99 e2e) is {'; '.join(f'{claim_ratio(sl)} ({lb})' for lb, sl in REGIMES)}, at "
        f"best {f2(best_ratio)}×. At equal GPU count (6 to 14) the best split beats the "
        f"shared pool on short p99 TTFT {win_text}. GPUs to reach short p99 "
        f"TTFT ≤ 0.25 s, shared vs split: {needs('ttft', 0.25)}; short p99 e2e ≤ 2.5 s: "
        f"{needs('e2e', 2.5)}. Splitting can buy short requests a slightly lower p99 e2e in "
        f"large fleets, paid by a long pool running near its bound, but never a multiple. "
        f"In a continuous-batching engine a short request is not stuck behind a long one: it "
        f"joins the running batch at once, so isolation buys little, while splitting gives "
        f"up statistical multiplexing (each pool needs its own headroom, and the long pool, "
        f"with {pct(1 - share_tokens, 0)} of the output tokens, needs most of the GPUs)."
    )
    r.h2("Setup")
    r.bullets(
        [
            f"Trace: the first {N_REQUESTS:,} requests of `{TRACE}` (recorded arrival "
            f"pattern, rescaled in time) offered at {rate:.1f} req/s = {LOAD} × the "
            f"saturation throughput of {base} replicas at 64 slots each; the same traffic in "
            "every run.",
            f"Short = true output ≤ {SHORT_MAX_TOKENS} tokens: {n_short:,} requests "
            f"({pct(n_short / len(workload), 0)}), {pct(share_tokens, 0)} of the output tokens. "
            "Split pools route by the true length (the best case for splitting).",
            f"Engine: `{PROFILE_NAME}` per replica, least-loaded routing inside a pool; "
            "gateway: preset `fifo`, unbounded queue, no buckets, no shedding.",
            f"A split counts only if the long pool keeps its p99 TTFT ≤ {LONG_TTFT_P99_MAX:g} s "
            f"and p99 e2e ≤ {LONG_E2E_P99_MAX:g} s (otherwise giving every GPU to short "
            "requests would win trivially; without a gateway cap an overloaded pool shows up "
            "in e2e rather than TTFT); the shared pool is held to the same bound.",
            f"Check: one real two-pool run ({check_ab[0]} + {check_ab[1]}, capped) gives short "
            f"p99 TTFT {f2(check[0].ttft)} s / e2e {f2(check[0].e2e)} s and long "
            f"{f2(check[1].ttft)} s / {f2(check[1].e2e)} s; the separate runs give "
            f"{f2(separate[0].ttft)} / {f2(separate[0].e2e)} and {f2(separate[1].ttft)} / "
            f"{f2(separate[1].e2e)}: {'identical' if check == separate else 'DIFFERENT'}.",
        ]
    )
    r.h2("GPUs needed for a short-request target")
    rows = []
    for (name, _metric, t), by in tgt.items():
        for label, slots in REGIMES:
            n_sh, n_sp = by[slots]
            rows.append(
                [
                    f"short {name} ≤ {t:g} s",
                    label,
                    f"> {max(SHARED_N)}" if n_sh is None else str(n_sh),
                    f"> {max(SHORT_A) + max(LONG_B)}" if n_sp is None else str(n_sp),
                ]
            )
    r.table(["target", "gateway", "shared pool: GPUs", "split pools: GPUs (best a + b)"], rows)
    for label, slots in REGIMES:
        g = grids[slots]
        r.h2(f"Equal GPU count, gateway {label}")
        rows = []
        for n in SHARED_N:
            sh_s, sh_l = g.shared[n]
            ab = g.best_split(n, "ttft")
            if ab is None:
                split_cells = ["none within the long bound", "–", "–", "–", "–"]
            else:
                a, b = ab
                split_cells = [
                    f"{a} + {b}",
                    f2(g.short[a].ttft),
                    f2(g.short[a].e2e),
                    f2(g.long[b].ttft),
                    f2(g.long[b].e2e),
                ]
            rows.append(
                [str(n), f2(sh_s.ttft), f2(sh_s.e2e), f2(sh_l.ttft), f2(sh_l.e2e), *split_cells]
            )
        r.table(
            [
                "GPUs",
                "shared: short p99 TTFT",
                "short p99 e2e",
                "long p99 TTFT",
                "long p99 e2e",
                "best split (short + long)",
                "split: short p99 TTFT",
                "short p99 e2e",
                "long p99 TTFT",
                "long p99 e2e",
            ],
            rows,
        )
    r.para(
        "Seconds. The best split minimises short p99 TTFT under the long-pool bound. The "
        "64-slot cap binds only on the smallest pools at this traffic, which is why the "
        "uncapped numbers coincide with it from 8 GPUs up; the 16-slot cap binds everywhere "
        "and shows the head-of-line blocking that a tight gateway cap creates, in both "
        "layouts."
    )
    r.image("short p99 vs GPUs", "short_p99_vs_gpus.png")
    r.h2("Each pool alone")
    rows = []
    for label, slots in REGIMES:
        g = grids[slots]
        for a in SHORT_A:
            rows.append([label, "short", str(a), f2(g.short[a].ttft), f2(g.short[a].e2e)])
        for b in LONG_B:
            rows.append([label, "long", str(b), f2(g.long[b].ttft), f2(g.long[b].e2e)])
    r.table(["gateway", "pool", "GPUs", "p99 TTFT (s)", "p99 e2e (s)"], rows)
    r.h2("Why splitting does not pay here")
    r.bullets(
        [
            "The engine batches continuously: a short request that reaches a replica starts "
            "at the next iteration, whatever long requests are running. The only place it "
            "can wait behind a long request is the gateway queue, and at this load that "
            "queue is usually empty in a shared pool of this size.",
            "What a short request feels from long ones in the batch is a slightly slower "
            "iteration (more sequences, more KV to read), and mostly the chunked prefill of "
            "everyone's prompts. Prompts are about as long for short completions as for long "
            "ones, so a short pool runs prefill-heavy batches and its decode steps are not "
            "much faster: the short p99 e2e floor (≈ 2 s) barely moves with the split.",
            "Splitting costs multiplexing: each pool needs its own headroom against its own "
            "bursts, and the GPU counts come in integers per pool.",
            "With the gateway uncapped, bursts go straight into the batch and inflate every "
            "running request's step time, in either layout; a cap and a queue (study d) is "
            "the better lever for the tail.",
            "Where the claim would hold: engines whose batch is small or KV-bound (long "
            "requests holding most of the cache and blocking admission, vLLM's head-of-line "
            "blocking), or a gateway with very few slots per replica and queues near "
            "saturation. The engine model here has a 432k-token KV cache per replica that "
            "this trace never fills.",
        ]
    )
    r.h2("Reproduce")
    r.para(
        "`.venv/bin/python -m experiments.c_split_pools.run` (deterministic; about 1.5 minutes)."
    )
    r.write(OUT)

    fig = Figure(figsize=(13, 4.3))
    axes = fig.subplots(1, len(REGIMES), sharey=True)
    for ax, (label, slots) in zip(axes, REGIMES, strict=True):
        g = grids[slots]
        xs = list(SHARED_N)
        ax.plot(xs, [g.shared[n][0].ttft for n in xs], "o-", label="shared: short p99 TTFT")
        ax.plot(xs, [g.shared[n][0].e2e for n in xs], "s-", label="shared: short p99 e2e")
        totals = list(range(min(SHORT_A) + min(LONG_B), max(SHORT_A) + max(LONG_B) + 1))
        sx, st, se = [], [], []
        for t in totals:
            ab = g.best_split(t, "ttft")
            if ab is not None:
                sx.append(t)
                st.append(g.short[ab[0]].ttft)
                se.append(g.short[ab[0]].e2e)
        ax.plot(sx, st, "o--", label="best split: short p99 TTFT")
        ax.plot(sx, se, "s--", label="best split: short p99 e2e")
        ax.set_yscale("log")
        ax.set_xlabel("GPUs (replicas) in total")
        ax.set_title(f"gateway {label}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("seconds")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Short requests' p99 vs GPU count, {rate:.0f} req/s offered")
    save_plot(fig, OUT / "short_p99_vs_gpus.png")


if __name__ == "__main__":
    main()
