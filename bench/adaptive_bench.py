"""The adaptive in-flight limit against the knee a concurrency sweep finds.

Two cases, each one replica in closed loop (more clients than the knee, so the gateway
always holds a queue and the limit alone decides how much runs): Llama-3-8B on an H100
with the Azure code trace's (prompt, output) mix (prefill-bound: the knee is the per-step
token budget) and on an A100 with the conversation trace's mix (KV-bound).  Per case:

1. a sweep of fixed limits (:func:`~velvetrope.sim.closed_loop.knee_sweep`), coarse then
   fine around the crossing, finds the knee as the adaptive limit defines it (where half
   of each extra job in flight waits for its first token) and the best throughput;
2. the adaptive limit runs ``RUN_S`` virtual seconds from its default start (16);
3. the best fixed limit of the sweep runs the same length, same seed.

``knee_err`` is ``|mean limit over the last two thirds / knee − 1|``; ``converge_s`` the
time after which every 60-second mean of the limit stays within 10% of the knee (the time
it first gets there is printed too: the limit dithers around the knee, base and probe 20%
apart, and its slope estimate is noisy, so a 60-second mean can stray later);
``throughput_ratio`` the adaptive run's completions per second over the last two thirds
divided by the best fixed limit's over the same span.  The last line gives the worst
case of each: ``adaptive: knee_err=<e> converge_s=<t> throughput_ratio=<r>`` (targets:
knee_err <= 0.10, throughput_ratio >= 0.98).

Run: ``.venv/bin/python bench/adaptive_bench.py`` (about a minute and a half on 2 cores).
"""

from __future__ import annotations

import math
import time

import numpy as np

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.closed_loop import ClosedLoopResult, KneeSweep, knee_sweep, run_closed_loop
from velvetrope.sim.traces import load_trace

CASES = (("llama3-8b-h100", "azure_code"), ("llama3-8b-a100", "azure_conv"))
COARSE = (16, 32, 64, 128, 256, 512)
RUN_S = 900.0
SWEEP_S = 300.0
WARMUP_S = 60.0
BLOCK_S = 60.0
SEED = 3


def pairs_of(trace: str, max_len: int) -> list[tuple[int, int]]:
    out = []
    for r in load_trace(trace):
        o = max(1, r.output_tokens)
        if r.prompt_tokens + o <= max_len:
            out.append((r.prompt_tokens, o))
    return out


def sweep(profile_name: str, pairs: list[tuple[int, int]]) -> KneeSweep:
    """Coarse sweep, then a fine one (steps of 1/16) across the bracket of the crossing."""
    profile = load_profile(profile_name)
    coarse = knee_sweep(profile, pairs, COARSE, duration_s=SWEEP_S, warmup_s=WARMUP_S)
    k = coarse.knee if not math.isnan(coarse.knee) else COARSE[-1]
    lo = max(2, int(k / 1.5))
    step = max(1, lo // 16)
    fine = list(range(lo, int(k * 1.5) + step, step))
    return knee_sweep(profile, pairs, fine, duration_s=SWEEP_S, warmup_s=WARMUP_S)


def run(
    profile_name: str, pairs: list[tuple[int, int]], pool: dict[str, object], clients: int
) -> ClosedLoopResult:
    cfg = PolicyConfig.model_validate(
        {"preset": "fifo", "queue": {"max_queued": 1 << 40}, "pools": [{"name": "p", **pool}]}
    )
    return run_closed_loop(
        cfg,
        load_profile(profile_name),
        pairs,
        replicas=1,
        clients=clients,
        duration_s=RUN_S,
        seed=SEED,
    )


def reach_s(res: ClosedLoopResult, knee: float) -> float:
    """End of the first 60-second block whose mean limit is within 10% of the knee."""
    for start in np.arange(0.0, RUN_S, BLOCK_S):
        if abs(res.mean("limit", float(start), float(start) + BLOCK_S) / knee - 1) <= 0.10:
            return float(start) + BLOCK_S
    return math.inf


def converge_s(res: ClosedLoopResult, knee: float) -> float:
    """End of the last 60-second block whose mean limit is off the knee by more than 10%."""
    last_off = 0.0
    for start in np.arange(0.0, RUN_S, BLOCK_S):
        mean = res.mean("limit", float(start), float(start) + BLOCK_S)
        if abs(mean / knee - 1) > 0.10:
            last_off = float(start) + BLOCK_S
    return last_off


def main() -> None:
    t0 = time.perf_counter()
    errs, convs, ratios = [], [], []
    for profile_name, trace in CASES:
        pairs = pairs_of(trace, load_profile(profile_name).max_model_len)
        sw = sweep(profile_name, pairs)
        best_i = int(np.argmax(sw.throughput))
        best_limit = sw.limits[best_i]
        clients = int(2 * sw.knee) + 32
        adaptive = run(profile_name, pairs, {"limit": "adaptive"}, clients)
        fixed = run(profile_name, pairs, {"max_in_flight": best_limit}, clients)
        start = RUN_S / 3
        mean_limit = adaptive.mean("limit", start, RUN_S)
        err = abs(mean_limit / sw.knee - 1)
        conv = converge_s(adaptive, sw.knee)
        ratio = adaptive.throughput(start, RUN_S) / fixed.throughput(start, RUN_S)
        print(
            f"{profile_name} × {trace}: sweep {sw.limits[0]}..{sw.limits[-1]} → knee "
            f"{sw.knee:.1f} (throughput there {sw.throughput_at(sw.knee) / sw.best:.1%} of the "
            f"sweep's best, {sw.best:.2f} req/s at {best_limit}); adaptive: mean limit "
            f"{mean_limit:.1f} over {start:.0f}-{RUN_S:.0f} s (knee_err {err:.3f}), first within "
            f"10% at {reach_s(adaptive, sw.knee):.0f} s, within 10% from {conv:.0f} s on, "
            f"{adaptive.throughput(start, RUN_S):.2f} req/s vs "
            f"{fixed.throughput(start, RUN_S):.2f} at fixed {best_limit} (ratio {ratio:.3f})",
            flush=True,
        )
        errs.append(err)
        convs.append(conv)
        ratios.append(ratio)
    print(f"({time.perf_counter() - t0:.0f} s)")
    print(
        f"adaptive: knee_err={max(errs):.3f} converge_s={max(convs):.0f} "
        f"throughput_ratio={min(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
