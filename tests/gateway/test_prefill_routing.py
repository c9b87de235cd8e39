"""The replica choice by prefill backlog through real processes: a gateway in front of two
``velvetrope engine`` (priority scheduling, slowed so that a 6,000-token prompt takes
seconds to prefill), the official ``openai`` client streaming.

While one engine prefills a long top-tier prompt, every further top-tier request goes to
the other engine, although the two then hold the same number of requests (a count-based
choice would send every other one behind the long prompt); a batch request, which has no
TTFT objective, still goes to the engine with fewer requests.  The backlog the gateway
reports per engine (``/admin/status`` ``engine_load[*].prefill_backlog_tokens``, and the
``velvetrope_engine_prefill_backlog_tokens`` gauge) is exact:
the long prompt's tokens while it prefills, 0 once every request has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .conftest import (
    gateway_config,
    metric,
    start_engine,
    start_gateway,
    start_together,
    status_until,
    stream_to_end,
)

pytestmark = pytest.mark.integration

TIERS = [  # objectives loose enough that no late first token moves a limit during the test
    {"name": "interactive", "slo": {"ttft_s": 60.0, "tpot_s": 5.0}},
    {"name": "standard", "slo": {"ttft_s": 120.0}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]
LONG_PROMPT = "lorem " * 4000  # 6,000 tokens by the gateway's count and the engine's


def _backlogs(st: dict[str, Any]) -> dict[str, int]:
    return {url: e["prefill_backlog_tokens"] for url, e in st["engine_load"].items()}


def _requests(st: dict[str, Any]) -> dict[str, int]:
    return {u["url"]: u["requests"] for u in st["upstreams"]}


def in_flight(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda st: st["in_flight"] == n


def test_top_tier_requests_go_where_no_long_prompt_is_prefilling(tmp_path: Path) -> None:
    engines = start_together(
        *(lambda: start_engine(0.02, "--scheduling", "priority") for _ in range(2))
    )
    cfg = gateway_config(
        [e.url for e in engines],
        tiers=TIERS,
        pools=[{"name": "default", "engine_priority": True}],
        # the brake gives both engines room throughout: the backlog alone decides
        saturation={"scrape_interval_s": 0.1, "initial_capacity": 64, "max_waiting": 64},
    )
    gw = start_gateway(tmp_path, cfg)
    gold = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-gold-0000", max_retries=0)
    bronze = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-bronze-0000", max_retries=0)

    async def go() -> None:
        async with gold, bronze, httpx.AsyncClient(timeout=30) as c:
            tasks = [asyncio.create_task(stream_to_end(gold, LONG_PROMPT, 4))]
            st = await status_until(c, gw.url, lambda s: max(_backlogs(s).values()) >= 5000)
            long_at = max(_backlogs(st), key=lambda u: _backlogs(st)[u])
            assert _backlogs(st)[long_at] == 6000, st["engine_load"]
            for i in range(4):  # short top-tier streams, one at a time
                tasks.append(asyncio.create_task(stream_to_end(gold, "hi", 400)))
                st = await status_until(c, gw.url, in_flight(i + 2))
                assert st["in_flight"] == i + 2, st
            other = next(u for u in _requests(st) if u != long_at)
            assert _requests(st) == {long_at: 1, other: 4}, st["upstreams"]
            assert _backlogs(st)[long_at] == 6000, "the long prompt was prefilled too soon"
            gauge = "velvetrope_engine_prefill_backlog_tokens"
            assert metric(gw.url, gauge, upstream=long_at) == 6000
            tasks.append(asyncio.create_task(stream_to_end(bronze, "hi", 400)))  # no TTFT objective
            st = await status_until(c, gw.url, in_flight(6))
            assert _requests(st) == {long_at: 2, other: 4}, st["upstreams"]  # the fewer
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            st = await status_until(c, gw.url, in_flight(0))
            assert st["in_flight"] == 0, st
            assert _backlogs(st) == {long_at: 0, other: 0}, st["engine_load"]
            assert metric(gw.url, gauge) == 0

    try:
        asyncio.run(go())
    finally:
        gw.stop()
        for e in engines:
            e.stop()
