"""The capacity planner against exact arithmetic and against the simulator, on both traces.

Last line::

    planner: erlang_c_max_rel_err=<e> conv_err=<f> code_err=<g> replicas_over_min=<k> \
        prefix_err=<h> spec_err=<s>

* ``e`` — the largest relative error of Erlang C over c = 1..200 × ρ = 0.01..0.99 (step
  0.01) against a 50-digit mpmath evaluation of the factorial-sum formula, taken over both
  ways the planner computes it: :func:`velvetrope.planner.queueing.erlang_c` and the
  planner's own birth–death fleet model (:func:`velvetrope.planner.predict.predict` with a
  linear throughput curve ``X(n) = n·μ``, which is M/M/c).  Points whose exact value is
  below the smallest normal double (about 2.2e-308) are skipped and counted: a subnormal
  result keeps only absolute accuracy.  Target ≤ 1e-9.
* ``f``, ``g`` — for the Azure conversation and code traces on ``llama3-8b-h100`` (or
  ``--profile``), the
  largest relative error of the planner's p99 (wait, time to first token, end-to-end)
  against the simulator's, over the rows whose simulated p99 is at least 0.5 s (below
  that a relative error says little; those rows are printed too).  Each trace is
  time-compressed so that its p99 one-minute rate is ``--conv-rps`` / ``--code-rps`` (a
  compressed minute then holds several original ones, so the compressed trace's own p99
  one-minute rate, printed, comes out a little different) and sized under the printed SLO.
  Two checks per trace, at the recommended size and one replica fewer:

  - *design point*: :func:`velvetrope.planner.verify.verify_plan`: the trace's arrival
    pattern at the design rate (every minute at that rate, the bursts inside kept),
    20,000 requests, through the real admission core (FCFS, ``max_in_flight = N·K``) and
    real batchers, against the plan's own prediction;
  - *replay*: the whole compressed trace, every minute at its own rate, against the
    model evaluated minute by minute on that minute's arrivals and mixed by arrivals
    (:func:`velvetrope.planner.prediction.mixture_quantile`).

  Target ≤ 0.20.
* ``k`` — for the conversation trace, the recommended replicas minus the smallest count
  whose *simulated* replay p99 end-to-end meets the SLO (searched downwards).  Target 0 or 1.
* ``h``, ``s`` — the conversation trace as for ``f``, planned with an engine feature on
  (``h``: prefix caching, every prompt's first 30 % one shared prefix; ``s``: speculative
  decoding with 4 draft tokens, 2.3 tokens per verification step measured, 0.5 ms per
  draft token), the *design point* check only: the largest relative error of the p99s over
  the rows whose simulated p99 is at least 0.5 s.  Target ≤ 0.20.

Run: ``.venv/bin/python bench/planner_validate.py`` (about a minute; ``--skip-sim`` for
``e`` alone, ``--skip-e`` for the rest).  Deterministic.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import mpmath
import numpy as np

from velvetrope.engine import EngineProfile, load_profile
from velvetrope.planner.engine_options import prefix_caching_profile, with_speculation
from velvetrope.planner.plan import P99Target
from velvetrope.planner.predict import predict
from velvetrope.planner.prediction import Metric, Prediction, mixture_quantile
from velvetrope.planner.queueing import erlang_c
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.service_methods import curve_from_measurements, measure_service_curve
from velvetrope.planner.sizing import make_plan
from velvetrope.planner.verify import simulate_fleet, verify_plan
from velvetrope.planner.workload import MINUTE_S, one_minute_rates, workload_from_trace
from velvetrope.sim import TraceRequest, load_trace, rescale_time

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


def replay_prediction(
    curve: ServiceCurve, times: np.ndarray, replicas: int, k: int, metric: Metric
) -> float:
    """The model's p99 for a replay: one operating point per whole minute, each fed that
    minute's own arrivals, mixed by arrivals (the quasi-stationary approximation)."""
    rates = one_minute_rates(times)
    rel = times - times[0]
    preds: list[Prediction] = []
    weights: list[float] = []
    for i, r in enumerate(rates):
        inside = rel[(rel >= i * MINUTE_S) & (rel < (i + 1) * MINUTE_S)]
        if inside.size < 2:
            continue
        pattern = (inside - inside[0]) * r
        preds.append(predict(curve, float(r), replicas, k, arrival_pattern=pattern))
        weights.append(float(r))
    return mixture_quantile(preds, weights, metric, 0.99)


METRICS: tuple[Metric, ...] = ("wait", "ttft", "e2e")
MIN_P99_S = 0.5


def _err(pred: float, sim: float) -> float | None:
    return (pred - sim) / sim if sim >= MIN_P99_S and math.isfinite(pred) else None


def _compressed(name: str, design_rps: float) -> tuple[list[TraceRequest], float]:
    """The trace time-compressed so that its p99 one-minute rate is ``design_rps``."""
    raw = load_trace(name)
    p99_minute = float(np.percentile(one_minute_rates([r.t for r in raw]), 99))
    return rescale_time(raw, design_rps / p99_minute), design_rps / p99_minute


def check_feature(
    label: str, name: str, design_rps: float, slo: P99Target, profile: EngineProfile, hit: float
) -> float:
    """Plan the compressed trace with an engine feature on and check the design point in the
    simulator (whose engines run the feature); the largest relative error."""
    trace, factor = _compressed(name, design_rps)
    wl = workload_from_trace(name, requests=trace)
    curve = measure_service_curve(profile, wl.prompt, wl.output, prefix_hit_rate=hit)
    plan = make_plan(wl, curve, slo, tier="interactive")
    print(
        f"\n{label}: {name} compressed x{factor:.3f}, SLO {slo}: plan {plan.replicas} replicas "
        f"x {plan.concurrency} slots (saturated {curve.max_throughput_rps:.2f} req/s per replica)"
    )
    worst = 0.0
    for r in verify_plan(plan, requests=20_000, seed=0):
        for metric in METRICS:
            pred, sim = r.predicted.p99(metric), r.simulated.p99(metric)
            e = _err(pred, sim)
            if e is not None:
                worst = max(worst, abs(e))
            shown = "-" if e is None else f"{e:+.1%}"
            print(
                f"  design point  {r.simulated.replicas:>2} replicas  {metric:<5} "
                f"plan {pred:7.2f} s  sim {sim:7.2f} s  {shown}"
            )
    print(f"  largest error {worst:.3f}")
    return worst


def check_trace(
    name: str, design_rps: float, slo: P99Target, tier: str, profile_name: str
) -> tuple[float, int]:
    """Plan for the compressed trace, print both checks; (largest error, replicas over min)."""
    profile = load_profile(profile_name)
    trace, factor = _compressed(name, design_rps)
    wl = workload_from_trace(name, requests=trace)
    t1 = time.perf_counter()
    curve = measure_service_curve(profile, wl.prompt, wl.output)
    plan = make_plan(wl, curve, slo, tier=tier)
    n, k = plan.replicas, plan.concurrency
    print(
        f"\n{name} ({len(trace)} requests) compressed x{factor:.3f}: p99 "
        f"one-minute rate {wl.design_rps:.1f} req/s (mean {wl.mean_rps:.1f}; C_a^2 "
        f"{wl.arrival_scv:.3g} inside minutes, {wl.whole_trace_scv:.3g} overall); {profile.name}"
    )
    print(
        f"SLO {slo}, tier {tier}: plan {n} replicas x {k} slots (binding {plan.binding}, "
        f"rho {plan.at.rho:.3f}) [{time.perf_counter() - t1:.1f}s]",
        flush=True,
    )
    worst = 0.0

    def row(label: str, m: int, metric: Metric, pred: float, sim: float) -> None:
        nonlocal worst
        e = _err(pred, sim)
        if e is not None:
            worst = max(worst, abs(e))
        shown = "-" if e is None else f"{e:+.1%}"
        nums = f"plan {pred:7.2f} s  sim {sim:7.2f} s"
        print(f"  {label:<13} {m:>2} replicas  {metric:<5} {nums}  {shown}")

    for r in verify_plan(plan, requests=20_000, seed=0):
        for metric in METRICS:
            row(
                "design point",
                r.simulated.replicas,
                metric,
                r.predicted.p99(metric),
                r.simulated.p99(metric),
            )
    times = np.array([r.t for r in trace])
    sim_e2e: dict[int, float] = {}

    def replay(m: int) -> float:
        s = simulate_fleet(curve, list(trace), m, k, warmup=0.0, label=name)
        for metric in METRICS:
            row("replay", m, metric, replay_prediction(curve, times, m, k, metric), s.p99(metric))
        sim_e2e[m] = s.p99(slo.metric)
        return sim_e2e[m]

    replay(n)
    smallest = n if sim_e2e[n] <= slo.p99_s else None
    m = n - 1
    while m >= 1:
        if replay(m) > slo.p99_s:
            break
        smallest = m
        m -= 1
    if smallest is None:  # the recommendation itself misses in simulation: look upwards
        m = n + 1
        while replay(m) > slo.p99_s:
            m += 1
        smallest = m
    print(f"  smallest replayed size meeting the SLO: {smallest}; largest error {worst:.3f}")
    return worst, n - smallest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conv-rps", type=float, default=40.0, help="conv: p99 one-minute rate")
    ap.add_argument("--code-rps", type=float, default=20.0, help="code: p99 one-minute rate")
    ap.add_argument("--skip-sim", action="store_true", help="compute e only")
    ap.add_argument("--skip-e", action="store_true", help="skip the Erlang C grid")
    ap.add_argument("--profile", default="llama3-8b-h100", help="engine profile of f and g")
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
            f"planner: erlang_c_max_rel_err={e:.3g} conv_err=nan code_err=nan "
            "replicas_over_min=nan prefix_err=nan spec_err=nan"
        )
        return
    prof = args.profile
    f, over = check_trace("azure_conv", args.conv_rps, P99Target("e2e", 9.0), "interactive", prof)
    g, _ = check_trace("azure_code", args.code_rps, P99Target("wait", 4.0), "interactive", prof)
    base = load_profile(prof)
    conv_slo = P99Target("e2e", 9.0)
    h = check_feature(
        "prefix caching 30%", "azure_conv", args.conv_rps, conv_slo,
        prefix_caching_profile(base, 0.3), 0.3,
    )  # fmt: skip
    spec = with_speculation(base, 4, None, 0.5, accepted_per_step=2.3)
    sp = check_feature(
        "speculative decoding k=4, 2.3 tokens/step", "azure_conv", args.conv_rps, conv_slo,
        spec, 0.0,
    )  # fmt: skip
    line = (
        f"erlang_c_max_rel_err={e:.3g} conv_err={f:.3f} code_err={g:.3f} replicas_over_min={over}"
        f" prefix_err={h:.3f} spec_err={sp:.3f}"
    )
    print(f"planner: {line}")


if __name__ == "__main__":
    main()
