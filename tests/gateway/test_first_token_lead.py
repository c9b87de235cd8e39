"""A queued request that its tier's lead to the first token would make late is answered
503 ``expired`` rather than sent, through real processes: ``velvetrope serve`` in front of
a ``velvetrope engine`` whose every step takes at least 3 s, with ``httpx``.

Eight streamed standard requests measure the tier's lead (dispatch to first token: one
step, 3 s or more).  Eight more of one token, not streamed, then take the pool's eight
slots for one step; a standard request (TTFT objective 4.5 s) queued behind them has waited about
3 s when they end, so sent then its first token would come at about 6 s: the gateway
answers it 503 ``expired`` with ``Retry-After`` at once, before its deadline, and the
engine never sees it.  A standard request arriving to a free slot is served.  Tests wait on
``/admin/status``, never a fixed time.
"""

from __future__ import annotations

import asyncio
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

SILVER = {"Authorization": "Bearer sk-silver-0000"}
TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 4.5}},
    {"name": "standard", "slo": {"ttft_s": 4.5}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]


def _leads(s: dict[str, Any]) -> dict[str, Any]:
    return dict(s["pools"]["default"]["first_token_leads"])


def test_a_request_the_lead_would_make_late_is_expired_not_sent(tmp_path: Path) -> None:
    eng = start_engine(1.0, "--set", "step_base_s=3.0")
    cfg = gateway_config(
        [eng.url],
        tiers=TIERS,
        queue={"bands": "strict"},
        pools=[
            {
                "name": "default",
                "max_in_flight": 8,
                "limit": "slo",
                "slo_limit": {"preempt": False, "start_window_s": 120},
            }
        ],
        saturation={"enabled": False},
    )
    gw = start_gateway(tmp_path, cfg)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            url = gw.url + "/v1/completions"

            async def streamed(headers: dict[str, str]) -> httpx.Response:
                body = completion_body(1, stream=True)
                async with c.stream("POST", url, json=body, headers=headers) as r:
                    await r.aread()
                    return r

            measured = await asyncio.gather(*(streamed(SILVER) for _ in range(8)))
            assert [r.status_code for r in measured] == [200] * 8
            lead = _leads(await status_until(c, gw.url, lambda s: True))["leads_s"]["standard"]
            assert lead is not None and lead >= 3.0, lead  # one engine step at least
            blocking = [  # not streamed: their first tokens are not leads
                asyncio.create_task(c.post(url, json=completion_body(1), headers=SILVER))
                for _ in range(8)
            ]
            st = await status_until(c, gw.url, lambda s: s["in_flight"] == 8)
            assert st["in_flight"] == 8, st
            late = asyncio.create_task(streamed(SILVER))
            st = await status_until(c, gw.url, lambda s: s["queued"] == 1)
            assert st["queued"] == 1, st
            r = await late  # the eight end after 3 s: 3 s waited + a 3 s lead > 4.5 s
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "expired", err
            assert int(r.headers["retry-after"]) >= 1
            assert [b.status_code for b in await asyncio.gather(*blocking)] == [200] * 8
            st = await status_until(c, gw.url, lambda s: _leads(s)["expired"] == 1)
            assert _leads(st)["expired"] == 1, st  # the lead expired it, not its deadline
            ok = await streamed(SILVER)  # a free slot: in time, sent
            assert ok.status_code == 200, ok.text
        # the engine answered the 8 + 8 + 1 requests sent and never saw the expired one
        assert metric(eng.url, "vllm:time_to_first_token_seconds_count") == 17

    try:
        asyncio.run(go())
    finally:
        gw.stop()
        eng.stop()
