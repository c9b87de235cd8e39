"""A spent budget that downgrades instead of refusing, through real processes.

``velvetrope engine`` upstream, ``velvetrope serve`` on ``memory://`` with two pools on
that engine, the official ``openai`` client.  Tenant ``gold`` (tier ``interactive``) has a
daily budget with ``on_exceeded: downgrade`` to tier ``batch`` in pool ``cheap``; tenant
``bronze`` has one that refuses.  The calendar is the test's (``VELVETROPE_WALL_OFFSET_FILE``).
"""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from tests.support.polling import poll
from tests.support.prometheus import metric_sum
from velvetrope.config import parse_config
from velvetrope.errors import ConfigError
from velvetrope.serving import launch

from .conftest import ADMIN, admin_status, wait_idle
from .test_quotas import Calendar, quota_config, usage

pytestmark = pytest.mark.integration

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
DAY = "2027-04-14"
GOLD_KEY = f"quota:gold:day:{DAY}:tok"
DOWNGRADE = {"on_exceeded": "downgrade", "downgrade_to_tier": "batch"}


def downgrade_config(engine: str) -> dict[str, Any]:
    budgets = [
        {"tenant": "gold", "window": "day", "tokens": 300, **DOWNGRADE,
         "downgrade_to_pool": "cheap"},
        {"tenant": "bronze", "window": "day", "tokens": 300},
    ]  # fmt: skip
    cfg = quota_config(engine, {"url": "memory://"}, budgets=budgets)
    cfg["policy"]["pools"].append({"name": "cheap", "max_in_flight": 8})
    cfg["upstreams"]["cheap"] = [{"url": engine}]
    return cfg


def chat(client: openai.OpenAI) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="velvetrope-sim",
        messages=[{"role": "user", "content": "hello there, how are you today?"}],
        max_tokens=40,
        extra_body={"ignore_eos": True},
    )


def test_over_budget_gold_is_served_downgraded_and_bronze_is_refused(
    engine: str, tmp_path: Path
) -> None:
    cal = Calendar(tmp_path / "offset")
    cal.set(f"{DAY}T10:00:00")
    proc = launch.start_gateway(downgrade_config(engine), tmp_path, env=cal.env)
    gw = proc.url
    gold = openai.OpenAI(base_url=gw + "/v1", api_key="sk-gold-0000", max_retries=0)
    bronze = openai.OpenAI(base_url=gw + "/v1", api_key="sk-bronze-0000", max_retries=0)
    try:
        inp = out = served = 0
        down = None
        for _ in range(20):  # at its own tier until the budget is spent, then downgraded
            raw = chat(gold)
            assert raw.http_response.status_code == 200
            done = raw.parse()
            inp += done.usage.prompt_tokens
            out += done.usage.completion_tokens
            served += 1
            if "x-velvetrope-degraded" in raw.headers:
                down = raw.headers
                break
            assert raw.headers["x-velvetrope-pool"] == "default"
        assert down is not None, "never downgraded"
        assert down["x-velvetrope-degraded"] == "quota, tier=batch, pool=cheap"
        assert down["x-velvetrope-pool"] == "cheap"
        own = inp + out - done.usage.total_tokens  # what gold used at its own tier
        assert 300 - 80 < own <= 300 + 80
        wait_idle(gw)
        # the downgraded request is not charged to the spent budget ...
        level = admin_status(gw)["buckets"][GOLD_KEY]
        assert level == 300 - own
        raw = chat(gold)  # ... so the next one is downgraded too
        assert raw.headers["x-velvetrope-degraded"] == "quota, tier=batch, pool=cheap"
        done = raw.parse()
        inp += done.usage.prompt_tokens
        out += done.usage.completion_tokens
        served += 1
        wait_idle(gw)
        assert admin_status(gw)["buckets"][GOLD_KEY] == level
        # ... and counted in the ledger once, as every request
        rows = usage(gw, tenant="gold").json()["rows"]
        got = [(r["day"], r["requests"], r["input_tokens"], r["output_tokens"]) for r in rows]
        assert got == [(DAY, served, inp, out)]
        metrics = httpx.get(gw + "/metrics").text
        downgrades = 'velvetrope_quota_downgrades_total{enforced="true",tier="batch",window="day"}'
        assert f"{downgrades} 2.0" in metrics
        assert metric_sum(metrics, "velvetrope_requests_total", tier="batch") == 2
        assert metric_sum(metrics, "velvetrope_quota_refusals_total") == 0

        # a budget that refuses: 429 quota_exceeded with the reset in Retry-After
        refused: openai.RateLimitError | None = None
        for _ in range(20):
            try:
                chat(bronze)
            except openai.RateLimitError as e:
                refused = e
                break
        assert refused is not None and refused.code == "quota_exceeded"
        retry = int(refused.response.headers["retry-after"])
        assert 14 * 3600 - 5 <= retry <= 14 * 3600 + 1  # 10:00 UTC to midnight
        assert "x-velvetrope-degraded" not in refused.response.headers

        # the budgets' burn: /admin/status, and velvetrope top's table of it
        wait_idle(gw)
        burn = {b["scope"]: b for b in admin_status(gw)["budgets"]}
        assert (burn["gold"]["used"], burn["gold"]["limit"]) == (own, 300)
        assert burn["gold"]["window"] == "day" and burn["bronze"]["used"] > 300 - 80
        assert 14 * 3600 - 60 <= burn["gold"]["reset_s"] <= 14 * 3600
        top = subprocess.run(
            [sys.executable, "-m", "velvetrope", "top", "--url", gw, "--admin-token", ADMIN,
             "--once", "--interval", "0"],
            capture_output=True, text=True, timeout=60, check=True,
            env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
        ).stdout.splitlines()  # fmt: skip
        row = next(r for r in (line.split() for line in top) if r[:2] == ["gold", "day"])
        assert row[-3:-1] == [f"{own}/300", f"{own / 3:.0f}%"]  # used/limit, share

        # shadow mode (by reload): gold runs at its own tier; the header says what would be
        path = next(tmp_path.glob("gateway-*.yaml"))
        shadow = yaml.safe_load(path.read_text())
        shadow["quotas"]["enforce"] = False
        path.write_text(yaml.safe_dump(shadow))
        assert httpx.post(gw + "/admin/reload", headers=ADMIN_H).status_code == 200
        raw = chat(gold)
        assert raw.headers["x-velvetrope-shadow-quota"] == "downgraded; tier=batch; pool=cheap"
        assert "x-velvetrope-degraded" not in raw.headers
        assert raw.headers["x-velvetrope-pool"] == "default"
        metrics = httpx.get(gw + "/metrics").text
        shadowed = 'velvetrope_quota_downgrades_total{enforced="false",tier="batch",window="day"}'
        assert f"{shadowed} 1.0" in metrics
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("budget", "says"),
    [
        ({"on_exceeded": "downgrade"}, "needs downgrade_to_tier or downgrade_to_pool"),
        ({"downgrade_to_tier": "batch"}, "with on_exceeded: downgrade, and only then"),
        ({**DOWNGRADE, "downgrade_to_tier": "gold"}, "downgrade_to_tier 'gold'"),
        ({**DOWNGRADE, "downgrade_to_pool": "nowhere"}, "downgrade_to_pool 'nowhere'"),
        ({"on_exceeded": "ignore"}, "on_exceeded"),
    ],
)
def test_a_downgrade_names_where_to(budget: dict[str, Any], says: str) -> None:
    cfg = quota_config("http://127.0.0.1:1", {"url": "memory://"})
    cfg["quotas"]["budgets"] = [{"tenant": "gold", "window": "day", "tokens": 10, **budget}]
    with pytest.raises(ConfigError, match=says):
        parse_config(cfg, "gateway.yaml")


def settled_at(level: Callable[[], float], left: float) -> bool:
    return level() == left


def test_on_redis_the_downgrade_is_the_same_and_settled_once(
    engine: str, fresh_redis: str, tmp_path: Path
) -> None:
    """The store's denial comes from the Lua script: the same downgrade, the spent budget
    untouched by it in Redis, and the ledger there equal to what the engine reported."""
    cal = Calendar(tmp_path / "offset")
    cal.set(f"{DAY}T10:00:00")
    cfg = downgrade_config(engine)
    ns = f"t{uuid.uuid4().hex[:8]}"
    cfg["state"] = {"url": fresh_redis, "namespace": ns, "call_timeout_ms": 1000}
    proc = launch.start_gateway(cfg, tmp_path, env=cal.env)
    gold = openai.OpenAI(base_url=proc.url + "/v1", api_key="sk-gold-0000", max_retries=0)
    r_ = redis.Redis.from_url(fresh_redis)

    def level() -> float:
        raw = r_.hget(f"{ns}:{{t:gold}}:b:{GOLD_KEY}", "l")
        return float(raw) if raw is not None else math.nan

    try:
        served = inp = out = downgraded = 0
        spent_at = math.nan
        for _ in range(12):
            raw = chat(gold)
            done = raw.parse()
            served += 1
            inp += done.usage.prompt_tokens
            out += done.usage.completion_tokens
            if "x-velvetrope-degraded" in raw.headers:
                assert raw.headers["x-velvetrope-degraded"] == "quota, tier=batch, pool=cheap"
                downgraded += 1
                if downgraded == 1:
                    left = 300.0 - (inp + out - done.usage.total_tokens)  # less gold's own use
                    poll(partial(settled_at, level, left), 20.0, "settled before the downgrade")
                    spent_at = level()
        assert downgraded >= 2
        poll(lambda: usage(proc.url, tenant="gold").json()["rows"][0]["requests"] == served,
             20.0, "every request in the ledger")  # fmt: skip
        row = usage(proc.url, tenant="gold").json()["rows"][0]
        assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (served, inp, out)
        assert level() == spent_at  # the downgraded requests were not charged to it
    finally:
        proc.stop()
        r_.close()
