"""The simulator's fast-forward is exact: with pure-decode stretches advanced in closed form
(:mod:`velvetrope.engine.fastforward`) a run makes the same decisions at the same times and
records the same per-request times, bit for bit, as one that steps every iteration — for
every built-in profile, with and without preemption, with client timeouts, with both
routers, and when step boundaries tie with arrivals, timeouts and other replicas' events."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from tests.sim.test_loop import STRESS_POLICY, stress_workload
from velvetrope.core import PolicyConfig
from velvetrope.engine import EngineProfile, list_profiles, load_profile
from velvetrope.engine.fastforward import RunCounts
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.prefixes import with_system_prompts
from velvetrope.sim.result import SimResult
from velvetrope.sim.trace_request import TraceRequest


def preempting(profile: EngineProfile) -> EngineProfile:
    """``profile`` with a 3,200-token KV cache: a busy replica preempts."""
    return profile.with_overrides(
        num_gpu_blocks=200, max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=2048
    )


def assert_same(a: SimResult, b: SimResult) -> None:
    assert a.decisions == b.decisions
    for f in fields(a.records):
        x, y = getattr(a.records, f.name), getattr(b.records, f.name)
        if x is None or y is None:  # an optional column a run did not fill
            assert x is None and y is None, f.name
        elif x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert np.array_equal(x, y), f.name
    assert a.pools == b.pools
    assert a.span_s == b.span_s
    for x, y in zip(a.samples, b.samples, strict=True):
        assert np.array_equal(x, y)


def both(*args: Any, **kw: Any) -> tuple[SimResult, SimResult]:
    """The run fast-forwarded and stepped; the stepped one applied no decode run."""
    ff = run_simulation(*args, **kw, record_decisions=True)
    step = run_simulation(*args, **kw, record_decisions=True, fast_forward=False)
    assert step.fast_forward == RunCounts()
    assert ff.fast_forward.steps > 0
    return ff, step


@pytest.mark.parametrize("preempt", [False, True], ids=["roomy", "preempting"])
@pytest.mark.parametrize(
    "name", [n for n in list_profiles() if not n.endswith("-vllm-v1")]
)  # the *-vllm-v1 profiles have the shape of the unsuffixed ones, other numbers
def test_fast_forward_equals_step_by_step(name: str, preempt: bool) -> None:
    profile = load_profile(name)
    if preempt:
        profile = preempting(profile)
    work = stress_workload(n=300, rate=20.0, seed=11)
    seen = RunCounts()
    for router, timeout in (("least_loaded", 4.0), ("round_robin", None)):
        ff, step = both(STRESS_POLICY, work, 2, profile, router=router, client_timeout_s=timeout)
        assert_same(ff, step)
        if preempt:
            assert sum(p.preemptions for p in ff.pools) > 0
        seen.whole += ff.fast_forward.whole
        seen.cut += ff.fast_forward.cut
    assert seen.whole > 0
    assert seen.cut > 0


@pytest.mark.parametrize("preempt", [False, True], ids=["roomy", "preempting"])
def test_fast_forward_equals_step_by_step_with_prefix_caching(preempt: bool) -> None:
    """Shared system prompts on engines with automatic prefix caching."""
    profile = load_profile("llama3-8b-h100").with_overrides(enable_prefix_caching=True)
    if preempt:
        profile = preempting(profile)
    work = with_system_prompts(stress_workload(n=300, rate=20.0, seed=12), 256)
    ff, step = both(STRESS_POLICY, work, 2, profile, client_timeout_s=4.0)
    assert_same(ff, step)
    assert ff.fast_forward.whole > 0
    assert ff.fast_forward.cut > 0


def test_fast_forward_equals_step_by_step_with_engine_readings() -> None:
    """The saturation rule and the recorded samples read every engine at each scrape: a
    decode run in progress is applied up to that moment first."""
    policy = STRESS_POLICY.model_copy(
        update={
            "saturation": STRESS_POLICY.saturation.model_copy(
                update={"enabled": True, "max_waiting": 1, "scrape_interval_s": 0.3}
            )
        }
    )
    work = stress_workload(n=300, rate=20.0, seed=13)
    ff, step = both(
        policy, work, 2, preempting(load_profile("llama3-8b-h100")), record_engines=True
    )
    assert_same(ff, step)
    assert ff.engines is not None and step.engines is not None
    for f in fields(ff.engines):
        assert np.array_equal(getattr(ff.engines, f.name), getattr(step.engines, f.name))
    assert ff.engines.waiting.sum() > 0  # the readings are not all idle
    assert ff.fast_forward.cut > 0


# Every step lasts exactly 1/4 s and arrivals fall on the same grid, so step boundaries
# tie with arrivals, client timeouts and the other replicas' step ends all the time.  The
# tight cache preempts; the roomy one admits what is dispatched at a tie at once (so a run
# cut one step too late or too early shows).
GRID = load_profile("llama3-8b-h100").with_overrides(
    name="grid",
    step_base_s=0.25,
    per_prefill_token_s=0.0,
    per_decode_seq_s=0.0,
    per_context_token_s=0.0,
    num_gpu_blocks=40,
    max_model_len=640,
    max_num_seqs=8,
    max_num_batched_tokens=1024,
)
ROOMY_GRID = GRID.with_overrides(name="roomy-grid", num_gpu_blocks=4000)

GRID_POLICY = PolicyConfig.model_validate(
    {
        "preset": "hybrid",
        "tiers": [{"name": "gold", "max_wait_s": 6.0}, {"name": "bronze", "max_wait_s": 9.0}],
        "tenants": [{"name": "a", "tier": "gold"}, {"name": "b", "tier": "bronze"}],
        "pools": [{"name": "default", "max_in_flight": 12}],
    }
)


def grid_workload(n: int, seed: int) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += 0.25 * int(rng.integers(0, 4))
        prompt, output = int(rng.integers(1, 400)), int(rng.integers(1, 120))
        out.append(TraceRequest(t, prompt, output, "ab"[i % 2], None, output + 10))
    return out


@pytest.mark.parametrize("profile", [GRID, ROOMY_GRID], ids=lambda p: p.name)
@pytest.mark.parametrize("router", ["least_loaded", "round_robin"])
@pytest.mark.parametrize("replicas", [1, 3])
def test_fast_forward_is_exact_when_times_tie(
    profile: EngineProfile, router: str, replicas: int
) -> None:
    work = grid_workload(250, seed=replicas)
    ff, step = both(GRID_POLICY, work, replicas, profile, router=router, client_timeout_s=5.0)
    assert_same(ff, step)
    assert ff.fast_forward.ties_inclusive > 0
    if replicas > 1 and router == "round_robin":
        assert ff.fast_forward.ties_exclusive > 0
    if profile is GRID:
        assert sum(p.preemptions for p in ff.pools) > 0
