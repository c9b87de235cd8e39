"""Budgets over days and months, and the usage ledger, through real processes.

``velvetrope engine`` upstream, ``velvetrope serve`` (two of them sharing one real
``redis-server``, or one on ``memory://``), httpx and the official ``openai`` client.  The
gateways' calendar is moved by their wall-clock offset file
(``VELVETROPE_WALL_OFFSET_FILE``), never by waiting.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from tests.support.polling import poll
from tests.support.redis_server import RedisServer
from velvetrope.clock import OFFSET_ENV
from velvetrope.core.quota import LEDGER_CAP
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

from .conftest import ADMIN, admin_status, free_port, gateway_config

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


class Calendar:
    """The gateways' wall clock: an offset file they read at each request."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, when: str) -> float:
        """Make the gateways' now ``when`` (ISO, UTC); returns it as epoch seconds."""
        target = datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp()
        self.path.write_text(repr(target - time.time()))
        return target

    @property
    def env(self) -> dict[str, str]:
        return {OFFSET_ENV: str(self.path)}


def quota_config(engine: str, state: dict[str, Any], **quotas: Any) -> dict[str, Any]:
    cfg = gateway_config([engine])
    cfg["policy"]["estimator"] = {"reserve": "max_tokens"}
    cfg["gateway"]["saturation"] = {"enabled": False}
    cfg["state"] = state
    cfg["quotas"] = {"time_zone": "UTC", "ledger": True, **quotas}
    return cfg


def ask(gw: str, max_tokens: int = 40) -> httpx.Response:
    body = {
        "model": "velvetrope-sim",
        "messages": [{"role": "user", "content": "hello there, how are you today?"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return httpx.post(gw + "/v1/chat/completions", json=body, headers=GOLD, timeout=30)


def usage(gw: str, **query: str) -> httpx.Response:
    r = httpx.get(gw + "/admin/usage", params=query, headers=ADMIN_H)
    r.raise_for_status()
    return r


def usage_cli(*args: str) -> str:
    """What ``velvetrope usage ARGS`` prints (the admin token from its environment)."""
    return subprocess.run(
        [sys.executable, "-m", "velvetrope", "usage", *args],
        capture_output=True,
        text=True,
        env={"VELVETROPE_ADMIN_TOKEN": ADMIN, "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=True,
    ).stdout


def until(pred: Callable[[], bool], what: str) -> None:
    poll(pred, 20.0, what)


class Tally:
    """What the engine reported, per day, from the clients' side."""

    def __init__(self) -> None:
        self.days: dict[str, Counter[str]] = {}

    def add(self, day: str, r: httpx.Response) -> int:
        u = r.json()["usage"]
        c = self.days.setdefault(day, Counter())
        c["requests"] += 1
        c["input_tokens"] += u["prompt_tokens"]
        c["output_tokens"] += u["completion_tokens"]
        return int(u["prompt_tokens"] + u["completion_tokens"])

    def rows(self) -> list[tuple[str, int, int, int]]:
        return [
            (d, c["requests"], c["input_tokens"], c["output_tokens"])
            for d, c in sorted(self.days.items())
        ]


def ledger(gw: str) -> list[tuple[str, int, int, int]]:
    return [
        (r["day"], r["requests"], r["input_tokens"], r["output_tokens"])
        for r in usage(gw, tenant="gold").json()["rows"]
    ]


def spend_until_refused(gws: list[str], tally: Tally, day: str, limit: int = 100) -> httpx.Response:
    """Requests, alternating between ``gws``, until one is refused; returns the refusal."""
    for i in range(limit):
        r = ask(gws[i % len(gws)])
        if r.status_code != 200:
            return r
        tally.add(day, r)
    raise AssertionError(f"no refusal after {limit} requests")


def test_two_gateways_on_one_redis_share_a_daily_and_a_monthly_budget(
    engine: str, tmp_path: Path
) -> None:
    server = RedisServer()
    server.start()
    cal = Calendar(tmp_path / "offset")
    cal.set("2027-01-30T12:00:00")
    ns = f"t{uuid.uuid4().hex[:8]}"
    state = {"url": server.url, "namespace": ns, "call_timeout_ms": 1000}
    budgets = [
        {"tenant": "gold", "window": "day", "tokens": 600},
        {"tenant": "gold", "window": "month", "tokens": 1000},
    ]
    cfg = quota_config(engine, state, budgets=budgets)
    other = {**cfg, "listen": {"host": "127.0.0.1", "port": free_port()}}
    procs: list[ServerProcess] = []
    r_ = redis.Redis.from_url(server.url)
    try:
        procs += [launch.start_gateway(c, tmp_path, env=cal.env) for c in (cfg, other)]
        gws = [p.url for p in procs]
        tally = Tally()

        def level(key: str) -> float:
            raw = r_.hget(f"{ns}:{{t:gold}}:b:{key}", "l")
            return float(raw) if raw is not None else math.nan

        # day 1: the daily budget runs out first, shared by both gateways
        now = cal.set("2027-01-30T12:00:00")
        refused = spend_until_refused(gws, tally, "2027-01-30")
        assert refused.status_code == 429, refused.text
        err = refused.json()["error"]
        assert err["code"] == "quota_exceeded" and "gold:day:2027-01-30" in err["message"]
        to_midnight = datetime(2027, 1, 31, tzinfo=UTC).timestamp() - now
        retry = int(refused.headers["retry-after"])
        assert to_midnight - 5 <= retry <= to_midnight + 1  # 12 hours, less the test's time
        assert refused.headers["x-ratelimit-reset-quota"].startswith(("718m", "719m", "720m"))
        used_1 = sum(c for k, c in tally.days["2027-01-30"].items() if k != "requests")
        until(
            lambda: level("quota:gold:day:2027-01-30:tok") == 600 - used_1,
            "day 1 settled exactly",
        )
        assert used_1 > 600 - 2 * 80  # refused only when the next one would not fit

        # day 2 (the month's last): a fresh day, until the month's budget is spent
        now = cal.set("2027-01-31T12:00:00")
        refused = spend_until_refused(gws, tally, "2027-01-31")
        err = refused.json()["error"]
        assert err["code"] == "quota_exceeded" and "gold:month:2027-01" in err["message"]
        to_february = datetime(2027, 2, 1, tzinfo=UTC).timestamp() - now
        assert to_february - 5 <= int(refused.headers["retry-after"]) <= to_february + 1
        used_2 = sum(c for k, c in tally.days["2027-01-31"].items() if k != "requests")
        until(
            lambda: level("quota:gold:month:2027-01:tok") == 1000 - used_1 - used_2,
            "the month settled exactly",
        )

        # a new month: both budgets full again; the ledger counts every request once
        cal.set("2027-02-01T00:30:00")
        for gw in gws:
            ok = ask(gw)
            assert ok.status_code == 200, ok.text
            tally.add("2027-02-01", ok)
            assert float(ok.headers["x-ratelimit-remaining-quota"]) <= 600
        until(lambda: ledger(gws[0]) == tally.rows(), "the ledger equals the engine's usage")
        assert ledger(gws[1]) == tally.rows()

        # a gateway restart loses nothing: the day's budget goes on where it was
        day_key = "quota:gold:day:2027-02-01:tok"
        until(lambda: level(day_key) == 600 - sum(ask_sum(tally, "2027-02-01")), "settled")
        before = level(day_key)
        procs[0].stop()
        procs[0] = launch.start_gateway(cfg, tmp_path, env=cal.env)
        after = ask(gws[0])
        assert after.status_code == 200, after.text
        spent = tally.add("2027-02-01", after)
        # the reservation (the gateway's prompt count + max_tokens) was taken from `before`
        assert float(after.headers["x-ratelimit-remaining-quota"]) <= before - 40
        until(lambda: level(day_key) == before - spent, "settled after the restart")
        until(lambda: ledger(gws[1]) == tally.rows(), "the ledger after the restart")
        # the ledger counters are the settlements' and nothing else's
        for day, requests, inp, out in tally.rows():
            base = f"{ns}:{{t:gold}}:b:ledger|{day}|gold|velvetrope-sim|"
            assert LEDGER_CAP - float(r_.hget(base + "requests", "l") or 0) == requests
            assert LEDGER_CAP - float(r_.hget(base + "input", "l") or 0) == inp
            assert LEDGER_CAP - float(r_.hget(base + "output", "l") or 0) == out
            assert r_.pttl(base + "input") > 399 * 86400 * 1000  # kept 400 days

        # the CLI prints what the endpoint answers
        csv_text = usage(gws[0], format="csv").text
        assert usage_cli("--url", gws[1], "--format", "csv") == csv_text
        assert csv_text.splitlines()[0] == (
            "day,tenant,model,requests,input_tokens,cached_input_tokens,output_tokens,cost_usd"
        )
    finally:
        for p in procs:
            p.stop()
        r_.close()
        server.stop()


def ask_sum(tally: Tally, day: str) -> list[int]:
    c = tally.days.get(day, Counter())
    return [c["input_tokens"], c["output_tokens"]]


def test_one_gateway_warns_refuses_shadows_and_reloads_without_losing_usage(
    engine: str, tmp_path: Path
) -> None:
    cal = Calendar(tmp_path / "offset")
    now = cal.set("2026-12-06T20:00:00")
    budgets = [{"tenant": "gold", "window": "day", "tokens": 400}]
    cfg = quota_config(engine, {"url": "memory://"}, budgets=budgets, time_zone="Europe/Paris")
    proc = launch.start_gateway(cfg, tmp_path, env=cal.env)
    gw = proc.url
    client = openai.OpenAI(base_url=gw + "/v1", api_key="sk-gold-0000", max_retries=0)
    try:
        warned = None
        used = served = 0
        for _ in range(20):
            raw = client.chat.completions.with_raw_response.create(
                model="velvetrope-sim",
                messages=[{"role": "user", "content": "hello there, how are you today?"}],
                max_tokens=40,
                extra_body={"ignore_eos": True},
            )
            done = raw.parse()
            assert done.usage is not None
            used += done.usage.total_tokens
            served += 1
            if "x-velvetrope-quota-warning" in raw.headers:
                warned = raw.headers["x-velvetrope-quota-warning"]
                break
        assert warned is not None and "quota:gold:day:2026-12-06:tok" in warned
        assert used >= 0.8 * 400 and int(warned.split("%")[0]) >= 80
        refused: openai.RateLimitError | None = None
        for _ in range(20):
            try:
                done = client.chat.completions.create(
                    model="velvetrope-sim",
                    messages=[{"role": "user", "content": "hello there, how are you today?"}],
                    max_tokens=40,
                    extra_body={"ignore_eos": True},
                )
            except openai.RateLimitError as e:
                refused = e
                break
            assert done.usage is not None
            used += done.usage.total_tokens
            served += 1
        assert refused is not None
        assert refused.code == "quota_exceeded"
        # Paris midnight is 23:00 UTC: three hours after 20:00
        retry = int(refused.response.headers["retry-after"])
        assert 3 * 3600 - 5 <= retry <= 3 * 3600 + 1, (retry, now)
        metrics = httpx.get(gw + "/metrics").text
        assert 'velvetrope_quota_refusals_total{enforced="true",window="day"}' in metrics
        assert "velvetrope_quota_warnings_total" in metrics

        # shadow mode by reload: let through, said in a header; the usage is kept
        path = next(tmp_path.glob("gateway-*.yaml"))
        shadow = yaml.safe_load(path.read_text())
        shadow["quotas"]["enforce"] = False
        path.write_text(yaml.safe_dump(shadow))
        r = httpx.post(gw + "/admin/reload", headers=ADMIN_H)
        assert r.status_code == 200 and "quotas changed" in r.json()["changes"], r.text
        for _ in range(2):  # the second finds the budget in debt: let through all the same
            r = ask(gw)
            assert r.status_code == 200, r.text
            assert r.headers["x-velvetrope-shadow-quota"] == "rejected; quota_exceeded"
            used += r.json()["usage"]["total_tokens"]
            served += 1
        rows = usage(gw, tenant="gold").json()["rows"]
        assert [(x["day"], x["requests"]) for x in rows] == [("2026-12-06", served)]

        # enforced again and raised by reload: what was used stays used
        shadow["quotas"].update(enforce=True, budgets=[{**budgets[0], "tokens": 1000}])
        path.write_text(yaml.safe_dump(shadow))
        assert httpx.post(gw + "/admin/reload", headers=ADMIN_H).status_code == 200
        r = ask(gw)
        assert r.status_code == 200, r.text
        used += r.json()["usage"]["total_tokens"]
        assert admin_status(gw)["buckets"]["quota:gold:day:2026-12-06:tok"] == 1000 - used

        # velvetrope usage's table: the endpoint's row, aligned
        table = usage_cli("--url", gw, "--tenant", "gold").splitlines()
        row = usage(gw, tenant="gold").json()["rows"][0]
        assert table[0].split() == ["day", "tenant", "model", "requests", "input_tokens",
                                    "cached_input_tokens", "output_tokens", "cost_usd"]  # fmt: skip
        assert table[1].split() == [
            "2026-12-06", "gold", "velvetrope-sim", str(served + 1), str(row["input_tokens"]),
            "0", str(row["output_tokens"]), "0.000000",
        ]  # fmt: skip
        assert len(table) == 2 and len(table[0]) == len(table[1])
    finally:
        proc.stop()


def test_budgets_and_the_ledger_outlive_a_redis_killed_with_appendonly(
    engine: str, tmp_path: Path
) -> None:
    """The persistence the docs ask for (``appendonly yes``; ``always`` here, so a SIGKILL
    loses nothing acknowledged): Redis killed and restarted, the day's budget and the
    ledger are where they were, and counting goes on from there."""
    server = RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    cal = Calendar(tmp_path / "offset")
    cal.set("2027-03-10T09:00:00")
    ns = f"t{uuid.uuid4().hex[:8]}"
    state = {
        "url": server.url,
        "namespace": ns,
        "call_timeout_ms": 1000,
        "on_store_error": "fail_closed",  # nothing served, so nothing counted, while away
    }
    cfg = quota_config(engine, state, budgets=[{"tenant": "gold", "window": "day", "tokens": 5000}])
    proc = launch.start_gateway(cfg, tmp_path, env=cal.env)
    r_ = redis.Redis.from_url(server.url)
    key = f"{ns}:{{t:gold}}:b:quota:gold:day:2027-03-10:tok"
    tally = Tally()
    try:
        for _ in range(3):
            tally.add("2027-03-10", ask(proc.url))
        used = sum(c for k, c in tally.days["2027-03-10"].items() if k != "requests")
        until(lambda: float(r_.hget(key, "l") or 0) == 5000 - used, "settled before the kill")
        server.stop()  # SIGKILL
        server.start()
        served = None
        for _ in range(200):  # 503 state_unavailable until the gateway sees Redis again
            r = ask(proc.url)
            if r.status_code == 200:
                served = r
                break
            assert r.status_code == 503, r.text
            time.sleep(0.05)
        assert served is not None, "Redis never came back for the gateway"
        used += tally.add("2027-03-10", served)
        until(lambda: float(r_.hget(key, "l") or 0) == 5000 - used, "settled after the kill")
        until(lambda: ledger(proc.url) == tally.rows(), "the ledger after Redis's restart")
    finally:
        proc.stop()
        r_.close()
        server.stop()
