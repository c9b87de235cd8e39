"""Shadow mode through real processes: a tenant at 3x its limit gets 200s, and the shadow
counters match what enforcement answers to the same requests in the same run.

Two ``velvetrope serve`` in front of one ``velvetrope engine``: one with the tenant's
``enforce: false``, one with it enforced.  The same 30 requests go to each, one at a time;
the bucket (a burst of 10, refilled at one request per 100 s) is what decides, so both
gateways see exactly the same bucket.  Clients are httpx.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import gateway_config, metric, start_engine, start_gateway

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
LIMIT = 10
SENT = 3 * LIMIT


def _config(engine: str, enforce: bool) -> dict[str, Any]:
    cfg = gateway_config([engine])
    gold = next(t for t in cfg["policy"]["tenants"] if t["name"] == "gold")
    gold["limits"] = {"requests_per_minute": 0.6, "request_burst": LIMIT}
    gold["enforce"] = enforce
    return cfg


def _send(gw: str) -> list[httpx.Response]:
    body = {"model": "velvetrope-sim", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30) as c:
        return [
            c.post(gw + "/v1/chat/completions", json={**body, "max_tokens": 4}, headers=GOLD)
            for _ in range(SENT)
        ]


def test_shadow_passes_everything_and_counts_what_enforcement_refuses(tmp_path: Path) -> None:
    eng = start_engine(50.0, "--tokenizer", "approx")
    shadow = start_gateway(tmp_path, _config(eng.url, enforce=False))
    enforced = start_gateway(tmp_path, _config(eng.url, enforce=True))
    try:
        passed = _send(shadow.url)
        refused = _send(enforced.url)
        assert [r.status_code for r in passed] == [200] * SENT
        said = Counter(r.headers["x-velvetrope-shadow"] for r in passed)
        assert said == {"admitted": LIMIT, "rejected; rate_limited": SENT - LIMIT}
        answers = Counter((r.status_code, _code(r)) for r in refused)
        assert answers == {(200, ""): LIMIT, (429, "rate_limited"): SENT - LIMIT}
        counted = metric(
            shadow.url,
            "velvetrope_shadow_decisions_total",
            tier="interactive",
            decision="rejected",
            reason="rate_limited",
        )
        assert counted == answers[(429, "rate_limited")]
        assert (
            metric(shadow.url, "velvetrope_shadow_decisions_total", decision="admitted")
            == (answers[(200, "")])
        )
        # nothing was refused by the shadow gateway, and the enforcing one counts no shadow
        assert metric(shadow.url, "velvetrope_requests_total", outcome="rejected") == 0
        assert metric(enforced.url, "velvetrope_shadow_decisions_total") == 0
        assert "x-velvetrope-shadow" not in refused[0].headers
    finally:
        shadow.stop()
        enforced.stop()
        eng.stop()


def _code(r: httpx.Response) -> str:
    return "" if r.status_code == 200 else str(r.json()["error"]["code"])
