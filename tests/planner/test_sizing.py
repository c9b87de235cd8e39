"""Sizing: the seed's worked examples, minimality, monotonicity, admission settings, JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.planner.plan import P99Target
from velvetrope.planner.plan_report import plan_to_dict
from velvetrope.planner.predict import predict
from velvetrope.planner.rules import (
    queue_bound,
    queue_depth_rule_of_thumb,
    replicas_for_utilisation,
    seed_keda_equivalent,
)
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.service_methods import (
    analytic_service_curve,
    curve_from_measurements,
    measure_service_curve,
)
from velvetrope.planner.sizing import (
    gpus_per_replica,
    make_plan,
    replicas_needed,
    service_floor_p99,
)
from velvetrope.planner.workload import PlanWorkload, Tenant

PROFILE = load_profile("llama3-8b-h100")
RNG = np.random.default_rng(9)
PROMPT = np.rint(RNG.lognormal(np.log(1000), 0.6, 300)).astype(np.int64) + 1
OUTPUT = np.rint(RNG.lognormal(np.log(130), 0.7, 300)).astype(np.int64) + 1
CURVE = analytic_service_curve(PROFILE, PROMPT, OUTPUT)
BURSTY = np.cumsum(np.where(RNG.random(4000) < 0.9, RNG.exponential(0.1, 4000), 9.1))


def workload(rps: float, tenants: tuple[Tenant, ...] = (Tenant("default", 1.0),)) -> PlanWorkload:
    return PlanWorkload(
        name="test",
        source="test",
        design_rps=rps,
        design_rate_origin="test",
        mean_rps=None,
        arrival_scv=1.0,
        prompt=PROMPT,
        output=OUTPUT,
        prompt_p50=1000.0,
        prompt_p99=4000.0,
        output_p50=130.0,
        output_p99=600.0,
        tenants=tenants,
    )


# --------------------------------------------------------------------------- seed examples


def test_seed_example_seven_gpus() -> None:
    # 50 req/s peak at 12 req/s per worker and ρ = 0.6: ceil(50 / 7.2) = 7.
    assert replicas_for_utilisation(50, 12, 0.6) == 7
    assert replicas_for_utilisation(36, 10, 0.6) == 6  # 6.000…: no extra replica for rounding
    assert replicas_for_utilisation(0.1, 12, 0.6) == 1
    for bad in ((0, 12, 0.6), (50, 0, 0.6), (50, 12, 1.0), (50, 12, 0.0)):
        with pytest.raises(PolicyError):
            replicas_for_utilisation(*bad)


def test_seed_example_seven_gpus_through_the_planner() -> None:
    # A worker whose throughput at 32 in flight is exactly 12 req/s, a loose SLO: the plan is
    # the seed's arithmetic, and the ρ bound is what binds.
    curve = curve_from_measurements(PROFILE, PROMPT, OUTPUT, [1, 32], [0.5, 12.0])
    plan = make_plan(workload(50.0), curve, P99Target("wait", 60.0), concurrency=32)
    assert (plan.replicas, plan.binding, plan.gpus) == (7, "rho", 7)
    assert plan.at.rho == pytest.approx(50 / (7 * 12))


def test_queue_bound_formula_and_the_seed_example() -> None:
    # S = 800 ms, p99 budget L = 4 s, 32 in flight: a slot frees every S/32 = 25 ms, so the
    # request at depth Q starts after Q × 25 ms; with the whole budget for waiting that is
    # 160, with L − S = 3.2 s left after its own service 128.  The seed's rule of thumb
    # (L/S) × concurrency × 1.5 gives its 240.
    assert queue_depth_rule_of_thumb(4.0, 0.8, 32) == 240
    assert queue_depth_rule_of_thumb(4.0, 0.8, 1) == 7  # 7.5: floored
    for bad in ((0.0, 0.8, 32), (4.0, 0.0, 32), (4.0, 0.8, 0)):
        with pytest.raises(PolicyError):
            queue_depth_rule_of_thumb(*bad)
    assert queue_bound(0.8, 4.0 - 0.8, 32) == 128
    assert queue_bound(0.8, 4.0, 32) == 160
    assert queue_bound(0.8, -1.0, 32) == 0
    assert queue_bound(0.1, 0.3, 1) == 3  # 2.9999… from rounding still counts as 3
    with pytest.raises(PolicyError):
        queue_bound(0.0, 1.0, 1)
    with pytest.raises(PolicyError):
        queue_bound(1.0, 1.0, 0)


def test_gpus_per_replica_from_the_profile_name() -> None:
    assert gpus_per_replica("llama3-70b-4xh100") == 4
    assert gpus_per_replica("llama3-8b-h100") == 1
    assert gpus_per_replica("custom", "Llama on 8x A100") == 8


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize("metric", ["e2e", "ttft", "wait"])
def test_plan_is_the_fewest_replicas_meeting_slo_and_rho(metric: str) -> None:
    lam = 60.0
    bound = {"e2e": 9.0, "ttft": 0.4, "wait": 0.05}[metric]
    slo = P99Target(metric, bound)  # type: ignore[arg-type]
    plan = make_plan(workload(lam), CURVE, slo, tier="batch")
    k, n = plan.concurrency, plan.replicas
    assert plan.at.p99(slo.metric) <= bound
    assert plan.at.rho <= 0.85 + 1e-12
    fewer = predict(CURVE, lam, n - 1, k)
    assert (not fewer.stable) or fewer.rho > 0.85 or fewer.p99(slo.metric) > bound
    # and no other concurrency tried does better
    assert all(m is None or m >= n for _, m in plan.candidates)


def test_slo_binding_plan_exceeds_the_rho_bound() -> None:
    bound = 1.1 * service_floor_p99(CURVE, "e2e")  # tight: only more replicas can meet it
    plan = make_plan(workload(60.0), CURVE, P99Target("e2e", bound), concurrency=64)
    assert plan.binding == "slo"
    assert plan.replicas > plan.replicas_for_rho
    assert plan.at.e2e_p99_s <= bound
    assert plan.one_fewer is not None and plan.one_fewer.e2e_p99_s > bound


def test_unreachable_slo_is_an_error() -> None:
    floor = service_floor_p99(CURVE, "e2e")
    assert floor > 1.0
    with pytest.raises(PolicyError, match="cannot be met"):
        make_plan(workload(10.0), CURVE, P99Target("e2e", 0.9 * floor))
    plan = make_plan(workload(10.0), CURVE, P99Target("e2e", 1.2 * floor))  # just above: feasible
    assert plan.at.e2e_p99_s <= 1.2 * floor
    with pytest.raises(PolicyError, match="more than 6 replicas"):
        replicas_needed(CURVE, 40.0, 64, P99Target("e2e", 1.05 * floor), 0.6, max_replicas=6)
    with pytest.raises(PolicyError, match="utilisation bound alone needs"):
        replicas_needed(CURVE, 40.0, 64, P99Target("e2e", 60.0), 0.6, max_replicas=3)


def test_tier_defaults_and_errors() -> None:
    a = make_plan(workload(30.0), CURVE, P99Target("wait", 5.0), tier="interactive")
    b = make_plan(workload(30.0), CURVE, P99Target("wait", 5.0), tier="batch")
    assert (a.rho_target, b.rho_target) == (0.6, 0.85)
    assert b.replicas <= a.replicas
    with pytest.raises(PolicyError, match="no default utilisation"):
        make_plan(workload(30.0), CURVE, P99Target("wait", 5.0), tier="gold")
    assert make_plan(workload(30.0), CURVE, P99Target("wait", 5.0), tier="gold", rho_target=0.5)
    with pytest.raises(PolicyError):
        P99Target("latency", 1.0)  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        P99Target("e2e", 0.0)


@settings(max_examples=25, deadline=None)
@given(st.floats(1.0, 150.0), st.floats(1.0, 150.0), st.sampled_from(["e2e", "wait", "ttft"]))
def test_more_load_never_needs_fewer_replicas(l1: float, l2: float, metric: str) -> None:
    lo, hi = sorted((l1, l2))
    slo = P99Target(metric, {"e2e": 10.0, "wait": 0.5, "ttft": 0.5}[metric])  # type: ignore[arg-type]
    assert (
        make_plan(workload(hi), CURVE, slo).replicas >= make_plan(workload(lo), CURVE, slo).replicas
    )


@settings(max_examples=15, deadline=None)
@given(st.floats(1.0, 150.0), st.floats(1.0, 150.0))
def test_more_load_never_needs_fewer_replicas_with_bursty_arrivals(l1: float, l2: float) -> None:
    lo, hi = sorted((l1, l2))
    bursty = dataclasses.replace(workload(lo), arrival_pattern=BURSTY)
    slo = P99Target("wait", 1.0)
    a = make_plan(bursty, CURVE, slo)
    b = make_plan(bursty.with_design_rate(hi, "test"), CURVE, slo)
    assert b.replicas >= a.replicas
    assert b.at.wait_sample.size == a.at.wait_sample.size == BURSTY.size


@settings(max_examples=25, deadline=None)
@given(st.floats(6.5, 30.0), st.floats(6.5, 30.0), st.floats(5.0, 120.0))
def test_tighter_slo_never_needs_fewer_replicas(s1: float, s2: float, lam: float) -> None:
    tight, loose = sorted((s1, s2))
    a = make_plan(workload(lam), CURVE, P99Target("e2e", tight), tier="batch")
    b = make_plan(workload(lam), CURVE, P99Target("e2e", loose), tier="batch")
    assert a.replicas >= b.replicas


# --------------------------------------------------------------------------- settings


def test_buckets_queue_bound_and_keda() -> None:
    tenants = (Tenant("big", 0.75), Tenant("small", 0.25))
    plan = make_plan(workload(40.0, tenants), CURVE, P99Target("e2e", 10.0), gpus=2)
    n, x, tok = plan.replicas, plan.per_replica_rps, plan.tokens_per_request
    assert plan.gpus == 2 * n
    assert tok == pytest.approx(float(np.mean(PROMPT + OUTPUT)))
    big, small = plan.buckets
    # the seed's rule: sustainable tok/s per GPU × GPUs × 0.7, capacity 4 × refill
    per_gpu = x * tok / 2
    assert big.rule_refill_tps == pytest.approx(per_gpu * plan.gpus * 0.7)
    assert big.rule_capacity_tokens == pytest.approx(4 * big.rule_refill_tps)
    # the model: shares of the token rate at the target ρ add up to it
    assert big.model_refill_tps + small.model_refill_tps == pytest.approx(0.6 * n * x * tok)
    assert big.model_refill_tps == pytest.approx(3 * small.model_refill_tps)
    spare = (1 - plan.at.rho) * n * x * plan.wait_budget_s
    assert big.model_capacity_tokens == pytest.approx(min(plan.queue_bound_pool, spare) * tok)
    # queue bound: ⌊N·K·W_b/S⌋ with W_b = L − S for an end-to-end SLO
    s = plan.at.service_mean_s
    assert plan.wait_budget_s == pytest.approx(10.0 - s)
    assert plan.queue_bound_pool == math.floor(n * plan.concurrency * (10.0 - s) / s + 1e-9)
    assert plan.keda_threshold == max(1, math.floor(x * plan.wait_budget_s / 2))
    # the seed's rules beside the model's: queue depth (L/S) × concurrency × 1.5 with L the
    # SLO's p99, and its 8 waiting per engine as the gateway depth that drains as fast
    assert plan.rule_queue_bound_pool == math.floor(10.0 / s * n * plan.concurrency * 1.5 + 1e-9)
    assert plan.rule_queue_bound_per_replica == math.floor(10.0 / s * plan.concurrency * 1.5 + 1e-9)
    assert plan.seed_keda_threshold == max(1, round(8 * x / CURVE.max_throughput_rps))


def test_seed_keda_equivalent() -> None:
    assert seed_keda_equivalent(9.0, 9.0) == 8  # at saturation: the same 8
    assert seed_keda_equivalent(4.5, 9.0) == 4  # half as fast: 4 drain in the same time
    assert seed_keda_equivalent(0.1, 9.0) == 1  # never below one request
    for bad in ((0.0, 9.0), (10.0, 9.0), (math.nan, 9.0)):
        with pytest.raises(PolicyError):
            seed_keda_equivalent(*bad)


def test_json_schema() -> None:
    curve: ServiceCurve = CURVE
    plan = make_plan(workload(5.0), curve, P99Target("wait", 2.0))
    doc = plan_to_dict(plan)
    text = json.dumps(doc, allow_nan=False)  # no NaN/inf leaks into JSON
    back = json.loads(text)
    assert back["schema"] == 1
    assert set(back) == {
        "schema",
        "inputs",
        "service",
        "plan",
        "latency",
        "queue",
        "buckets",
        "warnings",
        "keda",
    }
    assert back["warnings"] == []
    assert back["inputs"]["slo"] == {"metric": "wait", "p99_s": 2.0}
    p = back["plan"]
    assert isinstance(p["replicas"], int) and p["replicas"] == plan.replicas
    assert p["max_in_flight"] == plan.replicas * plan.concurrency
    assert p["binding"] in ("rho", "slo")
    lat = back["latency"]["at"]
    for key in ("wait_p50_s", "wait_p99_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s"):
        assert isinstance(lat[key], float)
    assert lat["e2e_p99_s"] >= lat["e2e_p50_s"] > 0
    fewer = back["latency"]["one_fewer"]
    assert fewer is None or fewer["replicas"] == plan.replicas - 1
    assert {"rule_of_thumb", "model"} <= set(back["buckets"][0])
    assert back["keda"]["threshold_per_replica"] >= 1
    assert back["keda"]["seed_rule"]["vllm_num_requests_waiting"] == 8
    assert back["queue"]["rule_of_thumb"]["bound_pool"] == plan.rule_queue_bound_pool
    assert len(back["service"]["concurrency"]) == len(back["service"]["throughput_rps"])


def test_json_writes_null_for_an_overloaded_smaller_fleet() -> None:
    # One replica fewer than the ρ bound allows can be past saturation: latencies are null.
    curve = curve_from_measurements(PROFILE, PROMPT, OUTPUT, [1, 32], [0.5, 12.0])
    slo = P99Target("wait", 60.0)
    plan = make_plan(workload(23.0), curve, slo, concurrency=32, rho_target=0.99)
    assert plan.replicas == 2 and plan.one_fewer is not None and not plan.one_fewer.stable
    doc = json.loads(json.dumps(plan_to_dict(plan), allow_nan=False))
    assert doc["latency"]["one_fewer"]["e2e_p99_s"] is None
    assert doc["latency"]["one_fewer"]["stable"] is False


def test_warnings_name_where_the_model_is_weak() -> None:
    bursty = dataclasses.replace(workload(20.0), arrival_scv=9.0)
    plan = make_plan(bursty, CURVE, P99Target("wait", 2.0))
    assert len(plan.warnings) == 1 and "bursty (C_a² = 9" in plan.warnings[0]
    # with the arrivals themselves, bursts are replayed: the warning is about end-to-end
    bursts = np.repeat(np.arange(30.0) * 600, 600)  # 600 at once every 600 s: 1 req/s
    replayed = dataclasses.replace(bursty, arrival_pattern=bursts)
    plan = make_plan(replayed, CURVE, P99Target("wait", 60.0), concurrency=16)
    assert plan.at.p_wait > 0.01
    assert len(plan.warnings) == 1 and "arrivals come in bursts" in plan.warnings[0]
    smooth = dataclasses.replace(replayed, arrival_pattern=np.arange(2000.0), arrival_scv=0.0)
    assert make_plan(smooth, CURVE, P99Target("wait", 60.0), concurrency=16).warnings == ()
    ttft = make_plan(workload(20.0), CURVE, P99Target("ttft", 2.0)).warnings
    assert len(ttft) == 1 and "time to first token was measured" in ttft[0]
    long = dataclasses.replace(
        workload(5.0), prompt=np.array([9000, 100]), output=np.array([10, 0])
    )
    curve = analytic_service_curve(PROFILE, long.prompt, long.output)
    plan = make_plan(long, curve, P99Target("wait", 2.0))
    # the long prompt was cut; the one with no output is prompt-only work, not cut
    assert any("1 of 2 requests exceed max_model_len 8192" in w for w in plan.warnings)
    tiny_kv = PROFILE.with_overrides(num_gpu_blocks=600, max_num_seqs=64)  # 9600 KV tokens
    curve = measure_service_curve(tiny_kv, PROMPT, OUTPUT, min_completions=100)
    plan = make_plan(workload(5.0), curve, P99Target("wait", 5.0), concurrency=64)
    assert any("preempts at concurrency" in w for w in plan.warnings), plan.warnings
