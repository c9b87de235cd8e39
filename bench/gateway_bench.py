"""Gateway throughput and added latency, measured side by side in one run.

Starts a ``velvetrope engine --instant`` (zero model time) and two gateways in front of
it: one with admission switched off (a pure proxy) and one with admission on (one tenant
whose limits never bind).  The same load is sent, in turn:

* directly to the engine (A),
* through the pure proxy (P),
* through the admission gateway (B),

at 64 concurrent connections, non-streaming, for a bounded time each.  Then, at one
connection, the latency the admission gateway adds (hop) is the difference between its
latency percentiles and the direct ones.  Ends with one line::

    gateway: direct_rps=<A> passthrough_rps=<P> gateway_rps=<B> ratio=<B/P>
             hop_p50_ms=<x> hop_p99_ms=<y>          (on one line)

Run: ``.venv/bin/python bench/gateway_bench.py [--seconds 8] [--concurrency 64]``.
All traffic goes to 127.0.0.1 and every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import uvloop

from velvetrope.serving.launch import start_engine, start_gateway

KEY = "sk-bench-tenant-key"
BODY = (
    b'{"model":"velvetrope-sim","messages":[{"role":"user","content":"Say hello to the '
    b'benchmark"}],"max_tokens":16}'
)


def config(engine: str, admission: bool) -> dict[str, Any]:
    return {
        "admin_token": "bench-admin-token",
        "api_keys": [{"tenant": "bench", "key": KEY}],
        "policy": {
            "preset": "hybrid",
            "tenants": [
                {
                    "name": "bench",
                    "tier": "default",
                    "limits": {"tokens_per_minute": 1e12, "requests_per_minute": 1e9},
                }
            ],
            "pools": [{"name": "default", "max_in_flight": 4096}],
        },
        "upstreams": {"default": [{"url": engine}]},
        "gateway": {"admission": admission},
    }


async def load(url: str, concurrency: int, seconds: float) -> tuple[float, int]:
    """Closed loop: ``concurrency`` workers send back-to-back requests; returns (rps, errors)."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency)
    done = 0
    errors = 0
    async with aiohttp.ClientSession(connector=conn) as s:
        target = url + "/v1/chat/completions"

        async def worker(until: float) -> None:
            nonlocal done, errors
            while time.perf_counter() < until:
                async with s.post(target, data=BODY, headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                    else:
                        errors += 1

        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        done = errors = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(t0 + seconds) for _ in range(concurrency)))
        dt = time.perf_counter() - t0
    return done / dt, errors


async def latencies(url: str, n: int) -> np.ndarray:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    out = np.empty(n)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        target = url + "/v1/chat/completions"
        for i in range(-50, n):
            t = time.perf_counter()
            async with s.post(target, data=BODY, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            if i >= 0:
                out[i] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency-samples", type=int, default=2000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vr-bench-"))
    with (
        start_engine("--instant") as eng,
        start_gateway(config(eng.url, False), tmp) as proxy,
        start_gateway(config(eng.url, True), tmp) as gw,
    ):
        rps: dict[str, float] = {}
        for name, url in (("direct", eng.url), ("passthrough", proxy.url), ("gateway", gw.url)):
            r, err = uvloop.run(load(url, args.concurrency, args.seconds))
            rps[name] = r
            print(f"  {name:12s} {r:8.0f} rps  ({err} errors)")
        direct = uvloop.run(latencies(eng.url, args.latency_samples))
        plain = uvloop.run(latencies(proxy.url, args.latency_samples))
        via = uvloop.run(latencies(gw.url, args.latency_samples))
    hop50 = (np.percentile(via, 50) - np.percentile(direct, 50)) * 1000
    hop99 = (np.percentile(via, 99) - np.percentile(direct, 99)) * 1000
    print(
        f"  one connection: pure proxy adds p50="
        f"{(np.percentile(plain, 50) - np.percentile(direct, 50)) * 1e3:.3f}ms "
        f"p99={(np.percentile(plain, 99) - np.percentile(direct, 99)) * 1e3:.3f}ms"
    )
    print(
        f"  one connection: direct p50={np.percentile(direct, 50) * 1e3:.3f}ms "
        f"p99={np.percentile(direct, 99) * 1e3:.3f}ms; via gateway "
        f"p50={np.percentile(via, 50) * 1e3:.3f}ms p99={np.percentile(via, 99) * 1e3:.3f}ms"
    )
    print(
        f"gateway: direct_rps={rps['direct']:.0f} passthrough_rps={rps['passthrough']:.0f} "
        f"gateway_rps={rps['gateway']:.0f} ratio={rps['gateway'] / rps['passthrough']:.2f} "
        f"hop_p50_ms={hop50:.3f} hop_p99_ms={hop99:.3f}"
    )


if __name__ == "__main__":
    main()
