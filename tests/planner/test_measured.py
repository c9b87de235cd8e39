"""Sizing from a measured throughput: the seed's 7 workers, the ρ warning, waits, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.errors import PolicyError
from velvetrope.planner.measured import measured_plan_to_dict, plan_from_throughput
from velvetrope.planner.plan import P99Target
from velvetrope.planner.queueing_general import gdc_waits
from velvetrope.planner.sizing import make_plan
from velvetrope.planner.workload import parse_workload

runner = CliRunner()

RNG = np.random.default_rng(4)
BURSTY = np.cumsum(np.where(RNG.random(8000) < 0.9, RNG.exponential(0.1, 8000), 9.1))
BURSTY = BURSTY / BURSTY[-1] * BURSTY.size  # 1 req/s


def test_the_seed_example_needs_no_profile() -> None:
    p = plan_from_throughput(50.0, 12.0, rho_target=0.6, tier="interactive")
    assert (p.replicas, p.replicas_for_rho) == (7, 7)
    assert p.rho == pytest.approx(50 / 84) and p.rho_one_fewer == pytest.approx(50 / 72)
    assert p.warnings == () and p.wait_p99_s is None and p.concurrency is None


def test_a_target_rho_above_085_is_warned_about() -> None:
    assert plan_from_throughput(50.0, 12.0, rho_target=0.85).warnings == ()
    (w,) = plan_from_throughput(50.0, 12.0, rho_target=0.9).warnings
    assert "target ρ 0.9 > 0.85" in w


def test_the_wait_slo_grows_the_fleet_on_bursty_arrivals() -> None:
    lam, x, k = 40.0, 12.0, 16
    slo = P99Target("wait", 0.1)
    p = plan_from_throughput(lam, x, rho_target=0.6, concurrency=k, slo=slo, arrival_pattern=BURSTY)
    assert p.replicas > p.replicas_for_rho  # the SLO binds, not ρ

    def p99(n: int) -> float:
        w = np.sort(gdc_waits(BURSTY / lam, n * k, k / x))
        return float(w[math.ceil(0.99 * w.size) - 1])

    assert p.slot_s == pytest.approx(k / x)
    assert p.wait_p99_s is not None and p.wait_p99_one_fewer_s is not None
    assert p.wait_p99_s == pytest.approx(p99(p.replicas))
    assert p.wait_p99_s <= 0.1
    assert p.wait_p99_one_fewer_s == pytest.approx(p99(p.replicas - 1))
    assert p.wait_p99_one_fewer_s > 0.1
    assert p.queue_bound_pool == math.floor(p.replicas * k * 0.1 / (k / x) + 1e-9)
    assert p.rule_queue_bound_pool == math.floor(0.1 / (k / x) * p.replicas * k * 1.5 + 1e-9)
    assert p.keda_threshold == max(1, math.floor(x * 0.1 / 2))
    doc = json.loads(json.dumps(measured_plan_to_dict(p), allow_nan=False))
    assert doc["mode"] == "measured" and doc["plan"]["replicas"] == p.replicas


def test_what_needs_an_engine_model_is_refused() -> None:
    with pytest.raises(PolicyError, match="needs an engine profile"):
        plan_from_throughput(50.0, 12.0, rho_target=0.6, concurrency=8, slo=P99Target("e2e", 9.0))
    with pytest.raises(PolicyError, match="needs --concurrency"):
        plan_from_throughput(50.0, 12.0, rho_target=0.6, slo=P99Target("wait", 2.0))
    with pytest.raises(PolicyError):
        plan_from_throughput(50.0, 0.0, rho_target=0.6)


def test_the_full_planner_warns_about_a_high_target_rho_too() -> None:
    from velvetrope.engine import load_profile
    from velvetrope.planner.service_methods import analytic_service_curve

    wl = parse_workload(
        "prompt_tokens: {p50: 600, p99: 3000}\noutput_tokens: {p50: 100, p99: 500}\n"
        "arrival_rate_p99_1m: 30\n"
    )
    curve = analytic_service_curve(load_profile("llama3-8b-h100"), wl.prompt, wl.output)
    plan = make_plan(wl, curve, P99Target("wait", 10.0), tier="batch", rho_target=0.95)
    assert any("target ρ 0.95 > 0.85" in w for w in plan.warnings)


def test_cli_worker_rps_and_tps() -> None:
    res = runner.invoke(app, ["plan", "--worker-rps", "12", "--peak-rps", "50"])
    assert res.exit_code == 0, res.output
    assert "replicas          7 — ceil(50 / (12 × 0.6)) = 7" in res.stdout
    assert "no engine profile used" in res.stdout
    args = ["plan", "--worker-rps", "12", "--peak-rps", "50", "--rho", "0.9", "--json"]
    res = runner.invoke(app, args)
    doc = json.loads(res.stdout)
    assert doc["plan"]["replicas"] == 5 and "0.85" in doc["warnings"][0]
    cmd = "plan --worker-tps 24000 --tokens-per-request 2000 --peak-rps 50 --concurrency 16"
    res = runner.invoke(app, cmd.split())
    assert res.exit_code == 0, res.output
    assert "per worker        12 req/s — measured 24,000 tok/s per worker" in res.stdout
    assert "queue wait        p99 " in res.stdout and "KEDA threshold" in res.stdout


def test_one_replica_is_said_in_the_singular_and_none_fewer_is_offered() -> None:
    out = runner.invoke(app, ["plan", "--worker-rps", "12", "--peak-rps", "5"])
    assert out.exit_code == 0, out.output
    assert "(1 × 12)" in out.output and "at 0 replicas" not in out.output
    assert "why not one fewer" not in out.output
    many = runner.invoke(app, ["plan", "--worker-rps", "12", "--peak-rps", "50"])
    assert "  at 6 replicas     ρ 0.694 > target 0.6 — why not one fewer" in many.output
    assert "the usual utilisation rule" in many.output and "seed" not in many.output


def test_the_plan_counts_replicas_and_gpus_in_words() -> None:
    from velvetrope.planner.words import count

    assert [count(1, "replica"), count(2, "replica"), count(0, "replica")] == [
        "1 replica",
        "2 replicas",
        "0 replicas",
    ]
    out = runner.invoke(
        app, ["plan", "--trace", "azure_conv", "--peak-rps", "1", "--slo-p99", "30s"]
    )
    assert out.exit_code == 0, out.output
    assert "1 replica × 1 GPU per replica" in out.output
    assert "GPU(s)" not in out.output and "at 0 replicas" not in out.output
    assert "predicted latency   at 1 replica\n" in out.output
