"""How fast the TPOT-derived in-flight limit is known after a start, and how far it moves
after a load step: the simulator's record of a run replayed, event by event, into the
core's :class:`~velvetrope.core.tpot_limit.TpotLimit`.

The run: two ``llama3-8b-a100`` engines at the demo's speed (3×) behind the shipped example
config with the interactive tier's TPOT objective at 50 ms, the Azure conversation trace at
0.8× the engines' capacity for 30 s, then 1.6× for 30 s (a load step). Every dispatched
job's start, first token and end, in time order, are fed to a fresh ``TpotLimit`` with the
config's settings (what the controller feeds it in the run); after each end the limit per
engine is read. Printed: when the limit first binds (and after how many samples), its value
before the step, and how long after the step it stays within 10% of its value at the end.

Ends with ``tpot_limit: known_after_s=<t> samples=<n> before_step=<x> after_step=<y>
settled_s=<s>``.  Run: ``.venv/bin/python bench/tpot_limit_convergence.py`` (a few
seconds).
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.n_engine_priority.run import at_speed  # noqa: E402
from velvetrope.core import PolicyConfig  # noqa: E402
from velvetrope.core.job import Job  # noqa: E402
from velvetrope.core.tpot_limit import TpotLimit  # noqa: E402
from velvetrope.demo.settings import DEFAULT_CONFIG, DemoSettings, read_config  # noqa: E402
from velvetrope.demo.workload import build_workload  # noqa: E402
from velvetrope.engine import load_profile  # noqa: E402
from velvetrope.sim.loop import run_simulation  # noqa: E402
from velvetrope.sim.trace_request import TraceRequest  # noqa: E402

ENGINES = 2
STEP_S = 30.0
TPOT_S = 0.05


def workload() -> list[TraceRequest]:
    """0.8× capacity for ``STEP_S``, then 1.6× for ``STEP_S``."""
    low = build_workload(DemoSettings(live=False, overload=0.8, window_s=STEP_S, seed=3))
    high = build_workload(
        DemoSettings(live=False, overload=1.6, window_s=STEP_S, trace_start_s=1500, seed=5)
    )
    return low.requests + [replace(r, t=r.t + STEP_S) for r in high.requests]


def policy() -> PolicyConfig:
    mapping: dict[str, Any] = read_config(DEFAULT_CONFIG)["policy"]
    tiers = [dict(t) for t in mapping["tiers"]]
    tiers[0]["slo"] = {**tiers[0]["slo"], "tpot_s": TPOT_S}
    return PolicyConfig.model_validate({**mapping, "tiers": tiers})


def main() -> None:
    cfg = policy()
    s = DemoSettings(live=False)
    profile = at_speed(load_profile(s.profile), s.speed)
    rec = run_simulation(
        cfg, workload(), ENGINES, profile, seed=3, engine_scheduling="priority"
    ).records
    sl = cfg.pools[0].slo_limit
    limit = TpotLimit(
        {t.name: None if t.slo is None else t.slo.tpot_s for t in cfg.tiers},
        z=sl.tpot_margin_sd,
        half_life=sl.half_life,
        min_samples=sl.min_samples,
        min_spread=sl.min_spread,
    )
    limit.engines_changed(ENGINES)
    events: list[tuple[float, int, int]] = []  # (time, order, index): start, first, end
    for i in range(rec.arrival.size):
        if not rec.dispatched[i] <= rec.end[i]:
            continue
        events.append((float(rec.dispatched[i]), 0, i))
        if rec.first_token[i] <= rec.end[i]:
            events.append((float(rec.first_token[i]), 1, i))
        events.append((float(rec.end[i]), 2, i))
    events.sort()
    jobs: dict[int, Job] = {}
    trail: list[tuple[float, float]] = []
    known: tuple[float, int] | None = None
    for t, kind, i in events:
        if kind == 0:
            job = jobs[i] = Job(f"j{i}", "t", str(rec.tier[i]), int(rec.prompt[i]), 1)
            limit.started(job, t)
        elif kind == 1:
            jobs[i].first_token_at = t
            limit.first_token(jobs[i], t)
        else:
            done = bool(rec.completed[i])
            limit.ended(jobs.pop(i), t, int(rec.output[i]), done)
            per = limit.per_engine("interactive")
            if per != math.inf:
                trail.append((t, per))
                if known is None:
                    known = (t, limit.samples)
    if known is None or not trail:
        print("tpot_limit: never known")
        return
    before = [p for t, p in trail if t <= STEP_S]
    after = [(t, p) for t, p in trail if t > STEP_S]
    final = after[-1][1] if after else trail[-1][1]
    outside = [t for t, p in after if abs(p - final) > 0.1 * final]
    settled = (max(outside) - STEP_S) if outside else 0.0
    print(
        f"tpot_limit: known_after_s={known[0]:.1f} samples={known[1]} "
        f"before_step={before[-1] if before else math.nan:.0f} after_step={final:.0f} "
        f"settled_s={settled:.1f}"
    )


if __name__ == "__main__":
    main()
