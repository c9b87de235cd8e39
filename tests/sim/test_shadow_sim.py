"""Shadow mode in the simulator: the same controller code, so a run with ``enforce: false``
counts, as shadow rejections, exactly the bucket refusals an enforced run returns."""

from __future__ import annotations

from typing import Any

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest

PROFILE = load_profile("llama3-8b-h100")


def _policy(enforce: bool) -> PolicyConfig:
    d: dict[str, Any] = {
        "tiers": [{"name": "gold"}, {"name": "bronze"}],
        "tenants": [
            # a burst of 20 requests, refilled at 30/min, offered 3 per second
            {
                "name": "a",
                "tier": "gold",
                "enforce": enforce,
                "limits": {"requests_per_minute": 30, "request_burst": 20},
            },
            {"name": "b", "tier": "bronze"},
        ],
        "pools": [{"name": "default", "max_in_flight": 256}],
        "saturation": {"enabled": False},
    }
    return PolicyConfig.model_validate(d)


def test_shadow_counts_in_the_simulator_are_the_enforced_runs_refusals() -> None:
    work = [TraceRequest(i / 3.0, 200, 50, "a" if i % 2 else "b", None, 100) for i in range(240)]
    enforced = run_simulation(_policy(True), work, 2, PROFILE)
    shadow = run_simulation(_policy(False), work, 2, PROFILE)
    refused = enforced.overall().outcomes
    counts = shadow.records.shadow_counts()
    assert refused == {"rate_limited": counts[("gold", "rejected", "rate_limited")]}
    assert refused["rate_limited"] > 0
    assert counts[("gold", "admitted", "")] == 120 - refused["rate_limited"]
    assert shadow.overall().outcomes == {}  # every request was served
