"""A pool's ``engine_priority`` through real processes: the gateway forwards each job's tier
band as vLLM's ``priority`` to a ``velvetrope engine --scheduling priority`` on loopback.

The engine runs one sequence at a time, so requests the gateway dispatches wait in the
engine's own queue.  A long streamed batch request takes the seat, three short batch
requests queue behind it, then one short interactive request; the long one's client then
hangs up, and the engine serves its queue.  With the tier forwarded the
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


def _finish_order(tmp: Path, engine: str, engine_priority: bool) -> list[str]:
    """The order in which the three queued batch requests (``b``) and the interactive one
    (``i``) finished, through a gateway of their own in front of ``engine`` (idle)."""
    tmp.mkdir()
    cfg = gateway_config(
        [engine],
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
            # the long one holds the engine's one seat until the client hangs up, after all
            # four short ones are in the engine's queue: however slow the machine, none of
            # them can find the seat free before then (8,000 tokens take 3 s at 20×)
            long = _body(8000) | {"stream": True}
            url = gw.url + "/v1/completions"
            async with c.stream("POST", url, json=long, headers=BRONZE) as held:
                assert held.status_code == 200
                batch = [
                    asyncio.create_task(one(c, "b", BRONZE, _body(30, priority=-10)))
                    for _ in range(3)
                ]
                st = await status_until(c, gw.url, lambda s: s["in_flight"] == 4)
                assert st["in_flight"] == 4, st
                top = asyncio.create_task(one(c, "i", GOLD, _body(30)))
                st = await status_until(c, gw.url, lambda s: s["in_flight"] == 5)
                assert st["in_flight"] == 5, st
            # the stream closed: the gateway cancels the long one at the engine, which
            # then serves its queue in its own order
            await asyncio.gather(*batch, top)

    try:
        asyncio.run(go())
    finally:
        gw.stop()
    return order


def test_the_forwarded_tier_puts_the_top_tier_ahead_in_the_engines_queue(
    tmp_path: Path,
) -> None:
    # one engine for both gateways: each run leaves it idle, every request answered
    with start_engine(20.0, "--scheduling", "priority", "--set", "max_num_seqs=1") as eng:
        forwarded = _finish_order(tmp_path / "on", eng.url, engine_priority=True)
        assert forwarded == ["i", "b", "b", "b"], forwarded  # ahead of the earlier batch jobs
        plain = _finish_order(tmp_path / "off", eng.url, engine_priority=False)
    assert plain == ["b", "b", "b", "i"], plain  # arrival order: the client's -10 was dropped


def test_an_engine_left_fcfs_refuses_the_tier_once_and_every_request_is_served(
    tmp_path: Path,
) -> None:
    """The default config forwards the tier; ``velvetrope engine`` run FCFS refuses a nonzero
    ``priority`` as vLLM does (400).  The first batch request is sent again without it and
    answered; the gateway then sends that engine no priority, so no request is refused
    again: the engine was asked once more than there were requests, and only once."""
    eng = start_engine(50.0)  # FCFS
    cfg = gateway_config([eng.url], saturation={"enabled": False})
    assert "engine_priority" not in cfg["policy"]["pools"][0]  # the default
    gw = start_gateway(tmp_path, cfg)
    try:
        with httpx.Client(timeout=60) as c:
            direct = c.post(eng.url + "/v1/completions", json=_body(5, priority=2))
            assert direct.status_code == 400, direct.text
            assert "Priority scheduling is not enabled" in direct.json()["error"]["message"]

            def served(headers: dict[str, str]) -> dict[str, Any]:
                r = c.post(gw.url + "/v1/completions", json=_body(7), headers=headers)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 7
                (up,) = c.get(
                    gw.url + "/admin/status", headers={"Authorization": "Bearer test-admin-token"}
                ).json()["upstreams"]
                return dict(up)

            assert served(GOLD)["requests"] == 1  # band 0: vLLM takes 0 in any mode
            first = served(BRONZE)
            assert (first["requests"], first["priority"]) == (3, "refused")  # asked twice
            assert served(BRONZE)["requests"] == 4  # then once per request
            assert served(GOLD)["requests"] == 5
        assert gw.stderr_text().count("refused the request priority") == 1
    finally:
        gw.stop()
        eng.stop()
