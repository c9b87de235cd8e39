"""What a chaos run reads: Redis's keys once the load has stopped, the engines' journals,
and the gateways' shared-state status sampled during the load (the context of an excursion
over ``max_in_flight``).

Redis's key layout is :mod:`velvetrope.store.redis_store`'s: ``ns:{pool:P}:leases`` (a
zset, job id -> lease expiry in whole ms of Redis's ``TIME``), ``ns:{pool:P}:lease_tokens``,
``ns:{t:T}:held:J`` (a reservation awaiting settlement) and ``ns:{t:T}:b:K`` (a bucket, a
hash ``l`` = level, ``t`` = last refill in Redis seconds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from harness.chaos_deployment import TENANTS, Deployment
from velvetrope.core.quota import LEDGER_CAP, LEDGER_PREFIX

__all__ = [
    "JournalEntry",
    "RedisView",
    "Sample",
    "read_journal",
    "read_ledger",
    "read_redis",
    "sample_states",
    "state_context",
]


@dataclass
class RedisView:
    """The namespace's keys at one instant of Redis's clock."""

    now_ms: int
    leases: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per leases key: job id -> expiry (ms)."""
    lease_tokens: dict[str, dict[str, str]] = field(default_factory=dict)
    holds: list[str] = field(default_factory=list)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per bucket key: ``(level, last refill s)`` as stored."""

    @property
    def live_leases(self) -> list[tuple[str, str, float]]:
        """``(key, job id, expiry)`` of the leases not yet expired."""
        return [
            (k, job, exp)
            for k, held in self.leases.items()
            for job, exp in held.items()
            if exp > self.now_ms
        ]

    @property
    def stale_leases(self) -> int:
        """Expired leases still listed (dropped by the pool's next acquire: no leak)."""
        return sum(
            1 for held in self.leases.values() for exp in held.values() if exp <= self.now_ms
        )

    def bucket_levels(self) -> dict[str, tuple[float, float, float]]:
        """Per bucket key of the run's tenants: ``(level now, capacity, refill per s)``
        (a missing key is a full bucket: it expires once it would be full)."""
        out: dict[str, tuple[float, float, float]] = {}
        now = self.now_ms / 1000.0
        for t in TENANTS:
            rate = t.tokens_per_minute / 60.0
            key_end = f"{{t:{t.name}}}:b:{t.bucket}"
            for key, (level, last) in self.buckets.items():
                if key.endswith(key_end):
                    now_level = min(t.token_burst, level + max(0.0, now - last) * rate)
                    out[key] = (now_level, t.token_burst, rate)
        return out

    def seconds_to_full(self) -> float:
        """How long until every bucket is full again by its own refill."""
        levels = self.bucket_levels().values()
        return max(((cap - level) / rate for level, cap, rate in levels), default=0.0)


def read_redis(port: int, namespace: str) -> RedisView:
    """Every key of ``namespace`` that holds a lease, a hold or a bucket."""
    with redis.Redis(port=port, socket_timeout=5) as r:
        sec, usec = r.time()
        view = RedisView(int(sec) * 1000 + int(usec) // 1000)
        for raw in r.scan_iter(match=f"{namespace}:*", count=1000):
            key = raw.decode()
            if key.endswith(":leases"):
                pairs: Iterable[tuple[bytes, float]] = r.zrange(key, 0, -1, withscores=True)
                view.leases[key] = {m.decode(): s for m, s in pairs}
            elif key.endswith(":lease_tokens"):
                h: dict[bytes, bytes] = r.hgetall(key)
                view.lease_tokens[key] = {k.decode(): v.decode() for k, v in h.items()}
            elif ":held:" in key:
                view.holds.append(key)
            elif ":b:" in key:
                b: dict[bytes, bytes] = r.hgetall(key)
                if b"l" in b and b"t" in b:
                    view.buckets[key] = (float(b[b"l"]), float(b[b"t"]))
    return view


@dataclass
class JournalEntry:
    """One request one engine process held (``velvetrope.engine.serve.journal``)."""

    engine: str
    incarnation: int
    id: str
    request_id: str | None
    start: float
    prompt: int
    stream: bool
    end: float | None = None
    """``None``: no end line (the engine was killed holding it)."""
    state: str = ""
    prefilled: int = 0
    generated: int = 0
    taken: int = 0


def read_journal(path: Path, engine: str, incarnation: int) -> tuple[list[JournalEntry], int]:
    """The entries of one engine process's journal, and how many lines could not be read
    (a torn last line of a killed engine is the only expected one)."""
    entries: dict[str, JournalEntry] = {}
    bad = 0
    if not path.exists():
        return [], 0
    for line in path.read_bytes().splitlines():
        try:
            rec: dict[str, Any] = orjson.loads(line)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if rec["ev"] == "start":
            entries[rec["id"]] = JournalEntry(
                engine,
                incarnation,
                rec["id"],
                rec["request_id"],
                float(rec["t"]),
                int(rec["prompt"]),
                bool(rec["stream"]),
            )
        elif rec["ev"] == "end" and rec["id"] in entries:
            e = entries[rec["id"]]
            e.end, e.state = float(rec["t"]), str(rec["state"])
            e.prefilled, e.generated, e.taken = (
                int(rec["prefilled"]),
                int(rec["generated"]),
                int(rec["taken"]),
            )
        else:
            bad += 1
    return list(entries.values()), bad


# -- the gateways' shared state during the run ----------------------------------------------


Sample = tuple[float, str, dict[str, Any]]
"""``(time, gateway#process, its /admin/status "state")``."""


async def sample_states(
    deployment: Deployment, samples: list[Sample], period_s: float = 0.25
) -> None:
    """Read each gateway's shared-state status every ``period_s`` (until cancelled): the
    context of an excursion over ``max_in_flight``."""
    while True:
        for g in deployment.gateways:
            where = f"{g.name}#{len(g.runs) - 1}"
            try:
                st = await asyncio.to_thread(deployment.admin_status, g, 1.0)
            except httpx.HTTPError:
                continue  # restarting
            samples.append((time.monotonic(), where, st["state"]))
        await asyncio.sleep(period_s)


def state_context(samples: Sequence[Sample], at: float, t0: float) -> str:
    """Each gateway's shared state just before ``at`` and its fallbacks in the second
    before: whether its breaker was open, the leases it held in Redis and locally."""
    out = []
    for where in sorted({w for _, w, _ in samples}):
        mine = [(t, st) for t, w, st in samples if w == where]
        before = [(t, st) for t, st in mine if t <= at]
        if not before:
            continue
        t, st = before[-1]
        earlier = [st2 for t2, st2 in before if t2 <= at - 1.0]
        grew = sum(st["fallbacks"].values()) - (
            sum(earlier[-1]["fallbacks"].values()) if earlier else 0
        )
        out.append(
            f"{where} at {t - t0:.2f}s: breaker {st['breaker']}, leases {st['leases']}, "
            f"local {st['local_leases']}, fallbacks +{grew} in the second before"
        )
    return "; ".join(out)


def read_ledger(port: int, namespace: str) -> dict[str, int]:
    """The usage ledger's totals in Redis (``velvetrope.core.quota``'s counters): requests,
    input and output tokens, summed over every tenant, model and day."""
    totals = {"requests": 0, "input": 0, "output": 0}
    with redis.Redis(port=port, socket_timeout=5) as r:
        for raw in r.scan_iter(match=f"{namespace}:*:b:{LEDGER_PREFIX}*", count=1000):
            key = raw.decode()
            level = r.hget(key, "l")
            metric = key.rsplit("|", 1)[1]
            if level is not None and metric in totals:
                totals[metric] += int(LEDGER_CAP - float(level))
    return totals
