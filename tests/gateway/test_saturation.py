"""Dispatch is held while the engines report a queue of their own (vLLM's metrics)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from velvetrope.gateway.saturation import parse_vllm_metrics

from .conftest import ADMIN, gateway_config, start_engine, start_gateway, wait_idle

GOLD = {"Authorization": "Bearer sk-gold-0000"}


def test_parse_vllm_metrics_sums_label_sets() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="a"} 3.0',
            'vllm:num_requests_waiting{model_name="b"} 2.0',
            'vllm:num_requests_running{model_name="a"} 7.0',
            'vllm:kv_cache_usage_perc{model_name="a"} 0.5',
            'vllm:kv_cache_usage_perc{model_name="b"} 0.25',
            "vllm:num_preemptions_total 4.0",
            "process_cpu_seconds_total 1.5",
        ]
    )
    load = parse_vllm_metrics(text)
    assert load.waiting == 5.0
    assert load.running == 7.0
    assert load.kv_usage == 0.5
    assert load.scraped


def _run(tmp: Path, engine: str, saturation: bool) -> tuple[float, int]:
    """12 requests, 50 ms apart, to an engine that runs 2 at a time; returns the largest
    engine waiting count and gateway queue seen."""
    cfg = gateway_config([engine])
    cfg["gateway"]["saturation"] = {
        "enabled": saturation,
        "max_waiting": 0,
        "scrape_interval_s": 0.1,
    }
    gw = start_gateway(tmp, cfg)
    body: dict[str, Any] = {
        "model": "velvetrope-sim",
        "prompt": "hello",
        "max_tokens": 60,
        "ignore_eos": True,
    }

    async def go() -> tuple[float, int]:
        seen = {"wait": 0.0, "queued": 0}
        done = asyncio.Event()

        async def watch() -> None:
            async with httpx.AsyncClient(timeout=10) as w:
                while not done.is_set():
                    m = await w.get(engine + "/metrics")
                    seen["wait"] = max(seen["wait"], parse_vllm_metrics(m.text).waiting)
                    st = await w.get(
                        gw.url + "/admin/status", headers={"Authorization": f"Bearer {ADMIN}"}
                    )
                    seen["queued"] = max(seen["queued"], st.json()["queued"])
                    await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = []
            for _ in range(12):
                post = c.post(gw.url + "/v1/completions", json=body, headers=GOLD)
                tasks.append(asyncio.create_task(post))
                await asyncio.sleep(0.05)
            results = await asyncio.gather(*tasks)
        done.set()
        await watcher
        assert all(r.status_code == 200 for r in results)
        return seen["wait"], int(seen["queued"])

    try:
        out = asyncio.run(go())
        wait_idle(gw.url)
        return out
    finally:
        gw.stop()


def test_the_queue_stays_in_the_gateway_while_the_engine_is_saturated(tmp_path: Path) -> None:
    eng = start_engine(1.0, "--set", "max_num_seqs=2")
    try:
        held_wait, held_q = _run(tmp_path, eng.url, saturation=True)
        free_wait, free_q = _run(tmp_path, eng.url, saturation=False)
    finally:
        eng.stop()
    # without the signal the engine holds the backlog, where nobody can order or shed it
    assert free_wait >= 8
    assert free_q == 0
    # with it the gateway holds it; the engine sees at most a scrape or two of overshoot
    assert held_wait <= free_wait / 2
    assert held_q >= 5
