"""Which engine runs sweeps: start-up cost and per-task overhead of the candidates, here.

For each candidate that imports (a local process pool always; Dask's ``distributed`` — a
dependency —; Ray if installed, e.g. in a scratch virtualenv), in a fresh interpreter each
time, 2 workers: the time to start the cluster and run one task (start-up), the time per
task of 200 no-op tasks submitted at once (overhead), the time to shut down, and the
driver's peak resident memory.  Medians of ``--repeats`` runs (default 3).  Ends with one
line per candidate::

    engine: name=<n> startup_s=<s> per_task_ms=<ms> shutdown_s=<s> driver_mb=<mb>

Run: ``.venv/bin/python bench/sweep_engines_bench.py`` (about 40 s on 2 cores with Ray).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time

TASKS = 200


def _noop(x: int) -> int:
    return x


def _measure(which: str) -> dict[str, float]:
    t0 = time.perf_counter()
    if which == "pool":
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(2)
        pool.submit(_noop, 0).result()
        t1 = time.perf_counter()
        futs = [pool.submit(_noop, i) for i in range(TASKS)]
        for f in futs:
            f.result()
        t2 = time.perf_counter()
        pool.shutdown()
    elif which == "dask":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
        client.submit(_noop, 0, pure=False).result()
        t1 = time.perf_counter()
        client.gather([client.submit(_noop, i, pure=False) for i in range(TASKS)])
        t2 = time.perf_counter()
        client.close()
        cluster.close()
    else:
        import ray  # type: ignore[import-not-found, unused-ignore]

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        remote = ray.remote(_noop)
        ray.get(remote.remote(0))
        t1 = time.perf_counter()
        ray.get([remote.remote(i) for i in range(TASKS)])
        t2 = time.perf_counter()
        ray.shutdown()
    t3 = time.perf_counter()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "startup_s": t1 - t0,
        "per_task_ms": (t2 - t1) / TASKS * 1e3,
        "shutdown_s": t3 - t2,
        "driver_mb": rss_mb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(args.child)))
        return
    names = ["pool", "dask"] + (["ray"] if importlib.util.find_spec("ray") else [])
    for name in names:
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--child", name],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"engine: name={name} startup_s={med['startup_s']:.2f} "
            f"per_task_ms={med['per_task_ms']:.2f} shutdown_s={med['shutdown_s']:.2f} "
            f"driver_mb={med['driver_mb']:.0f}"
        )


if __name__ == "__main__":
    main()
