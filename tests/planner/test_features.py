"""``velvetrope plan`` with speculative decoding and prefix caching: how service time changes,
the options' validation, and ``--verify`` with shared prefixes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.engine import load_profile, profile_to_yaml
from velvetrope.engine.speculative import acceptance_for_tokens_per_step
from velvetrope.planner.engine_options import prefix_caching_profile
from velvetrope.planner.features import FeatureEffect, ServiceStats, predicted_service
from velvetrope.planner.plan import P99Target
from velvetrope.planner.service_methods import analytic_service_curve
from velvetrope.planner.sizing import make_plan
from velvetrope.planner.verify import stationary_workload, verify_plan
from velvetrope.planner.workload import load_workload

runner = CliRunner()

WORKLOAD = """\
prompt_tokens: {p50: 2000, p99: 6000}
output_tokens: {p50: 100, p99: 500}
arrival_rate_p99_1m: 30
"""


@pytest.fixture
def wfile(tmp_path: Path) -> Path:
    f = tmp_path / "workload.yaml"
    f.write_text(WORKLOAD)
    return f


def _args(wfile: Path, *more: str) -> list[str]:
    return ["plan", "--workload", str(wfile), "--service-model", "analytic", *more]


def test_analytic_plan_says_how_service_time_changes(wfile: Path) -> None:
    both = ("--prefix-hit-rate", "0.3", "--spec-tokens", "4", "--spec-acceptance", "0.7")
    res = runner.invoke(app, [*_args(wfile, *both), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["service"]["method"] == "analytic"
    settings = doc["engine_feature_settings"]
    assert settings["prefix_hit_rate"] == 0.3 and settings["spec_tokens"] == 4
    assert settings["spec_tokens_per_step"] == pytest.approx((1 - 0.7**5) / 0.3)
    effects = doc["engine_feature_effects"]
    assert [e["feature"] for e in effects] == [
        "speculative decoding k=4 (2.77 tokens/step)",
        "prefix cache 30%",
        "speculative decoding k=4 (2.77 tokens/step) + prefix cache 30%",
    ]
    plan = doc["plan"]
    for e in effects:
        assert (e["replicas"], e["concurrency"]) == (
            plan["replicas"],
            plan["concurrency_per_replica"],
        )
        a, b = e["without"], e["with"]
        assert set(a) == set(b) == {
            "service_mean_s", "service_cv", "service_p99_s", "e2e_p99_s",
            "max_throughput_rps", "replicas",
        }  # fmt: skip
        assert b["service_mean_s"] < a["service_mean_s"]
        assert b["max_throughput_rps"] > a["max_throughput_rps"]
        assert b["service_cv"] > 0 and a["service_cv"] > 0
    # every row compares against the same plan without features; the last is the plan itself
    assert len({json.dumps(e["without"]) for e in effects}) == 1
    assert effects[-1]["with"]["replicas"] == plan["replicas"]
    assert effects[-1]["with"]["e2e_p99_s"] == pytest.approx(doc["latency"]["at"]["e2e_p99_s"])

    text = runner.invoke(app, _args(wfile, "--prefix-hit-rate", "0.3"))
    assert text.exit_code == 0, text.output
    line = next(x for x in text.stdout.splitlines() if x.startswith("  prefix cache 30%:"))
    assert "mean service" in line and "CV" in line and "→" in line and "replicas needed" in line


def test_accepted_tokens_per_step_is_an_alternative_to_the_acceptance(wfile: Path) -> None:
    res = runner.invoke(
        app,
        [*_args(wfile, "--spec-tokens", "4", "--spec-accepted-per-step", "2.3"), "--json"],
    )
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["engine_feature_settings"]
    assert s["spec_acceptance"] == pytest.approx(acceptance_for_tokens_per_step(4, 2.3))
    assert s["spec_tokens_per_step"] == pytest.approx(2.3)


def test_closed_loop_plan_takes_both_features(wfile: Path) -> None:
    args = ["plan", "--workload", str(wfile), "--json", "--prefix-hit-rate", "0.5"]
    res = runner.invoke(app, [*args, "--spec-tokens", "3", "--spec-accepted-per-step", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["service"]["method"] == "closed-loop"
    for e in doc["engine_feature_effects"]:
        assert e["with"]["max_throughput_rps"] > e["without"]["max_throughput_rps"]


@pytest.mark.parametrize(
    ("more", "needle"),
    [
        (
            "--spec-tokens 4 --spec-acceptance 0.7 --spec-accepted-per-step 2.3",
            "--spec-acceptance and --spec-accepted-per-step are mutually exclusive",
        ),
        ("--spec-tokens 4 --spec-accepted-per-step 5.5", "--spec-accepted-per-step must be in"),
        ("--spec-tokens 4 --spec-accepted-per-step 0.5", "--spec-accepted-per-step must be in"),
        ("--spec-accepted-per-step 1.5", "--spec-accepted-per-step needs --spec-tokens"),
        ("--spec-tokens 2 --spec-acceptance 1.5", "--spec-acceptance must be in"),
        ("--prefix-hit-rate 1", "--prefix-hit-rate must be in"),
    ],
)
def test_feature_options_are_validated(wfile: Path, more: str, needle: str) -> None:
    res = runner.invoke(app, _args(wfile, *more.split()))
    assert res.exit_code == 2, res.output
    assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.output


def test_verify_simulates_shared_prefixes(wfile: Path, tmp_path: Path) -> None:
    small = load_profile("llama3-8b-h100").with_overrides(name="small", max_num_seqs=32)
    pfile = tmp_path / "small.yaml"
    pfile.write_text(profile_to_yaml(small))
    opts = "--verify --verify-requests 1500 --slo-metric e2e --slo-p99 20s --prefix-hit-rate 0.4"
    res = runner.invoke(app, [*_args(wfile, "--profile", str(pfile), *opts.split()), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["verify"]

    # The same check computed here: the workload carries the shared prefix, and the
    # simulator's answer is exactly what the command printed (deterministic).
    prof = prefix_caching_profile(small, 0.4)
    wl = load_workload(wfile)
    curve = analytic_service_curve(prof, wl.prompt, wl.output, prefix_hit_rate=0.4)
    plan = make_plan(wl, curve, P99Target("e2e", 20.0), tier="interactive")
    work = stationary_workload(curve, wl.design_rps, wl.arrival_scv, 1500, 0)
    assert all(r.prefix_id == "shared" for r in work if r.prefix_tokens)
    assert sum(r.prefix_tokens for r in work) == pytest.approx(
        0.4 * sum(r.prompt_tokens for r in work), rel=0.01
    )
    mine = verify_plan(plan, requests=1500, seed=0)
    assert [r["replicas"] for r in rows] == [m.simulated.replicas for m in mine]
    for got, m in zip(rows, mine, strict=True):
        assert got["completed_fraction"] == m.simulated.completed_fraction == 1.0
        for metric in ("wait", "ttft", "e2e"):
            assert got[f"{metric}_p99_s"]["simulated"] == m.simulated.p99(metric)
            pred = m.predicted.p99(metric)
            assert got[f"{metric}_p99_s"]["predicted"] == pred
        mean, cv = predicted_service(m.predicted)
        assert got["service_mean_s"] == {"predicted": mean, "simulated": m.simulated.service_mean_s}
        assert got["service_cv"] == {"predicted": cv, "simulated": m.simulated.service_cv}
        assert m.simulated.service_mean_s > 0 and m.simulated.service_cv > 0


def test_an_overloaded_fleet_without_the_feature_is_said_so() -> None:
    over = ServiceStats(math.inf, math.nan, math.nan, math.inf, 10.0, 4)
    ok = ServiceStats(2.0, 0.8, 6.0, 7.0, 14.0, 3)
    e = FeatureEffect("prefix cache 30%", 3, 64, over, ok)
    assert e.line() == (
        "prefix cache 30%: mean service overloaded at 3 replicas without it → 2 s; "
        "replicas needed 4 → 3"
    )
    d = e.to_dict()
    assert d["without"]["service_mean_s"] is None and d["without"]["replicas"] == 4
    assert d["with"] == {
        "service_mean_s": 2.0, "service_cv": 0.8, "service_p99_s": 6.0, "e2e_p99_s": 7.0,
        "max_throughput_rps": 14.0, "replicas": 3,
    }  # fmt: skip
    none = FeatureEffect("x", 1, 1, ok, ServiceStats(1.0, 0.5, 3.0, 4.0, 20.0, None))
    assert "mean service 2 s → 1 s (−50%), CV 0.80 → 0.50" in none.line()
    assert none.line().endswith("replicas needed 3 → none meets the SLO")
