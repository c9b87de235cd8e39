"""Prefix-aware routing: the gateway and the simulator send a recorded stream of chats to the
same engines, both through the core's PrefixRouter, and the gateway's metrics count it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from velvetrope.config import parse_config
from velvetrope.engine import load_profile
from velvetrope.errors import ConfigError
from velvetrope.openai.prefix import prefix_hashes
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.traces import read_jsonl, write_jsonl

from .conftest import admin_status, gateway_config, metric, start_engine, start_gateway

KEY = "sk-gold-0000"
BLOCK = 128  # tokens a prefix block: 512 bytes of text


def chats() -> list[dict[str, Any]]:
    """Five applications (system prompts of 2 to 6 blocks), three requests each, in turn;
    the third of each repeats its first turn and adds to it (a conversation)."""
    out = []
    for turn in range(3):
        for app in range(5):
            system = f"You are assistant {app}. " + "Be precise and brief. " * (50 + 25 * app)
            messages = [{"role": "system", "content": system}]
            if turn == 2:
                messages += [
                    {"role": "user", "content": f"first question of app {app} " * 30},
                    {"role": "assistant", "content": "an answer " * 40},
                ]
            messages.append({"role": "user", "content": f"question {turn} for app {app}"})
            out.append({"model": "m", "messages": messages, "max_tokens": 4})
    return out


@pytest.fixture(scope="module")
def engines() -> Any:
    procs = [start_engine(50.0, "--instant", "--model", "m") for _ in range(3)]
    yield [p.url for p in procs]
    for p in procs:
        p.stop()


@pytest.mark.integration
@pytest.mark.parametrize("routing", ["prefix_affinity", "prefix_hash"])
def test_gateway_and_simulator_pick_the_same_engines(
    tmp_path: Path, engines: list[str], routing: str
) -> None:
    pool = {"name": "default", "max_in_flight": 32, "routing": routing}
    pool["prefix"] = {"block_tokens": BLOCK, "hash_tokens": 2 * BLOCK}
    cfg = gateway_config(engines, pools=[pool], estimator={"min_observations": 10_000})
    bodies = chats()
    gw = start_gateway(tmp_path, cfg)
    served: list[str] = []
    try:
        before = {u["url"]: u["requests"] for u in admin_status(gw.url)["upstreams"]}
        with httpx.Client(timeout=30) as c:
            for body in bodies:
                r = c.post(
                    gw.url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                assert r.status_code == 200, r.text
                after = {u["url"]: u["requests"] for u in admin_status(gw.url)["upstreams"]}
                moved = [u for u in after if after[u] != before[u]]
                assert len(moved) == 1
                served.append(moved[0])
                before = after
        outcomes = {
            o: metric(gw.url, "velvetrope_prefix_routing_total", outcome=o)
            for o in ("kept", "overridden", "miss")
        }
        hit_ratio = metric(gw.url, "velvetrope_prefix_expected_hit_ratio", pool="default")
    finally:
        gw.stop()
    # the recorded stream, with the prefix hashes the gateway computed, replayed
    work = [
        TraceRequest(
            10.0 * i,
            4000,
            4,
            "gold",
            block_hashes=prefix_hashes(b, BLOCK, 64),
            block_tokens=BLOCK,
        )
        for i, b in enumerate(bodies)
    ]
    path = tmp_path / "recorded.jsonl"
    write_jsonl(work, path)
    policy = parse_config(cfg).policy
    res = run_simulation(
        policy,
        read_jsonl(path),
        3,
        load_profile("llama3-8b-h100"),
        engine_names=engines,
        record_decisions=True,
    )
    assert res.decisions is not None
    in_sim = [engines[int(d[3])] for d in res.decisions if d[1] == "dispatch"]
    assert served == in_sim
    # every application stays on one engine, and the five spread over the engines
    per_app = [{served[turn * 5 + app] for turn in range(3)} for app in range(5)]
    assert all(len(s) == 1 for s in per_app)
    assert len(set().union(*per_app)) >= 2
    if routing == "prefix_affinity":  # each application's first request is a miss
        assert outcomes == {"kept": 10.0, "overridden": 0.0, "miss": 5.0}
        assert hit_ratio > 0.5
    else:
        assert outcomes == {"kept": 15.0, "overridden": 0.0, "miss": 0.0}


def test_an_unknown_routing_is_refused_naming_the_field() -> None:
    cfg = gateway_config(["http://127.0.0.1:1"], pools=[{"name": "default", "routing": "prefix"}])
    with pytest.raises(ConfigError) as e:
        parse_config(cfg)
    msg = str(e.value)
    assert "routing" in msg and "prefix_affinity" in msg and "least_loaded" in msg
