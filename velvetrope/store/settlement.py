"""Where each job's reservation was taken — Redis, or this replica's fallback buckets at
1/N — and its settlement there.

A reservation taken while Redis cannot be asked (``fail_open``) comes from local buckets of
1/N of each limit (N: the live replicas seen through heartbeats before the outage, or
``expected_replicas``).  A job settles where it was reserved: locally at once, or in Redis
through the :class:`~velvetrope.store.outbox.Outbox` (retried, idempotent per job id), the
settlements queued together that share a Redis slot as one call (the finishes of one
tenant tag and pool, with their lease releases; the settlements of one tag).  The usage
ledger is Redis's: a job settled locally has its ledger counts written there through the
outbox (``ledger_many.lua``, once per job) when Redis answers again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from velvetrope.clock import Clock
from velvetrope.core.bucket import Claim, Denial, Grant, MemoryBuckets, SettleLine
from velvetrope.core.quota import LEDGER_PREFIX
from velvetrope.store.call_guard import CallGuard
from velvetrope.store.outbox import Outbox
from velvetrope.store.redis_store import RedisStore

__all__ = ["Settlements"]


def _share(c: Claim, n: int) -> Claim:
    """``c`` against a bucket of 1/n of its size and refill."""
    floor = -c.capacity if c.floor is None else c.floor
    return c._replace(capacity=c.capacity / n, rate=c.rate / n, floor=floor / n)


class Settlements:
    """The fallback's reservations (``local``, the jobs in ``local_jobs``) and every job's
    settlement where it was reserved; ``deferred`` counts the ledger's requests and tokens
    settled locally, written to Redis later."""

    def __init__(self, redis: RedisStore, guard: CallGuard, outbox: Outbox, clock: Clock) -> None:
        self.redis = redis
        self.guard = guard
        self.outbox = outbox
        self.clock = clock
        self.local = MemoryBuckets()
        self.local_jobs: set[str] = set()  # reserved in the local fallback
        self.deferred: Counter[str] = Counter()  # ledger counts settled locally, sent later

    def reserve_locally(
        self, job_id: str, claims: Sequence[Claim], replicas: int
    ) -> Grant | Denial:
        """Reserve ``claims`` from this replica's 1/N share (N: ``replicas``), or raise
        :class:`~velvetrope.errors.StoreUnavailable` as the failure policy says."""
        self.guard.fall_back("reserve")
        n = max(1, replicas)
        res = self.local.reserve([_share(c, n) for c in claims], self.clock.now())
        if isinstance(res, Grant):
            self.local_jobs.add(job_id)
            return Grant(tuple(claims), self.local.snapshots(res.claims, self.clock.now()))
        return res

    def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> None:
        """Settle where the job was reserved: locally at once (its ledger lines to Redis
        through the outbox), or in Redis via the outbox."""
        if job_id in self.local_jobs:
            self.local_jobs.discard(job_id)
            self.local.settle(lines, self.clock.now(), job_id)
            led_claims: list[Claim] = []
            led_lines: list[SettleLine] = []
            for i in range(len(lines)):
                key, _, actual = lines[i]
                if actual and key.startswith(LEDGER_PREFIX):
                    led_claims.append(claims[i])
                    led_lines.append((key, 0.0, actual))
                    if not key.endswith("|cached"):  # cached tokens are input tokens too
                        kind = "requests" if key.endswith("|requests") else "tokens"
                        self.deferred[kind] += int(actual)
            if led_lines:
                job = (job_id, tenant, tuple(led_claims), tuple(led_lines))
                group = ("ledger", self.redis.tag(tenant))
                self.outbox.put_grouped(group, job, self._send_many, len(led_lines))
            return
        self.settle_remote(job_id, tenant, claims, lines)

    def settle_remote(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> None:
        """Settle ``job_id`` in Redis, through the outbox."""
        job = (job_id, tenant, tuple(claims), tuple(lines))
        self.outbox.put_grouped(
            ("settle", self.redis.tag(tenant)), job, self._send_many, len(lines)
        )

    def finish_remote(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        """Settle ``job_id`` in Redis and give back its lease of ``pool`` there, as one
        outbox entry (needs :attr:`RedisStore.combined`)."""
        job = (job_id, tenant, tuple(claims), tuple(lines))
        self.outbox.put_grouped(
            ("finish", self.redis.tag(tenant), pool), job, self._send_many, len(lines)
        )

    def _send_many(self, group: tuple[str, ...], items: list[Any]) -> Any:
        """One call for the outbox's items of ``group`` (jobs of one slot)."""
        if group[0] == "finish":
            return self.redis.send_finish_many(group[2], items)
        if group[0] == "settle":
            return self.redis.send_settle_many(items)
        return self.redis.send_ledger_many(items)
