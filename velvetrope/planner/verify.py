"""Checking a plan against the simulator: predicted versus simulated p99, side by side.

:func:`verify_plan` replays a stationary workload at the plan's design rate through
:func:`velvetrope.sim.loop.run_simulation` — the real admission core and real engine
batchers in virtual time — at the recommended size and at one replica fewer, and compares
the p99 of queue wait, time to first token and end-to-end latency with the model's.

What is simulated, and why
--------------------------
The model predicts a *stationary* operating point (:mod:`velvetrope.planner.predict`), so
the check replays one: the workload's arrival pattern at ``design_rps`` — for a trace its
own arrivals, every minute at the design rate; for a workload file the seeded Poisson or
Gamma-renewal sample (:mod:`velvetrope.planner.workload`) — repeated as often as the
request count needs (without a pattern: Poisson when ``C_a² = 1``, else a Gamma renewal
process with the workload's inter-arrival CV, deterministic when ``C_a² = 0``), each
request's (prompt, output) drawn independently from the workload's length mix as fitted to
the engine (:class:`~velvetrope.planner.length_mix.LengthMix`); with a prefix hit rate each
request's first ``int(h·P)`` prompt tokens are one shared prefix (the same rule the
closed-loop service curve uses, ``LengthMix.prefix``), which the simulated engines' prefix
caches serve, and with speculative decoding the simulated engines speculate (the profile
carries both).  The model sees the same
arrivals, so the check tests the fleet model (slots, service, waits), not the arrivals.
The policy is the one the model assumes: the ``fifo`` preset (FCFS, one band, no
fairness), one pool with ``max_in_flight = N·K``, an unbounded queue, no shedding and no
buckets, least-loaded routing.  The first ``warmup`` fraction of requests (by arrival) is
left out of the percentiles, so the empty start does not flatter the simulated fleet.
Deterministic for a given seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from velvetrope.core.policy import PolicyConfig
from velvetrope.errors import PolicyError
from velvetrope.planner.features import predicted_service
from velvetrope.planner.plan import Plan
from velvetrope.planner.predict import predict
from velvetrope.planner.prediction import Prediction
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.words import figure as _n
from velvetrope.planner.words import seconds as _s
from velvetrope.sim import Deterministic, GammaRenewal, Poisson, TraceRequest
from velvetrope.sim.loop import run_simulation

__all__ = [
    "SimulatedLatency",
    "VerifyRow",
    "fifo_policy",
    "mix_requests",
    "simulate_fleet",
    "stationary_workload",
    "verify_lines",
    "verify_plan",
    "verify_to_dict",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def stationary_workload(
    curve: ServiceCurve,
    rate_rps: float,
    arrival_scv: float,
    requests: int,
    seed: int,
    *,
    pattern: FloatArray | None = None,
) -> list[TraceRequest]:
    """``requests`` arrivals at ``rate_rps`` with lengths drawn (seeded) from ``curve``'s
    fitted mix (see the module docstring).

    The arrival times are ``pattern`` (a workload's arrival pattern at 1 req/s) divided by
    the rate, repeated end to end as often as ``requests`` needs; without a pattern, a
    renewal process with inter-arrival SCV ``arrival_scv`` seeded by ``seed``.
    """
    if requests < 1:
        raise PolicyError(f"requests must be >= 1 (got {requests})")
    cv = math.sqrt(max(arrival_scv, 0.0))
    if pattern is not None:
        times = _tiled(np.asarray(pattern, dtype=np.float64), requests) / rate_rps
    elif cv == 0.0:
        times = Deterministic(rate_rps).times(seed, count=requests)
    elif abs(cv - 1.0) < 1e-9:
        times = Poisson(rate_rps).times(seed, count=requests)
    else:
        times = GammaRenewal(rate_rps, cv).times(seed, count=requests)
    rng = np.random.default_rng(seed + 1)
    idx = rng.integers(0, len(curve.mix), size=requests)
    return mix_requests(curve, times, idx)


def mix_requests(curve: ServiceCurve, times: FloatArray, idx: IntArray) -> list[TraceRequest]:
    """Requests arriving at ``times``, the ``i``-th with the lengths of ``curve.mix``'s
    request ``idx[i]`` and, with a prefix hit rate, its shared prefix (id ``shared``)."""
    mix = curve.mix
    prompts = mix.prompt[idx].tolist()
    outputs = mix.output[idx].tolist()
    ts = np.asarray(times, dtype=np.float64).tolist()
    if mix.prefix_hit_rate <= 0:
        return [TraceRequest(t, p, o) for t, p, o in zip(ts, prompts, outputs, strict=True)]
    prefixes = mix.prefix[idx].tolist()
    return [
        TraceRequest(t, p, o, prefix_id="shared" if f else None, prefix_tokens=f)
        for t, p, o, f in zip(ts, prompts, outputs, prefixes, strict=True)
    ]


def _tiled(pattern: FloatArray, count: int) -> FloatArray:
    """The first ``count`` times of ``pattern`` repeated end to end, each copy starting one
    mean gap after the previous one ends."""
    span = float(pattern[-1] - pattern[0]) * len(pattern) / max(len(pattern) - 1, 1)
    reps = -(-count // len(pattern))
    base = pattern - pattern[0]
    out = (base[None, :] + span * np.arange(reps)[:, None]).ravel()[:count]
    return np.asarray(out, dtype=np.float64)


def fifo_policy(max_in_flight: int, max_queued: int) -> PolicyConfig:
    """FCFS, one tier, one pool of ``max_in_flight`` slots, no shedding, no buckets, no
    engine-saturation rule (the queueing model is a plain K-slot FCFS gateway)."""
    return PolicyConfig.model_validate(
        {
            "preset": "fifo",
            "queue": {"max_queued": max_queued},
            "pools": [{"name": "default", "max_in_flight": max_in_flight}],
            "saturation": {"enabled": False},
        }
    )


@dataclass(frozen=True, slots=True)
class SimulatedLatency:
    """What the simulator measured: p50/p99 of wait, TTFT and e2e (s) over the completed
    requests after warm-up, and the fraction of all requests that completed;
    ``service_mean_s``/``service_cv`` the mean and coefficient of variation of the time
    each of them spent in an engine (end-to-end minus queue wait)."""

    replicas: int
    completed_fraction: float
    wait_p50_s: float
    wait_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    service_mean_s: float
    service_cv: float

    def p99(self, metric: str) -> float:
        """The p99 of ``wait``, ``ttft`` or ``e2e``."""
        value: float = getattr(self, f"{metric}_p99_s")
        return value


def simulate_fleet(
    curve: ServiceCurve,
    workload: list[TraceRequest],
    replicas: int,
    concurrency: int,
    *,
    warmup: float = 0.1,
    seed: int = 0,
    label: str = "planner verify",
) -> SimulatedLatency:
    """Run ``workload`` on ``replicas`` × ``curve.profile`` with ``concurrency`` slots each
    (:func:`fifo_policy`) and summarise it (requests arriving in the first ``warmup``
    fraction of the run are left out)."""
    if not 0 <= warmup < 1:
        raise PolicyError(f"warmup must be in [0, 1) (got {warmup!r})")
    config = fifo_policy(replicas * concurrency, max(len(workload), 1))
    res = run_simulation(
        config, workload, replicas, curve.profile, lengths="oracle", seed=seed, label=label
    )
    rec = res.records
    keep = rec.completed.copy()
    keep[: int(warmup * len(rec))] = False
    done = float(np.mean(rec.completed)) if len(rec) else math.nan

    def q(x: FloatArray) -> tuple[float, float]:
        v = x[keep]
        if v.size == 0:
            return math.nan, math.nan
        p50, p99 = np.percentile(v, [50, 99])
        return float(p50), float(p99)

    w = q(rec.queue_wait())
    t = q(rec.ttft())
    e = q(rec.e2e())
    service = (rec.e2e() - rec.queue_wait())[keep]
    mean = float(service.mean()) if service.size else math.nan
    cv = float(service.std()) / mean if service.size and mean > 0 else math.nan
    return SimulatedLatency(replicas, done, w[0], w[1], t[0], t[1], e[0], e[1], mean, cv)


@dataclass(frozen=True, slots=True)
class VerifyRow:
    """One fleet size: the model's prediction and what the simulator measured."""

    predicted: Prediction
    simulated: SimulatedLatency


def verify_plan(
    plan: Plan, *, requests: int = 20_000, seed: int = 0, warmup: float = 0.1
) -> list[VerifyRow]:
    """Simulate ``plan`` at its size and at one replica fewer (when there is one).

    See the module docstring for what is replayed.  Returns one row per size, recommended
    size first.
    """
    w = plan.workload
    wl = stationary_workload(
        plan.curve, w.design_rps, w.arrival_scv, requests, seed, pattern=w.arrival_pattern
    )
    rows = []
    for n in (plan.replicas, plan.replicas - 1):
        if n < 1:
            continue
        pred = (
            plan.at
            if n == plan.replicas
            else predict(
                plan.curve,
                plan.workload.design_rps,
                n,
                plan.concurrency,
                arrival_scv=w.arrival_scv,
                arrival_pattern=w.arrival_pattern,
            )
        )
        sim = simulate_fleet(plan.curve, wl, n, plan.concurrency, warmup=warmup, seed=seed)
        rows.append(VerifyRow(pred, sim))
    return rows


def verify_lines(
    rows: list[VerifyRow], requests: int, design_rps: float, prefix_hit_rate: float
) -> list[str]:
    """``velvetrope plan --verify``'s table, a blank line first: at each size the predicted
    and simulated p99 of each metric with the relative error, then the service times."""
    out = [
        "",
        f"verify: simulated {requests:,} requests at {_n(design_rps)} req/s "
        "(stationary, FCFS, first 10% left out) with the real admission core and batchers"
        + (
            f"; every prompt's first {prefix_hit_rate:.0%} one shared prefix"
            if prefix_hit_rate > 0
            else ""
        ),
    ]
    head = f"  {'replicas':<9} {'metric':<7} {'predicted p99':>14} {'simulated p99':>14}"
    out.append(f"{head}  error")
    for r in rows:
        for m in ("wait", "ttft", "e2e"):
            p, s = r.predicted.p99(m), r.simulated.p99(m)
            err = f"{(p - s) / s:+.1%}" if math.isfinite(p) and math.isfinite(s) and s > 0 else "—"
            out.append(f"  {r.simulated.replicas:<9} {m:<7} {_s(p):>14} {_s(s):>14}  {err}")
    for r in rows:
        mean, cv = predicted_service(r.predicted)
        sim = r.simulated
        out.append(
            f"  service time at {sim.replicas} replicas: predicted mean {_s(mean)}, CV "
            f"{cv:.2f}; simulated mean {_s(sim.service_mean_s)}, CV {sim.service_cv:.2f}"
        )
    return out


def verify_to_dict(rows: list[VerifyRow]) -> list[dict[str, Any]]:
    """``velvetrope plan --json --verify``'s ``verify`` rows: predicted and simulated, at each
    size (a latency that does not exist is null)."""

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    out = []
    for r in rows:
        p, s = r.predicted, r.simulated
        mean, cv = predicted_service(p)
        out.append(
            {
                "replicas": s.replicas,
                "completed_fraction": s.completed_fraction,
                "service_mean_s": {
                    "predicted": finite(mean),
                    "simulated": finite(s.service_mean_s),
                },
                "service_cv": {"predicted": finite(cv), "simulated": finite(s.service_cv)},
                **{
                    f"{m}_p99_s": {
                        "predicted": p.p99(m) if math.isfinite(p.p99(m)) else None,
                        "simulated": s.p99(m),
                    }
                    for m in ("wait", "ttft", "e2e")
                },
            }
        )
    return out
