"""The simulated day that study (k) and ``bench/autoscale_bench.py`` share.

Traffic: the Azure conversation trace's request mix (whole rows: prompt and output lengths)
arriving as a :class:`~velvetrope.sim.traffic.DayCycle`: a mean of ``mean_rps``, four times
busier at 14:00 than at 02:00, with two spikes on top: 3× for 15 minutes at 10:00 and 2× for
10 minutes at 19:30.  Tenants: 20% interactive (``acme``), 30% standard (``globex``), 50%
batch (``initech``).

Fleet: Llama-3-70B on 4×H100 per replica (``llama3-70b-4xh100``), 128 requests in flight per
replica: what ``velvetrope plan --profile llama3-70b-4xh100 --trace azure_conv --peak-rps 9.6
--slo-p99 2s --slo-metric ttft`` sizes for the day's 14:00 peak at 5 req/s (2 replicas, 8.32
req/s each at 128 in flight, KEDA threshold 7 queued per replica).

Policy: the ``hybrid`` preset (tier bands weighted 10:2:1, VTC, SJF with aging); the tiers'
SLOs define goodput: interactive TTFT ≤ 2 s, standard TTFT ≤ 10 s, batch end-to-end ≤ 300 s;
each tier sheds at arrival what would wait longer than its ``max_wait_s`` (4, 15, 120 s).

Autoscaling: the shipped ``deploy/keda/scaledobject.yaml`` (2 to 8 replicas, polling 15 s,
scale up 2 pods per minute, scale down one pod per 5 minutes after a 10-minute window), with
the signal, the threshold and the start-up delay as the study varies them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.autoscale import AutoscaleSpec
from velvetrope.sim.inputs import prepare_workload
from velvetrope.sim.keda import load_scaled_object
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.replicas import StartupDelay
from velvetrope.sim.result import SimResult
from velvetrope.sim.tenant_mix import TenantMix
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traffic import DayCycle, Spike

__all__ = [
    "DAY_S",
    "GPUS_PER_REPLICA",
    "PLANNER_THRESHOLD",
    "PROFILE",
    "SEED_THRESHOLD",
    "SLOTS",
    "day_policy",
    "day_workload",
    "run_day",
    "scaled",
]

DAY_S = 86_400.0
PROFILE = "llama3-70b-4xh100"
GPUS_PER_REPLICA = 4
SLOTS = 128
PLANNER_THRESHOLD = 7
SEED_THRESHOLD = 8
MIX = TenantMix.parse("acme:interactive:0.2,globex:standard:0.3,initech:batch:0.5")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "keda" / "scaledobject.yaml"
QUERIES = {
    "queue_depth": 'sum(avg_over_time(velvetrope_queue_depth{pool="default"}[1m]))',
    "num_requests_waiting": "sum(avg_over_time(vllm:num_requests_waiting[1m]))",
    "gpu_utilization": "sum(avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m]))",
}


def day_policy(replicas: int = 2, slots: int = SLOTS) -> PolicyConfig:
    """The gateway's policy for ``replicas`` engines of ``slots`` in flight each."""
    return PolicyConfig.model_validate(
        {
            "preset": "hybrid",
            "queue": {"max_queued": 4000},
            "tiers": [
                {"name": "interactive", "weight": 10, "max_wait_s": 4, "slo": {"ttft_s": 2}},
                {"name": "standard", "weight": 2, "max_wait_s": 15, "slo": {"ttft_s": 10}},
                {"name": "batch", "weight": 1, "max_wait_s": 120, "slo": {"e2e_s": 300}},
            ],
            "tenants": [
                {"name": "acme", "tier": "interactive"},
                {"name": "globex", "tier": "standard"},
                {"name": "initech", "tier": "batch"},
            ],
            "pools": [{"name": "default", "max_in_flight": slots * replicas}],
        }
    )


def day_workload(mean_rps: float, seed: int = 0, hours: float = 24.0) -> list[TraceRequest]:
    """The day's requests (see the module docstring), over the first ``hours``."""
    day = DayCycle(
        mean_rps,
        peak_to_trough=4.0,
        peak_hour=14.0,
        spikes=(Spike(10 * 3600.0, 900.0, 3.0), Spike(19.5 * 3600.0, 600.0, 2.0)),
    )
    rows = prepare_workload("azure_conv")
    rng = np.random.default_rng(seed)
    from velvetrope.sim.traffic import with_mix

    work = with_mix(day.times(rng, duration=hours * 3600.0), rows, rng)
    return MIX.assign(work, seed)


def scaled(
    signal: str, threshold: float, startup_s: float, horizon_s: float, min_replicas: int = 2
) -> AutoscaleSpec:
    """The deploy ScaledObject on ``signal`` with ``threshold``, ``min_replicas`` (its
    ``minReplicaCount``, 2 as shipped) and a fixed start-up."""
    so = replace(load_scaled_object(DEPLOY), threshold=float(threshold), min_replicas=min_replicas)
    if signal != "queue_depth":
        so = replace(so, signals=(signal,), query=QUERIES[signal])
    return AutoscaleSpec(
        so,
        startup=StartupDelay("fixed", startup_s),
        gpus_per_replica=GPUS_PER_REPLICA,
        horizon_s=horizon_s,
    )


def run_day(
    work: list[TraceRequest],
    *,
    autoscale: AutoscaleSpec | None = None,
    replicas: int = 2,
    slots: int = SLOTS,
) -> SimResult:
    """One run of the day: autoscaled from 2 replicas, or a static fleet of ``replicas``."""
    return run_simulation(
        day_policy(replicas, slots), work, replicas, load_profile(PROFILE),
        autoscale=autoscale, label="simulated day",
    )  # fmt: skip
