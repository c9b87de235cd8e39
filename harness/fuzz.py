"""``make fuzz``: schema-aware fuzzing of the gateway's two completion endpoints.

``python -m harness.fuzz [--requests N] [--seed S] [--concurrency C] [--state memory|redis]``
starts a real ``velvetrope engine`` and a real ``velvetrope serve`` on loopback (and, with
``--state redis``, a ``redis-server`` of its own), sends N requests drawn by
:mod:`harness.fuzz_requests` (in a process of their own, while the first are sent) with
httpx, and with raw sockets what is not HTTP, then checks:

* ``status_5xx``: answers with a 5xx status, and 200 streams that end in an error event.
  With a healthy engine and room for every request the gateway has no reason to answer
  one (no 502/503/504 for upstream reasons arise), so any is a failure;
* ``bad_shape``: 4xx answers whose body is not OpenAI's error object
  (``{"error": {"message", "type", "param", "code"}}``, JSON), the HTTP parser's included;
* ``leaked``: what the state says afterwards.  Nothing in flight, queued or waiting in the
  gateway nor running in the engine, both tenants' buckets back to full once refilled,
  and the tokens charged (``velvetrope_tokens_settled_total``) equal to those the engine
  counted (``vllm:prompt_tokens_total`` + ``vllm:generation_tokens_total``).  The engine
  counts a prompt once per choice, usage once per request: a served ``n > 1`` request's
  other prompts are taken off the engine's side.  Clients that hang up mid-stream (after
  the first token) run last, on their own: the gateway charges what it relayed, and the
  engine may generate a few more tokens before the abort reaches it, so there the charge
  must not exceed the engine's count nor fall short of it by more than the longest output
  per request.  ``leaked`` counts the tokens off, plus each request still held and each
  bucket not full.

A request that gets no answer within ``--request-timeout`` (a hang) or whose connection
drops without one is not counted as answered (``hung``); the run stops sending after
``--time-limit`` seconds.  The last line is ``fuzz: requests=N status_5xx=K bad_shape=K
leaked=K``, and the exit status 0 exactly when N reached ``--requests`` and the three
are 0.
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from harness.fuzz_requests import DRAW_COMMAND, KEY, MAX_BODY_BYTES, MODEL, TIGHT_KEY, Probe
from velvetrope.errors import RequestError
from velvetrope.openai.request import Kind, count_prompt_tokens, parse
from velvetrope.openai.tokenizer import get_tokenizer
from velvetrope.serving.launch import ServerProcess, free_port, start_engine, start_gateway

__all__ = ["Feed", "Report", "fed", "gateway_config", "main", "run", "send_all"]

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root, where the drawing process starts."""
ADMIN = "fuzz-admin-token"
OUTPUT_MAX = 12
"""The engine's longest output (``--outputs uniform:1:12``): small answers, fast runs."""
BODY_TIMEOUT_S = 1.0
TENANTS = {
    "fuzz": (KEY, {"tokens_per_minute": 60_000_000, "token_burst": 1_000_000}),
    "tight": (TIGHT_KEY, {"tokens_per_minute": 120_000, "token_burst": 3_000}),
}
"""Each tenant's key and bucket: one large, one small enough to meet 429s.  Both refill
within seconds once the run ends.  The small one's clients are trusted with their expected
output lengths (``x-velvetrope-expected-tokens``, fuzzed too)."""


@dataclass
class Report:
    """What a run saw.  ``requests`` counts the requests answered (or hung up on by design)."""

    requests: int = 0
    status_5xx: int = 0
    bad_shape: int = 0
    leaked: int = 0
    hung: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    served: list[tuple[str, bytes]] = field(default_factory=list)
    """The (path, body) of every request sent with httpx and answered 200 (for the engine's
    count of ``n > 1``)."""
    notes: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        return (
            f"fuzz: requests={self.requests} status_5xx={self.status_5xx} "
            f"bad_shape={self.bad_shape} leaked={self.leaked}"
        )

    def ok(self, wanted: int) -> bool:
        """Every request answered, no 5xx, every 4xx in OpenAI's shape, nothing leaked."""
        return self.requests >= wanted and not (self.status_5xx or self.bad_shape or self.leaked)

    def sample(self, text: str) -> None:
        if len(self.samples) < 20:
            self.samples.append(text)


def openai_error(content_type: str, body: bytes) -> bool:
    """Whether an error answer is OpenAI's shape: JSON ``{"error": {"message": str, "type":
    str, "param": str | null, "code": str | null}}``."""
    if not content_type.startswith("application/json"):
        return False
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    err = obj.get("error") if isinstance(obj, dict) else None
    return (
        isinstance(err, dict)
        and set(err) == {"message", "type", "param", "code"}
        and isinstance(err["message"], str)
        and bool(err["message"])
        and isinstance(err["type"], str)
        and all(err[k] is None or isinstance(err[k], str) for k in ("param", "code"))
    )


def _judge(report: Report, probe: Probe, status: int, content_type: str, body: bytes) -> None:
    """Count one answer; a 200 stream that ends in an error event (a failure after the
    stream began: the engine's or the gateway's) counts as a 5xx."""
    report.requests += 1
    report.statuses[status] += 1
    if status >= 500 or (status == 200 and b'data: {"error"' in body):
        report.status_5xx += 1
    elif status >= 400 and not openai_error(content_type, body):
        report.bad_shape += 1
    elif status == 200 and probe.how == "http":  # (raw ones never ask for n > 1)
        report.served.append((probe.path, probe.body))
        return
    else:
        return
    report.sample(f"{status} {probe.label}: {probe.body[:120]!r} -> {body[:200]!r}")


# -- sending --------------------------------------------------------------------------------


async def _http(client: httpx.AsyncClient, probe: Probe) -> tuple[int, str, bytes]:
    headers = [(k.encode("latin-1"), v.encode("utf-8")) for k, v in probe.headers]
    async with client.stream(probe.method, probe.path, content=probe.body, headers=headers) as r:
        if probe.how == "disconnect" and r.status_code == 200:
            async for chunk in r.aiter_raw():
                if b'"content"' in chunk or b'"text"' in chunk:
                    break  # the first token: hang up (leaving the block closes the connection)
            return 200, "", b""
        return r.status_code, r.headers.get("content-type", ""), await r.aread()


def _written(probe: Probe) -> bytes:
    """``probe`` as HTTP/1.1 bytes, its connection closed after the answer (for headers
    that httpx refuses to send, such as a value ending in a space)."""
    head = [f"{probe.method} {probe.path} HTTP/1.1", "Host: fuzz", "Connection: close"]
    head += [f"{k}: {v}" for k, v in probe.headers]
    head.append(f"Content-Length: {len(probe.body)}")
    return "\r\n".join([*head, "", ""]).encode() + probe.body


async def _raw(base: str, data: bytes) -> tuple[int, str, bytes]:
    """Write ``data`` on a connection of its own; the answer read until the gateway closes
    it."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        answer = await reader.read()  # to EOF: the gateway closes after these answers
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 "):
        raise ConnectionError(f"no HTTP answer: {answer[:80]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), fields.get("content-type", ""), body


async def _one(client: httpx.AsyncClient, base: str, probe: Probe, report: Report) -> None:
    for attempt in (1, 2):
        try:
            if probe.how in ("raw", "stall"):
                status, content_type, body = await _raw(base, probe.body)
            else:
                status, content_type, body = await _http(client, probe)
        except httpx.LocalProtocolError:  # httpx will not send these headers: by hand
            status, content_type, body = await _raw(base, _written(probe))
        except (httpx.TransportError, ConnectionError, OSError) as e:
            if attempt == 1 and not isinstance(e, httpx.TimeoutException):
                continue  # a pooled connection closed under us: once more
            report.hung += 1
            report.sample(f"no answer ({type(e).__name__}) {probe.label}: {probe.body[:120]!r}")
            return
        _judge(report, probe, status, content_type, body)
        return


Feed = asyncio.Queue[Probe | None]
"""Probes to send; ``None`` once there are no more."""


async def send_all(
    base: str, feed: Feed, report: Report, concurrency: int, timeout_s: float, until: float
) -> None:
    """Send the probes of ``feed`` to the gateway at ``base``, ``concurrency`` at a time,
    none started after the monotonic time ``until``; judge each answer into ``report``."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout_s) as client:

        async def worker() -> None:
            while (probe := await feed.get()) is not None and time.monotonic() < until:
                try:
                    await asyncio.wait_for(_one(client, base, probe, report), timeout_s * 2)
                except TimeoutError:
                    report.hung += 1
                    report.sample(f"hung {probe.label}: {probe.body[:120]!r}")
            feed.put_nowait(None)  # the end, for the next worker too

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def fed(probes: list[Probe]) -> Feed:
    """A feed of ``probes``, ended."""
    feed: Feed = asyncio.Queue()
    for p in [*probes, None]:
        feed.put_nowait(p)
    return feed


CHUNK = 250
"""Probes drawn per call in the drawing process."""


def chunk_seeds(requests: int, seed: int) -> list[tuple[int, int]]:
    """``(size, seed)`` of each chunk of :data:`CHUNK` probes that make ``requests``."""
    return [
        (min(CHUNK, requests - start), seed * 1_000_003 + i)
        for i, start in enumerate(range(0, requests, CHUNK))
    ]


async def _drawn(requests: int, seed: int) -> AsyncIterator[list[Probe]]:
    """The chunks of ``requests`` probes for ``seed``, in order, as a process of their own
    draws them (:data:`~harness.fuzz_requests.DRAW_COMMAND`: the same probes for a seed
    wherever the run starts, and hypothesis, which is slow, on the other core)."""
    chunks = [f"{size}:{s}" for size, s in chunk_seeds(requests, seed)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DRAW_COMMAND, *chunks, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None
    try:
        for _ in chunks:
            try:
                size = int.from_bytes(await proc.stdout.readexactly(8), "big")
                probes: list[Probe] = pickle.loads(await proc.stdout.readexactly(size))
            except asyncio.IncompleteReadError:
                raise RuntimeError("the drawing process failed (its error is above)") from None
            yield probes
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def _drawn_and_sent(
    base: str, requests: int, seed: int, report: Report, concurrency: int, timeout_s: float,
    until: float,
) -> list[Probe]:  # fmt: skip
    """Send ``requests`` probes as they are drawn, all but the clients that hang up
    mid-stream: those are returned, to be sent on their own."""
    feed: Feed = asyncio.Queue()
    hang_ups: list[Probe] = []
    sending = asyncio.create_task(send_all(base, feed, report, concurrency, timeout_s, until))
    try:
        async for chunk in _drawn(requests, seed):
            for p in chunk:
                if p.how == "disconnect":
                    hang_ups.append(p)
                else:
                    feed.put_nowait(p)
    finally:
        feed.put_nowait(None)
        await sending
    return hang_ups


# -- the state afterwards -------------------------------------------------------------------


def _metric(text: str, name: str) -> float:
    """The sum of every sample named ``name`` in a Prometheus text exposition."""
    families = text_string_to_metric_families(text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


@dataclass(frozen=True)
class Tokens:
    """Tokens charged by the gateway and counted by the engine, at one moment."""

    charged: float
    engine: float


def _tokens(gateway: str, engine: str) -> Tokens:
    gw = httpx.get(gateway + "/metrics").text
    en = httpx.get(engine + "/metrics").text
    generated = _metric(en, "vllm:prompt_tokens_total") + _metric(
        en, "vllm:generation_tokens_total"
    )
    return Tokens(_metric(gw, "velvetrope_tokens_settled_total"), generated)


def _admin(gateway: str) -> dict[str, Any]:
    r = httpx.get(gateway + "/admin/status", headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    status: dict[str, Any] = r.json()
    return status


def _bucket_levels(st: dict[str, Any], redis_url: str | None) -> dict[str, float]:
    """Each tenant's bucket level now: the gateway's own (memory) or read in Redis, where a
    bucket is a hash ``{l: level, t: last refill}`` (Redis ``TIME``) and a missing one is
    full (``velvetrope/store/lua/common.lua``); the gateway shows only the last level a
    reply told it."""
    if redis_url is None:
        return {
            t: st["buckets"].get(f"tenant:{t}:tok", lim["token_burst"])
            for t, (_, lim) in TENANTS.items()
        }
    import redis  # only for a run on Redis

    levels: dict[str, float] = {}
    with redis.Redis.from_url(redis_url) as r:
        secs, micros = r.time()
        now = secs + micros / 1e6
        for tenant, (_, lim) in TENANTS.items():
            full = float(lim["token_burst"])
            keys = list(r.scan_iter(match=f"*:b:tenant:{tenant}:tok"))
            level, at = r.hmget(keys[0], "l", "t") if keys else (None, None)
            if level is None or at is None:  # no bucket: full
                levels[tenant] = full
                continue
            refill = (now - float(at)) * lim["tokens_per_minute"] / 60
            levels[tenant] = min(full, float(level) + refill)
    return levels


def _shared_held(st: dict[str, Any], redis_url: str) -> dict[str, int]:
    """What shared state still holds: settlements not yet sent (the outbox) or dropped,
    leases, reservations in Redis awaiting settlement."""
    import redis  # only for a run on Redis

    state = st["state"]
    held = {
        "outbox": int(state["outbox"]),
        "outbox dropped": int(state["outbox_dropped"]),
        "leases": sum(state["leases"].values()) + sum(state["local_leases"].values()),
    }
    with redis.Redis.from_url(redis_url) as r:
        held["holds in Redis"] = sum(1 for _ in r.scan_iter(match="*:held:*"))
    return {k: n for k, n in held.items() if n}


def _settle(
    report: Report, gateway: str, engine: str, redis_url: str | None, timeout_s: float = 30.0
) -> None:
    """Wait (bounded) until nothing is held in the gateway (or shared state) nor running in
    the engine, and both buckets are full again; count into ``report.leaked`` what is still
    off at the deadline: each request or reservation held, each bucket not full."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = _admin(gateway)
        off = {k: int(st[k]) for k in ("in_flight", "queued", "waiting_requests") if st[k]}
        if redis_url is not None:
            off.update(_shared_held(st, redis_url))
        for tenant, level in _bucket_levels(st, redis_url).items():
            full = TENANTS[tenant][1]["token_burst"]
            if level < full - 1e-6:
                off[f"bucket {tenant} at {level:.1f} of {full}"] = 1
        en = httpx.get(engine + "/metrics").text
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            if n := int(_metric(en, gauge)):
                off[f"engine {gauge}"] = n
        if not off or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for what, n in off.items():
        report.leaked += n
        report.sample(f"not back to rest after {timeout_s:g}s: {what} = {n}")


def _extra_prompts(served: list[tuple[str, bytes]]) -> int:
    """Prompt tokens the engine counted beyond the usage it reported: ``n - 1`` more of each
    served request's prompt (counted as the engine counts it: ``approx``)."""
    tok = get_tokenizer("approx")
    extra = 0
    for path, body in served:
        kind: Kind = "chat" if path.endswith("/chat/completions") else "completions"
        try:
            req = parse(body, kind)
        except RequestError:  # served: the gateway and the engine took it; never here
            continue
        if req.n > 1:
            extra += (req.n - 1) * count_prompt_tokens(req, tok.count, tok.count_chat)
    return extra


# -- a run ----------------------------------------------------------------------------------


def gateway_config(engine: str, state_url: str) -> dict[str, Any]:
    """The gateway under fuzzing: two tenants (:data:`TENANTS`), small bodies, a short body
    timeout, room for every request (nothing queues long enough to be shed)."""
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "admin_token": ADMIN,
        "api_keys": [{"tenant": t, "key": key} for t, (key, _) in TENANTS.items()],
        "policy": {
            "preset": "hybrid",
            "tiers": [{"name": "interactive"}, {"name": "batch"}],
            "tenants": [
                {
                    "name": t,
                    "tier": "interactive",
                    "allowed_tiers": ["batch"],
                    "limits": lim,
                    "trust_expected_output": t == "tight",
                }
                for t, (_, lim) in TENANTS.items()
            ],
            "pools": [{"name": "default", "max_in_flight": 256}],
        },
        "upstreams": {"default": [{"url": engine}]},
        "gateway": {
            "max_body_bytes": MAX_BODY_BYTES,
            "request_timeout_s": BODY_TIMEOUT_S,
            "default_max_tokens": 64,
            "tokenizer": "approx",  # the engine's too: both count a prompt alike
        },
        "state": {"url": state_url},
    }


@dataclass(frozen=True)
class Processes:
    """The URLs of what a run started: the gateway, the engine, Redis (or ``None``)."""

    gateway: str
    engine: str
    redis: str | None


@contextmanager
def _processes(state: str, seed: int) -> Iterator[Processes]:
    """An engine and a gateway (and a Redis for ``state == "redis"``) on loopback.
    Everything started here is stopped here."""
    started: list[Any] = []
    try:
        url = "memory://"
        if state == "redis":
            from tests.support.redis_server import RedisServer  # the suite's own server

            redis = RedisServer()
            redis.start()
            started.append(redis)
            url = redis.url
        engine = start_engine(
            *("--speed", "200", "--tokenizer", "approx", "--model", MODEL),
            *("--outputs", f"uniform:1:{OUTPUT_MAX}", "--seed", str(seed)),
            port=free_port(),
        )
        started.append(engine)
        with tempfile.TemporaryDirectory(prefix="vr-fuzz-") as tmp:
            gateway: ServerProcess = start_gateway(gateway_config(engine.url, url), Path(tmp))
            started.append(gateway)
            yield Processes(gateway.url, engine.url, None if state == "memory" else url)
    finally:
        for proc in reversed(started):
            proc.stop()


def _check_tokens(report: Report, before: Tokens, after: Tokens, extra: int, slack: int) -> None:
    """Count into ``report.leaked`` the tokens charged between ``before`` and ``after`` that
    the engine did not count (``extra``: engine tokens never charged by design), or, beyond
    ``slack``, that it counted and were not charged."""
    charged = after.charged - before.charged
    counted = after.engine - before.engine - extra
    off = round(max(0.0, charged - counted) + max(0.0, counted - charged - slack))
    report.notes.append(f"tokens charged={charged:g} engine={counted:g} (slack {slack})")
    if off:
        report.leaked += off
        report.sample(f"tokens off by {off}: charged {charged:g}, engine counted {counted:g}")


def run(
    requests: int = 10_000,
    seed: int = 0,
    concurrency: int = 16,
    state: str = "memory",
    time_limit_s: float = 900.0,
    request_timeout_s: float = 30.0,
) -> Report:
    """One fuzzing run (see the module); the report of what it saw."""
    started = time.monotonic()
    until = started + time_limit_s
    report = Report()
    with _processes(state, seed) as procs:
        gateway, engine = procs.gateway, procs.engine
        t0 = _tokens(gateway, engine)
        hang_ups = asyncio.run(
            _drawn_and_sent(gateway, requests, seed, report, concurrency, request_timeout_s, until)
        )
        report.notes.append(f"{time.monotonic() - started:.1f}s: {requests} drawn and sent")
        _settle(report, gateway, engine, procs.redis)
        t1 = _tokens(gateway, engine)
        _check_tokens(report, t0, t1, _extra_prompts(report.served), 0)
        asyncio.run(send_all(gateway, fed(hang_ups), report, concurrency, request_timeout_s, until))
        _settle(report, gateway, engine, procs.redis)
        _check_tokens(report, t1, _tokens(gateway, engine), 0, OUTPUT_MAX * len(hang_ups))
        report.notes.append(f"{time.monotonic() - started:.1f}s in all ({state} state)")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.fuzz", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000, help="how many (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--state", choices=["memory", "redis"], default="memory")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds of sending")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="a hang, seconds")
    args = parser.parse_args(argv)
    report = run(
        args.requests, args.seed, args.concurrency, args.state, args.time_limit,
        args.request_timeout,
    )  # fmt: skip
    statuses = " ".join(f"{s}:{n}" for s, n in sorted(report.statuses.items()))
    print(f"fuzz: statuses {statuses}; hung={report.hung}")
    for line in (*report.notes, *report.samples):
        print(f"fuzz: {line}")
    print(report.line, flush=True)
    return 0 if report.ok(args.requests) else 1


if __name__ == "__main__":
    sys.exit(main())
