"""Scenarios whose results are pinned byte for byte (``test_loop_golden``).

Each scenario is a :func:`~velvetrope.sim.loop.run_simulation` call exercising a part of the
loop: queueing, shedding, bucket limits, engine refusals, preemption, client timeouts (some
arriving at the same instant), deadlines, load rescaling, noisy predictions, prefix caching.
:func:`digest` hashes everything a run returns.  ``python -m tests.sim.golden`` prints the
digests of the code on the path: the pinned values were printed by the simulator's loop
before the event environment replaced it, so the test proves the two decide alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.sim.test_loop import SMALL
from tests.sim.test_loop import STRESS_POLICY as STRESS
from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.inputs import default_policy, prepare_workload
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.prefixes import with_system_prompts
from velvetrope.sim.result import SimResult
from velvetrope.sim.workload import TenantMix, TraceRequest

H100 = load_profile("llama3-8b-h100")
MIX = TenantMix.parse("gold:interactive:0.2,silver:standard:0.3,bronze:batch:0.5")


def _stress(
    n: int = 400, rate: float = 30.0, seed: int = 3, dup: bool = False
) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    times = Poisson(rate).times(seed, count=n)
    if dup:  # groups of three at one instant: their client timeouts fall together too
        times = np.repeat(times[::3], 3)[:n]
    out = []
    for i, t in enumerate(times.tolist()):
        prompt = int(rng.integers(20, 900))
        output = int(rng.integers(0, 300))
        if i == 1:
            prompt = 2040
        out.append(TraceRequest(t, prompt, output, "abc"[i % 3], None, max(output, 1) + 50))
    return out


def _conv() -> SimResult:
    work = prepare_workload("azure_conv", tenants=MIX, seed=1, limit=700)
    return run_simulation(
        default_policy(MIX, 2), work, 2, H100, load=1.3, lengths="noisy:0.5",
        client_timeout_s=20.0, seed=1, record_decisions=True,
    )  # fmt: skip


def _prefix() -> SimResult:
    work = with_system_prompts(prepare_workload("azure_code", tenants=MIX, limit=500), 800)
    prof = H100.with_overrides(enable_prefix_caching=True)
    return run_simulation(
        default_policy(MIX, 1, "fifo"), work, 1, prof, load=1.1, record_decisions=True
    )


def _least_loaded() -> SimResult:
    work = _stress()
    return run_simulation(
        STRESS, work, 2, SMALL, lengths="oracle", client_timeout_s=4.0, record_decisions=True
    )


def _round_robin() -> SimResult:
    work = _stress()
    return run_simulation(STRESS, work, 2, SMALL, router="round_robin", record_decisions=True)


def _same_instant() -> SimResult:
    work = _stress(dup=True, rate=60.0)
    return run_simulation(STRESS, work, 3, SMALL, client_timeout_s=2.5, record_decisions=True)


ROUTED = PolicyConfig.model_validate(
    {
        "preset": "priority",
        "queue": {"max_queued": 60},
        "tiers": [
            {
                "name": "gold",
                "max_wait_s": 2.0,
                "degrade": {"wait_s": 0.5, "max_tokens": 64, "pool": "short"},
            },
            {"name": "bronze", "max_wait_s": 6.0},
        ],
        "tenants": [
            {"name": "a", "tier": "gold"},
            {"name": "b", "tier": "bronze"},
            {"name": "c", "tier": "bronze"},
        ],
        "pools": [
            {"name": "long", "max_in_flight_per_engine": 6},
            {"name": "short", "max_in_flight_per_engine": 5},
        ],
        "routes": [{"name": "short-answers", "pool": "short", "max_predicted_output": 120}],
    }
)


def _routed() -> SimResult:
    work = _stress(n=500, rate=40.0, seed=5)
    return run_simulation(
        ROUTED, work, {"long": 2, "short": 1}, SMALL, lengths="oracle", client_timeout_s=5.0,
        record_decisions=True, record_engines=True,
    )  # fmt: skip


SCENARIOS: dict[str, Callable[[], SimResult]] = {
    "stress-least-loaded": _least_loaded,
    "stress-round-robin": _round_robin,
    "stress-same-instant": _same_instant,
    "conv-overload": _conv,
    "code-prefix": _prefix,
    "routes-degrade-engines": _routed,
}


def digest(res: SimResult) -> str:
    """SHA-256 over the decision log, every per-request array, the span, the pools' stats
    and the samples."""
    h = hashlib.sha256()
    h.update(repr(res.decisions).encode())
    for f in dataclasses.fields(res.records):
        h.update(f.name.encode())
        h.update(np.ascontiguousarray(getattr(res.records, f.name)).tobytes())
    h.update(repr(res.span_s).encode())
    h.update(repr(res.pools).encode())
    for a in res.samples:
        h.update(np.ascontiguousarray(a).tobytes())
    engines = getattr(res, "engines", None)
    if engines is not None:
        for f in dataclasses.fields(engines):
            h.update(np.ascontiguousarray(getattr(engines, f.name)).tobytes())
    return h.hexdigest()[:40]


def current() -> dict[str, Any]:
    return {name: digest(fn()) for name, fn in SCENARIOS.items()}


if __name__ == "__main__":
    for name, d in current().items():
        print(f'    "{name}": "{d}",')
