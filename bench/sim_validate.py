"""The analytic mode against closed forms, with the real admission core making every decision.

Nine cases of 10^6 jobs each (``--jobs`` to change), Poisson arrivals at utilisation
ρ ∈ {0.5, 0.8, 0.9}:

* ``mg1_fcfs``: preset ``fifo``, one server, service = output tokens of the Azure conversation
  trace (scaled to a mean of 1 s; C_s² ≈ 0.6), against Pollaczek–Khinchine;
* ``mg1_sjf``: preset ``sjf`` with oracle sizes, same service, against Phipps's formula;
* ``mmc``: preset ``fifo`` with ``max_in_flight = 4`` servers, exponential service, against
  Erlang C.

Prints one line per case and ends with the worst relative error of the mean response time
per family:

    validate: mg1_fcfs_err=<e1> mg1_sjf_err=<e2> mmc_err=<e3>

Each case has its own seed (fixed), so a run repeats exactly.  Each line also shows the
relative standard error of the simulated mean by batch means (20 batches): at ρ = 0.9 a
million jobs still leave about 1–2% of sampling noise, which is most of the error.
Run: ``.venv/bin/python bench/sim_validate.py [--jobs N]``.
"""

from __future__ import annotations

import argparse
import time

from velvetrope.planner.queueing import mmc_response_mean
from velvetrope.planner.queueing_general import mg1_response_mean, mg1_sjf_waits
from velvetrope.sim.analytic import ExponentialService, ServiceDist, TokenService, run_analytic
from velvetrope.sim.traces import load_trace

RHOS = (0.5, 0.8, 0.9)
SERVERS = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000, help="jobs per case")
    args = ap.parse_args()
    n = args.jobs
    sizes = [max(1, r.output_tokens) for r in load_trace("azure_conv")]
    tokens = TokenService.with_mean(sizes, 1.0)
    expo = ExponentialService(1.0)
    worst = {"mg1_fcfs": 0.0, "mg1_sjf": 0.0, "mmc": 0.0}
    seed = 100
    for rho in RHOS:
        cases: list[tuple[str, str, ServiceDist, int]] = [
            ("mg1_fcfs", "fifo", tokens, 1),
            ("mg1_sjf", "sjf", tokens, 1),
            ("mmc", "fifo", expo, SERVERS),
        ]
        for name, preset, service, servers in cases:
            seed += 1
            t0 = time.perf_counter()
            res = run_analytic(preset, service, rho=rho, n_jobs=n, servers=servers, seed=seed)
            wall = time.perf_counter() - t0
            if name == "mg1_fcfs":
                theory = mg1_response_mean(res.lam, tokens.mean, tokens.second_moment)
            elif name == "mg1_sjf":
                theory = mg1_sjf_waits(res.lam, tokens.service_times()).wait_mean + tokens.mean
            else:
                theory = mmc_response_mean(res.lam, 1.0 / expo.mean, servers)
            err = abs(res.mean_response - theory) / theory
            worst[name] = max(worst[name], err)
            stderr = res.response_stderr() / theory
            print(
                f"{name:9s} rho={rho:.1f} jobs={n} sim={res.mean_response:.4f} "
                f"theory={theory:.4f} err={err:.4f} (batch-means stderr {stderr:.4f}) "
                f"wall_s={wall:.1f}",
                flush=True,
            )
    print(
        f"validate: mg1_fcfs_err={worst['mg1_fcfs']:.4f} mg1_sjf_err={worst['mg1_sjf']:.4f} "
        f"mmc_err={worst['mmc']:.4f}"
    )


if __name__ == "__main__":
    main()
