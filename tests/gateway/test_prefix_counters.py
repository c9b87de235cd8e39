"""The engines' prefix caches, seen through the gateway: real ``velvetrope engine`` processes
with prefix caching on, a real ``velvetrope serve`` routing by prefix affinity with the
saturation rule off (so the engines are read for their prefix counters alone), the official
openai client.  Requests that share a system prompt hit the engine the router sends them
to; the gateway's ``/metrics`` and ``/admin/status`` carry the engines' own counters and the
pool's observed hit rate beside the router's expected one.  Waits are deadline polls."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import admin_status, gateway_config, metric, start_engine, start_gateway

pytestmark = pytest.mark.integration

SYSTEM = "You are the support assistant of a bank. Answer in two sentences. " * 60  # ~4 KB
QUESTIONS = ("What is my balance?", "Can I close my account?", "Where is my card?", "How?")


def test_gateway_reexports_the_engines_prefix_cache_counters(tmp_path: Path) -> None:
    engines = [
        start_engine(50.0, "--tokenizer", "approx", "--set", "enable_prefix_caching=true")
        for _ in range(2)
    ]
    gw = None
    try:
        cfg = gateway_config(
            [e.url for e in engines],
            pools=[{"name": "default", "max_in_flight": 32, "routing": "prefix_affinity"}],
            saturation={"enabled": False, "scrape_interval_s": 0.1},
        )
        gw = start_gateway(tmp_path, cfg)
        # both engines read once (counters at zero) before any request: the gateway's tally
        # counts from its first reading on
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not all(
            u["engine"] is not None and u["engine"]["prefix_cache"] is not None
            for u in admin_status(gw.url)["upstreams"]
        ):
            time.sleep(0.05)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-gold-0000", max_retries=0)
        prompt_tokens = 0
        for q in QUESTIONS:
            r = client.chat.completions.create(
                model="velvetrope-sim",
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                max_tokens=2,
            )
            assert r.usage is not None
            prompt_tokens += r.usage.prompt_tokens
        # the engines' counters reach the gateway at its next scrapes
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            queries = metric(gw.url, "velvetrope_engine_prefix_cache_queries_total")
            if queries >= prompt_tokens:
                break
            time.sleep(0.1)
        assert queries == prompt_tokens  # every prompt token looked up once, in one engine
        hits = metric(gw.url, "velvetrope_engine_prefix_cache_hits_total")
        # affinity sent all four to one engine: the three later ones found the system prompt
        shared = (len(SYSTEM) // 4) // 16 * 16
        assert 3 * (shared - 16) <= hits < prompt_tokens
        per_engine = [
            metric(gw.url, "velvetrope_engine_prefix_cache_hits_total", upstream=e.url)
            for e in engines
        ]
        assert sorted(per_engine) == [0.0, hits]
        observed = metric(gw.url, "velvetrope_prefix_observed_hit_ratio", pool="default")
        assert observed == pytest.approx(hits / prompt_tokens)
        # the saturation rule is off: no saturation state is claimed for these engines
        assert "velvetrope_engine_saturation_state{" not in httpx.get(gw.url + "/metrics").text
        ups = admin_status(gw.url)["upstreams"]
        seen = {u["url"]: u["engine"]["prefix_cache"] for u in ups}
        assert sorted(s["hits"] for s in seen.values()) == [0.0, hits]
        assert sum(s["queries_seen"] for s in seen.values()) == prompt_tokens
        assert {u["engine"]["saturation"] for u in ups} == {"off"}
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()
