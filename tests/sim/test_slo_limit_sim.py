"""The SLO-derived limits in the simulator, which runs the gateway's own controller on the
engine model: the TPOT limit keeps a tight TPOT objective that engines left to themselves
break, and the headroom keeps the top tier's TTFT under an overload of lower-tier work."""

from __future__ import annotations

from typing import Any

import numpy as np

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest

TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 1.0, "tpot_s": 0.03}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]
TENANTS = [{"name": "a", "tier": "interactive"}, {"name": "b", "tier": "batch"}]


def _workload(n: int, rate: float, share_top: float, seed: int) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    out = []
    for i in range(n):
        top = rng.random() < share_top
        out.append(
            TraceRequest(
                t=float(t[i]),
                prompt_tokens=int(rng.integers(100, 800)),
                output_tokens=int(rng.integers(50, 400)),
                tenant="a" if top else "b",
            )
        )
    return out


def _run(
    pool: dict[str, Any], scheduling: str, reqs: list[TraceRequest], tpot_s: float = 0.03
) -> Any:
    tiers = [{**TIERS[0], "slo": {"ttft_s": 1.0, "tpot_s": tpot_s}}, TIERS[1]]
    cfg = PolicyConfig.model_validate(
        {
            "tiers": tiers,
            "tenants": TENANTS,
            "queue": {"bands": "strict"},
            "pools": [{"name": "default", **pool}],
            "saturation": {"scrape_interval_s": 0.25, "stale_after_s": 3},
        }
    )
    return run_simulation(
        cfg, reqs, 1, load_profile("llama3-8b-a100"), seed=1, engine_scheduling=scheduling
    ).records


def _tpot_misses(rec: Any) -> tuple[int, int]:
    done = rec.completed & (rec.tier == "interactive")
    tpot = rec.tpot()[done]
    tpot = tpot[~np.isnan(tpot)]
    return int((tpot > 0.03).sum()), int(tpot.size)


def test_the_tpot_limit_keeps_a_tight_tpot_objective() -> None:
    reqs = _workload(1500, 14.0, 0.3, seed=3)  # an overload of one A100 engine
    free, _ = _tpot_misses(
        _run({"max_in_flight": 100_000, "limit": "fixed"}, "fcfs", reqs)
    )  # saturation rule only: the engine runs all its seats
    held, total = _tpot_misses(_run({}, "fcfs", reqs))
    assert total > 300
    assert free > 10 * max(1, held), (free, held)
    assert held <= 0.01 * total, (held, total)


def test_headroom_and_ceilings_keep_the_top_tiers_ttft() -> None:
    """Against the saturation brake alone (which holds every tier alike), on an overload
    of which the top tier is 40%: more top-tier requests within their TTFT."""
    reqs = _workload(1500, 25.0, 0.4, seed=5)
    ttft_ok = {}
    for mode, pool in (
        ("slo", {"engine_priority": True}),
        ("fixed", {"engine_priority": True, "max_in_flight": 100_000, "limit": "fixed"}),
    ):
        rec = _run(pool, "priority", reqs, tpot_s=0.2)
        top = rec.tier == "interactive"
        ttft = rec.ttft()[top & rec.completed]
        ttft_ok[mode] = int((ttft <= 1.0).sum())
    assert ttft_ok["slo"] > ttft_ok["fixed"], ttft_ok
