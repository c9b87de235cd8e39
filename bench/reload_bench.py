"""Reloads under load: the same load twice through one gateway, without and with reloads.

Starts a ``velvetrope engine`` (``--speed``, 50× real time by default) and a ``velvetrope
serve`` from a config file on 127.0.0.1, then runs ``--requests`` chat completions (half
streamed) from ``--concurrency`` httpx clients of three tenants, twice: first with no
reload (the baseline), then while the file is rewritten and ``POST /admin/reload`` is called
``--reloads`` times, evenly spread (each reload adds a tenant with a key and changes a
tenant's limit).  An error is any answer other than 200 or a request that got no answer.

Ends with one line::

    reload: requests=N errors=E reload_ms=<median server-side apply> reload_ms_max=<max> \
p99_ms=<p99 latency with reloads> baseline_p99_ms=<without> reloads_ok=K/R

Run: ``.venv/bin/python bench/reload_bench.py [--requests 2000] [--reloads 10]``.  Every
process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from velvetrope.serving.launch import free_port, start, start_engine

ADMIN = "bench-admin-token"


def _config(engine: str, port: int) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "admin_token": ADMIN,
        "api_keys": [{"tenant": t, "key": f"sk-{t}-0000"} for t in ("gold", "silver", "bronze")],
        "policy": {
            "preset": "hybrid",
            "tiers": [{"name": "interactive"}, {"name": "standard"}, {"name": "batch"}],
            "tenants": [
                {"name": "gold", "tier": "interactive"},
                {"name": "silver", "tier": "standard", "limits": {"tokens_per_minute": 1e9}},
                {"name": "bronze", "tier": "batch"},
            ],
            "pools": [{"name": "default", "max_in_flight": 32}],
        },
        "upstreams": {"default": [{"url": engine}]},
    }


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def _load(
    gw: str, n: int, concurrency: int, latencies: list[float], errors: list[str]
) -> None:
    tenants = ("gold", "silver", "bronze")
    todo = iter(range(n))

    async def client(c: httpx.AsyncClient, k: int) -> None:
        for i in todo:
            who = tenants[(i + k) % 3]
            body = {
                "model": "velvetrope-sim",
                "messages": [{"role": "user", "content": f"request {i}"}],
                "max_tokens": 16,
                "stream": bool(i % 2),
            }
            t0 = time.perf_counter()
            try:
                r = await c.post(
                    gw + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer sk-{who}-0000"},
                )
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:120]}")
            except httpx.HTTPError as e:
                errors.append(f"{type(e).__name__}: {e}")
            latencies.append((time.perf_counter() - t0) * 1e3)

    async with httpx.AsyncClient(timeout=60) as c:
        await asyncio.gather(*(client(c, k) for k in range(concurrency)))


async def _reloads(
    gw: str, path: Path, cfg: dict[str, Any], count: int, every_s: float, out: list[float]
) -> list[int]:
    statuses = []
    async with httpx.AsyncClient(timeout=30) as c:
        for i in range(count):
            await asyncio.sleep(every_s)
            cfg = copy.deepcopy(cfg)
            cfg["policy"]["tenants"].append({"name": f"new{i}", "tier": "standard"})
            cfg["api_keys"].append({"tenant": f"new{i}", "key": f"sk-new{i}-0000"})
            silver = cfg["policy"]["tenants"][1]
            silver["limits"] = {"tokens_per_minute": 1e9 + i}
            path.write_text(yaml.safe_dump(cfg))
            r = await c.post(gw + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
            statuses.append(r.status_code)
            if r.status_code == 200:
                out.append(float(r.json()["took_ms"]))
            else:
                print(f"reload {i}: {r.status_code} {r.text}", file=sys.stderr)
    return statuses


async def _run(args: argparse.Namespace, gw: str, path: Path, cfg: dict[str, Any]) -> str:
    base_lat: list[float] = []
    base_err: list[str] = []
    t0 = time.perf_counter()
    await _load(gw, args.requests, args.concurrency, base_lat, base_err)
    base_s = time.perf_counter() - t0
    print(
        f"baseline: {args.requests} requests in {base_s:.1f}s, errors {len(base_err)}",
        file=sys.stderr,
    )
    lat: list[float] = []
    err: list[str] = []
    took: list[float] = []
    every = base_s / (args.reloads + 1)
    statuses, _ = await asyncio.gather(
        _reloads(gw, path, cfg, args.reloads, every, took),
        _load(gw, args.requests, args.concurrency, lat, err),
    )
    for e in sorted(set(err))[:5]:
        print(f"error: {e}", file=sys.stderr)
    ok = sum(1 for s in statuses if s == 200)
    return (
        f"reload: requests={args.requests} errors={len(err)} "
        f"reload_ms={statistics.median(took) if took else float('nan'):.2f} "
        f"reload_ms_max={max(took) if took else float('nan'):.2f} "
        f"p99_ms={_percentile(lat, 0.99):.1f} baseline_p99_ms={_percentile(base_lat, 0.99):.1f} "
        f"reloads_ok={ok}/{args.reloads}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--reloads", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--speed", type=float, default=50.0)
    args = ap.parse_args()
    engine = start_engine("--speed", str(args.speed), "--tokenizer", "approx")
    try:
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            cfg = _config(engine.url, port)
            path = Path(d) / "gateway.yaml"
            path.write_text(yaml.safe_dump(cfg))
            url = f"http://127.0.0.1:{port}"
            gw = start(["serve", "--config", str(path)], url, "/readyz")
            try:
                print(asyncio.run(_run(args, url, path, cfg)))
            finally:
                gw.stop()
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
