"""Reloading the configuration of a running gateway, through real processes.

A real ``velvetrope engine`` and ``velvetrope serve`` on loopback; the config file is
rewritten and the gateway told (``POST /admin/reload``, ``SIGHUP``, or its file watch).
Clients are httpx.  Every wait is a deadline poll; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from velvetrope.serving.launch import ServerProcess

from .conftest import ADMIN, admin_status, gateway_config, metric, start_engine, start_gateway

pytestmark = pytest.mark.integration

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def _key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{name}-0000"}


def _post(gw: str, who: str, **body: Any) -> httpx.Response:
    """One chat completion as tenant ``who``."""
    return httpx.post(gw + "/v1/chat/completions", json=_chat(**body), headers=_key(who))


def _chat(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": "velvetrope-sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        **extra,
    }


class Running:
    """A gateway started from a file this test rewrites."""

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.config = config
        self.proc: ServerProcess = start_gateway(tmp, config)
        self.url = self.proc.url
        self.path = tmp / f"gateway-{config['listen']['port']}.yaml"
        assert self.path.exists()

    def write(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Rewrite the file with ``change`` applied to a copy of the current config."""
        cfg = copy.deepcopy(self.config)
        change(cfg)
        self.path.write_text(yaml.safe_dump(cfg))
        self.config = cfg
        return cfg

    def reload(self) -> httpx.Response:
        return httpx.post(self.url + "/admin/reload", headers=ADMIN_H, timeout=10)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    p = start_engine(50.0, "--tokenizer", "approx")
    yield p.url
    p.stop()


def _add_tenant(name: str, tier: str = "standard") -> Callable[[dict[str, Any]], None]:
    def change(cfg: dict[str, Any]) -> None:
        cfg["policy"]["tenants"].append({"name": name, "tier": tier})
        cfg["api_keys"].append({"tenant": name, "key": f"sk-{name}-0000"})

    return change


def test_reload_applies_keys_and_limits_and_refuses_bad_files(tmp_path: Path, engine: str) -> None:
    cfg = gateway_config([engine])
    gw = Running(tmp_path, cfg)
    try:
        assert (
            httpx.post(
                gw.url + "/v1/chat/completions", json=_chat(), headers=_key("new")
            ).status_code
            == 401
        )
        assert httpx.post(gw.url + "/admin/reload").status_code == 401  # the admin token
        gw.write(_add_tenant("new"))
        r = gw.reload()
        assert r.status_code == 200, r.text
        assert "tenants added: new" in r.json()["changes"]
        ok = httpx.post(gw.url + "/v1/chat/completions", json=_chat(), headers=_key("new"))
        assert ok.status_code == 200, ok.text

        # a bad file: refused with the reason, the running config still serves
        good = gw.path.read_text()
        gw.path.write_text(good.replace("tenants:", "tenantz:", 1))
        bad = gw.reload()
        assert bad.status_code == 400
        err = bad.json()["error"]
        assert err["code"] == "invalid_config" and "tenantz" in err["message"]
        assert (
            httpx.post(
                gw.url + "/v1/chat/completions", json=_chat(), headers=_key("new")
            ).status_code
            == 200
        )

        # a change only a restart can make: refused, named
        gw.path.write_text(good)
        gw.write(lambda c: c["listen"].update(port=c["listen"]["port"] + 1))
        late = gw.reload()
        assert late.status_code == 409
        assert late.json()["error"]["code"] == "needs_restart"
        assert "listen" in late.json()["error"]["message"]
        gw.write(lambda c: c["listen"].update(port=c["listen"]["port"] - 1))

        assert metric(gw.url, "velvetrope_config_reload_total", result="ok") == 1
        assert metric(gw.url, "velvetrope_config_reload_total", result="invalid") == 1
        assert metric(gw.url, "velvetrope_config_reload_total", result="needs_restart") == 1
        assert "config reload refused" in gw.proc.stderr_text()

        # SIGHUP: the same reload
        gw.write(_add_tenant("hup"))
        os.kill(gw.proc.pid, signal.SIGHUP)
        _until(
            lambda: (
                httpx.post(
                    gw.url + "/v1/chat/completions", json=_chat(), headers=_key("hup")
                ).status_code
                == 200
            )
        )
        assert metric(gw.url, "velvetrope_config_reload_total", result="ok") == 2
    finally:
        gw.proc.stop()


def test_bucket_levels_carry_over_a_reload(tmp_path: Path, engine: str) -> None:
    cfg = gateway_config([engine])
    silver = next(t for t in cfg["policy"]["tenants"] if t["name"] == "silver")
    silver["limits"] = {"requests_per_minute": 6}  # a bucket of 6, refilled 1 per 10 s
    gw = Running(tmp_path, cfg)

    def left() -> int:
        r = httpx.post(gw.url + "/v1/chat/completions", json=_chat(), headers=_key("silver"))
        assert r.status_code == 200, r.text
        return int(r.headers["x-ratelimit-remaining-requests"])

    def limit_to(rpm: int) -> Callable[[dict[str, Any]], None]:
        def change(c: dict[str, Any]) -> None:
            t = next(t for t in c["policy"]["tenants"] if t["name"] == "silver")
            t["limits"] = {"requests_per_minute": rpm}

        return change

    try:
        assert [left() for _ in range(3)] == [5, 4, 3]
        gw.write(limit_to(60))  # raised: refills from the current level, not reset to full
        assert gw.reload().status_code == 200
        assert left() in (2, 3, 4)  # 3, less this request, plus what 60/min refilled since
        gw.write(limit_to(2))  # lowered below the level: clipped to the new capacity
        assert gw.reload().status_code == 200
        assert left() in (0, 1)
        r = httpx.post(gw.url + "/v1/chat/completions", json=_chat(), headers=_key("silver"))
        if r.status_code == 200:  # the clipped bucket had 2 left: one more, then none
            r = httpx.post(gw.url + "/v1/chat/completions", json=_chat(), headers=_key("silver"))
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    finally:
        gw.proc.stop()


def test_a_removed_tenants_queued_requests_are_rejected_its_running_one_finishes(
    tmp_path: Path,
) -> None:
    slow = start_engine(1.0, "--tokenizer", "approx", "--outputs", "fixed:40")
    cfg = gateway_config([slow.url])
    cfg["policy"]["pools"] = [{"name": "default", "max_in_flight": 1}]
    gw = Running(tmp_path, cfg)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            first = asyncio.create_task(
                c.post(gw.url + "/v1/chat/completions", json=_chat(40), headers=_key("bronze"))
            )
            await _async_until(c, gw.url, lambda st: st["in_flight"] == 1)
            queued = [
                asyncio.create_task(
                    c.post(gw.url + "/v1/chat/completions", json=_chat(4), headers=_key("bronze"))
                )
                for _ in range(2)
            ]
            await _async_until(c, gw.url, lambda st: st["queued"] == 2)

            def drop(c2: dict[str, Any]) -> None:
                c2["policy"]["tenants"] = [
                    t for t in c2["policy"]["tenants"] if t["name"] != "bronze"
                ]
                c2["api_keys"] = [k for k in c2["api_keys"] if k["tenant"] != "bronze"]

            gw.write(drop)
            r = await c.post(gw.url + "/admin/reload", headers=ADMIN_H)
            assert r.status_code == 200, r.text
            assert any("rejected (removed_by_reload)" in x for x in r.json()["changes"])
            return [await first, *[await q for q in queued]]

    try:
        first, *rest = asyncio.run(run())
        assert first.status_code == 200  # it was running: it finishes
        for r in rest:
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "removed_by_reload"
        gone = httpx.post(gw.url + "/v1/chat/completions", json=_chat(), headers=_key("bronze"))
        assert gone.status_code == 401  # its key went with it
        st = admin_status(gw.url)
        assert st["queued"] == 0 and st["in_flight"] == 0
        assert metric(gw.url, "velvetrope_requests_total", reason="removed_by_reload") == 2
    finally:
        gw.proc.stop()
        slow.stop()


def test_the_file_watch_reloads_a_rewritten_file(tmp_path: Path, engine: str) -> None:
    cfg = gateway_config([engine])
    cfg["gateway"]["reload_watch_s"] = 0.2
    gw = Running(tmp_path, cfg)
    try:
        gw.write(_add_tenant("watched"))
        _until(
            lambda: (
                httpx.post(
                    gw.url + "/v1/chat/completions", json=_chat(), headers=_key("watched")
                ).status_code
                == 200
            )
        )
    finally:
        gw.proc.stop()


def test_reloads_under_load_lose_nothing(tmp_path: Path, engine: str) -> None:
    cfg = gateway_config([engine])
    gw = Running(tmp_path, cfg)
    statuses: list[int] = []

    async def client(c: httpx.AsyncClient, who: str, n: int) -> None:
        for i in range(n):
            body = _chat(8, stream=bool(i % 2))
            r = await c.post(gw.url + "/v1/chat/completions", json=body, headers=_key(who))
            statuses.append(r.status_code)

    async def reloads(c: httpx.AsyncClient) -> list[int]:
        out = []
        for i in range(10):
            gw.write(_add_tenant(f"t{i}"))
            out.append((await c.post(gw.url + "/admin/reload", headers=ADMIN_H)).status_code)
            await asyncio.sleep(0.05)
        return out

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as c:
            load = [client(c, who, 40) for who in ("gold", "silver", "bronze") for _ in range(3)]
            done, *_ = await asyncio.gather(reloads(c), *load)
            assert done is not None
            return done

    try:
        assert asyncio.run(run()) == [200] * 10
        assert len(statuses) == 9 * 40
        assert set(statuses) == {200}, sorted(set(statuses))
        st = admin_status(gw.url)
        assert st["queued"] == 0 and st["in_flight"] == 0
    finally:
        gw.proc.stop()


def _until(ok: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


async def _async_until(
    c: httpx.AsyncClient, gw: str, ok: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        st = (await c.get(gw + "/admin/status", headers=ADMIN_H)).json()
        if ok(st):
            return
        assert time.monotonic() < deadline, f"status never matched: {st}"
        await asyncio.sleep(0.02)
