"""Simulator speed: the full Azure conversation trace through the gateway policy on 4 replicas.

Replays all 19,366 requests of ``azure_conv`` at their recorded times through the ``hybrid``
preset (three tiers: a tenant mix of 20% interactive, 30% standard, 50% batch, the core's
own output-length estimator) on 4 replicas of the ``llama3-8b-h100`` engine model with
iteration-level batching, and ends with the line the simulator issue asks for:

    sim: requests=19366 wall_s=<T> speedup_x=<simulated seconds / wall seconds>

T is the wall time of :func:`~velvetrope.sim.loop.run_simulation` alone (trace loading and
the report are not timed), the fastest of ``--repeat`` runs (3 by default: the same work
each time, and other processes on the machine can only add time); the CPU time of that run
is printed above it, and the result is checked to be the same in every run.  With
``--step-by-step`` it also times the simulation without fast-forward (every engine
iteration stepped) and checks that the records are identical.
Run: ``.venv/bin/python bench/sim_bench.py [--repeat 3] [--step-by-step]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from velvetrope.engine import load_profile
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import SimResult
from velvetrope.sim.tenant_mix import TenantMix

MIX = "acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5"
REPLICAS = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported")
    ap.add_argument("--step-by-step", action="store_true", help="also time fast_forward=False")
    args = ap.parse_args()
    mix = TenantMix.parse(MIX)
    workload = prepare_workload("azure_conv", tenants=mix, seed=0)
    policy = default_policy(mix, REPLICAS, "hybrid")
    profile = load_profile("llama3-8b-h100")

    def timed(fast_forward: bool) -> tuple[float, float, SimResult]:
        c0, t0 = time.process_time(), time.perf_counter()
        res = run_simulation(
            policy, workload, REPLICAS, profile, label="azure_conv", fast_forward=fast_forward
        )
        return time.perf_counter() - t0, time.process_time() - c0, res

    wall, cpu, res = timed(True)
    for _ in range(args.repeat - 1):
        w, c, again = timed(True)
        assert np.array_equal(again.records.end, res.records.end, equal_nan=True)
        if w < wall:
            wall, cpu = w, c
    steps = sum(p.steps for p in res.pools)
    overall = res.overall()
    print(
        f"replayed {len(workload):,} requests, {res.span_s:.1f} simulated s, "
        f"{steps:,} engine steps ({wall / steps * 1e6:.2f} µs of wall time per step), "
        f"completed {overall.completed:,}, GPU busy {100 * res.busy_fraction():.1f}%"
    )
    if args.step_by_step:
        w, c, plain = timed(False)
        for f in ("dispatched", "first_token", "end"):
            a, b = getattr(plain.records, f), getattr(res.records, f)
            assert np.array_equal(a, b, equal_nan=True), f
        print(f"  step by step: wall {w:.2f} s, CPU {c:.2f} s (same records): {w / wall:.1f}x")
    print(f"  fastest of {args.repeat}: CPU {cpu:.2f} s of the {wall:.2f} s wall")
    print(f"sim: requests={len(workload)} wall_s={wall:.2f} speedup_x={res.span_s / wall:.0f}")


if __name__ == "__main__":
    main()
