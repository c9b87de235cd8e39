"""Admission core throughput, depth scaling and memory per queued job.

Prints, per preset, cycles/s of a full arrive → dispatch → complete cycle with the queue
held at a fixed depth (4 tenants on 3 tiers, per-tenant token buckets that do not bind,
one slot so every cycle dispatches exactly one job), and ends with one line:

    core: slowest=<preset> cycles_per_s=<N> depth_ratio=<R> bytes_per_queued=<B>

N is the rate of the slowest preset at 100,000 queued (every preset's rate is printed above
it); R is the ``hybrid`` preset's time per cycle at 1,000,000 queued over its time at 1,000
queued, in the same run; B is the traced allocation per queued job under ``hybrid`` (the
Job included).  A rate is measured over ``n`` cycles in :data:`CHUNKS` equal chunks and
taken from the fastest chunk (the depth is the same in every chunk), in cycles per second of
this process's CPU time (``time.process_time``): on a machine shared with other work the
wall clock also counts the time the process waited for a core; on an idle machine the two
agree.
Run: ``.venv/bin/python bench/core_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import time
import tracemalloc

from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, Job, PolicyConfig, Usage

TENANTS = [("gold", "tier-1"), ("silver", "tier-2"), ("bronze", "tier-3"), ("bronze2", "tier-3")]
CHUNKS = 5
PRESETS = ("fifo", "priority", "fair", "sjf_aging", "hybrid")


def make_config(preset: str) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "preset": preset,
            "queue": {"max_queued": 10_000_000},
            "tiers": [{"name": "tier-1"}, {"name": "tier-2"}, {"name": "tier-3"}],
            "tenants": [
                {"name": n, "tier": t, "limits": {"tokens_per_minute": 1e15}} for n, t in TENANTS
            ],
            "pools": [{"name": "default", "max_in_flight": 1}],
        }
    )


class Feed:
    """Pre-built jobs so that job construction is not what is measured."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ids = itertools.count()

    def jobs(self, n: int, clock: ManualClock) -> list[Job]:
        rng = self.rng
        out = []
        for _ in range(n):
            tenant, tier = TENANTS[rng.randrange(len(TENANTS))]
            out.append(
                Job(
                    id=f"r{next(self.ids)}",
                    tenant=tenant,
                    tier=tier,
                    prompt_tokens=rng.randrange(10, 4000),
                    max_tokens=1024,
                    predicted_output=rng.randrange(1, 1024),
                    arrival=clock.now(),
                )
            )
        return out


def fill(ctl: AdmissionController, clock: ManualClock, feed: Feed, depth: int) -> str:
    """Queue ``depth`` jobs behind one in flight; return the in-flight job's id."""
    first = feed.jobs(1, clock)[0]
    ctl.arrive(first)
    for j in feed.jobs(depth, clock):
        clock.advance(1e-6)
        ctl.arrive(j)
    assert ctl.queued == depth
    return first.id


def cycles(ctl: AdmissionController, clock: ManualClock, feed: Feed, running: str, n: int) -> float:
    """Seconds per cycle at constant depth: the fastest of :data:`CHUNKS` chunks of ``n``
    cycles in all."""
    usage = Usage(1000, 200)
    best = float("inf")
    m = max(1, n // CHUNKS)
    for _ in range(CHUNKS):
        new = feed.jobs(m, clock)
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        for j in new:
            clock.advance(1e-6)
            ctl.complete(running, usage)
            running = ctl.dispatchable()[0].id
            ctl.arrive(j)
        best = min(best, (time.process_time() - t0) / m)
        gc.enable()
    return best


def per_cycle(preset: str, depth: int, n: int) -> float:
    clock = ManualClock()
    ctl = AdmissionController(make_config(preset), clock)
    feed = Feed(depth)
    running = fill(ctl, clock, feed, depth)
    return cycles(ctl, clock, feed, running, n)


def bytes_per_queued(preset: str, depth: int) -> float:
    clock = ManualClock()
    ctl = AdmissionController(make_config(preset), clock)
    feed = Feed(1)
    first = feed.jobs(1, clock)[0]
    ctl.arrive(first)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for j in feed.jobs(depth, clock):
        clock.advance(1e-6)
        ctl.arrive(j)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / depth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller depths, for a smoke run")
    args = ap.parse_args()
    big = 100_000 if args.quick else 1_000_000
    n = 20_000 if args.quick else 100_000
    rates = {}
    for preset in PRESETS:
        rates[preset] = 1 / per_cycle(preset, 100_000, n)
        print(f"  {preset:10s} cycles_per_s={rates[preset]:,.0f} at 100,000 queued (CPU time)")
    slowest = min(rates, key=rates.__getitem__)
    s1k = per_cycle("hybrid", 1_000, n)
    sbig = per_cycle("hybrid", big, n)
    print(f"  hybrid: {s1k * 1e6:.2f} us/cycle at 1,000 queued, {sbig * 1e6:.2f} us at {big:,}")
    b = bytes_per_queued("hybrid", 100_000)
    print(
        f"core: slowest={slowest} cycles_per_s={rates[slowest]:.0f} "
        f"depth_ratio={sbig / s1k:.2f} bytes_per_queued={b:.0f}"
    )


if __name__ == "__main__":
    main()
