"""The simulator's engines in vLLM's priority mode, fed the priority the gateway forwards."""

from __future__ import annotations

from typing import Any

import numpy as np

from velvetrope.core import PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import SimResult
from velvetrope.sim.trace_request import TraceRequest

# two sequences at once: whatever else is dispatched waits in the engine's own queue
TINY = load_profile("llama3-8b-h100").with_overrides(max_num_seqs=2)


def _policy(engine_priority: bool) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "tiers": [{"name": "hi"}, {"name": "lo"}],
            "tenants": [{"name": "h", "tier": "hi"}, {"name": "l", "tier": "lo"}],
            "pools": [
                {"name": "default", "max_in_flight": 1000, "engine_priority": engine_priority}
            ],
            "saturation": {"enabled": False},
        }
    )


# ten low-tier requests, then one high-tier request behind them
WORK = [TraceRequest(0.001 * i, 100, 50, "l") for i in range(10)] + [
    TraceRequest(0.02, 100, 50, "h")
]


def _run(engine_priority: bool, scheduling: str, **kw: Any) -> SimResult:
    return run_simulation(
        _policy(engine_priority), WORK, 1, TINY, engine_scheduling=scheduling, **kw
    )


def _rank_of_hi(res: SimResult) -> int:
    """How many low-tier requests got their first token before the high-tier one."""
    first = res.records.first_token
    return int(np.sum(first[:10] < first[10]))


def test_the_forwarded_tier_orders_the_engines_queue() -> None:
    assert _rank_of_hi(_run(True, "priority")) == 2  # only the two already running
    assert _rank_of_hi(_run(False, "priority")) == 10  # no priority sent: arrival order
    assert _rank_of_hi(_run(True, "fcfs")) == 10  # an FCFS engine ignores it


def test_priority_mode_is_the_same_with_and_without_fast_forward() -> None:
    a = _run(True, "priority").records
    b = _run(True, "priority", fast_forward=False).records
    assert np.array_equal(a.first_token, b.first_token)
    assert np.array_equal(a.end, b.end)
