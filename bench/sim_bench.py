"""Simulator speed: the full Azure conversation trace through the gateway policy on 4 replicas.

Replays all 19,366 requests of ``azure_conv`` at their recorded times through the ``hybrid``
preset (three tiers: a tenant mix of 20% interactive, 30% standard, 50% batch, the core's
own output-length estimator) on 4 replicas of the ``llama3-8b-h100`` engine model with
iteration-level batching, and ends with the line the simulator issue asks for:

    sim: requests=19366 wall_s=<T> speedup_x=<simulated seconds / wall seconds>

T is the wall time of :func:`~velvetrope.sim.loop.run_simulation` alone (trace loading and
the report are not timed).  Run: ``.venv/bin/python bench/sim_bench.py``.
"""

from __future__ import annotations

import time

from velvetrope.engine import load_profile
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.workload import TenantMix

MIX = "acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5"
REPLICAS = 4


def main() -> None:
    mix = TenantMix.parse(MIX)
    workload = prepare_workload("azure_conv", tenants=mix, seed=0)
    policy = default_policy(mix, REPLICAS, "hybrid")
    profile = load_profile("llama3-8b-h100")
    t0 = time.perf_counter()
    res = run_simulation(policy, workload, REPLICAS, profile, label="azure_conv")
    wall = time.perf_counter() - t0
    steps = sum(p.steps for p in res.pools)
    overall = res.overall()
    print(
        f"replayed {len(workload):,} requests, {res.span_s:.1f} simulated s, "
        f"{steps:,} engine steps ({wall / steps * 1e6:.2f} µs of wall time per step), "
        f"completed {overall.completed:,}, GPU busy {100 * res.busy_fraction():.1f}%"
    )
    print(f"sim: requests={len(workload)} wall_s={wall:.2f} speedup_x={res.span_s / wall:.0f}")


if __name__ == "__main__":
    main()
