"""Checking the start-up answer in the simulator: ``velvetrope plan --spike ... --verify``.

:func:`verify_startup` replays the spike the answer was computed for through
:func:`velvetrope.sim.loop.run_simulation` with the answer's settings: Poisson arrivals at
the design rate for :data:`~velvetrope.planner.startup.WARMUP_S`, ``k×`` for ``T``, the design
rate again for as long as the spike lasted (so the backlog can clear), lengths drawn from
the plan's length mix, each request in the top tier with probability ``f``; the ``priority``
preset (strict bands, as the answer assumes) with the two bands bounded as the answer says
and the lower one shedding what would wait longer than its patience; one pool of ``K``
slots per ready replica; KEDA on the gateway's queue depth with the answer's ScaledObject
(``minReplicaCount`` ``M``, threshold ``θ``) and a fixed start-up of ``S``.  It compares
what the model predicted with what the simulation measured: the top tier's p99 wait during
the spike, when the first new replica served, and the lower tiers' loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from velvetrope.core.policy import PolicyConfig
from velvetrope.planner.startup import WARMUP_S, StartupPlan
from velvetrope.planner.verify import mix_requests
from velvetrope.sim.autoscale import AutoscaleSpec
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.replicas import StartupDelay
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.traffic import DayCycle, Spike

__all__ = ["StartupCheck", "verify_startup"]


@dataclass(frozen=True, slots=True)
class StartupCheck:
    """Predicted against simulated (times in seconds after the spike starts)."""

    requests: int
    top_wait_p99_predicted: float
    top_wait_p99_simulated: float
    first_ready_predicted: float | None
    first_ready_simulated: float | None
    lower_lost_predicted: float
    lower_lost_simulated: int
    lower_offered_simulated: int
    top_lost_simulated: int

    def lines(self) -> list[str]:
        def s(x: float | None) -> str:
            return "never" if x is None else f"{x:.3g} s"

        return [
            f"verify: the spike simulated ({self.requests:,} requests, the real admission core "
            "and batchers, KEDA and the HPA as modelled)",
            f"  top tier p99 wait in the spike   predicted {s(self.top_wait_p99_predicted)}, "
            f"simulated {s(self.top_wait_p99_simulated)}; top-tier requests lost "
            f"{self.top_lost_simulated}",
            f"  first new replica serving        predicted {s(self.first_ready_predicted)}, "
            f"simulated {s(self.first_ready_simulated)}",
            f"  lower tiers lost in the spike    predicted {self.lower_lost_predicted:,.0f}, "
            f"simulated {self.lower_lost_simulated:,} of {self.lower_offered_simulated:,}",
        ]


def verify_startup(sp: StartupPlan, seed: int = 0) -> StartupCheck:
    """Simulate ``sp``'s spike with ``sp``'s settings (see the module docstring)."""
    plan = sp.plan
    lam = sp.base_rps
    curve = plan.curve
    duration = WARMUP_S + 2 * sp.duration_s
    rng = np.random.default_rng(seed)
    times = DayCycle(lam, 1.0, spikes=(Spike(WARMUP_S, sp.duration_s, sp.factor),)).times(
        rng, duration=duration
    )
    idx = rng.integers(0, len(curve.mix), size=times.size)
    work = mix_requests(curve, times, idx)
    mix = TenantMix([("top", "top", sp.top_share), ("lower", "lower", 1.0 - sp.top_share)])
    if sp.top_share < 1.0:
        work = mix.assign(work, seed + 1)
    else:
        work = TenantMix([("top", "top", 1.0)]).assign(work, seed + 1)
    m, k = sp.min_replicas, plan.concurrency
    policy = PolicyConfig.model_validate(
        {
            "preset": "priority",
            "tiers": [
                {"name": "top", "max_queued": max(1, sp.queue_bound_top)},
                {
                    "name": "lower",
                    "max_queued": max(1, sp.queue_bound_lower),
                    "max_wait_s": sp.lower_max_wait_s,
                },
            ],
            "tenants": [{"name": "top", "tier": "top"}, {"name": "lower", "tier": "lower"}],
            "pools": [{"name": "default", "max_in_flight": m * k}],
        }
    )
    spec = AutoscaleSpec(sp.scaled_object, startup=StartupDelay("fixed", sp.startup_s))
    res = run_simulation(policy, work, m, curve.profile, autoscale=spec, lengths="oracle")
    rec = res.records
    in_spike = (rec.arrival >= WARMUP_S) & (rec.arrival < WARMUP_S + sp.duration_s)
    top = in_spike & (rec.tier == "top")
    low = in_spike & (rec.tier == "lower")
    waits = np.nan_to_num(rec.dispatched[top & rec.completed] - rec.arrival[top & rec.completed])
    tr = res.autoscale
    assert tr is not None
    first = next((t - WARMUP_S for t, _, r in tr.samples if t >= WARMUP_S and r > m), None)
    return StartupCheck(
        requests=len(work),
        top_wait_p99_predicted=sp.top_wait_p99_s,
        top_wait_p99_simulated=float(np.percentile(waits, 99)) if waits.size else math.nan,
        first_ready_predicted=sp.first_ready_s,
        first_ready_simulated=first,
        lower_lost_predicted=sp.lower_shed,
        lower_lost_simulated=int(np.count_nonzero(low & ~rec.completed)),
        lower_offered_simulated=int(np.count_nonzero(low)),
        top_lost_simulated=int(np.count_nonzero(top & ~rec.completed)),
    )
