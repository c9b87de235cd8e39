"""Shared state on Redis against memory, measured side by side in one run.

Starts ``velvetrope engine --instant``, a real ``redis-server`` (on PATH, else the one the
dev extras install) and, in turn, with the load of ``bench/gateway_bench.py`` (64
connections, non-streaming, closed loop; ``wrk`` when it is on PATH, so that the gateway,
not a Python load generator, is what limits the rate, else the Python generator; the
output says which):

* one gateway worker on ``memory://`` (A),
* one gateway worker on ``redis://`` (B),
* two workers on ``redis://`` behind one port (C).

For A and B it also reports the gateway's CPU time per request (kernel accounting, over
the whole run), and for B the Redis part of one admission (``admit_p99_us``): the p99 of
the reserve call at one connection, where the gateway is not saturated; at 64 connections
it also shows the p99 of one pipelined round trip to Redis
(``velvetrope_state_call_seconds{op="round_trip"}``: the reservations of one event-loop
tick travel together), next to the p99 of the reserve call as a request waits
for it (which adds the event loop's own backlog at this load), both from the gateway's
histogram, interpolated within a bucket as ``histogram_quantile`` does.  Last, two gateway
processes on one Redis serve one tenant pushing at twice its token limit for
``--limit-seconds``: the relative error of the tokens admitted against burst + rate ×
window is ``shared_limit_err``.
Ends with::

    redis: memory_rps=<A> redis_rps=<B> ratio=<B/A> workers2_rps=<C> admit_p99_us=<u>
           shared_limit_err=<e>                    (on one line)

A and B run in alternating rounds (``--rounds``, 3 by default), each figure the median.

Run: ``.venv/bin/python bench/redis_bench.py [--seconds 8] [--rounds 3] [--limit-seconds 20]``.
All traffic goes to 127.0.0.1; every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvloop
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_bench import (
    KEY,
    Load,
    Summary,
    config,
    cpu_seconds,
    latencies,
    python_load,
    wrk_load,
)

from tests.support.redis_server import RedisServer
from velvetrope.serving.launch import free_port, start, start_engine, start_gateway


def shared(cfg: dict[str, Any], url: str, **state: Any) -> dict[str, Any]:
    cfg["state"] = {"url": url, "namespace": f"bench{free_port()}", **state}
    return cfg


def histogram(text: str, name: str, op: str) -> dict[float, float]:
    """Cumulative bucket counts (``le`` → count) of one labelled Prometheus histogram."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{") and f'op="{op}"' in line:
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(bound)] = float(line.rsplit(" ", 1)[1])
    return out


def p99_from_histogram(text: str, name: str, op: str, since: str = "") -> float:
    """``histogram_quantile(0.99, ...)`` of one labelled Prometheus histogram; with
    ``since`` (an earlier exposition), of what was observed after it."""
    now = histogram(text, name, op)
    before = histogram(since, name, op) if since else {}
    buckets = sorted((le, n - before.get(le, 0.0)) for le, n in now.items())
    total = buckets[-1][1]
    rank = 0.99 * total
    prev_le, prev_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_n) / max(1e-12, n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


WRK = shutil.which("wrk")


def measure(url: str, pid: int, seconds: float, concurrency: int) -> Load:
    """One closed-loop run with the gateway benchmark's load (wrk when it is on PATH, else
    the Python generator); CPU of ``pid``."""
    if WRK is not None:
        return wrk_load(WRK, url, pid, False, concurrency, seconds)
    return python_load(url, pid, False, concurrency, seconds)


async def push_at_twice(urls: list[str], rate: float, burst: float, seconds: float) -> float:
    """One tenant offers 2x its limit through ``urls``; returns tokens admitted."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = (
        b'{"model":"velvetrope-sim","messages":[{"role":"user","content":"hi"}],'
        b'"max_tokens":40,"ignore_eos":true}'
    )
    admitted = 0.0
    per_request = 50.0
    interval = per_request / rate  # each of len(urls) senders offers 1x: 2x with two
    async with aiohttp.ClientSession() as s:

        async def sender(url: str, t0: float) -> None:
            nonlocal admitted
            k = 0
            tasks = []
            while t0 + k * interval <= t0 + seconds:
                await asyncio.sleep(max(0.0, t0 + k * interval - time.perf_counter()))
                tasks.append(asyncio.ensure_future(one(url)))
                k += 1
            await asyncio.gather(*tasks)

        async def one(url: str) -> None:
            nonlocal admitted
            async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                data = await r.read()
                if r.status == 200:
                    admitted += json.loads(data)["usage"]["total_tokens"]

        t0 = time.perf_counter() + 0.2
        await asyncio.gather(*(sender(u, t0) for u in urls))
    return admitted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--limit-seconds", type=float, default=20.0)
    ap.add_argument("--latency-samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vr-redis-bench-"))
    atexit.register(shutil.rmtree, tmp, True)
    rds = RedisServer()
    rds.start()
    try:
        with (
            start_engine("--instant") as eng,
            start_gateway(config(eng.url, True), tmp) as ga,
            start_gateway(shared(config(eng.url, True), rds.url), tmp) as gw,
        ):
            # A and B alternate, round by round, so that a noisy neighbour hits both alike;
            # each figure is the median of its rounds
            print(f"  load generator: {'wrk' if WRK else 'python (aiohttp)'}")
            runs: dict[str, list[Load]] = {"A": [], "B": []}
            assert rds.proc is not None
            redis_cpu = 0.0
            b_requests = 0.0
            for _ in range(args.rounds):
                runs["A"].append(measure(ga.url, ga.pid, args.seconds, args.concurrency))
                r0 = cpu_seconds(rds.proc.pid)
                t0 = time.perf_counter()
                runs["B"].append(measure(gw.url, gw.pid, args.seconds, args.concurrency))
                redis_cpu += cpu_seconds(rds.proc.pid) - r0
                b_requests += runs["B"][-1].rps * (time.perf_counter() - t0)
            a, b = Summary.of(runs["A"]), Summary.of(runs["B"])
            a_rps, a_cpu, a_err = a.rps, a.cpu_us, a.errors
            b_rps, b_cpu, b_err = b.rps, b.cpu_us, b.errors
            for name, rs in runs.items():
                print(
                    f"  rounds {name}: "
                    + ", ".join(f"{r.rps:.0f} rps/{r.cpu_us:.0f} µs" for r in rs)
                )
            print(f"  memory://  1 worker  {a_rps:8.0f} rps  {a_cpu:6.0f} µs CPU/req ({a_err} err)")
            text = httpx.get(gw.url + "/metrics").text
            state = httpx.get(
                gw.url + "/admin/status",
                headers={"Authorization": "Bearer bench-admin-token"},
            ).json()["state"]
            # the Redis part of one admission when the gateway is not saturated: one
            # connection, sequential requests
            uvloop.run(latencies(gw.url, args.latency_samples))
            quiet = httpx.get(gw.url + "/metrics").text
            hist = "velvetrope_state_call_seconds"
            sat_rt = p99_from_histogram(text, hist, "round_trip") * 1e6
            sat_seen = p99_from_histogram(text, hist, "reserve") * 1e6
            admit_p99_us = p99_from_histogram(quiet, hist, "reserve", since=text) * 1e6
            quiet_rt = p99_from_histogram(quiet, hist, "round_trip", since=text) * 1e6
            print(
                f"  redis://   1 worker  {b_rps:8.0f} rps  {b_cpu:6.0f} µs CPU/req ({b_err} err;"
                f" fallbacks {state['fallbacks'] or 'none'}, late calls {state['late_calls']});"
                f" redis-server {redis_cpu / max(1.0, b_requests) * 1e6:.0f} µs CPU/req"
            )
            print(
                f"    saturated ({args.concurrency} connections): reserve p99 {sat_seen:.0f} µs as"
                f" a request waits for it (event-loop backlog included), round trip p99"
                f" {sat_rt:.0f} µs"
            )
            print(
                f"    one connection: reserve p99 {admit_p99_us:.0f} µs, round trip p99"
                f" {quiet_rt:.0f} µs"
            )
            cfg = shared(config(eng.url, True), rds.url)
            port = free_port()
            cfg["listen"] = {"host": "127.0.0.1", "port": port}
            path = tmp / "workers.yaml"
            path.write_text(yaml.safe_dump(cfg))
            url = f"http://127.0.0.1:{port}"
            with start(["serve", "--config", str(path), "--workers", "2"], url, "/readyz") as gw:
                c = measure(url, gw.pid, args.seconds, args.concurrency)
                c_rps, c_cpu, c_err = c.rps, c.cpu_us, c.errors
            print(f"  redis://   2 workers {c_rps:8.0f} rps  {c_cpu:6.0f} µs CPU/req ({c_err} err)")
            rate, burst = 200.0, 800.0
            lim = shared(config(eng.url, True), rds.url, call_timeout_ms=1000)
            lim["policy"]["tenants"][0]["limits"] = {
                "tokens_per_minute": rate * 60,
                "token_burst": burst,
            }
            lim["policy"]["estimator"] = {"reserve": "max_tokens"}
            other = yaml.safe_load(yaml.safe_dump(lim))
            with start_gateway(lim, tmp) as g1, start_gateway(other, tmp) as g2:
                got = uvloop.run(push_at_twice([g1.url, g2.url], rate, burst, args.limit_seconds))
            expected = burst + rate * args.limit_seconds
            err = abs(got - expected) / expected
            print(
                f"  two replicas, one tenant at 2x: admitted {got:.0f} tokens, limit {expected:.0f}"
            )
    finally:
        rds.stop()
    print(
        f"  note: on 2 cores the load generator takes about one core; two workers share the"
        f" other with redis-server: workers2_rps/memory_rps = {c_rps / a_rps:.2f}"
    )
    print(
        f"redis: memory_rps={a_rps:.0f} redis_rps={b_rps:.0f} ratio={b_rps / a_rps:.2f} "
        f"workers2_rps={c_rps:.0f} admit_p99_us={admit_p99_us:.0f} shared_limit_err={err:.3f}"
    )


if __name__ == "__main__":
    main()
