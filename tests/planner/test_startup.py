"""The start-up question: minReplicaCount for the top tier, the threshold and bounds, the gap."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from tests.planner.test_sizing import CURVE, workload
from velvetrope.cli import app
from velvetrope.errors import PolicyError
from velvetrope.planner.plan import P99Target
from velvetrope.planner.sizing import make_plan
from velvetrope.planner.startup import plan_startup, top_p99_wait

PLAN = make_plan(workload(10.0), CURVE, P99Target("wait", 4.0))
TIGHT = make_plan(workload(10.0), CURVE, P99Target("wait", 0.3))


def test_top_tier_wait_is_mm1_on_the_fleet_throughput() -> None:
    # rho 0.5 at 10 req/s of slot releases: ln(50) / (10 x 0.5)
    assert top_p99_wait(5.0, 10.0) == pytest.approx(math.log(50.0) / 5.0)
    assert top_p99_wait(0.05, 10.0) == 0.0  # rho 0.005: 99 % start at once
    assert top_p99_wait(10.0, 10.0) == math.inf


def test_min_replicas_is_the_fewest_that_hold_the_top_tier() -> None:
    sp = plan_startup(TIGHT, factor=6.0, duration_s=600, startup_s=120, top_share=0.5)
    x = TIGHT.per_replica_rps
    m = sp.min_replicas
    assert m > TIGHT.replicas  # the spike, not the plain day, binds
    assert top_p99_wait(sp.top_rps, m * x) <= TIGHT.wait_budget_s
    assert top_p99_wait(sp.top_rps, (m - 1) * x) > TIGHT.wait_budget_s
    assert sp.top_rps == pytest.approx(0.5 * 6.0 * 10.0)
    # a small top tier needs no more than the plan
    small = plan_startup(TIGHT, factor=6.0, duration_s=600, startup_s=120, top_share=0.01)
    assert small.min_replicas == TIGHT.replicas


def test_threshold_lets_a_full_queue_ask_for_the_spike() -> None:
    sp = plan_startup(PLAN, factor=3.0, duration_s=600, startup_s=90)
    assert sp.spike_replicas == math.ceil(30.0 / (PLAN.per_replica_rps * PLAN.rho_target))
    assert sp.threshold <= (sp.queue_bound_top + sp.queue_bound_lower) // sp.spike_replicas
    assert sp.threshold <= PLAN.keda_threshold
    assert sp.scaled_object.threshold == sp.threshold
    assert sp.scaled_object.min_replicas == sp.min_replicas
    assert sp.scaled_object.max_replicas == sp.spike_replicas


def test_a_longer_start_up_costs_the_lower_tiers_and_delays_serving() -> None:
    fast = plan_startup(PLAN, factor=3.0, duration_s=600, startup_s=90)
    slow = plan_startup(PLAN, factor=3.0, duration_s=600, startup_s=180)
    assert fast.first_ask_s == slow.first_ask_s
    assert fast.first_ready_s is not None and slow.first_ready_s is not None
    assert slow.first_ready_s - fast.first_ready_s == 90.0
    assert slow.lower_shed > fast.lower_shed > 0
    assert fast.top_shed == slow.top_shed == 0.0
    assert fast.lower_offered == pytest.approx(0.8 * 30.0 * 600)


def test_a_spike_the_fleet_absorbs_loses_nothing() -> None:
    sp = plan_startup(PLAN, factor=1.05, duration_s=600, startup_s=120)
    assert sp.lower_shed == 0.0
    assert sp.first_ask_s is None


def test_bad_inputs() -> None:
    with pytest.raises(PolicyError):
        plan_startup(PLAN, factor=0.0, duration_s=60, startup_s=10)
    with pytest.raises(PolicyError):
        plan_startup(PLAN, factor=2.0, duration_s=60, startup_s=-1)
    with pytest.raises(PolicyError):
        plan_startup(PLAN, factor=2.0, duration_s=60, startup_s=1, top_share=1.5)


def test_plan_prints_the_answer() -> None:
    runner = CliRunner()
    args = ["plan", "--trace", "azure_code", "--service-model", "analytic", "--spike", "3",
            "--startup", "180s", "--spike-duration", "5m"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "start-up: a spike of 3×" in result.output
    assert "minReplicaCount" in result.output and "lower tiers lose" in result.output
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["startup"]["startup_s"] == 180.0
    assert doc["startup"]["threshold"] >= 1


def test_the_simulator_confirms_the_answer() -> None:
    from velvetrope.planner.startup_verify import verify_startup

    sp = plan_startup(PLAN, factor=3.0, duration_s=600, startup_s=90)
    chk = verify_startup(sp)
    assert chk.top_lost_simulated == 0
    assert chk.top_wait_p99_simulated <= PLAN.wait_budget_s
    assert chk.first_ready_predicted is not None and chk.first_ready_simulated is not None
    # the simulated queue reaches the threshold within a sync or two of the fluid model's
    assert 0 <= chk.first_ready_simulated - chk.first_ready_predicted <= 30
    assert chk.lower_lost_simulated == pytest.approx(chk.lower_lost_predicted, rel=0.25)
    assert chk.lower_offered_simulated == pytest.approx(sp.lower_offered, rel=0.05)
    assert "predicted" in "\n".join(chk.lines())


def test_plan_verifies_the_answer_in_json() -> None:
    args = ["plan", "--trace", "azure_code", "--service-model", "analytic", "--spike", "2",
            "--spike-duration", "3m", "--verify", "--verify-requests", "200", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    check = json.loads(result.output)["startup"]["verify"]
    assert check["top_lost_simulated"] == 0 and check["requests"] > 0
