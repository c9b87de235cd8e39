"""The chaos run's clients: an open-loop load of chat completions through real HTTP.

:func:`plan` draws the run's requests up front from a seed (:class:`Shot`: when, which
tenant and so which tier, streaming or not, how many tokens, and whether and when its
client hangs up); :func:`drive` sends each at its time from one asyncio loop with httpx, to
the gateway a :class:`Rotation` (the load balancer) names then, and records what came
back.  Every request carries a unique ``request_id`` in its body (vLLM's field, passed
through by the gateway), which the engines' journals record: that joins a client's view of
a request to the engines'.

A request's terminal outcome, as the client sees it (:attr:`Shot.outcome`):

* ``answered``: a status line and a complete body (a JSON body; for a 200 stream, events up
  to ``data: [DONE]`` or up to an error event that ends it);
* ``hung_up``: the client went away on purpose (``early``: a fixed time after sending, if
  the exchange had not ended by then; ``mid``: after its k-th content chunk);
* not terminal: ``broken`` (a transport error, or a stream that ended without
  ``[DONE]`` or an error event), ``timeout`` (no end within :data:`REQUEST_TIMEOUT_S`),
  ``pending`` (still running when the run gave up waiting).

Times are :func:`time.monotonic` readings (asyncio's loop clock, and the clock of the
gateways' timing header and the engines' journals).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from harness.chaos_deployment import MODEL, TENANTS, Tenant
from velvetrope.openai.sse import content_keys, event_data, split_events

__all__ = [
    "PROMPTS",
    "REQUEST_TIMEOUT_S",
    "Rotation",
    "Shot",
    "body_of",
    "drive",
    "plan",
    "request_body",
]

REQUEST_TIMEOUT_S: Final = 60.0
"""A request whose exchange has not ended this long after it was sent is ``timeout``."""

PROMPTS: Final = (
    "Summarise the plot of Hamlet in two sentences.",
    "Write a haiku about a queue at a nightclub door.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain token buckets to a five-year-old.",
    "List three prime numbers larger than one hundred.",
    "Translate 'the velvet rope keeps the line orderly' into French.",
    "Give me a regular expression that matches an IPv4 address.",
    "Why do continuous-batching engines need a KV cache?",
)

_WEIGHTS: Final = {"acme": 0.3, "globex": 0.15, "bulk": 0.45, "capped": 0.1}


@dataclass
class Shot:
    """One request: its plan (fixed before the run) and what its client saw."""

    n: int
    request_id: str
    at: float
    """Seconds after the load's start at which it is sent."""
    tenant: Tenant
    stream: bool
    max_tokens: int
    prompt: int
    hangup: str
    """``""``, ``"early"`` or ``"mid"``."""
    hangup_after: float
    """``early``: seconds after sending; ``mid``: content chunks received."""
    gateway: str = ""
    incarnation: int = -1
    sent_at: float | None = None
    head_at: float | None = None
    ended_at: float | None = None
    hung_up_at: float | None = None
    """When the client went away: the deadline of an ``early`` hang-up (the connection
    closed after it), the moment a ``mid`` one decided to (before closing)."""
    status: int | None = None
    code: str | None = None
    """The error's code: of a non-200 body, or of the error event that ended a stream."""
    message: str = ""
    chunks: int = 0
    """Content chunks received (:func:`~velvetrope.openai.sse.content_keys`)."""
    usage: tuple[int, int] | None = None
    """``(prompt, completion)`` tokens as the answer reported them."""
    done: bool = False
    """A complete 200 answer: a JSON body with its usage, or a stream up to ``[DONE]``."""
    timing: tuple[float, float, int, int] | None = None
    """``(arrived, dispatched, seq, pid)`` from the gateway's ``x-velvetrope-timing``: the
    process that answered (a request sent to a gateway about to exit may reach the one
    restarted on its port)."""
    outcome: str = "pending"
    detail: str = ""

    @property
    def tier(self) -> str:
        return self.tenant.tier


def plan(rate: float, seconds: float, seed: int, tag: str) -> list[Shot]:
    """The requests of a run at ``rate`` per second (Poisson arrivals) for ``seconds``:
    tenants by fixed weights; 70% streaming; short answers (4 to 20 tokens interactive, 8
    to 40 batch) but for 3% of all, non-streaming, of 150 to 300 tokens (they hold their
    slots through a Redis outage); 10% hanging up early (any kind) and 10% hanging up
    mid-stream (streams only)."""
    rng = random.Random(seed)
    names = list(_WEIGHTS)
    weights = [_WEIGHTS[k] for k in names]
    by_name = {t.name: t for t in TENANTS}
    shots: list[Shot] = []
    t = 0.0
    for n in itertools.count():
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        tenant = by_name[rng.choices(names, weights)[0]]
        stream = rng.random() < 0.7
        mt = rng.randint(4, 20) if tenant.tier == "interactive" else rng.randint(8, 40)
        if not stream and rng.random() < 0.1:
            mt = rng.randint(150, 300)  # a long one: seconds, through any short outage
        u = rng.random()
        hangup, after = "", 0.0
        if u < 0.1:
            hangup, after = "early", rng.uniform(0.02, 0.6)
        elif stream and u < 0.1 + 0.1 / 0.7:
            hangup, after = "mid", float(rng.randint(1, max(1, mt // 2)))
        shots.append(
            Shot(n, f"{tag}-{n}", t, tenant, stream, mt, rng.randrange(len(PROMPTS)), hangup, after)
        )
    return shots


def request_body(prompt: int, max_tokens: int, stream: bool, request_id: str) -> bytes:
    """A chat completion's JSON body: prompt :data:`PROMPTS` ``[prompt]``, exactly
    ``max_tokens`` generated (``ignore_eos``), the usage asked for when streaming."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[prompt]}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "request_id": request_id,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def body_of(shot: Shot) -> bytes:
    """``shot``'s request body, exactly as sent."""
    return request_body(shot.prompt, shot.max_tokens, shot.stream, shot.request_id)


CLIENTS_PER_GATEWAY: Final = 8
"""httpx clients per gateway, used in turn.  httpcore scans its whole pool at every
request and response (a cost linear in its connections): at 60 requests/s with hundreds of
connections open one client's pool costs more CPU than the requests themselves."""


class Rotation:
    """The gateways a load balancer sends to now, each with its own clients; round-robin."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[int, list[httpx.AsyncClient]]] = {}
        self._order = itertools.count()
        self.retired: list[httpx.AsyncClient] = []
        self.pending: Counter[tuple[str, int]] = Counter()
        """Requests sent to each (gateway, process number) whose exchange has not ended."""

    def add(self, name: str, url: str, incarnation: int) -> None:
        """Send to ``name`` (its process number ``incarnation``) from now on."""
        limits = httpx.Limits(max_keepalive_connections=16, keepalive_expiry=2.0)
        timeout = httpx.Timeout(30.0, connect=5.0)
        clients = [
            # plain HTTP on loopback: verify=False spares loading the CA bundle per client
            httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout, verify=False)
            for _ in range(CLIENTS_PER_GATEWAY)
        ]
        self._live[name] = (incarnation, clients)

    def remove(self, name: str) -> None:
        """Stop sending to ``name`` (its requests under way go on)."""
        entry = self._live.pop(name, None)
        if entry is not None:
            self.retired += entry[1]

    def pick(self) -> tuple[str, int, httpx.AsyncClient] | None:
        """The next gateway and one of its clients, or ``None`` when none is in rotation."""
        if not self._live:
            return None
        names = sorted(self._live)
        k = next(self._order)
        name = names[k % len(names)]
        incarnation, clients = self._live[name]
        return name, incarnation, clients[(k // len(names)) % len(clients)]

    async def close(self) -> None:
        for _, clients in self._live.values():
            self.retired += clients
        self._live.clear()
        for client in self.retired:
            await client.aclose()
        self.retired.clear()


def _timing(value: str | None) -> tuple[float, float, int, int] | None:
    """``x-velvetrope-timing``'s ``arrived=A dispatched=D seq=S pid=P`` (``None`` if
    absent)."""
    if not value:
        return None
    f = dict(part.split("=", 1) for part in value.split())
    return float(f["arrived"]), float(f["dispatched"]), int(f["seq"]), int(f["pid"])


def _error(shot: Shot, obj: Any) -> None:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        shot.code = str(err.get("code"))
        shot.message = str(err.get("message", ""))[:200]


def _usage(obj: Any) -> tuple[int, int] | None:
    u = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(u, dict):
        return int(u["prompt_tokens"]), int(u["completion_tokens"])
    return None


async def _exchange(client: httpx.AsyncClient, shot: Shot, raw: bytes) -> None:
    """Send ``shot`` and read its answer into it (a ``mid`` hang-up returns early)."""
    headers = {"Authorization": f"Bearer {shot.tenant.key}", "Content-Type": "application/json"}
    async with client.stream("POST", "/v1/chat/completions", content=raw, headers=headers) as r:
        shot.head_at = time.monotonic()
        shot.status = r.status_code
        shot.timing = _timing(r.headers.get("x-velvetrope-timing"))
        if r.status_code != 200 or not shot.stream:
            data = await r.aread()
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                shot.outcome, shot.detail = "answered", f"not JSON: {data[:120]!r}"
                return
            if r.status_code == 200:
                shot.usage = _usage(obj)
                shot.chunks = content_keys(data)
                shot.done = shot.usage is not None
            else:
                _error(shot, obj)
            shot.outcome = "answered"
            return
        buf = b""
        async for piece in r.aiter_raw():
            events, buf = split_events(buf + piece)
            for ev in events:
                payload = event_data(ev)
                if payload is None:
                    continue  # a comment (queue progress)
                if payload == b"[DONE]":
                    shot.done = True
                    continue
                obj = orjson.loads(payload)
                if isinstance(obj, dict) and "error" in obj:
                    _error(shot, obj)
                    continue
                shot.chunks += content_keys(payload)
                shot.usage = _usage(obj) or shot.usage
            if shot.hangup == "mid" and shot.chunks >= shot.hangup_after and not shot.done:
                shot.hung_up_at = time.monotonic()
                shot.outcome = "hung_up"
                return
        if shot.done or shot.code is not None:
            shot.outcome = "answered"
        else:
            shot.outcome, shot.detail = "broken", "the stream ended without [DONE]"


async def _fire(client: httpx.AsyncClient, shot: Shot) -> None:
    raw = body_of(shot)
    shot.sent_at = time.monotonic()
    loop = asyncio.get_running_loop()
    limit = shot.hangup_after if shot.hangup == "early" else REQUEST_TIMEOUT_S
    deadline = loop.time() + limit  # the loop's clock is time.monotonic
    try:
        async with asyncio.timeout_at(deadline) as cm:
            await _exchange(client, shot, raw)
    except TimeoutError:
        if not cm.expired():
            raise
        if shot.hangup == "early":
            shot.hung_up_at = deadline  # the connection closed just after
            shot.outcome = "hung_up"
        else:
            shot.outcome, shot.detail = "timeout", f"no end within {REQUEST_TIMEOUT_S:g}s"
    except httpx.HTTPError as e:
        shot.outcome, shot.detail = "broken", repr(e)[:200]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        shot.outcome, shot.detail = "broken", f"unreadable answer: {e!r}"[:200]
    finally:
        shot.ended_at = time.monotonic()


def _ended(pending: Counter[tuple[str, int]], where: tuple[str, int], _: object) -> None:
    pending[where] -= 1


async def drive(
    shots: list[Shot],
    rotation: Rotation,
    *,
    started: Callable[[float], None] | None = None,
    wait_s: float = 90.0,
) -> None:
    """Send every shot at its time (``shots`` in order of ``at``) to the gateway
    ``rotation`` picks then, then wait for their ends (at most ``wait_s``; those still
    running are cancelled and stay ``pending``).  ``started`` hears the load's start."""
    t0 = time.monotonic()
    if started is not None:
        started(t0)
    tasks: set[asyncio.Task[None]] = set()
    for shot in shots:
        delay = t0 + shot.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        picked = rotation.pick()
        if picked is None:
            shot.outcome, shot.detail = "broken", "no gateway in rotation"
            continue
        shot.gateway, shot.incarnation, client = picked
        where = (shot.gateway, shot.incarnation)
        rotation.pending[where] += 1
        task = asyncio.create_task(_fire(client, shot))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(functools.partial(_ended, rotation.pending, where))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=wait_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=10)
    for shot in shots:
        if shot.outcome == "pending" and shot.sent_at is not None:
            shot.detail = shot.detail or "still running when the run stopped waiting"
