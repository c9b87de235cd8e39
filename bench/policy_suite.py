"""The shipped config against the engines' own schedulers, on workloads nobody tuned for.

Each workload is a trace window (Azure 2023 conversation or code, Mooncake conversation)
with tenants on the example config's three tiers, compressed to an overload of two
``llama3-8b-a100`` engines' derived capacity at the demo's speed (3×), in the simulator:
the gateway's own ``AdmissionController`` on the engine model.  Three runs per workload:

* **fcfs**: the engines alone, round-robin, vLLM's FCFS scheduler;
* **prio**: the engines alone, round-robin, vLLM's priority scheduler with the tier's index
  as each request's ``priority`` (what a user tries first);
* **gateway**: ``velvetrope/data/examples/gateway.yaml`` unchanged except, on the
  tight-TPOT workloads, the tiers' SLOs (an operator's statement, not a tuning knob); the
  engines in priority mode when the config forwards the tier (``pools[].engine_priority``).

Counted at the bound (window + 12 s drain) with study (n)'s ``measure``: *in SLO* per tier;
*wasted tokens* = output generated for requests dispatched before the window ended that
never completed (those dispatched during the drain are cut by the bound, not by policy, and
are reported apart); *TPOT SLO violations* = completed requests of a tier with a TPOT SLO
whose TPOT exceeded it.

Then each run is counted again with no bound (``settled:``): every request once its
outcome is known, the simulation running until each one has completed or been turned
away.  A batch request queued behind the higher tiers at the bound, with most of its 120 s
objective left, counts against the gateway at the bound and for it when settled.

Ends with one line::

    policy: workloads=N tiers_at_or_above=K/M total_ratio_min=a total_ratio_mean=b \
wasted_tokens=w tpot_slo_violations=v hopeless_tokens=h preemptions=p

where K counts tier × workload pairs in which the gateway is at or above the priority run,
the ratios are the gateway's total in SLO over the priority run's, and w, v, h and p are
the gateway's (p: the jobs it took back from an engine before their first token).  The
aim (issue 39): K = M, a ≥ 1.0, b ≥ 1.15, w = 0, v = 0.

Run: ``.venv/bin/python bench/policy_suite.py`` (``--only NAME`` for one workload,
``--config PATH`` to measure another config, ``--seeds N`` to run every workload with N
seeds: the tenant draws change, the trace window does not, and the lines count all N × 8
runs; a margin of a few requests that changes sign from seed to seed is noise, one that
keeps its sign is the policy; ``--held-out`` for twelve other workloads no setting was
chosen on: other slices, mixes and overloads, other engines and pool sizes; ``--random N``
for N workloads drawn at random, ``bench/random_workloads.py``, with ``--random-seed S``).
Seconds on 2 cores with the compiled core.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from random_workloads import draw  # noqa: E402

from experiments.n_engine_priority.run import (  # noqa: E402
    Result,
    at_speed,
    generated_by,
    measure,
)
from velvetrope.core import PolicyConfig  # noqa: E402
from velvetrope.core.policy import SloPolicy  # noqa: E402
from velvetrope.demo.settings import DEFAULT_CONFIG, DemoSettings, read_config  # noqa: E402
from velvetrope.demo.workload import Workload as DemoWorkload  # noqa: E402
from velvetrope.demo.workload import build_workload  # noqa: E402
from velvetrope.engine import load_profile  # noqa: E402
from velvetrope.errors import PolicyError  # noqa: E402
from velvetrope.sim.loop import run_simulation  # noqa: E402
from velvetrope.sim.metrics import JobRecords  # noqa: E402

ENGINES = 2
PROFILE = "llama3-8b-a100"
DRAIN_S = 12.0
TIGHT_TPOT_S = 0.05
"""The tight SLO set: interactive and standard TPOT at 50 ms (the demo's engines decode at
~15 ms per token alone and ~50 ms in a full batch)."""
MIX_DEFAULT = "acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5"
MIX_INTERACTIVE = "acme:interactive:0.4,globex:standard:0.4,initech:batch:0.2"


@dataclass(frozen=True)
class Workload:
    name: str
    trace: str
    start_s: float
    overload: float
    window_s: float = 30.0
    mix: str = MIX_DEFAULT
    seed: int = 7
    tight_tpot: bool = False
    profile: str = PROFILE
    engines: int = ENGINES
    tenant_limits: bool = True
    """False: the tenants' rate limits (contracts, not capacity) are lifted."""


WORKLOADS: tuple[Workload, ...] = (
    Workload("conv-2.0", "azure_conv", 600, 2.0, window_s=20.0),
    Workload("conv-1.2", "azure_conv", 1800, 1.2, seed=11),
    Workload("conv-3.0", "azure_conv", 0, 3.0, window_s=20.0, seed=13),
    Workload("code-1.5", "azure_code", 300, 1.5, seed=17),
    Workload("mooncake-1.5", "mooncake_conv", 0, 1.5, seed=19),
    Workload("interactive-heavy-2.0", "azure_conv", 1200, 2.0, mix=MIX_INTERACTIVE, seed=23),
    Workload("tight-tpot-conv-1.5", "azure_conv", 300, 1.5, seed=29, tight_tpot=True),
    Workload(
        "tight-tpot-code-2.5",
        "azure_code",
        900,
        2.5,
        mix=MIX_INTERACTIVE,
        seed=31,
        tight_tpot=True,
    ),
)
MIX_BATCH_HEAVY = "acme:interactive:0.1,globex:standard:0.2,initech:batch:0.7"
MIX_STANDARD_HEAVY = "acme:interactive:0.1,globex:standard:0.7,initech:batch:0.2"
MIX_FOUR_TENANTS = (
    "acme:interactive:0.15,hooli:interactive:0.15,globex:standard:0.3,initech:batch:0.4"
)

HELD_OUT: tuple[Workload, ...] = (
    Workload("conv-1.7-late", "azure_conv", 2400, 1.7, seed=41),
    Workload("code-2.0-batch-heavy", "azure_code", 0, 2.0, 20.0, MIX_BATCH_HEAVY, 43),
    Workload("conv-4.0", "azure_conv", 1000, 4.0, 15.0, seed=53),
    Workload("code-1.2-40s", "azure_code", 1200, 1.2, 40.0, seed=59),
    Workload("conv-2.0-standard-heavy", "azure_conv", 900, 2.0, mix=MIX_STANDARD_HEAVY, seed=61),
    Workload("conv-2.0-four-tenants", "azure_conv", 1500, 2.0, mix=MIX_FOUR_TENANTS, seed=67),
    Workload("conv-2.0-70b", "azure_conv", 600, 2.0, seed=71, profile="llama3-70b-4xh100"),
    Workload("code-1.5-h100", "azure_code", 600, 1.5, 20.0, seed=73, profile="llama3-8b-h100"),
    Workload(
        "conv-2.0-vllm-v0", "azure_conv", 1800, 2.0, 20.0, seed=97, profile="llama3-8b-a100-vllm-v0"
    ),
    Workload("conv-2.0-four-engines", "azure_conv", 1200, 4.0, 15.0, seed=79, engines=4),
    Workload("conv-3.0-one-engine", "azure_conv", 2700, 1.5, seed=83, engines=1),
    Workload(
        "mooncake-2.5-tight-tpot",
        "mooncake_conv",
        300,
        2.5,
        mix=MIX_INTERACTIVE,
        seed=89,
        tight_tpot=True,
    ),
)
"""Workloads no setting was chosen on: other slices, mixes and overloads, other engines
(a 70B model on 4×H100, an H100, vLLM's V0 scheduler) and pool sizes (one and four engines;
the overload is against two engines' capacity, so 4.0 on four engines is 2× and 1.5 on one
is 3×).  ``--held-out`` runs these instead of :data:`WORKLOADS`."""
TIERS = ("interactive", "standard", "batch")


def _policy_mapping(path: Path) -> dict[str, Any]:
    policy: dict[str, Any] = read_config(path)["policy"]
    return policy


def _tighten(policy: dict[str, Any]) -> dict[str, Any]:
    """The tight SLO set: every tier that states a TTFT also states a 50 ms TPOT."""
    tiers = []
    for t in policy["tiers"]:
        t = dict(t)
        slo = dict(t.get("slo") or {})
        if "ttft_s" in slo:
            slo["tpot_s"] = TIGHT_TPOT_S
        t["slo"] = slo
        tiers.append(t)
    return {**policy, "tiers": tiers}


def engines_alone(policy: Mapping[str, Any], priority: bool) -> PolicyConfig:
    """No admission: every request goes to an engine at once; the tiers only for the SLOs
    and, with ``priority``, as the engine's priority."""
    tiers = [{"name": t["name"], "slo": t.get("slo")} for t in policy["tiers"]]
    return PolicyConfig.model_validate(
        {
            "preset": "fifo",
            "queue": {"max_queued": 10**9},
            "tiers": tiers,
            "tenants": [{"name": t["name"], "tier": t["tier"]} for t in policy["tenants"]],
            "pools": [{"name": "default", "max_in_flight": 10**9, "engine_priority": priority}],
            "saturation": {"enabled": False},
        }
    )


@dataclass(frozen=True)
class Run:
    result: Result
    tpot_violations: int
    hopeless_tokens: int
    """Of the wasted tokens (dispatched before the window ended, not finished by the
    bound), those of requests that could no longer meet their SLO at the bound: the first
    token after the TTFT objective (or none yet, past it), or the bound past the e2e
    objective.  The rest would have completed within their SLO after the bound."""
    taken_back: int
    """Jobs the gateway took back from an engine before their first token."""
    settled: Result
    """The same run counted with no bound: every request once its outcome is known (the
    simulation runs until each one has completed or been turned away)."""
    unsettled: int
    """Requests with no outcome at the end of the simulation (0 when it ran to the end)."""


def hopeless_tokens(
    rec: JobRecords, slos: Mapping[str, SloPolicy], bound: float, window: float
) -> int:
    open_ = (rec.dispatched < window) & ~(rec.end <= bound)
    lost = np.zeros(rec.arrival.shape, dtype=bool)
    for name, slo in slos.items():
        sel = open_ & (rec.tier == name)
        if slo.ttft_s is not None:
            late_first = np.where(rec.first_token <= bound, rec.first_token, bound)
            lost |= sel & (late_first - rec.arrival > slo.ttft_s)
        if slo.e2e_s is not None:
            lost |= sel & (bound - rec.arrival > slo.e2e_s)
    return generated_by(rec, lost, bound)


def tpot_violations(rec: JobRecords, slos: Mapping[str, SloPolicy], bound: float) -> int:
    done = rec.completed & (rec.end <= bound)
    tpot = rec.tpot()
    n = 0
    for name, slo in slos.items():
        if slo.tpot_s is None:
            continue
        sel = done & (rec.tier == name) & ~np.isnan(tpot)
        n += int((tpot[sel] > slo.tpot_s).sum())
    return n


def _settings(w: Workload) -> DemoSettings:
    return DemoSettings(
        live=False,
        trace=w.trace,
        trace_start_s=w.start_s,
        overload=w.overload,
        window_s=w.window_s,
        mix=w.mix,
        seed=w.seed,
        profile=w.profile,
    )


@functools.cache
def _built(w: Workload) -> DemoWorkload | PolicyError:
    """``w``'s requests (built once per workload: ``--random`` asks :func:`feasible` of each
    draw, then :func:`run`s it), or why its trace cannot offer them."""
    try:
        return build_workload(_settings(w))
    except PolicyError as e:
        return e


def feasible(w: Workload) -> bool:
    """Whether ``w``'s trace holds enough requests after its start for its rate and window."""
    return not isinstance(_built(w), PolicyError)


def _without_limits(policy: dict[str, Any]) -> dict[str, Any]:
    tenants = [{k: v for k, v in t.items() if k != "limits"} for t in policy["tenants"]]
    return {**policy, "tenants": tenants}


def run(w: Workload, config: Path, records: dict[str, JobRecords] | None = None) -> dict[str, Run]:
    """The three runs of ``w`` (``fcfs``, ``prio``, ``gateway``) counted; ``records``, if
    given, receives each run's per-job records by the same keys."""
    s = _settings(w)
    built = _built(w)
    if isinstance(built, PolicyError):
        raise built
    requests = built.requests
    profile = at_speed(load_profile(s.profile), s.speed)
    mapping = _policy_mapping(config)
    if w.tight_tpot:
        mapping = _tighten(mapping)
    if not w.tenant_limits:
        mapping = _without_limits(mapping)
    gateway = PolicyConfig.model_validate(mapping)
    forwards = any(p.engine_priority for p in gateway.pools)
    cases = {
        "fcfs": (engines_alone(mapping, False), "fcfs", "round_robin"),
        "prio": (engines_alone(mapping, True), "priority", "round_robin"),
        "gateway": (gateway, "priority" if forwards else "fcfs", "least_loaded"),
    }
    slos = {t.name: t.slo for t in gateway.tiers if t.slo is not None}
    bound = w.window_s + DRAIN_S
    out: dict[str, Run] = {}
    for key, (policy, scheduling, router) in cases.items():
        res = run_simulation(
            policy,
            requests,
            w.engines,
            profile,
            router=router,
            seed=w.seed,
            label=key,
            engine_scheduling=scheduling,
        )
        if records is not None:
            records[key] = res.records
        out[key] = Run(
            measure(key, res, slos, bound, w.window_s),
            tpot_violations(res.records, slos, bound),
            hopeless_tokens(res.records, slos, bound, w.window_s),
            sum(p.taken_back for p in res.pools),
            measure(key, res, slos, math.inf, w.window_s),
            int((~(res.records.end < math.inf)).sum()),
        )
    return out


def _tiers(r: Result) -> str:
    return " ".join(f"{t[:5]} {r.tiers[t].in_slo:>4}/{r.tiers[t].offered:<4}" for t in TIERS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--only", action="append", default=[], help="run only this workload")
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run each workload with this many seeds (its own, then +101, +202, ...): "
        "tenant draws and arrival order change, the trace window does not",
    )
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="run the held-out workloads (other slices, mixes, engines, pool sizes) instead",
    )
    ap.add_argument(
        "--random",
        type=int,
        default=0,
        metavar="N",
        help="run N workloads drawn at random (bench/random_workloads.py) instead",
    )
    ap.add_argument("--random-seed", type=int, default=1, help="the draw's seed (default 1)")
    args = ap.parse_args()
    workloads = HELD_OUT if args.held_out else WORKLOADS
    if args.random:
        workloads = tuple(draw(args.random, args.random_seed, Workload, feasible))
    chosen = [
        replace(w, name=f"{w.name}@{w.seed + 101 * i}" if i else w.name, seed=w.seed + 101 * i)
        for i in range(max(1, args.seeds))
        for w in workloads
        if not args.only or w.name in args.only
    ]
    at_or_above = pairs = 0
    ratios: list[float] = []
    wasted = violations = hopeless = taken = 0
    settled_above = unsettled = 0
    settled_ratios: list[float] = []
    t0 = time.perf_counter()
    for w in chosen:
        runs = run(w, args.config)
        g, p = runs["gateway"].result, runs["prio"].result
        where = (
            "" if (w.profile, w.engines) == (PROFILE, ENGINES) else (f", {w.engines} × {w.profile}")
        )
        if w.mix not in (MIX_DEFAULT, MIX_INTERACTIVE):
            where += f", {w.mix}"
        if w.tight_tpot:
            where += f", TPOT {1000 * TIGHT_TPOT_S:g} ms"
        print(
            f"{w.name}  ({w.trace} from {w.start_s:g} s, {w.overload:g}×, {w.window_s:g} s{where})"
        )
        for key in ("fcfs", "prio", "gateway"):
            r = runs[key]
            x = r.result
            print(
                f"  {key:8} in SLO {x.in_slo:>5}  {_tiers(x)}  wasted {x.wasted_tokens:>6} "
                f"(drain {x.wasted_late:>5}, hopeless {r.hopeless_tokens:>6})  "
                f"TPOT p99 {1000 * x.tpot_p99:5.0f} ms  TPOT>SLO {r.tpot_violations}"
            )
        marks = []
        for t in TIERS:
            pairs += 1
            ok = g.tiers[t].in_slo >= p.tiers[t].in_slo
            at_or_above += ok
            marks.append(f"{t} {g.tiers[t].in_slo}/{p.tiers[t].in_slo}{'' if ok else ' (below)'}")
        ratios.append(g.in_slo / p.in_slo if p.in_slo else math.inf)
        gs, ps = runs["gateway"].settled, runs["prio"].settled
        settled_above += sum(gs.tiers[t].in_slo >= ps.tiers[t].in_slo for t in TIERS)
        settled_ratios.append(gs.in_slo / ps.in_slo if ps.in_slo else math.inf)
        unsettled += sum(r.unsettled for r in runs.values())
        print(
            "  settled (no bound): "
            + ", ".join(f"{k} {runs[k].settled.in_slo}" for k in ("fcfs", "prio", "gateway"))
            + "; gateway/prio "
            + ", ".join(f"{t} {gs.tiers[t].in_slo}/{ps.tiers[t].in_slo}" for t in TIERS)
        )
        wasted += g.wasted_tokens - g.wasted_late
        violations += runs["gateway"].tpot_violations
        hopeless += runs["gateway"].hopeless_tokens
        taken += runs["gateway"].taken_back
        print(
            f"  gateway/prio: total {ratios[-1]:.3f}; "
            + ", ".join(marks)
            + f"; taken back {runs['gateway'].taken_back}"
        )
    print(f"({time.perf_counter() - t0:.0f} s)")
    print(
        f"settled: tiers_at_or_above={settled_above}/{pairs} "
        f"total_ratio_min={min(settled_ratios):.3f} "
        f"total_ratio_mean={sum(settled_ratios) / len(settled_ratios):.3f} "
        f"unsettled={unsettled}"
    )
    print(
        f"policy: workloads={len(chosen)} tiers_at_or_above={at_or_above}/{pairs} "
        f"total_ratio_min={min(ratios):.3f} total_ratio_mean={sum(ratios) / len(ratios):.3f} "
        f"wasted_tokens={wasted} tpot_slo_violations={violations} hopeless_tokens={hopeless} "
        f"preemptions={taken}"
    )


if __name__ == "__main__":
    main()
