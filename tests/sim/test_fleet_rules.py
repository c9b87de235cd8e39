"""The fleet rules in the simulator: the same core routing, degradation, capacity per engine
and saturation rule as the gateway, fed from the engine models."""

from __future__ import annotations

from typing import Any

import numpy as np
from typer.testing import CliRunner

from velvetrope.cli import app
from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, EngineReading, PolicyConfig
from velvetrope.engine import load_profile
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.fleet import Fleet
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import write_jsonl

SMALL = load_profile("llama3-8b-h100").with_overrides(
    num_gpu_blocks=200, max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=2048
)


def burst(n: int = 300, rate: float = 40.0, seed: int = 5) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    times = Poisson(rate).times(seed, count=n).tolist()
    return [
        TraceRequest(t, int(rng.integers(50, 400)), int(rng.integers(20, 200)), max_tokens=256)
        for t in times
    ]


def policy(**extra: Any) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {"pools": [{"name": "default", "max_in_flight": 200}], **extra}
    )


def test_saturation_keeps_the_backlog_in_the_gateway() -> None:
    """Engines that run 8 at once, a gateway that would send 200: without the rule the
    engines queue the overload themselves; with it they hold at most max_waiting beyond
    what they run (after the first reading) and the rest waits in the gateway."""
    work = burst()
    off = run_simulation(policy(saturation={"enabled": False}), work, 2, SMALL, record_engines=True)
    on = run_simulation(
        policy(saturation={"max_waiting": 1, "scrape_interval_s": 0.5}),
        work,
        2,
        SMALL,
        record_engines=True,
    )
    assert off.engines is not None and on.engines is not None
    settled = on.engines.t > 2.0  # the first readings have taught the rule the capacity
    assert int(off.engines.waiting.max()) > 50
    assert int(on.engines.waiting[settled].max()) <= 1 + 8  # max_waiting + one step's finishes
    assert float(np.nanmax(on.records.queue_wait())) > 1.0  # it waited in the gateway
    assert on.records.completed.all() and off.records.completed.all()


def test_capacity_per_engine_is_per_replica_in_the_simulator() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "pools": [{"name": "default", "max_in_flight_per_engine": 3}],
            "saturation": {"enabled": False},
        }
    )
    res = run_simulation(cfg, burst(100), 4, SMALL)
    assert int(res.samples[2].max()) == 3 * 4


def test_degradation_caps_what_the_engine_generates() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "tiers": [
                {"name": "default", "max_wait_s": 60, "degrade": {"wait_s": 0.5, "max_tokens": 30}}
            ],
            "pools": [{"name": "default", "max_in_flight": 4, "initial_drain_tokens_per_s": 2000}],
            "saturation": {"enabled": False},
        }
    )
    work = burst(200, rate=30.0)
    res = run_simulation(cfg, work, 1, SMALL, lengths="oracle")
    rec = res.records
    assert rec.degraded is not None
    capped = rec.degraded == "max_tokens"
    true = np.asarray([r.output_tokens for r in work])
    assert 0 < capped.sum() < len(rec)
    assert (rec.output[capped] == np.minimum(true[capped], 30)).all()
    assert (rec.output[~capped] == true[~capped]).all()
    assert (rec.predicted[capped] <= 30).all()


def test_routes_by_model_tier_and_predicted_output() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "tiers": [{"name": "gold"}, {"name": "bronze"}],
            "pools": [{"name": "long"}, {"name": "short"}, {"name": "small"}],
            "routes": [
                {"name": "small", "pool": "small", "models": ["small"]},
                {"name": "short", "pool": "short", "max_predicted_output": 100},
            ],
            "saturation": {"enabled": False},
        }
    )
    work = [
        TraceRequest(0.0, 10, 5, "a", "gold", 500, model="small"),
        TraceRequest(0.1, 10, 50, "a", "gold", 500, model="big"),
        TraceRequest(0.2, 10, 300, "a", "bronze", 500, model="big"),
    ]
    res = run_simulation(cfg, work, 1, SMALL, lengths="oracle")
    assert res.records.pool is not None
    assert res.records.pool.tolist() == ["small", "short", "long"]


def test_simulate_cli_honours_the_configs_routes_and_says_so(tmp_path: Any) -> None:
    import yaml

    trace = tmp_path / "t.jsonl"
    write_jsonl(burst(60, rate=5.0), trace)
    cfg = {
        "policy": {
            "tiers": [{"name": "hi"}, {"name": "lo"}],
            "pools": [{"name": "big"}, {"name": "tiny"}],
            "routes": [{"name": "tiny-answers", "pool": "tiny", "max_predicted_output": 100}],
        },
        "upstreams": {"big": [{"url": "http://a:1"}, {"url": "http://b:1"}]},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "rep"
    result = CliRunner().invoke(
        app,
        ["simulate", "--config", str(path), "--trace", str(trace), "--lengths", "oracle",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "routing: tiny-answers → tiny; otherwise → big" in result.output
    assert "the trace names no tenants" in result.output and "tier 'lo'" in result.output
    report = (out / "report.md").read_text()
    assert "big: 2 ×" in report and "tiny: 4 ×" in report  # from the config's upstreams


def test_readings_count_waiting_as_vllm_does() -> None:
    """An engine that is never sent more than it runs never reports a waiting request, though
    every dispatch lands between two of its steps (vLLM's gauge is updated per step)."""
    cfg = PolicyConfig.model_validate(
        {
            "pools": [{"name": "default", "max_in_flight": 8}],
            "saturation": {"scrape_interval_s": 0.05},
        }
    )
    res = run_simulation(cfg, burst(200), 1, SMALL, record_engines=True)
    assert res.engines is not None
    assert int(res.engines.running.max()) == 8
    assert int(res.engines.waiting.max()) == 0


def test_the_replica_choice_prefers_replicas_the_readings_give_room() -> None:
    """The simulator picks replicas as the gateway does: the least loaded of those the
    saturation rule gives room, else the least loaded of all."""
    ctl = AdmissionController(policy(saturation={"max_waiting": 0}), ManualClock())
    fleet = Fleet(SMALL, {"default": 2})
    scrapes = EngineScrapes(ctl, fleet)
    rule = ctl.saturation("default")
    assert rule is not None
    fleet.load[:] = [0, 3]  # replica 0 is the least loaded ...
    rule.observe("0", EngineReading(running=8, waiting=2, kv_usage=0.2), 0.0)  # ... and full
    rule.observe("1", EngineReading(running=3, waiting=0, kv_usage=0.2), 0.0)
    assert scrapes.route(0, 0.0) == 1
    rule.observe("1", EngineReading(running=8, waiting=4, kv_usage=0.2), 0.0)
    assert scrapes.route(0, 0.0) == 0  # neither has room
    fleet.router = "round_robin"
    assert [scrapes.route(0, 0.0) for _ in range(2)] == [0, 1]  # no preference there
