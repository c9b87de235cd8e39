"""The capacity planner against exact arithmetic and against the simulator.

Three numbers, printed on the last line::

    planner: erlang_c_max_rel_err=<e> plan_vs_sim_p99_err=<f> replicas_over_min=<k>

* ``e`` — the largest relative error of Erlang C over c = 1..200 × ρ = 0.01..0.99 (step
  0.01) against a 50-digit mpmath evaluation of the factorial-sum formula, taken over both
  ways the planner computes it: :func:`velvetrope.planner.queueing.erlang_c` and the
  planner's own birth–death fleet model (:func:`velvetrope.planner.predict.predict` with a
  linear throughput curve ``X(n) = n·μ``, which is M/M/c).  Points whose exact value is
  below the smallest normal double (about 2.2e-308) are skipped and counted: a subnormal
  result keeps only absolute accuracy.  Target ≤ 1e-9.
* ``f`` — the relative error of the planner's p99 end-to-end latency against the
  simulator's, for the Azure conversation trace on the ``llama3-8b-h100`` profile at the
  recommended size.  The trace is time-compressed by ``--design-rps`` over its own p99
  one-minute rate (8.19 req/s); a compressed minute then holds several original ones, so
  the compressed trace's p99 one-minute rate — printed, and what the planner sizes for —
  comes out somewhat below ``--design-rps`` (40 → 36.4 req/s).  The planner sizes under
  the SLO the script prints (p99 end-to-end ≤ ``--slo`` seconds, default 9, in ``--tier``,
  default interactive: ρ ≤ 0.6).
  The simulator replays the whole compressed trace (every minute at its own rate) through
  the real admission core (FCFS, ``max_in_flight = N·K``) and real batchers; the planner's
  p99 for that replay is its model evaluated minute by minute and mixed by arrivals
  (:func:`velvetrope.planner.predict.mixture_quantile`).  Target ≤ 0.20.  The design-point
  p99 (the busiest-minute rate held for ever, what the plan is sized on) is printed too.
* ``k`` — the recommended replicas minus the smallest count whose *simulated* p99
  end-to-end meets the SLO (searched downwards from the recommendation).  Target 0 or 1.

Run: ``.venv/bin/python bench/planner_validate.py`` (about 20 s; ``--skip-sim`` for ``e``
alone, ``--skip-e`` for the rest).  Deterministic.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import mpmath
import numpy as np

from velvetrope.engine import load_profile
from velvetrope.planner.predict import Prediction, mixture_quantile, predict
from velvetrope.planner.queueing import erlang_c
from velvetrope.planner.service import (
    ServiceCurve,
    curve_from_measurements,
    measure_service_curve,
)
from velvetrope.planner.sizing import P99Target, make_plan
from velvetrope.planner.verify import simulate_fleet
from velvetrope.planner.workload import MINUTE_S, one_minute_rates, workload_from_trace
from velvetrope.sim import load_trace, rescale_time

C_MAX = 200
RHOS = [k / 100 for k in range(1, 100)]


def erlang_c_mp(c: int, a: float) -> mpmath.mpf:
    """Erlang C from the factorial-sum formula at the current mpmath precision."""
    am = mpmath.mpf(a)
    term = mpmath.mpf(1)
    total = mpmath.mpf(0)
    for k in range(c):
        total += term
        term = term * am / (k + 1)
    tail = term * c / (c - am)
    return tail / (total + tail)


def linear_curve(c_max: int) -> ServiceCurve:
    """A service curve with ``X(n) = n`` for n = 1..c_max: the fleet model becomes M/M/c."""
    grid = list(range(1, c_max + 1))
    profile = load_profile("llama3-8b-h100")
    return curve_from_measurements(profile, [100], [10], grid, [float(n) for n in grid])


def erlang_c_error() -> tuple[float, int, int]:
    """(max relative error, points checked, points skipped as subnormal)."""
    curve = linear_curve(C_MAX)
    worst = 0.0
    checked = skipped = 0
    with mpmath.workdps(50):
        for c in range(1, C_MAX + 1):
            for rho in RHOS:
                a = rho * c
                ref = erlang_c_mp(c, a)
                if ref < sys.float_info.min:
                    skipped += 1
                    continue
                checked += 1
                for got in (erlang_c(c, a), predict(curve, a, 1, c).p_wait):
                    worst = max(worst, float(abs((mpmath.mpf(got) - ref) / ref)))
    return worst, checked, skipped


def trace_prediction(
    curve: ServiceCurve, times: np.ndarray, replicas: int, k: int, scv: float
) -> float:
    """The model's p99 end-to-end for a replay: one operating point per whole minute, mixed
    by arrivals (the quasi-stationary approximation)."""
    rates = one_minute_rates(times)
    preds: list[Prediction] = []
    weights: list[float] = []
    for r in rates:
        if r <= 0:
            continue
        preds.append(predict(curve, float(r), replicas, k, arrival_scv=scv))
        weights.append(float(r))
    return mixture_quantile(preds, weights, "e2e", 0.99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design-rps", type=float, default=40.0, help="p99 one-minute rate")
    ap.add_argument("--slo", type=float, default=9.0, help="p99 end-to-end bound (s)")
    ap.add_argument("--tier", default="interactive", help="interactive (rho 0.6) or batch (0.85)")
    ap.add_argument("--skip-sim", action="store_true", help="compute e only")
    ap.add_argument("--skip-e", action="store_true", help="skip the Erlang C grid")
    args = ap.parse_args()

    t0 = time.perf_counter()
    e, checked, skipped = erlang_c_error() if not args.skip_e else (math.nan, 0, 0)
    print(
        f"erlang C: {checked} points c=1..{C_MAX} x rho=0.01..0.99 vs 50-digit mpmath "
        f"({skipped} subnormal points skipped): max relative error {e:.3g} "
        f"[{time.perf_counter() - t0:.1f}s]",
        flush=True,
    )
    if args.skip_sim:
        print(
            f"planner: erlang_c_max_rel_err={e:.3g} plan_vs_sim_p99_err=nan replicas_over_min=nan"
        )
        return

    profile = load_profile("llama3-8b-h100")
    raw = load_trace("azure_conv")
    p99_minute = float(np.percentile(one_minute_rates([r.t for r in raw]), 99))
    trace = rescale_time(raw, args.design_rps / p99_minute)
    wl = workload_from_trace("azure_conv", requests=trace)
    slo = P99Target("e2e", args.slo)
    t1 = time.perf_counter()
    curve = measure_service_curve(profile, wl.prompt, wl.output)
    plan = make_plan(wl, curve, slo, tier=args.tier)
    n, k = plan.replicas, plan.concurrency
    print(
        f"workload: azure_conv ({len(trace)} requests) compressed "
        f"x{args.design_rps / p99_minute:.3f}: its p99 one-minute rate is {wl.design_rps:.1f} "
        f"req/s (mean "
        f"{wl.mean_rps:.1f} req/s, C_a^2 {wl.arrival_scv:.2f}); profile {profile.name}"
    )
    print(f"SLO: p99 end-to-end <= {slo.p99_s:g} s, tier {args.tier} (rho <= {plan.rho_target:g})")
    print(
        f"plan: {n} replicas x {k} slots (binding: {plan.binding}, rho {plan.at.rho:.3f}); "
        f"design-point p99 e2e {plan.at.e2e_p99_s:.2f} s, at {n - 1}: "
        f"{plan.one_fewer.e2e_p99_s if plan.one_fewer else math.nan:.2f} s "
        f"[{time.perf_counter() - t1:.1f}s]",
        flush=True,
    )
    times = np.array([r.t for r in trace])
    sim: dict[int, float] = {}
    model: dict[int, float] = {}

    def simulate(m: int) -> float:
        t = time.perf_counter()
        s = simulate_fleet(curve, list(trace), m, k, warmup=0.0, label="azure_conv")
        model[m] = trace_prediction(curve, times, m, k, wl.arrival_scv)
        sim[m] = s.e2e_p99_s
        print(
            f"  {m} replicas: simulated p99 e2e {s.e2e_p99_s:.2f} s (completed "
            f"{s.completed_fraction:.3f}), planner's p99 for this replay {model[m]:.2f} s "
            f"[{time.perf_counter() - t:.1f}s]",
            flush=True,
        )
        return s.e2e_p99_s

    simulate(n)
    smallest = n if sim[n] <= slo.p99_s else None
    m = n - 1
    while m >= 1:
        if simulate(m) > slo.p99_s:
            break
        smallest = m
        m -= 1
    if smallest is None:  # the recommendation itself misses in simulation: look upwards
        m = n + 1
        while simulate(m) > slo.p99_s:
            m += 1
        smallest = m
    f = abs(model[n] - sim[n]) / sim[n]
    over = n - smallest
    print(
        f"at the recommended {n}: planner {model[n]:.2f} s vs simulator {sim[n]:.2f} s "
        f"(design-point p99 {plan.at.e2e_p99_s:.2f} s); "
        f"smallest simulated size meeting the SLO: {smallest}; minute window {MINUTE_S:g} s"
    )
    line = f"erlang_c_max_rel_err={e:.3g} plan_vs_sim_p99_err={f:.3f} replicas_over_min={over}"
    print(f"planner: {line}")


if __name__ == "__main__":
    main()
