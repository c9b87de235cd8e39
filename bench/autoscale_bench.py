"""Autoscaling what-if: a simulated day under KEDA, and a sweep of day slices on two cores.

1. The simulated day of study (k) (``experiments/k_autoscaling/day.py``: the Azure
   conversation mix arriving in a day-shaped curve at a mean of 5 req/s, 4:1 between 14:00
   and 02:00, a 3× spike at 10:00 and a 2× spike at 19:30; Llama-3-70B on 4×H100 per replica,
   128 in flight each; the ``hybrid`` policy with three tiers) through KEDA on the gateway's
   queue depth with the shipped ScaledObject and the seed's threshold of 8 queued per
   replica, engines serving 120 s after they are asked for.  ``wall_s`` times
   :func:`~velvetrope.sim.loop.run_simulation` alone.  ``gpu_hours_vs_static`` is the run's
   GPU-hours over those of a fleet sized statically for its peak (the most replicas the
   autoscaler asked for, held all day); ``top_tier_slo`` the interactive tier's SLO
   attainment (requests completed within TTFT ≤ 2 s / offered).
2. A sweep: the slice 06:00-14:00 of the same day (the morning ramp, the 3× spike at 10:00
   and the afternoon peak) at thresholds 8 and 7 (the planner's) × start-up 60, 90, 120 and
   180 s: 8 runs of several seconds each, in this process one after another and on a local
   process pool of 2 workers (:func:`velvetrope.cluster.sweep_executor`), the workload
   shipped once as a :class:`~velvetrope.sim.shared.Shared`; in the order serial half A, pool
   A and B, serial half B, so that a load drifting over the minutes weighs on both alike.
   The parallel time includes the workers' start-up, which runs this long amortise.  Each
   run also measures its own CPU seconds, so the line shows whether the workers got their
   cores (:class:`~velvetrope.cluster.SweepTiming`); then two pure-CPU loops the same way,
   to show how much of two cores the machine gave in that minute (the machines are shared).

Ends with::

    autoscale: sim_hours=24 requests=<n> wall_s=<w> gpu_hours_vs_static=<r> top_tier_slo=<p>
    sweep: runs=8 workers=2 serial_s=<a> parallel_s=<b> speedup=<a/b> efficiency=<a/b/2> \
cpu_per_run_serial_s=<c> cpu_per_run_parallel_s=<d> cpu_share=<e>

(one line).  Aim: efficiency >= 0.6 on 2 workers.  Run: ``.venv/bin/python
bench/autoscale_bench.py`` (about 2 minutes on 2 free cores; ``--sweep-only`` skips the
day).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.k_autoscaling.day import (
    DAY_S,
    PLANNER_THRESHOLD,
    SEED_THRESHOLD,
    day_workload,
    run_day,
    scaled,
)
from velvetrope.cluster import SweepTiming, sweep_executor
from velvetrope.sim.shared import Shared
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import time_window

MEAN_RPS = 5.0
SLICE = (6 * 3600.0, 14 * 3600.0)
THRESHOLDS = (SEED_THRESHOLD, PLANNER_THRESHOLD)
STARTUPS = (60.0, 90.0, 120.0, 180.0)
WORKERS = 2


def slice_point(
    work: Shared[list[TraceRequest]], threshold: int, startup_s: float
) -> tuple[float, float]:
    """One sweep point: the GPU-hours of the slice and the CPU seconds the run took (a
    module-level function: picklable)."""
    cpu0 = time.process_time()
    spec = scaled("queue_depth", threshold, startup_s, SLICE[1] - SLICE[0])
    res = run_day(work.get(), autoscale=spec)
    assert res.autoscale is not None
    return res.autoscale.gpu_hours, time.process_time() - cpu0


def burn(n: int) -> float:
    """A pure-CPU loop's seconds: what two processes get of the cores, in the same minute."""
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i * i
    return time.perf_counter() - t0


def day(work: list[TraceRequest]) -> str:
    """The simulated day under KEDA; returns the ``autoscale:`` line."""
    t0 = time.perf_counter()
    res = run_day(work, autoscale=scaled("queue_depth", SEED_THRESHOLD, 120.0, DAY_S))
    wall = time.perf_counter() - t0
    tr = res.autoscale
    assert tr is not None
    static = tr.peak_replicas * tr.end_s * tr.spec.gpus_per_replica / 3600.0
    top = res.summary()[0]
    print(
        f"day: {len(work):,} requests, {tr.end_s / 3600:.2f} simulated h, replicas 2 to "
        f"{tr.peak_replicas}, {tr.gpu_hours:.1f} GPU-hours (static at the peak: {static:.1f}), "
        f"{top.tier} {top.good:,}/{top.offered:,} within its SLO"
    )
    return (
        f"autoscale: sim_hours={tr.end_s / 3600:.0f} requests={len(work)} wall_s={wall:.1f} "
        f"gpu_hours_vs_static={tr.gpu_hours / static:.3f} "
        f"top_tier_slo={top.good / top.offered:.4f}"
    )


def sweep(work: list[TraceRequest]) -> str:
    """The sweep, serially and on the pool, then the two CPU loops; returns the
    ``sweep:`` line."""
    part = Shared(time_window(work, *SLICE))
    points = [(part, th, s) for th in THRESHOLDS for s in STARTUPS]
    # serial half A, then the pool on A and B, then serial half B: a load that drifts
    # steadily over the measurement weighs on the serial and the parallel time alike
    half_a, half_b = points[0::2], points[1::2]
    t1 = time.perf_counter()
    serial_a = [slice_point(*p) for p in half_a]
    serial_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    with sweep_executor(workers=WORKERS) as pool:
        assert pool is not None
        parallel = list(pool.map(slice_point, *zip(*(half_a + half_b), strict=True)))
        parallel_s = time.perf_counter() - t2
    t3 = time.perf_counter()
    serial_b = [slice_point(*p) for p in half_b]
    serial_s += time.perf_counter() - t3
    serial = serial_a + serial_b
    assert [g for g, _ in parallel] == [g for g, _ in serial], "the pool must give the same"
    timing = SweepTiming(
        runs=len(points),
        workers=WORKERS,
        serial_s=serial_s,
        parallel_s=parallel_s,
        serial_cpu_s=sum(c for _, c in serial),
        parallel_cpu_s=sum(c for _, c in parallel),
    )
    print(
        f"sweep: {len(points)} runs of the {(SLICE[1] - SLICE[0]) / 3600:.0f} h slice "
        f"({len(part.get()):,} requests, {part.nbytes / 1e6:.1f} MB pickled, shipped as one "
        f"byte string per task), {serial_s / len(points):.1f} s each serially"
    )
    with sweep_executor(workers=WORKERS) as pool:
        assert pool is not None
        n = 10_000_000
        one = burn(n) + burn(n)
        t4 = time.perf_counter()
        list(pool.map(burn, [n, n]))
        two = time.perf_counter() - t4
    print(
        f"cores: two pure-CPU loops ran {one / two:.2f}× faster on the pool than one after the "
        "other (2.00 on two free cores): the sweep's speedup is bounded by what the machine "
        "gives"
    )
    return timing.line()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep-only", action="store_true", help="skip the simulated day")
    args = ap.parse_args(argv)
    work = day_workload(MEAN_RPS)
    lines = [] if args.sweep_only else [day(work)]
    lines.append(sweep(work))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
