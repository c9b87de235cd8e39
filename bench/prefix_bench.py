"""Prefix-aware routing on the Mooncake conversation trace: least-loaded vs affinity vs hashed
bounded-load vs an oracle that knows every engine's prefix cache, on the same fleet.

The simulator replays the built-in trace ``mooncake_conv`` (Mooncake, FAST 2025: one hour of
production conversation traffic, 12,031 requests, each with its prompt's 512-token block
hashes) through one pool of ``--replicas`` modelled engines (``llama3-8b-h100`` with
automatic prefix caching on and ``max_model_len`` 131,072, the trace's longest prompt being
126,195 tokens).  The same policy runs four times, only the replica choice changing:

* ``least_loaded``: the default (fewest jobs in flight);
* ``prefix_affinity``: the core's index-based rule with bounded load;
* ``prefix_hash``: rendezvous hashing on the leading blocks with bounded load, no index;
* ``oracle``: the affinity rule told the true cached depth of every engine
  (``router="prefix_oracle"``), a yardstick no gateway has.

Admission does not queue (``max_in_flight`` 100,000, saturation off): every request goes to
an engine at once, so the differences are the routing's alone.  For each: the engines'
prefix-cache hit rate in tokens (vLLM's ``prefix_cache_hits / prefix_cache_queries``), TTFT
p50 / p99, throughput; then the fewest replicas that hold TTFT p99 within ``--slo-ttft``
seconds for least-loaded and for affinity (``gpus_saved`` is the difference, searched
from ``--min-replicas`` up to ``--max-replicas``).

The modes, the engine and the policy are study (l)'s (``experiments/l_prefix/run.py``): the
affinity index holds as many 512-token blocks as the fleet's KV caches (``index_blocks``),
the other prefix settings are the defaults.  ``--kv-scale K`` is a
what-if: engines whose prefix cache holds ``K`` × the GPU's KV blocks (a host-memory tier,
as vLLM's KV offloading or LMCache add; hits from it are modelled as free as GPU hits,
which flatters them).  ``--minutes`` replays only the trace's first minutes (the full hour
takes one to two minutes a run on two shared cores).  Ends with::

    prefix: hit_rate_least_loaded=a hit_rate_affinity=b ttft_p99_ratio=c gpus_saved=d

(``ttft_p99_ratio`` = affinity / least-loaded.)  Run: ``.venv/bin/python
bench/prefix_bench.py [--minutes 60] [--replicas 4] [--slo-ttft 4] [--kv-scale 1]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.l_prefix.run import MODES, mooncake_profile, routing_policy
from velvetrope.engine import EngineProfile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import SimResult
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace


def run(
    label: str, work: list[TraceRequest], replicas: int, prof: EngineProfile
) -> tuple[SimResult, float]:
    routing, router = MODES[label]
    t0 = time.perf_counter()
    cfg = routing_policy(routing, replicas, prof)
    res = run_simulation(cfg, work, replicas, prof, router=router, label=label)
    return res, time.perf_counter() - t0


def ttft(res: SimResult) -> NDArray[np.float64]:
    r = res.records
    ok = r.state == "completed"
    out: NDArray[np.float64] = (r.first_token - r.arrival)[ok]
    return out


def p99(res: SimResult) -> float:
    t = ttft(res)
    return float(np.percentile(t, 99)) if len(t) else float("inf")


def fewest(
    label: str, work: list[TraceRequest], prof: EngineProfile, slo: float, lo: int, hi: int
) -> int | None:
    """The fewest replicas in ``[lo, hi]`` whose TTFT p99 is within ``slo`` (``None``: none)."""
    for n in range(lo, hi + 1):
        res, _ = run(label, work, n, prof)
        print(f"  {label:16s} replicas={n}: ttft_p99={p99(res):.2f} s", flush=True)
        if p99(res) <= slo:
            return n
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="replay the first minutes")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slo-ttft", type=float, default=4.0, help="TTFT p99 bound, seconds")
    ap.add_argument("--min-replicas", type=int, default=3)
    ap.add_argument("--max-replicas", type=int, default=6)
    ap.add_argument(
        "--kv-scale",
        type=float,
        default=1.0,
        help="what-if: engines whose KV cache holds this x the GPU's blocks "
        "(a host-memory tier, as vLLM's KV offloading or LMCache add)",
    )
    args = ap.parse_args()
    work = [r for r in load_trace("mooncake_conv") if r.t < args.minutes * 60.0]
    prof = mooncake_profile(args.kv_scale)
    span = work[-1].t if work else 0.0
    print(
        f"mooncake_conv: {len(work)} requests over {span / 60:.1f} min, "
        f"{sum(r.prompt_tokens for r in work):,} prompt tokens; {args.replicas} x {prof.name}, "
        f"{prof.num_gpu_blocks * prof.block_size:,} KV tokens each (kv_scale {args.kv_scale:g})"
    )
    results: dict[str, SimResult] = {}
    print(f"{'routing':16s} {'hit_rate':>8s} {'ttft_p50':>9s} {'ttft_p99':>9s} "
          f"{'done':>6s} {'tok/s':>8s} {'busy':>6s} {'wall_s':>7s}")  # fmt: skip
    for label in MODES:
        res, wall = run(label, work, args.replicas, prof)
        results[label] = res
        t = ttft(res)
        rec = res.records
        done = int((rec.state == "completed").sum())
        out_tok = float(rec.output[rec.state == "completed"].sum())
        print(
            f"{label:16s} {res.pools[0].prefix_hit_rate:8.3f} {np.percentile(t, 50):9.2f} "
            f"{np.percentile(t, 99):9.2f} {done:6d} {out_tok / res.span_s:8.0f} "
            f"{res.busy_fraction():6.1%} {wall:7.1f}",
            flush=True,
        )
    least, aff = results["least_loaded"], results["prefix_affinity"]
    oracle_hit = results["oracle"].pools[0].prefix_hit_rate
    aff_hit = aff.pools[0].prefix_hit_rate
    print(
        f"affinity / oracle hit rate: {aff_hit / oracle_hit:.3f} (aim >= 0.8); "
        f"hashed / oracle: {results['prefix_hash'].pools[0].prefix_hit_rate / oracle_hit:.3f}"
    )
    ratio = p99(aff) / p99(least)
    print(f"fewest replicas holding TTFT p99 <= {args.slo_ttft:g} s:")
    n_least = fewest(
        "least_loaded", work, prof, args.slo_ttft, args.min_replicas, args.max_replicas
    )
    n_aff = fewest(
        "prefix_affinity", work, prof, args.slo_ttft, args.min_replicas, args.max_replicas
    )
    if n_least is None or n_aff is None:
        saved = "n/a"
        print(f"  not found within {args.min_replicas}..{args.max_replicas} replicas")
    else:
        saved = str(n_least - n_aff)
        print(f"  least_loaded {n_least}, prefix_affinity {n_aff}")
    print(
        f"prefix: hit_rate_least_loaded={least.pools[0].prefix_hit_rate:.3f} "
        f"hit_rate_affinity={aff_hit:.3f} ttft_p99_ratio={ratio:.3f} gpus_saved={saved}"
    )


if __name__ == "__main__":
    main()
