"""The gateway and the simulator route the same recorded job stream to the same pools: both
call the core's router, with the same policy read from the same file."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from velvetrope.config import parse_config
from velvetrope.engine import load_profile
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import read_jsonl, write_jsonl

from .conftest import gateway_config, start_engine, start_gateway

KEYS = {"gold": "sk-gold-0000", "silver": "sk-silver-0000", "bronze": "sk-bronze-0000"}


def stream() -> list[TraceRequest]:
    """Every combination of tenant (tier), model and declared max_tokens, twice."""
    out = []
    t = 0.0
    for _ in range(2):
        for tenant in ("gold", "silver", "bronze"):
            for model in ("big", "small"):
                for max_tokens in (30, 150, 600):
                    out.append(TraceRequest(t, 8, 4, tenant, None, max_tokens, model=model))
                    t += 0.5
    return out


@pytest.mark.integration
def test_gateway_and_simulator_route_a_recorded_stream_alike(tmp_path: Path) -> None:
    engines = {
        "long": start_engine(50.0, "--instant", "--model", "big"),
        "short": start_engine(50.0, "--instant", "--model", "big"),
        "small": start_engine(50.0, "--instant", "--model", "small"),
    }
    cfg = gateway_config(
        [],
        pools=[{"name": "long"}, {"name": "short"}, {"name": "small"}],
        routes=[
            {"name": "small-model", "pool": "small", "models": ["small"]},
            {
                "name": "gold-short",
                "pool": "short",
                "tiers": ["interactive"],
                "max_predicted_output": 200,
            },
            {"name": "short", "pool": "short", "max_predicted_output": 100},
        ],
        # predictions stay min(max_tokens, 256) in both: no learning from completions,
        # whose timing differs between real and virtual time
        estimator={"min_observations": 10_000},
    )
    cfg["upstreams"] = {p: [{"url": e.url}] for p, e in engines.items()}
    path = tmp_path / "recorded.jsonl"
    write_jsonl(stream(), path)
    recorded = read_jsonl(path)
    gw = start_gateway(tmp_path, cfg)
    try:
        via_gateway = []
        with httpx.Client(timeout=30) as c:
            for r in recorded:
                resp = c.post(
                    gw.url + "/v1/completions",
                    json={"model": r.model, "prompt": "x", "max_tokens": r.max_tokens},
                    headers={"Authorization": f"Bearer {KEYS[r.tenant]}"},
                )
                assert resp.status_code == 200, resp.text
                h = resp.headers
                via_gateway.append((h["x-velvetrope-pool"], h["x-velvetrope-route"]))
    finally:
        gw.stop()
        for e in engines.values():
            e.stop()
    policy = parse_config(cfg).policy
    res = run_simulation(
        policy, recorded, {"long": 1, "short": 1, "small": 1}, load_profile("llama3-8b-h100")
    )
    assert res.records.pool is not None and res.records.route is not None
    in_sim = list(zip(res.records.pool.tolist(), res.records.route.tolist(), strict=True))
    assert via_gateway == in_sim  # the same pools, for the same reasons
    assert {p for p, _ in via_gateway} == {"long", "short", "small"}
    assert {r for _, r in via_gateway} == {"small-model", "gold-short", "short", "default"}
