"""The gateway's own per-request cost, in process and without sockets: pure proxy, admission
on ``memory://``, admission on ``redis://``.

``bench/gateway_bench.py`` measures the whole server under load (kernel, HTTP parsing,
sockets, the load generator beside it); on a shared two-core machine its figures move from
run to run.  This bench drives the gateway's ASGI app directly, 64 requests at a time, with
an upstream that answers at once in process (:class:`InstantUpstream` stands in for the
HTTP client: the proxy still parses its answer and reads the usage), so what it measures is
the Python each request runs through the gateway: parsing, routing, the core, the buckets,
metrics, headers, and for ``redis://`` the store's calls (a real ``redis-server``, started
here, answers them).

* **CPU per request** (``time.process_time``), the best of ``--rounds`` alternating rounds.
* **Instructions per request** with ``--instructions`` when valgrind is on PATH: each mode
  runs once more under callgrind, counting only the timed loop.  Instruction counts do not
  depend on what else the machine runs, so two commits compare exactly (for ``redis://``
  they depend a little on how calls batch, which timing decides).

With ``--stream`` the requests stream (SSE): the upstream answers with the chunks
``velvetrope engine`` sends for 16 tokens (with ``"usage": null`` in each and a usage chunk
when asked for ``include_usage``), so the relay's per-chunk work is measured too.

Ends with (``path_stream:`` with ``--stream``)::

    path: passthrough_us=<p> admission_us=<a> redis_us=<r> admission_ratio=<a/p>
          redis_extra_us=<r-a> [passthrough_kinstr=.. admission_kinstr=.. redis_kinstr=..]

The replica choice: ``--upstreams N`` gives the pool N upstreams (default 1, whose choice
is trivial) and ``--routing`` its ``routing`` (``least_loaded``, the default, or
``prefix_affinity`` / ``prefix_hash``, which hash the prompt's leading blocks);
``--system-chars N`` puts a system message of N characters before the user's (a prompt
with blocks to hash: 512 characters a block at the default 128 tokens a block).

Run: ``.venv/bin/python bench/path_cost.py [--stream] [--requests 6400] [--rounds 3]
[--instructions] [--upstreams 4 --routing prefix_affinity --system-chars 8192]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_bench import KEY, body, config

from tests.support.redis_server import RedisServer
from velvetrope.config import GatewayConfig
from velvetrope.gateway.api.app import Gateway
from velvetrope.openai.sse import DONE, event

ANSWER = (
    b'{"id":"cmpl-1","object":"chat.completion","model":"velvetrope-sim","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hello benchmark hello benchmark"},'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":16,'
    b'"total_tokens":28}}'
)
MODES = ("passthrough", "admission", "redis")
SETUP: dict[str, Any] = {"routing": "least_loaded", "upstreams": 1, "system_chars": 0}
"""The pool's routing, its upstreams and the system prompt's length (set from the flags)."""


def request_body(stream: bool) -> bytes:
    """The benchmark's request, with a system message of ``SETUP["system_chars"]``."""
    data = body(stream)
    n = SETUP["system_chars"]
    if not n:
        return data
    system = ("You are a careful assistant. " * (n // 29 + 1))[:n]
    msg = orjson.dumps({"role": "system", "content": system})
    return data.replace(b'"messages":[', b'"messages":[' + msg + b",", 1)


def headers(data: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"127.0.0.1:8000"),
        (b"authorization", b"Bearer " + KEY.encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]


def sse_answer(include_usage: bool, tokens: int = 16) -> bytes:
    """The chunks of a streamed chat answer of ``tokens`` tokens, as the engine sends them."""
    extra: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "velvetrope-sim",
            "choices": [choice],
            **extra,
        }
        return event(orjson.dumps(obj))

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": f" w{i}"}) for i in range(tokens)]
    out.append(chunk({}, "length"))
    if include_usage:
        usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}
        out.append(event(orjson.dumps({"id": "chatcmpl-1", "choices": [], "usage": usage})))
    out.append(DONE)
    return b"".join(out)


SSE = {flag: sse_answer(flag) for flag in (False, True)}


class _Answer:
    """A complete upstream response (what :class:`~velvetrope.gateway.upstream.httpclient.Response`
    offers the proxy)."""

    status = 200
    at_end = True  # its one chunk is all of it

    def __init__(self, stream: bytes | None = None) -> None:
        self.stream = stream  # the SSE answer, or None for ANSWER

    def header(self, name: bytes, default: bytes | None = None) -> bytes | None:
        if name != b"content-type":
            return default
        return b"application/json" if self.stream is None else b"text/event-stream"

    async def read(self) -> bytes:
        return ANSWER if self.stream is None else self.stream

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self.stream is not None
        yield self.stream

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class InstantUpstream:
    """The gateway's HTTP client, answering every POST at once with :data:`ANSWER`."""

    async def post(self, url: str, data: bytes, **_access: object) -> _Answer:
        await asyncio.sleep(0)  # one turn of the loop, as a reply would take
        if b'"stream":true' not in data:
            return _Answer()
        return _Answer(SSE[b'"include_usage":true' in data])

    def close(self) -> None:
        return None


async def one(gw: Gateway, never: asyncio.Future[None], stream: bool = False) -> None:
    """One request through the ASGI app; the client stays connected until it is answered."""
    first = True
    sent = 0
    data = request_body(stream)

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": data, "more_body": False}
        await never
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal sent
        sent += 1
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"the gateway answered {message['status']}")

    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    scope["headers"] = headers(data)
    await gw(scope, receive, send)
    assert sent == 2  # the start, then the body (a stream's chunks and its end in one)


def gateway(mode: str, redis_url: str | None) -> Gateway:
    cfg = config("http://127.0.0.1:9", mode != "passthrough")
    cfg["upstreams"]["default"] = [
        {"url": f"http://127.0.0.1:{9 + i}"} for i in range(SETUP["upstreams"])
    ]
    if SETUP["routing"] != "least_loaded":  # (unset: the default, and older configs)
        cfg["policy"]["pools"][0]["routing"] = SETUP["routing"]
    # the upstream here is never scraped: trust it with all it is sent, as a read engine
    # with room would be (the saturation rule's per-request accounting still runs)
    cfg["policy"]["saturation"] = {"initial_capacity": 1 << 20}
    if mode == "redis":
        cfg["state"] = {"url": redis_url, "namespace": f"path{os.getpid()}"}
    gw = Gateway(GatewayConfig.model_validate(cfg))
    gw.http = InstantUpstream()  # type: ignore[assignment]
    return gw


async def measure(
    mode: str, redis_url: str | None, n: int, toggle: bool = False, stream: bool = False
) -> float:
    """CPU µs per request over ``n`` requests, 64 at a time, after a warm-up; with
    ``toggle``, callgrind counts only this loop."""
    gw = gateway(mode, redis_url)
    gw.store.start()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)  # as the gateway's start-up does
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conc = 64
    try:
        for _ in range(16):
            await asyncio.gather(*(one(gw, never, stream) for _ in range(conc)))
        if toggle:
            subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True)
        t0 = time.process_time()
        for _ in range(n // conc):
            await asyncio.gather(*(one(gw, never, stream) for _ in range(conc)))
        cpu = time.process_time() - t0
        if toggle:
            subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True)
    finally:
        await gw.store.stop()
    return cpu / (n // conc * conc) * 1e6


def instructions(mode: str, redis_url: str | None, n: int, stream: bool) -> float:
    """Instructions per request of ``mode`` under callgrind (a process of its own)."""
    out = Path(tempfile.mkdtemp(prefix="vr-path-")) / "callgrind.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--one",
        mode,
        "--requests",
        str(n),
    ]
    if redis_url:
        cmd += ["--redis-url", redis_url]
    if stream:
        cmd.append("--stream")
    cmd += ["--routing", SETUP["routing"], "--upstreams", str(SETUP["upstreams"])]
    cmd += ["--system-chars", str(SETUP["system_chars"])]
    subprocess.run(cmd, check=True, capture_output=True)
    for line in out.read_text().splitlines():
        if line.startswith("totals:"):
            total = int(line.split()[1])
            shutil.rmtree(out.parent)
            return total / n
    raise RuntimeError("callgrind wrote no totals")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=6400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instructions", action="store_true", help="also count (valgrind)")
    ap.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # under callgrind
    ap.add_argument("--redis-url", help=argparse.SUPPRESS)
    ap.add_argument("--upstreams", type=int, default=1, help="upstreams in the pool")
    ap.add_argument(
        "--routing",
        default="least_loaded",
        choices=("least_loaded", "prefix_affinity", "prefix_hash"),
        help="the pool's replica choice",
    )
    ap.add_argument("--system-chars", type=int, default=0, help="a system message's length")
    args = ap.parse_args()
    SETUP.update(routing=args.routing, upstreams=args.upstreams, system_chars=args.system_chars)
    if args.one:
        uvloop.run(measure(args.one, args.redis_url, args.requests, True, args.stream))
        return
    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions: valgrind is not on PATH")
    rds = RedisServer()
    rds.start()
    try:
        best = dict.fromkeys(MODES, float("inf"))
        for _ in range(args.rounds):
            for mode in MODES:
                us = uvloop.run(measure(mode, rds.url, args.requests, stream=args.stream))
                best[mode] = min(best[mode], us)
        for mode in MODES:
            print(f"  {mode:12s} {best[mode]:7.1f} µs CPU per request (best of {args.rounds})")
        p, a, r = best["passthrough"], best["admission"], best["redis"]
        print(
            f"  routing={args.routing} upstreams={args.upstreams} system_chars={args.system_chars}"
        )
        line = (
            f"{'path_stream' if args.stream else 'path'}: passthrough_us={p:.1f} "
            f"admission_us={a:.1f} redis_us={r:.1f} "
            f"admission_ratio={a / p:.2f} redis_extra_us={r - a:.1f}"
        )
        if args.instructions:
            n = max(640, args.requests // 5)
            counts = {m: instructions(m, rds.url, n, args.stream) for m in MODES}
            for mode in MODES:
                print(f"  {mode:12s} {counts[mode] / 1000:7.0f} k instructions per request")
            line += "".join(f" {m}_kinstr={counts[m] / 1000:.0f}" for m in MODES)
    finally:
        rds.stop()
    print(line)


if __name__ == "__main__":
    main()
