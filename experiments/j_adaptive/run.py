"""(j) Making the queue's policy pay on a batching fleet: an adaptive in-flight limit and a
length predictor.

Study (a) found that on 4 continuously batching replicas, with the gateway capping each at
64 requests in flight, oracle SJF cuts mean latency by a few percent where one server gives
30-60%: little waits in the gateway, where ordering happens.  This study puts the two
things that decide how much does, side by side, on the fleet of study (a) (4 replicas of
Llama-3-8B on an H100, least-loaded routing, unbounded queue, no buckets, no shedding):

* **how much is dispatched**: (1) the fixed 64 slots per replica, (2) the best fixed limit a
  sweep finds (per workload, arrivals and policy: the lowest mean end-to-end latency over
  ``SWEEP`` slots per replica, with oracle lengths), (3) the adaptive limit
  (:mod:`velvetrope.core.limit`: the pool's default when ``max_in_flight`` is unset;
  started at 64 per replica, since the compressed traces last minutes);
* **how well lengths are known**: the oracle, and the core's length predictor
  (:mod:`velvetrope.core.predictor`, the default estimator: tenant, prompt template, model,
  ``max_tokens`` and prompt length), learning online from completed requests;

for FIFO, SJF, SJF with aging and the hybrid preset, on the Azure code and conversation
traces and on a multi-tenant, multi-template synthetic workload built for this study
(:mod:`experiments.j_adaptive.templates`), with recorded (bursty) arrivals at ρ = 0.8 and
Poisson arrivals at ρ = 0.8 and 0.95 (ρ relative to the fleet's throughput at 64 slots
per replica, as in (a)).

Run from the repository root: ``.venv/bin/python -m experiments.j_adaptive.run`` (two
processes: 5 minutes of CPU, 6 minutes on 2 cores; 15 when they are shared with others).
Writes ``results.json`` (every run), ``REPORT.md`` and PNGs next to this file; with
``--report`` it rewrites the report and plots from ``results.json`` alone.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from experiments.common import (
    Progress,
    at_load,
    capacity_at,
    engine_profile,
    make_policy,
    mean_of,
    pctl,
    poisson_workload,
)
from experiments.j_adaptive.templates import multi_template_workload
from velvetrope.core import PolicyConfig
from velvetrope.engine import EngineProfile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import load_trace

OUT = Path(__file__).resolve().parent
REPLICAS = 4
SLOTS = 64
WORKLOADS = ("azure_code", "azure_conv", "templates")
SETTINGS: tuple[tuple[str, float], ...] = (("recorded", 0.8), ("poisson", 0.8), ("poisson", 0.95))
POLICIES = ("fifo", "sjf", "sjf_aging", "hybrid")
LENGTHS = ("oracle", "predicted")
SWEEP = (32, 48, 64, 96, 128, 192)
MAX_TOKENS = 8192  # a trace row without max_tokens declares the context (no length leaks in)
PROMPT_COST = {"sjf_prompt_weight": 1.0, "aging_ref_tokens": 8192}
"""SJF's cost with prompt tokens counted (section 4): output + prompt tokens."""
SEED = 7
WORKERS = 2


@dataclass(frozen=True)
class Row:
    """One run: what ran and what it gave.  ``limit`` is the fixed limit per replica, or
    ``None`` for the adaptive limit; ``in_flight_p95`` is the 95th percentile of the number
    of requests in flight over time while any was (what the limit let run)."""

    workload: str
    arrivals: str
    rho: float
    policy: str
    lengths: str
    limit: int | None
    e2e: float
    e2e_p99: float
    ttft: float
    ttft_p99: float
    long_p99_wait: float
    throughput: float
    tau: float
    in_flight_p95: float

    @property
    def mode(self) -> str:
        return "adaptive" if self.limit is None else str(self.limit)


def base_workloads() -> dict[str, list[TraceRequest]]:
    """The traces, and the synthetic workload on the code trace's recorded arrival times."""
    code = load_trace("azure_code")
    return {
        "azure_code": code,
        "azure_conv": load_trace("azure_conv"),
        "templates": multi_template_workload([r.t for r in code], SEED),
    }


def at_setting(
    base: Sequence[TraceRequest], arrivals: str, rho: float, profile: EngineProfile
) -> list[TraceRequest]:
    """``base`` at load ``rho`` of the fleet's throughput at 64 slots per replica, with its
    own arrival times (``recorded``) or Poisson ones (requests resampled, same count)."""
    cap = capacity_at(profile, base, REPLICAS, SLOTS)
    if arrivals == "recorded":
        return at_load(base, rho, cap)
    return at_load(poisson_workload(base, len(base), SEED), rho, cap)


def policy_config(
    policy: str, limit: int | None, queue: Mapping[str, Any] | None = None
) -> PolicyConfig:
    """``policy`` with ``limit`` slots per replica, or the adaptive limit (``None``)."""
    if limit is not None:
        return make_policy(policy, max_in_flight=limit * REPLICAS, queue=queue)
    pool = {"name": "default", "adaptive": {"initial": SLOTS}}  # per engine
    return make_policy(policy, max_in_flight=0, queue=queue, pools=[pool])


def in_flight_p95(dispatched: np.ndarray, end: np.ndarray) -> float:
    """95th percentile over busy time of the number of requests in flight."""
    ok = ~np.isnan(dispatched) & ~np.isnan(end)
    t = np.concatenate([dispatched[ok], end[ok]])
    d = np.concatenate([np.ones(int(ok.sum())), -np.ones(int(ok.sum()))])
    order = np.lexsort((d, t))  # ends before starts at a tie
    t, n = t[order], np.cumsum(d[order])
    dt = np.diff(t)
    level = n[:-1]
    busy = level > 0
    if not busy.any():
        return 0.0
    lv, w = level[busy], dt[busy]
    idx = np.argsort(lv)
    cw = np.cumsum(w[idx])
    return float(lv[idx][np.searchsorted(cw, 0.95 * cw[-1])])


def run_one(
    wl: Sequence[TraceRequest],
    profile: EngineProfile,
    policy: str,
    limit: int | None,
    lengths: str,
    *,
    queue: Mapping[str, Any] | None = None,
    tags: tuple[str, str, float] = ("", "", 0.0),
    estimator: str | None = None,
) -> Row:
    """Replay ``wl`` through ``policy`` on the fleet; ``lengths`` is ``oracle`` or
    ``predicted`` (the controller's estimator, ``estimator`` kind if given)."""
    cfg = policy_config(policy, limit, queue)
    if estimator is not None:
        cfg = cfg.model_copy(
            update={"estimator": cfg.estimator.model_copy(update={"kind": estimator})}
        )
    res = run_simulation(
        cfg,
        wl,
        REPLICAS,
        profile,
        lengths="oracle" if lengths == "oracle" else "estimator",
        default_max_tokens=MAX_TOKENS,
        seed=SEED,
    )
    rec = res.records
    done = rec.completed
    e2e = rec.e2e()[done]
    ttft = rec.ttft()[done]
    wait = rec.queue_wait()
    long_ = done & (rec.output >= np.percentile(rec.output, 90))
    tau = math.nan
    if lengths != "oracle":
        tau = float(kendalltau(rec.predicted[done], rec.output[done]).statistic)
    span = float(np.nanmax(rec.end) - np.nanmin(rec.arrival))
    return Row(
        workload=tags[0],
        arrivals=tags[1],
        rho=tags[2],
        policy=policy,
        lengths=lengths,
        limit=limit,
        e2e=mean_of(e2e),
        e2e_p99=pctl(e2e, 99),
        ttft=mean_of(ttft),
        ttft_p99=pctl(ttft, 99),
        long_p99_wait=pctl(wait[long_], 99),
        throughput=float(done.sum()) / span,
        tau=tau,
        in_flight_p95=in_flight_p95(rec.dispatched, rec.end),
    )


def best_fixed(rows: Sequence[Row]) -> Row:
    """The sweep's best: the lowest mean end-to-end latency."""
    return min(rows, key=lambda r: r.e2e)


def gain(base: Row, row: Row) -> float:
    """Mean end-to-end latency cut against ``base`` (0.2 = 20% lower)."""
    return 1.0 - row.e2e / base.e2e


def kept(base: Row, oracle: Row, predicted: Row) -> float:
    """Share of the oracle's gain the predictor keeps."""
    g = gain(base, oracle)
    return gain(base, predicted) / g if g > 0 else math.nan


@cache
def _setting(name: str, arrivals: str, rho: float) -> list[TraceRequest]:
    """A workload at a setting, built once per process."""
    return at_setting(_bases()[name], arrivals, rho, engine_profile())


@cache
def _bases() -> dict[str, list[TraceRequest]]:
    return base_workloads()


def cell(task: tuple[str, str, float, str]) -> tuple[list[Row], list[Row]]:
    """One (workload, arrivals, ρ, policy): its sweep (oracle), then the adaptive limit with
    oracle lengths and fixed 64, the sweep's best and the adaptive limit with predicted
    lengths.  Returns (rows kept, the sweep)."""
    name, arrivals, rho, policy = task
    profile = engine_profile()
    wl = _setting(name, arrivals, rho)
    tags = (name, arrivals, rho)
    sw = [run_one(wl, profile, policy, s, "oracle", tags=tags) for s in SWEEP]
    best = best_fixed(sw)
    rows = [r for r in sw if r.limit in (SLOTS, best.limit)]
    rows.append(run_one(wl, profile, policy, None, "oracle", tags=tags))
    for limit in dict.fromkeys((SLOTS, best.limit, None)):
        rows.append(run_one(wl, profile, policy, limit, "predicted", tags=tags))
    return rows, sw


def extras(name: str) -> list[Row]:
    """Recorded arrivals at ρ = 0.8: the per-tenant estimator's τ (SJF, fixed 64), and
    SJF(+aging) whose cost counts prompt tokens (section 4)."""
    profile = engine_profile()
    wl = _setting(name, "recorded", 0.8)
    tags = (name, "recorded", 0.8)
    out = [run_one(wl, profile, "sjf", SLOTS, "tenant", tags=tags, estimator="tenant")]
    for policy in ("sjf", "sjf_aging"):
        for limit in (SLOTS, None):
            for lengths in LENGTHS:
                r = run_one(wl, profile, policy, limit, lengths, queue=PROMPT_COST, tags=tags)
                out.append(replace(r, policy=f"{policy}+prompt"))
    return out


RESULTS = OUT / "results.json"
"""Every run's row, so that ``--report`` can rewrite the report without running again."""


def save(
    rows: list[Row], sweeps: dict[tuple[str, str, float, str], list[Row]], extra: list[Row]
) -> None:
    doc = {
        "rows": [asdict(r) for r in rows],
        "sweeps": [[list(k), [asdict(r) for r in v]] for k, v in sweeps.items()],
        "extra": [asdict(r) for r in extra],
    }
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load() -> tuple[list[Row], dict[tuple[str, str, float, str], list[Row]], list[Row]]:
    doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    sweeps = {(k[0], k[1], float(k[2]), k[3]): [Row(**r) for r in v] for k, v in doc["sweeps"]}
    return [Row(**r) for r in doc["rows"]], sweeps, [Row(**r) for r in doc["extra"]]


def main() -> None:
    from experiments.j_adaptive.report import write

    if "--report" in sys.argv[1:]:  # rewrite REPORT.md and the plots from results.json
        write(OUT, *load(), engine_profile())
        return
    tasks = [
        (name, arrivals, rho, policy)
        for name in WORKLOADS
        for arrivals, rho in SETTINGS
        for policy in POLICIES
    ]
    progress = Progress("j", len(tasks) + len(WORKLOADS))
    rows: list[Row] = []
    sweeps: dict[tuple[str, str, float, str], list[Row]] = {}
    extra: list[Row] = []
    # two processes (the study's budget is 2 cores); results are collected in task order,
    # so the report is the same whatever finishes first
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=get_context("fork")) as pool:
        for task, (kept_rows, sw) in zip(tasks, pool.map(cell, tasks), strict=True):
            rows += kept_rows
            sweeps[task] = sw
            progress.step(f"{' '.join(map(str, task))}: best {best_fixed(sw).limit}")
        for name, more in zip(WORKLOADS, pool.map(extras, WORKLOADS), strict=True):
            extra += more
            progress.step(f"{name}: per-tenant estimator, prompt-aware cost")
    progress.finish()
    save(rows, sweeps, extra)
    write(OUT, rows, sweeps, extra, engine_profile())


if __name__ == "__main__":
    main()
