"""Gateway throughput, CPU per request and latency, measured side by side in one run.

Starts a ``velvetrope engine --instant`` (zero model time) and two gateways in front of
it: one with admission switched off (a pure proxy) and one with admission on (one tenant
whose limits never bind).  The same closed-loop load (64 connections by default, bounded
time, after a warm-up) is sent, in turn:

* directly to the engine (A),
* through the pure proxy (P),
* through the admission gateway (B),

in that order, in ``--rounds`` rounds (3 by default); each figure reported is its median
over the rounds (the machine is shared: one slow run moves no figure).  Non-streaming by
default, streaming (SSE, ``"stream": true``) with ``--stream``.

**CPU per request** is the gateway process's CPU time (user + system, from the kernel's
accounting in ``/proc/<pid>/stat``, summed over the process and any worker processes it
started) over the whole timed window, divided by the requests answered in it.  It does not
depend on how fast the load generator is, unlike requests/s when generator and gateway
share the cores.

**Load generator**: ``wrk`` (C; far cheaper per request than any Python client, so the
gateway is the bottleneck) when it is on ``PATH``, else a Python (aiohttp) closed loop
that shares the cores with the servers and understates every ratio; ``--loadgen`` forces
one.  The output says which ran.  Latency percentiles under load come from the generator
(wrk's ``--latency`` distribution, or every request's time in Python).

Non-streaming, the latency the admission gateway adds at one connection (hop) is also
measured (its latency percentiles minus the engine's direct ones), and the run ends with::

    gateway: direct_rps=<A> passthrough_rps=<P> gateway_rps=<B> ratio=<B/P>
             passthrough_cpu_us=<p> admission_cpu_us=<a> cpu_ratio=<a/p>
             hop_p50_ms=<x> hop_p99_ms=<y> loadgen=<wrk|python>        (on one line)

With ``--stream`` it ends with (``p99_over_p50``: the admission gateway's latency tail
under load; ``cpu_ratio``: its CPU per request over the pure proxy's)::

    gateway_stream: passthrough_rps=<P> gateway_rps=<B> ratio=<B/P> p99_over_p50=<t> cpu_ratio=<c>

Run: ``.venv/bin/python bench/gateway_bench.py [--stream] [--seconds 8] [--concurrency 64]
[--rounds 3] [--loadgen auto|wrk|python]``.  All traffic goes to 127.0.0.1 and every process started
here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median_high
from typing import Any

import aiohttp
import numpy as np
import uvloop

from velvetrope.serving.launch import start_engine, start_gateway

KEY = "sk-bench-tenant-key"
PROMPT = '"messages":[{"role":"user","content":"Say hello to the benchmark"}],"max_tokens":16'
WARMUP_S = 1.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def body(stream: bool) -> bytes:
    extra = ',"stream":true' if stream else ""
    return f'{{"model":"velvetrope-sim",{PROMPT}{extra}}}'.encode()


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


# -- CPU accounting ----------------------------------------------------------------------


def _tree(pid: int) -> Iterator[int]:
    """``pid`` and its live descendants (``/proc/<pid>/task/<tid>/children``)."""
    yield pid
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for tid in tasks:
        try:
            kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except FileNotFoundError:
            continue
        for kid in kids:
            yield from _tree(int(kid))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of ``pid`` and its live descendants, each with its
    reaped children's (``/proc/*/stat`` fields 14-17: utime, stime, cutime, cstime)."""
    ticks = 0
    for p in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += sum(int(x) for x in fields[11:15])
    return ticks * _TICK_S


# -- load generators ---------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """One timed closed-loop run: answered requests, errors, latency percentiles (s) and
    the server's CPU seconds over the window."""

    seconds: float
    requests: int
    errors: int
    p50: float
    p99: float
    cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us(self) -> float:
        """Server CPU per answered request, in microseconds."""
        return self.cpu_s / max(1, self.requests) * 1e6


@dataclass(frozen=True)
class Summary:
    """One mode's figures over several runs: each the median (the upper one of an even
    count) of the runs' own; errors summed."""

    rps: float
    cpu_us: float
    p50: float
    p99: float
    errors: int

    @classmethod
    def of(cls, runs: list[Load]) -> Summary:
        return cls(
            median_high([r.rps for r in runs]),
            median_high([r.cpu_us for r in runs]),
            median_high([r.p50 for r in runs]),
            median_high([r.p99 for r in runs]),
            sum(r.errors for r in runs),
        )


_WRK_LUA = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
"""
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _wrk_seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if m is None:
        raise ValueError(f"cannot read a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> tuple[float, int, int, float, float]:
    """``(seconds, answered 2xx, errors, p50_s, p99_s)`` from ``wrk --latency`` output."""
    done = re.search(r"(\d+) requests in ([\d.]+\w+),", out)
    if done is None:
        raise ValueError(f"cannot read wrk's output:\n{out}")
    total, seconds = int(done.group(1)), _wrk_seconds(done.group(2))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    non2xx = int(bad.group(1)) if bad else 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = non2xx + (sum(int(g) for g in sock.groups()) if sock else 0)
    pct = dict(re.findall(r"^\s+(50|99)(?:\.0+)?%\s+(\S+)", out, re.MULTILINE))
    return seconds, total - non2xx, errors, _wrk_seconds(pct["50"]), _wrk_seconds(pct["99"])


def wrk_load(wrk: str, url: str, pid: int, stream: bool, conns: int, seconds: float) -> Load:
    """``wrk`` with one thread (it is not the bottleneck) against ``url`` for ``seconds``
    (whole seconds: wrk's unit), after a warm-up; CPU of ``pid`` over the timed run."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_WRK_LUA.format(body=repr(body(stream).decode()), key=KEY))
        script = f.name
    try:
        target = url + "/v1/chat/completions"
        base = [wrk, "-t1", f"-c{conns}", "-s", script, "--latency", target]
        warm = [*base[:1], f"-d{max(1, round(WARMUP_S))}s", *base[1:]]
        subprocess.run(warm, capture_output=True, check=True)
        cpu0 = cpu_seconds(pid)
        timed = [*base[:1], f"-d{max(1, round(seconds))}s", *base[1:]]
        out = subprocess.run(timed, capture_output=True, check=True, text=True).stdout
        cpu = cpu_seconds(pid) - cpu0
    finally:
        os.unlink(script)
    dt, ok, errors, p50, p99 = parse_wrk(out)
    return Load(dt, ok, errors, p50, p99, cpu)


async def _python_load(url: str, pid: int, stream: bool, conns: int, seconds: float) -> Load:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    data = body(stream)
    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as s:
        target = url + "/v1/chat/completions"

        async def worker(until: float, record: bool) -> None:
            nonlocal errors
            while (t := time.perf_counter()) < until:
                async with s.post(target, data=data, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += record
                    elif record:
                        lat.append(time.perf_counter() - t)

        warm = time.perf_counter() + WARMUP_S
        await asyncio.gather(*(worker(warm, False) for _ in range(conns)))
        cpu0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(t0 + seconds, True) for _ in range(conns)))
        dt = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0
    a = np.asarray(lat)
    return Load(dt, len(lat), errors, float(np.percentile(a, 50)), float(np.percentile(a, 99)), cpu)


def python_load(url: str, pid: int, stream: bool, conns: int, seconds: float) -> Load:
    """A closed loop of ``conns`` aiohttp workers (shares the cores with the servers)."""
    return uvloop.run(_python_load(url, pid, stream, conns, seconds))


async def latencies(url: str, n: int) -> np.ndarray:
    """``n`` request times at one connection (after 50 unmeasured ones)."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    out = np.empty(n)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        target = url + "/v1/chat/completions"
        for i in range(-50, n):
            t = time.perf_counter()
            async with s.post(target, data=body(False), headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            if i >= 0:
                out[i] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stream", action="store_true", help="SSE responses (stream: true)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each mode (medians)")
    ap.add_argument("--latency-samples", type=int, default=2000)
    ap.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto")
    args = ap.parse_args()
    wrk = shutil.which("wrk") if args.loadgen != "python" else None
    if args.loadgen == "wrk" and wrk is None:
        ap.error("--loadgen wrk: wrk is not on PATH")
    gen = "wrk" if wrk else "python"
    mode = "streaming (SSE)" if args.stream else "non-streaming"
    print(
        f"  load generator: {gen} "
        + (f"({wrk}, C, 1 thread)" if wrk else "(aiohttp, shares the cores with the servers)")
        + f"; {args.concurrency} connections, {args.seconds:g} s per run, {args.rounds} "
        f"round(s), {mode}"
    )

    def run(url: str, pid: int) -> Load:
        if wrk:
            return wrk_load(wrk, url, pid, args.stream, args.concurrency, args.seconds)
        return python_load(url, pid, args.stream, args.concurrency, args.seconds)

    tmp = Path(tempfile.mkdtemp(prefix="vr-bench-"))
    atexit.register(shutil.rmtree, tmp, True)
    with (
        start_engine("--instant") as eng,
        start_gateway(config(eng.url, False), tmp) as proxy,
        start_gateway(config(eng.url, True), tmp) as gw,
    ):
        runs: dict[str, list[Load]] = {"direct": [], "passthrough": [], "gateway": []}
        for _ in range(max(1, args.rounds)):
            for name, sp in (("direct", eng), ("passthrough", proxy), ("gateway", gw)):
                r = run(sp.url, sp.pid)
                runs[name].append(r)
                print(
                    f"  {name:12s} {r.rps:8.0f} rps ({r.errors} errors)  "
                    f"p50={r.p50 * 1e3:.2f}ms p99={r.p99 * 1e3:.2f}ms  "
                    f"server CPU {r.cpu_us:.0f} us/request"
                )
        res = {name: Summary.of(rs) for name, rs in runs.items()}
        if not args.stream:
            direct = uvloop.run(latencies(eng.url, args.latency_samples))
            plain = uvloop.run(latencies(proxy.url, args.latency_samples))
            via = uvloop.run(latencies(gw.url, args.latency_samples))
    p, g = res["passthrough"], res["gateway"]
    print(
        f"  medians: direct {res['direct'].rps:.0f} rps, pure proxy {p.rps:.0f} rps, "
        f"admission {g.rps:.0f} rps; errors {sum(r.errors for r in res.values())}"
    )
    print(
        f"  gateway CPU per request: pure proxy {p.cpu_us:.0f} us, admission {g.cpu_us:.0f} us "
        f"(admission adds {g.cpu_us - p.cpu_us:.0f} us)"
    )
    if args.stream:
        print(
            f"gateway_stream: passthrough_rps={p.rps:.0f} gateway_rps={g.rps:.0f} "
            f"ratio={g.rps / p.rps:.2f} p99_over_p50={g.p99 / g.p50:.2f} "
            f"cpu_ratio={g.cpu_us / p.cpu_us:.2f}"
        )
        return

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) * 1e3

    print(
        f"  one connection: pure proxy adds p50={pct(plain, 50) - pct(direct, 50):.3f}ms "
        f"p99={pct(plain, 99) - pct(direct, 99):.3f}ms"
    )
    print(
        f"  one connection: direct p50={pct(direct, 50):.3f}ms p99={pct(direct, 99):.3f}ms; "
        f"via gateway p50={pct(via, 50):.3f}ms p99={pct(via, 99):.3f}ms"
    )
    print(
        f"gateway: direct_rps={res['direct'].rps:.0f} passthrough_rps={p.rps:.0f} "
        f"gateway_rps={g.rps:.0f} ratio={g.rps / p.rps:.2f} "
        f"passthrough_cpu_us={p.cpu_us:.0f} admission_cpu_us={g.cpu_us:.0f} "
        f"cpu_ratio={g.cpu_us / p.cpu_us:.2f} hop_p50_ms={pct(via, 50) - pct(direct, 50):.3f} "
        f"hop_p99_ms={pct(via, 99) - pct(direct, 99):.3f} loadgen={gen}"
    )


if __name__ == "__main__":
    main()
