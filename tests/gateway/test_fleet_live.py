"""The fleet against real ``velvetrope engine`` processes on loopback: saturation on KV
usage, engines that die, hang, join and are discovered, routing rules and degradation.

Every wait is a deadline poll on ``/admin/status`` (or on the in-process gateway's state);
no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from velvetrope.config import parse_config
from velvetrope.gateway.api.app import Gateway
from velvetrope.openai.tokenizer import ApproxTokenizer
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess, free_port

from .conftest import (
    admin_status,
    gateway_config,
    metric,
    start_engine,
    start_gateway,
    start_together,
    status_until,
    wait_idle,
)

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
SILVER = {"Authorization": "Bearer sk-silver-0000"}


def body(max_tokens: int, model: str = "velvetrope-sim") -> dict[str, Any]:
    return {"model": model, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True}


def spawn(
    c: httpx.AsyncClient, gw: str, n: int, max_tokens: int, headers: dict[str, str] = GOLD
) -> list[asyncio.Task[httpx.Response]]:
    """``n`` completions of ``max_tokens`` tokens, started now."""
    url = gw + "/v1/completions"
    return [
        asyncio.create_task(c.post(url, json=body(max_tokens), headers=headers)) for _ in range(n)
    ]


def upstream(st: dict[str, Any], url: str) -> dict[str, Any]:
    return next(u for u in st["upstreams"] if u["url"] == url)


def generated(engine_url: str) -> float:
    text = httpx.get(engine_url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    )


def test_dispatch_pauses_while_kv_usage_is_over_the_threshold(tmp_path: Path) -> None:
    """Three long requests fill a small KV cache past 30%; four more wait in the gateway
    (32 slots free) until the readings show the cache has emptied, then run."""
    eng = start_engine(1.0, "--set", "num_gpu_blocks=64", "--set", "max_model_len=1024")
    cfg = gateway_config([eng.url])
    cfg["policy"]["saturation"] = {
        "max_waiting": 100,  # only the KV threshold holds
        "max_kv_usage": 0.3,
        "scrape_interval_s": 0.05,
    }
    gw = start_gateway(tmp_path, cfg)

    def kv(st: dict[str, Any]) -> float:
        return max((e["kv_usage"] or 0.0) for e in st["engine_load"].values())

    async def go() -> tuple[list[httpx.Response], dict[str, Any], float]:
        async with httpx.AsyncClient(timeout=60) as c:
            first = spawn(c, gw.url, 3, 300)
            st = await status_until(c, gw.url, lambda s: kv(s) >= 0.3)
            assert kv(st) >= 0.3, st
            late = spawn(c, gw.url, 4, 300)
            held = await status_until(c, gw.url, lambda s: s["queued"] == 4)
            assert (held["queued"], held["in_flight"]) == (4, 3), held  # slots were free
            # an idle pool always lets one through; the other three wait for a reading
            released = await status_until(c, gw.url, lambda s: s["queued"] == 0)
            rs = [*(await asyncio.gather(*first)), *(await asyncio.gather(*late))]
            return rs, held, kv(released)

    try:
        rs, held, kv_at_release = asyncio.run(go())
        assert [r.status_code for r in rs] == [200] * 7
        assert kv(held) >= 0.3
        assert kv_at_release < 0.3  # released by a reading that showed the cache below it
        assert wait_idle(gw.url)["dispatch_held_by_saturation"] > 0
        assert metric(gw.url, "velvetrope_dispatch_held_total", pool="default") > 0
        assert generated(eng.url) == 7 * 300
    finally:
        gw.stop()
        eng.stop()


async def _traffic(url: str, n: int, concurrency: int = 4) -> list[int]:
    """``n`` requests, ``concurrency`` at a time; their status codes."""
    codes: list[int] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30) as c:

        async def one() -> None:
            async with sem:
                r = await c.post(url + "/v1/completions", json=body(40), headers=GOLD)
                codes.append(r.status_code)

        await asyncio.gather(*(one() for _ in range(n)))
    return codes


def test_a_killed_engine_leaves_the_rotation_and_rejoins(tmp_path: Path) -> None:
    a = start_engine(50.0)
    port_b = free_port()
    b: ServerProcess = launch.start_engine("--speed", "50", port=port_b)
    cfg = gateway_config([a.url, b.url])
    cfg["gateway"]["fleet"] = {"health_interval_s": 0.2, "health_timeout_s": 0.5}
    gw = start_gateway(tmp_path, cfg)
    try:
        assert asyncio.run(_traffic(gw.url, 20)) == [200] * 20
        assert upstream(admin_status(gw.url), b.url)["requests"] > 0

        async def kill_mid_run() -> list[int]:
            traffic = asyncio.ensure_future(_traffic(gw.url, 40))
            await asyncio.sleep(0)  # let the traffic start
            b.proc.kill()  # SIGKILL: its connections break, new ones are refused
            b.proc.wait()
            return await traffic

        codes = asyncio.run(kill_mid_run())
        assert 500 not in codes and set(codes) <= {200, 502}  # 502: cut off mid-answer
        assert codes.count(502) <= 4  # at most what was in flight on it
        st = asyncio.run(_poll(gw.url, lambda s: not upstream(s, b.url)["healthy"]))
        served = upstream(st, b.url)["requests"]
        assert asyncio.run(_traffic(gw.url, 20)) == [200] * 20  # no request tries it
        assert upstream(admin_status(gw.url), b.url)["requests"] == served
        b2 = launch.start_engine("--speed", "50", port=port_b)  # it comes back
        try:
            asyncio.run(_poll(gw.url, lambda s: upstream(s, b.url)["healthy"]))
            assert asyncio.run(_traffic(gw.url, 20)) == [200] * 20
            assert upstream(admin_status(gw.url), b.url)["requests"] > served
        finally:
            b2.stop()
    finally:
        gw.stop()
        a.stop()
        b.stop()


async def _poll(gw: str, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as c:
        st = await status_until(c, gw, ok)
    assert ok(st), st
    return st


def test_a_third_engine_started_mid_run_raises_the_pools_capacity(tmp_path: Path) -> None:
    a, b = start_together(lambda: start_engine(1.0), lambda: start_engine(1.0))
    port_c = free_port()
    url_c = f"http://127.0.0.1:{port_c}"
    cfg = gateway_config(
        [a.url, b.url, url_c], pools=[{"name": "default", "max_in_flight_per_engine": 2}]
    )
    cfg["policy"]["saturation"] = {"enabled": False}
    cfg["gateway"]["fleet"] = {"health_interval_s": 0.2, "health_timeout_s": 0.5}
    gw = start_gateway(tmp_path, cfg)
    c: ServerProcess | None = None
    try:
        asyncio.run(_poll(gw.url, lambda s: s["pools"]["default"]["max_in_flight"] == 4))

        async def go() -> list[int]:
            nonlocal c
            async with httpx.AsyncClient(timeout=60) as cl:
                reqs = spawn(cl, gw.url, 10, 600)
                st = await status_until(cl, gw.url, lambda s: s["queued"] == 6)
                assert (st["in_flight"], st["queued"]) == (4, 6), st
                c = launch.start_engine("--speed", "1", port=port_c)
                st = await status_until(
                    cl, gw.url, lambda s: s["pools"]["default"]["max_in_flight"] == 6
                )
                assert st["pools"]["default"]["engines"] == 3, st
                st = await status_until(cl, gw.url, lambda s: s["in_flight"] > 4)
                assert st["in_flight"] > 4, st
                return [r.status_code for r in await asyncio.gather(*reqs)]

        assert asyncio.run(go()) == [200] * 10
        assert upstream(admin_status(gw.url), url_c)["requests"] > 0
        assert metric(gw.url, "velvetrope_pool_engines", pool="default") == 3
    finally:
        gw.stop()
        a.stop()
        b.stop()
        if c is not None:
            c.stop()


def test_length_rules_route_as_configured(tmp_path: Path) -> None:
    long_eng, short_eng = start_together(start_engine, start_engine)
    cfg = gateway_config(
        [],
        pools=[{"name": "long"}, {"name": "short"}],
        routes=[{"name": "short-answers", "pool": "short", "max_predicted_output": 100}],
    )
    cfg["upstreams"] = {"long": [{"url": long_eng.url}], "short": [{"url": short_eng.url}]}
    gw = start_gateway(tmp_path, cfg)
    try:
        with httpx.Client(timeout=30) as c:
            for _ in range(5):
                short = c.post(gw.url + "/v1/completions", json=body(50), headers=GOLD)
                long = c.post(gw.url + "/v1/completions", json=body(400), headers=SILVER)
                assert (short.status_code, long.status_code) == (200, 200)
                assert short.headers["x-velvetrope-pool"] == "short"
                assert short.headers["x-velvetrope-route"] == "short-answers"
                assert long.headers["x-velvetrope-pool"] == "long"
                assert long.headers["x-velvetrope-route"] == "default"
        assert (generated(short_eng.url), generated(long_eng.url)) == (5 * 50, 5 * 400)
        assert metric(gw.url, "velvetrope_routed_total", pool="short", rule="short-answers") == 5
    finally:
        gw.stop()
        long_eng.stop()
        short_eng.stop()


CAP = {"wait_s": 1, "max_tokens": 20}
FALLBACK = {"pool": "spare", "model": "small-sim"}


async def _raw(client: openai.AsyncOpenAI, max_tokens: int) -> Any:
    """A completion through ``client``, with its raw response (headers)."""
    return await client.completions.with_raw_response.create(
        model="velvetrope-sim",
        prompt="hello",
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
    )


def test_degraded_requests_succeed_capped_or_on_the_fallback_model(tmp_path: Path) -> None:
    """One slot in 'main' and a slow drain prior: a queue makes the predicted wait long.  A
    gold request is then capped at 20 tokens (served, and charged for 20); a silver one,
    whose wait would exceed its max_wait, goes to the spare pool's small model, the
    request's model rewritten (the small engine serves no other)."""
    main, spare = start_together(
        lambda: start_engine(1.0), lambda: start_engine(50.0, "--model", "small-sim")
    )
    cfg = gateway_config(
        [],
        preset="priority",  # strict bands: a band waits for the work in it and above
        pools=[
            {"name": "main", "max_in_flight": 1, "initial_drain_tokens_per_s": 1.0},
            {"name": "spare"},
        ],
        tiers=[
            {"name": "interactive", "max_wait_s": 10_000, "degrade": CAP},
            {"name": "standard", "max_wait_s": 5, "degrade": FALLBACK},
            {"name": "batch"},
        ],
    )
    cfg["upstreams"] = {"main": [{"url": main.url}], "spare": [{"url": spare.url}]}
    cfg["policy"]["tenants"][0]["limits"] = {"tokens_per_minute": 100_000}
    gw = start_gateway(tmp_path, cfg)

    base = gw.url + "/v1"

    async def go() -> tuple[Any, Any]:
        async with (
            httpx.AsyncClient(timeout=60) as c,
            openai.AsyncOpenAI(base_url=base, api_key="sk-gold-0000", max_retries=0) as gold,
            openai.AsyncOpenAI(base_url=base, api_key="sk-silver-0000", max_retries=0) as silver,
        ):
            first = spawn(c, gw.url, 2, 200)
            await status_until(c, gw.url, lambda s: s["queued"] == 1)
            capped = asyncio.create_task(_raw(gold, 200))
            await status_until(c, gw.url, lambda s: s["queued"] == 2)
            moved = await _raw(silver, 30)
            assert [r.status_code for r in await asyncio.gather(*first)] == [200, 200]
            return await capped, moved

    try:
        capped, moved = asyncio.run(go())
        assert capped.headers["x-velvetrope-degraded"] == "max_tokens=20"
        assert capped.headers["x-velvetrope-pool"] == "main"
        c = capped.parse()
        assert c.usage is not None and c.usage.completion_tokens == 20
        assert moved.headers["x-velvetrope-degraded"] == "pool=spare, model=small-sim"
        m = moved.parse()
        assert m.model == "small-sim" and m.usage is not None and m.usage.completion_tokens == 30
        p = ApproxTokenizer().count("hello")
        # the buckets reserved what each job would use: 200, 200, then the capped 20
        assert metric(gw.url, "velvetrope_tokens_reserved_total", tier="interactive") == 3 * p + 420
        degraded = "velvetrope_degraded_total"
        assert metric(gw.url, degraded, tier="interactive", action="max_tokens") == 1
        assert metric(gw.url, degraded, tier="standard", action="pool") == 1
        assert generated(spare.url) == 30
    finally:
        gw.stop()
        main.stop()
        spare.stop()


def test_dns_discovery_finds_scaled_engines(tmp_path: Path) -> None:
    """Engines on 127.0.0.2 and 127.0.0.3 behind one name; the name's answer is scripted
    (no DNS server on a test box), everything else is real: probes, requests, capacity."""
    port = _free_port_on("127.0.0.2", "127.0.0.3")
    engines = {
        ip: launch.start(
            ["engine", "--host", ip, "--port", str(port), "--speed", "50"],
            f"http://{ip}:{port}",
            "/health",
        )
        for ip in ("127.0.0.2", "127.0.0.3")
    }
    answer = ["127.0.0.2"]

    async def resolver(host: str, p: int) -> list[str]:
        assert (host, p) == ("engines.test", port)
        return list(answer)

    cfg = gateway_config([], pools=[{"name": "default", "max_in_flight_per_engine": 3}])
    cfg["upstreams"] = {"default": [{"url": f"http://engines.test:{port}", "discovery": "dns"}]}
    cfg["gateway"]["fleet"] = {"dns_refresh_s": 3600}  # the test refreshes by hand
    gw = Gateway(parse_config(cfg), resolver=resolver)
    cap = gw.ctl.pool_capacity("default")

    async def go() -> list[tuple[int, list[str]]]:
        seen = []
        await gw.startup()
        transport = httpx.ASGITransport(app=gw)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                for step in (["127.0.0.2"], ["127.0.0.2", "127.0.0.3"], ["127.0.0.3"]):
                    answer[:] = step
                    assert gw.session is not None
                    await gw.upstreams.refresh_dns(gw.session)
                    r = await c.post("/v1/completions", json=body(10), headers=GOLD)
                    assert r.status_code == 200
                    seen.append((cap.max_in_flight, [u.url for u in gw.upstreams.live("default")]))
        finally:
            await gw.shutdown()
        return seen

    try:
        u2, u3 = (f"http://{ip}:{port}" for ip in ("127.0.0.2", "127.0.0.3"))
        assert asyncio.run(go()) == [(3, [u2]), (6, [u2, u3]), (3, [u3])]
        assert generated(u3) >= 10
    finally:
        for e in engines.values():
            e.stop()


def _free_port_on(*hosts: str) -> int:
    import socket

    while True:
        port = free_port()
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, port))
        except OSError:
            continue
        return port


def test_the_breaker_takes_a_hung_engine_out_and_probes_it_back(tmp_path: Path) -> None:
    """Engine A hangs (SIGSTOP; health checks are far apart, so only the breaker acts):
    two requests time out on it, its breaker opens and everything goes to B; after SIGCONT
    a probe closes the breaker and A serves again."""
    a, b = start_together(start_engine, start_engine)
    cfg = gateway_config([a.url, b.url])
    cfg["policy"]["saturation"] = {"enabled": False}
    cfg["gateway"]["upstream_read_timeout_s"] = 0.5
    cfg["gateway"]["fleet"] = {
        "health_interval_s": 3600,
        "breaker_failures": 2,
        "breaker_open_s": 0.3,
    }
    gw = start_gateway(tmp_path, cfg)
    os.kill(a.pid, signal.SIGSTOP)

    def post() -> int:
        r = httpx.post(gw.url + "/v1/completions", json=body(20), headers=GOLD, timeout=30)
        return r.status_code

    try:
        codes: list[int] = []
        while upstream(admin_status(gw.url), a.url)["breaker"] == "closed" and len(codes) < 40:
            codes.append(post())
        assert codes.count(504) == 2 and set(codes) <= {200, 504}  # two timeouts open it
        # while A is out only its probes (one per open period, each a 504) reach it
        st0 = admin_status(gw.url)
        later = [post() for _ in range(10)]
        st1 = admin_status(gw.url)
        a0, a1 = upstream(st0, a.url), upstream(st1, a.url)
        b0, b1 = upstream(st0, b.url), upstream(st1, b.url)
        assert later.count(200) == b1["requests"] - b0["requests"]
        assert (
            later.count(504) == a1["requests"] - a0["requests"] == a1["failures"] - a0["failures"]
        )
        os.kill(a.pid, signal.SIGCONT)
        served = a1["requests"]
        for _ in range(200):  # a probe succeeds once the breaker half-opens
            assert post() in (200, 504)
            if upstream(admin_status(gw.url), a.url)["breaker"] == "closed":
                break
        st = admin_status(gw.url)
        assert upstream(st, a.url)["breaker"] == "closed"
        assert [post() for _ in range(6)] == [200] * 6
        assert upstream(admin_status(gw.url), a.url)["requests"] > served + 1  # serving again
        assert metric(gw.url, "velvetrope_upstream_breaker_state", upstream=a.url) == 0
    finally:
        os.kill(a.pid, signal.SIGCONT)
        gw.stop()
        a.stop()
        b.stop()


def test_one_clients_engine_errors_do_not_take_the_engine_out(tmp_path: Path) -> None:
    """Requests of one tenant that make the engine answer 500 get a 502 each and leave the
    engine in rotation; 500s from two tenants, or a 503 (the engine cannot serve), count
    against its breaker.  The engine is real, with its fault injection on."""
    eng = start_engine(50.0, "--faults")
    cfg = gateway_config([eng.url])
    cfg["policy"]["saturation"] = {"enabled": False}
    cfg["gateway"]["fleet"] = {
        "health_interval_s": 3600,
        "breaker_failures": 2,
        "breaker_open_s": 3600,
    }
    gw = start_gateway(tmp_path, cfg)

    def post(headers: dict[str, str], fault: int | None = None) -> httpx.Response:
        b: dict[str, Any] = body(5)
        if fault is not None:
            b["velvetrope_fault"] = fault
        return httpx.post(gw.url + "/v1/completions", json=b, headers=headers, timeout=30)

    def breaker() -> str:
        state: str = upstream(admin_status(gw.url), eng.url)["breaker"]
        return state

    try:
        for _ in range(6):
            r = post(GOLD, 500)
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
        assert breaker() == "closed"
        assert post(GOLD).status_code == 200
        assert upstream(admin_status(gw.url), eng.url)["failures"] == 6
        # 500s from a second tenant too: the engine fails everyone's requests
        assert post(GOLD, 500).status_code == 502 and breaker() == "closed"
        assert post(SILVER, 500).status_code == 502 and breaker() == "closed"  # one counted
        assert post(SILVER, 500).status_code == 502 and breaker() == "open"
        r = post(GOLD)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_upstream"
    finally:
        gw.stop()
        eng.stop()


def test_engine_503s_from_one_tenant_count_against_its_breaker(tmp_path: Path) -> None:
    eng = start_engine(50.0, "--faults")
    cfg = gateway_config([eng.url])
    cfg["policy"]["saturation"] = {"enabled": False}
    cfg["gateway"]["fleet"] = {"health_interval_s": 3600, "breaker_failures": 2}
    gw = start_gateway(tmp_path, cfg)
    try:
        b: dict[str, Any] = {**body(5), "velvetrope_fault": 503}
        for _ in range(2):
            r = httpx.post(gw.url + "/v1/completions", json=b, headers=GOLD, timeout=30)
            assert r.status_code == 502
        assert upstream(admin_status(gw.url), eng.url)["breaker"] == "open"
    finally:
        gw.stop()
        eng.stop()
