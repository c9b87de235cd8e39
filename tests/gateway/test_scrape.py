"""The gateway scrapes its engines' ``/metrics`` for the core's saturation rule.

The rule itself is tested deterministically in ``tests/core/test_saturation.py``, the
dialects' reading in ``tests/test_dialects.py``, every dialect through HTTP in
``tests/gateway/test_dialects_live.py``; here the wiring in the real gateway against a real
engine, with exact counters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import gateway_config, start_engine, start_gateway, status_until, wait_idle

GOLD = {"Authorization": "Bearer sk-gold-0000"}


@pytest.mark.integration
def test_the_gateway_scrapes_and_holds_in_its_own_queue(tmp_path: Path) -> None:
    """Eight requests for an engine that runs two: the gateway sends one, doubles while the
    engine runs all it got, and once a reading shows the engine queueing holds the rest;
    four more wait in the gateway too."""
    eng = start_engine(1.0, "--set", "max_num_seqs=2")
    cfg = gateway_config([eng.url])
    cfg["policy"]["saturation"] = {"enabled": True, "max_waiting": 0, "scrape_interval_s": 0.1}
    gw = start_gateway(tmp_path, cfg)
    body: dict[str, Any] = {
        "model": "velvetrope-sim",
        "prompt": "hello",
        "max_tokens": 60,
        "ignore_eos": True,
    }

    def seen_queueing(st: dict[str, Any]) -> bool:
        return any((e["waiting"] or 0) > 0 for e in st["engine_load"].values())

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            url = gw.url + "/v1/completions"
            first = [asyncio.create_task(c.post(url, json=body, headers=GOLD)) for _ in range(8)]
            st = await status_until(c, gw.url, seen_queueing)
            assert seen_queueing(st), st
            assert st["in_flight"] <= 4 and st["queued"] >= 4, st
            late = [asyncio.create_task(c.post(url, json=body, headers=GOLD)) for _ in range(4)]
            while not all(t.done() for t in late):  # the late four wait in the gateway too
                st = await status_until(c, gw.url, lambda s: True)
                assert st["in_flight"] <= 4, st
            return [*(await asyncio.gather(*first)), *(await asyncio.gather(*late))]

    try:
        rs = asyncio.run(go())
        assert [r.status_code for r in rs] == [200] * 12
        st = wait_idle(gw.url)
        assert st["dispatch_held_by_saturation"] >= 4
        m = httpx.get(eng.url + "/metrics").text
        assert "vllm:generation_tokens_total" in m
        gen = next(
            float(line.rsplit(" ", 1)[1])
            for line in m.splitlines()
            if line.startswith("vllm:generation_tokens_total")
        )
        assert gen == 12 * 60  # every request ran, in the engine, to the token
    finally:
        gw.stop()
        eng.stop()
