"""The saturation rule's KV room through real processes: ``velvetrope serve`` in front of a
``velvetrope engine`` whose KV cache holds 64 blocks of 16 tokens, with ``httpx``.

Four long-prompt batch streams fill the cache to about 0.87 (0.94 at their full length, so
the engine never has to preempt one of them) and are held open while they decode (slowly: a
step takes at least 0.25 s, twenty of them before they end).  The engine's capacity in
requests would let more go; its KV room, what the cache holds before ``max_kv_usage`` at
what each running request holds now, is under one.  Six more batch requests then wait in
the gateway's queue, where it orders them, not in the engine's, and the engine preempts
nothing; once the four streams end (their client hangs up, the gateway cancels them at the
engine) all six are served.  Tests wait on ``/admin/status``, never a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import (
    completion_body,
    gateway_config,
    metric,
    start_engine,
    start_gateway,
    status_until,
)

pytestmark = pytest.mark.integration

BRONZE = {"Authorization": "Bearer sk-bronze-0000"}
PROMPT = "the quick brown fox jumps over the lazy dog " * 22
"""About 215 tokens as ``velvetrope engine`` counts them: 14 of the cache's 64 blocks."""


def test_requests_the_kv_cache_cannot_hold_wait_in_the_gateway(tmp_path: Path) -> None:
    eng = start_engine(
        1.0,
        *("--set", "num_gpu_blocks=64", "--set", "block_size=16"),
        *("--set", "max_model_len=1024", "--set", "max_num_seqs=64"),
        *("--set", "step_base_s=0.25"),
    )
    cfg = gateway_config(
        [eng.url],
        pools=[{"name": "default", "max_in_flight": 64}],
        saturation={"max_waiting": 0, "scrape_interval_s": 0.1, "initial_capacity": 64},
    )
    gw = start_gateway(tmp_path, cfg)

    def engine_load(s: dict[str, Any]) -> dict[str, Any]:
        (load,) = s["engine_load"].values()
        return dict(load)

    def cache_read(s: dict[str, Any]) -> bool:
        """A reading of the four running, nothing queued, the cache over 0.8 full, and a
        capacity in requests with room for more: not learned (the slow-start window), or
        learned from a reading that showed one of the four queued (at most three running)
        and raised to five by the next that showed all four running with no queue."""
        load = engine_load(s)
        return (
            load["running"] == 4
            and load["waiting"] == 0
            and (load["kv_usage"] or 0.0) > 0.8
            and load["capacity"] >= 5
        )

    async def go() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            url = gw.url + "/v1/completions"
            async with contextlib.AsyncExitStack() as held:
                for _ in range(4):
                    body = completion_body(20, stream=True, prompt=PROMPT)
                    r = await held.enter_async_context(
                        c.stream("POST", url, json=body, headers=BRONZE)
                    )
                    assert r.status_code == 200
                st = await status_until(c, gw.url, cache_read)
                assert cache_read(st), st
                load = engine_load(st)  # the count would let one more go, the cache not
                assert load["capacity"] - load["projected"] >= 1.0, load
                assert load["room"] is not None and load["room"] < 1.0, load
                shorts = [
                    asyncio.create_task(
                        c.post(url, json=completion_body(4, prompt="hi"), headers=BRONZE)
                    )
                    for _ in range(6)
                ]
                st = await status_until(c, gw.url, lambda s: s["queued"] == 6)
                assert st["queued"] == 6 and st["in_flight"] == 4, st
                assert (engine_load(st)["waiting"] or 0) == 0, st
            # the four streams closed: the gateway cancels them at the engine
            done = await asyncio.gather(*shorts)
            assert [r.status_code for r in done] == [200] * 6, [r.text for r in done]

    try:
        asyncio.run(go())
        assert metric(eng.url, "vllm:num_preemptions_total") == 0
    finally:
        gw.stop()
        eng.stop()
