"""A pool's ``engine_priority`` through real processes: the gateway forwards each job's tier
band as vLLM's ``priority`` to a ``velvetrope engine --scheduling priority`` on loopback.

The engine runs one sequence at a time, so requests the gateway dispatches wait in the
engine's own queue.  A long batch request takes the seat, three short batch requests
queue behind it, then one short interactive request arrives.  With the tier forwarded the
engine serves the interactive request before the batch ones that arrived first; without it
(and with the batch tenant asking for ``priority: -10`` itself, which the gateway strips)
the engine serves them in arrival order.  The test reads the order in which the responses
finished, never how long anything took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import gateway_config, start_engine, start_gateway, status_until

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
BRONZE = {"Authorization": "Bearer sk-bronze-0000"}


def _body(max_tokens: int, priority: int | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "velvetrope-sim",
        "prompt": "hello",
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if priority is not None:
        b["priority"] = priority
    return b


def _finish_order(tmp: Path, engine_priority: bool) -> list[str]:
    """The order in which the three queued batch requests (``b``) and the interactive one
    (``i``) finished."""
    tmp.mkdir()
    eng = start_engine(20.0, "--scheduling", "priority", "--set", "max_num_seqs=1")
    cfg = gateway_config(
        [eng.url],
        pools=[{"name": "default", "max_in_flight": 32, "engine_priority": engine_priority}],
        saturation={"enabled": False},  # every request goes to the engine at once
    )
    gw = start_gateway(tmp, cfg)
    order: list[str] = []

    async def one(c: httpx.AsyncClient, name: str, headers: dict[str, str], b: Any) -> None:
        r = await c.post(gw.url + "/v1/completions", json=b, headers=headers)
        assert r.status_code == 200, r.text
        order.append(name)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            long = asyncio.create_task(one(c, "long", BRONZE, _body(1500)))
            st = await status_until(c, gw.url, lambda s: s["in_flight"] == 1)
            assert st["in_flight"] == 1, st
            batch = [
                asyncio.create_task(one(c, "b", BRONZE, _body(30, priority=-10))) for _ in range(3)
            ]
            st = await status_until(c, gw.url, lambda s: s["in_flight"] == 4)
            assert st["in_flight"] == 4, st
            top = asyncio.create_task(one(c, "i", GOLD, _body(30)))
            await asyncio.gather(long, *batch, top)

    try:
        asyncio.run(go())
    finally:
        gw.stop()
        eng.stop()
    return [x for x in order if x != "long"]


def test_the_forwarded_tier_puts_the_top_tier_ahead_in_the_engines_queue(
    tmp_path: Path,
) -> None:
    forwarded = _finish_order(tmp_path / "on", engine_priority=True)
    assert forwarded.index("i") < 2, forwarded  # ahead of at least two earlier batch jobs
    plain = _finish_order(tmp_path / "off", engine_priority=False)
    assert plain == ["b", "b", "b", "i"], plain  # arrival order: the client's -10 was dropped
