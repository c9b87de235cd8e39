"""Saturation in every engine dialect, through HTTP: real ``velvetrope engine
--metrics-dialect X`` processes on loopback, a real ``velvetrope serve``, httpx clients.

One gateway serves a pool per case (requests routed by model name), so the engines and the
gateway start once for the module: one engine per dialect (vLLM, vLLM's older KV name,
SGLang, TGI, trtllm-serve, Triton's TensorRT-LLM backend, llama.cpp), one with no
``/metrics``, a pool mixing vLLM and SGLang, and a pool kept cold until its test.  Every
engine runs two requests at once (``max_num_seqs=2``) and the gateway lets none wait in an
engine (``max_waiting: 0``) while it has 32 slots per pool: whatever the gateway holds beyond
what the engine runs, it holds because of that engine's readings.  A gateway of its own
reads one engine through a relay that can be made slower than the scrape interval (stale
readings).  Every wait is a deadline poll; no assertion is on how long anything took.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from velvetrope.serving.launch import ServerProcess, free_port

from .conftest import (
    gateway_config,
    metric,
    start_engine,
    start_gateway,
    start_together,
    status_until,
)

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
SPEED = "2"
ENGINE = ("--set", "max_num_seqs=2", "--tokenizer", "approx")  # approx: a faster start

DIALECT_CASES = [
    # engine's --metrics-dialect, dialect the gateway reads, the waiting gauge it reads
    ("vllm", "vllm", "vllm:num_requests_waiting"),
    ("vllm-old", "vllm", "vllm:num_requests_waiting"),
    ("sglang", "sglang", "sglang:num_queue_reqs"),
    ("tgi", "tgi", "tgi_queue_size"),
    ("trtllm", "trtllm", "trtllm_num_requests_waiting"),
    ("triton", "trtllm", 'nv_trt_llm_request_metrics{request_type="waiting"}'),
    ("llamacpp", "llamacpp", "llamacpp:requests_deferred"),
]
POOLS: dict[str, list[str]] = {
    **{f"d-{x}": [x] for x, _, _ in DIALECT_CASES},
    "blind": ["none"],
    "mixed": ["vllm", "sglang"],
    "cold": ["vllm"],
}
"""Pool (and model) name -> the metric dialects of its engines."""


@dataclass
class Fleet:
    gateway: ServerProcess
    engines: dict[str, list[str]]
    """Pool -> its engines' URLs."""

    @property
    def url(self) -> str:
        return self.gateway.url


def _engine(pool: str, dialect: str) -> ServerProcess:
    return start_engine(float(SPEED), *ENGINE, "--model", pool, "--metrics-dialect", dialect)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    wanted = [(pool, d) for pool, ds in POOLS.items() for d in ds]
    started = start_together(*(partial(_engine, pool, d) for pool, d in wanted))
    engines: dict[str, list[str]] = {}
    for (pool, _), proc in zip(wanted, started, strict=True):
        engines.setdefault(pool, []).append(proc.url)
    cfg = gateway_config([])
    cfg["policy"]["pools"] = [
        {"name": p, "max_in_flight": 4 if p == "blind" else 32} for p in POOLS
    ]
    cfg["policy"]["routes"] = [{"models": [p], "pool": p} for p in POOLS]
    cfg["policy"]["saturation"] = {
        "max_waiting": 0,
        "scrape_interval_s": 0.2,  # the scrape's timeout too
        "stale_after_s": 5.0,  # a busy machine's late scrape is not what these tests test
    }
    cfg["upstreams"] = {p: [{"url": u} for u in urls] for p, urls in engines.items()}
    gw = start_gateway(tmp_path_factory.mktemp("dialects"), cfg)
    try:
        yield Fleet(gw, engines)
    finally:
        with ThreadPoolExecutor(6) as ex:  # each waits for its own exit: in parallel
            list(ex.map(ServerProcess.stop, [gw, *started]))


def spawn(
    c: httpx.AsyncClient, gw: str, model: str, n: int, max_tokens: int
) -> list[asyncio.Task[httpx.Response]]:
    body = {"model": model, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True}
    url = gw + "/v1/completions"
    return [asyncio.create_task(c.post(url, json=body, headers=GOLD)) for _ in range(n)]


def upstream(st: dict[str, Any], url: str) -> dict[str, Any]:
    return next(u for u in st["upstreams"] if u["url"] == url)


def load(st: dict[str, Any], url: str) -> dict[str, Any]:
    got: dict[str, Any] = st["engine_load"].get(url) or {}
    return got


def pool(st: dict[str, Any], name: str) -> dict[str, Any]:
    got: dict[str, Any] = st["pools"][name]
    return got


@pytest.mark.parametrize(("engine_dialect", "dialect", "waiting_gauge"), DIALECT_CASES)
def test_dispatch_is_held_while_the_engine_reports_waiting_work(
    fleet: Fleet, engine_dialect: str, dialect: str, waiting_gauge: str
) -> None:
    """Six requests for an engine that runs two: once its own gauges (in its dialect) say
    it queues, the gateway holds the rest in its queue though 30 slots are free."""
    name = f"d-{engine_dialect}"
    (url,) = fleet.engines[name]

    def held(st: dict[str, Any]) -> bool:  # a reading showed it queueing; we hold the rest
        return bool(load(st, url).get("capacity_learned")) and pool(st, name)["queued"] > 0

    async def go() -> tuple[dict[str, Any], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = spawn(c, fleet.url, name, 6, 200)
            st = await status_until(c, fleet.url, held)
            return st, list(await asyncio.gather(*tasks))

    st, rs = asyncio.run(go())
    assert held(st), st
    assert pool(st, name)["in_flight"] <= 4 < 32  # slots free: the readings held them
    engine = upstream(st, url)["engine"]
    assert (engine["dialect"], engine["saturation"]) == (dialect, "on")
    assert engine["gauges"]["waiting"] == waiting_gauge
    assert set(engine["scrape_errors"]) <= {"timeout"}  # a busy machine's late answer, at most
    assert [r.status_code for r in rs] == [200] * 6
    assert metric(fleet.url, "velvetrope_dispatch_held_total", pool=name) > 0
    assert metric(fleet.url, "velvetrope_engine_dialect", upstream=url, dialect=dialect) == 1
    assert metric(fleet.url, "velvetrope_engine_scraped", upstream=url, metric=waiting_gauge) >= 0


def test_an_engine_without_metrics_is_served_unthrottled_and_said_so(fleet: Fleet) -> None:
    """No /metrics (404): blind, said once in the log, counted, shown in /admin/status;
    dispatch to it is held by the pool's in-flight limit (4) only, not by saturation,
    though the engine runs two at once."""
    (url,) = fleet.engines["blind"]

    async def go() -> tuple[dict[str, Any], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = spawn(c, fleet.url, "blind", 8, 200)
            st = await status_until(c, fleet.url, lambda s: pool(s, "blind")["in_flight"] == 4)
            return st, list(await asyncio.gather(*tasks))

    st, rs = asyncio.run(go())
    assert (pool(st, "blind")["in_flight"], pool(st, "blind")["queued"]) == (4, 4), st
    assert [r.status_code for r in rs] == [200] * 8
    engine = upstream(st, url)["engine"]
    assert (engine["saturation"], engine["dialect"]) == ("blind", None)
    assert engine["scrape_errors"]["http_status"] > 0
    assert set(engine["scrape_errors"]) <= {"http_status", "timeout"}
    assert f"GET {url}/metrics answered 404" in fleet.gateway.stderr_text() + engine["reason"]
    said = f"upstream {url} (pool blind): served WITHOUT saturation"
    assert fleet.gateway.stderr_text().count(said) == 1  # once, not once per scrape
    errors = [
        line
        for line in httpx.get(fleet.url + "/metrics").text.splitlines()
        if line.startswith("velvetrope_engine_scrape_errors_total{") and f'"{url}"' in line
    ]
    assert any('reason="http_status"' in e and float(e.rsplit(" ", 1)[1]) > 0 for e in errors)
    state = "velvetrope_engine_saturation_state"
    assert metric(fleet.url, state, upstream=url, state="blind") == 1
    assert metric(fleet.url, state, upstream=url, state="on") == 0


def test_a_mixed_vllm_and_sglang_pool_holds_for_both(fleet: Fleet) -> None:
    """Each upstream is read in its own dialect; the pool holds once both queue."""
    a, b = fleet.engines["mixed"]

    def both_held(st: dict[str, Any]) -> bool:
        learned = all(load(st, u).get("capacity_learned") for u in (a, b))
        return learned and pool(st, "mixed")["queued"] > 0

    async def go() -> tuple[dict[str, Any], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = spawn(c, fleet.url, "mixed", 14, 200)
            st = await status_until(c, fleet.url, both_held)
            return st, list(await asyncio.gather(*tasks))

    st, rs = asyncio.run(go())
    assert both_held(st), st
    assert pool(st, "mixed")["in_flight"] <= 8 < 32
    dialects = [upstream(st, u)["engine"]["dialect"] for u in (a, b)]
    assert dialects == ["vllm", "sglang"]
    assert [load(st, u)["capacity"] for u in (a, b)] == [2, 2]  # learned from each one
    assert [r.status_code for r in rs] == [200] * 14


def test_a_cold_start_holds_the_first_burst(fleet: Fleet) -> None:
    """The first twenty requests of a pool never read under load: the gateway sends one,
    then doubles while the engine runs all it got, and holds once it queues; never more
    than four reach the engine that runs two (twenty would, without a slow start)."""
    (url,) = fleet.engines["cold"]
    most_in_flight = most_waiting = most_queued = 0

    async def go() -> list[httpx.Response]:
        nonlocal most_in_flight, most_waiting, most_queued
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = spawn(c, fleet.url, "cold", 20, 60)
            while not all(t.done() for t in tasks):
                st = (await c.get(fleet.url + "/admin/status", headers=ADMIN)).json()
                most_in_flight = max(most_in_flight, pool(st, "cold")["in_flight"])
                most_queued = max(most_queued, pool(st, "cold")["queued"])
                most_waiting = max(most_waiting, load(st, url).get("waiting") or 0)
                await asyncio.sleep(0.01)
            return list(await asyncio.gather(*tasks))

    rs = asyncio.run(go())
    assert [r.status_code for r in rs] == [200] * 20
    assert most_in_flight <= 4  # 1, 2, then 4: the doubling that found the queue
    assert most_queued >= 16  # the burst waited in the gateway
    assert most_waiting <= 2  # not in the engine


ADMIN = {"Authorization": "Bearer test-admin-token"}


# -- stale readings ---------------------------------------------------------------------------


class _Relay(BaseHTTPRequestHandler):
    """Serves the engine's /metrics; slower than the scrape interval while ``slow``."""

    target = ""
    slow = threading.Event()
    client: httpx.Client

    def do_GET(self) -> None:
        if self.slow.is_set():
            time.sleep(1.5)
        body = self.client.get(self.target + "/metrics").content
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # the gateway gave up on a slow answer: its socket is closed


@pytest.fixture
def relay() -> Iterator[tuple[str, type[_Relay]]]:
    client = httpx.Client(timeout=5)
    handler = type("Relay", (_Relay,), {"slow": threading.Event(), "client": client})
    server = _Quiet(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", handler
    finally:
        server.shutdown()
        server.server_close()
        client.close()


def test_stale_readings_fall_back_after_the_bound_and_recover(
    tmp_path: Path, relay: tuple[str, type[_Relay]]
) -> None:
    """Readings that go slower than the scrape interval stop holding the pool once older
    than stale_after_s (the backlog goes, the in-flight limit alone holds it; said once in
    the log, counted as timeouts); when readings return, saturation holds again."""
    metrics_url, handler = relay
    eng = _engine("default", "vllm")
    handler.target = eng.url
    cfg = gateway_config([])
    cfg["upstreams"] = {"default": [{"url": eng.url, "metrics_url": metrics_url}]}
    cfg["policy"]["saturation"] = {
        "max_waiting": 0,
        "scrape_interval_s": 0.25,  # the scrape's timeout too: a relay in Python needs it
        "stale_after_s": 1.0,
    }
    gw = start_gateway(tmp_path, cfg)

    def engine(st: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = upstream(st, eng.url)["engine"] or {}
        return got

    def learned(st: dict[str, Any]) -> bool:
        return bool(load(st, eng.url).get("capacity_learned"))

    def queued(st: dict[str, Any]) -> int:
        return int(pool(st, "default")["queued"])

    async def go() -> tuple[list[dict[str, Any]], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = spawn(c, gw.url, "default", 8, 400)
            seen = [await status_until(c, gw.url, lambda s: queued(s) > 0)]
            seen.append(await status_until(c, gw.url, lambda s: learned(s) and queued(s) > 0))
            handler.slow.set()  # /metrics now answers after the scrape's timeout
            seen.append(await status_until(c, gw.url, lambda s: engine(s)["saturation"] == "stale"))
            seen.append(await status_until(c, gw.url, lambda s: queued(s) == 0))
            handler.slow.clear()
            seen.append(await status_until(c, gw.url, lambda s: engine(s)["saturation"] == "on"))
            tasks += spawn(c, gw.url, "default", 2, 20)
            seen.append(await status_until(c, gw.url, lambda s: queued(s) > 0))
            return seen, list(await asyncio.gather(*tasks))

    try:
        seen, rs = asyncio.run(go())
        held, seen_learned, stale, flowed, back, held_again = seen
        assert queued(held) > 0 and learned(seen_learned) and queued(seen_learned) > 0
        assert engine(stale)["saturation"] == "stale"
        assert engine(stale)["reason"].startswith("timeout: ")
        assert pool(flowed, "default")["queued"] == 0  # the backlog went to the engine ...
        assert pool(flowed, "default")["in_flight"] > 4  # ... past what its readings allowed
        assert engine(back)["saturation"] == "on"
        assert pool(held_again, "default")["queued"] > 0  # held again by fresh readings
        assert [r.status_code for r in rs] == [200] * 10
        log = gw.stderr_text()
        assert log.count(f"upstream {eng.url} (pool default): its last reading is older") == 1
        assert f"upstream {eng.url} (pool default): readings are back" in log
        timeouts = metric(gw.url, "velvetrope_engine_scrape_errors_total", reason="timeout")
        assert timeouts > 0
    finally:
        gw.stop()
        eng.stop()
