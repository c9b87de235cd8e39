"""Shared state with a failure policy: per-call time budgets, a circuit breaker, a fallback.

:class:`GuardedStore` is the :class:`~velvetrope.store.base.Store` of a ``state.url`` that
names Redis.  It composes the pieces that each own one thing:

* :class:`~velvetrope.store.call_guard.CallGuard`: every call to Redis within a budget
  that follows this process's own event-loop lag, failures fed to a
  :class:`~velvetrope.store.breaker.CircuitBreaker` (a dead Redis costs no timeout per
  request once it opened), and the failure policy's verdict while Redis cannot be reached
  (``on_store_error``);
* :class:`~velvetrope.store.settlement.Settlements`: reservations from the fallback and
  each job's settlement where it was reserved;
* :class:`~velvetrope.store.leases.Leases`: the leases this replica's jobs have, in Redis
  and from the fallback, re-asserted after an outage;
* an :class:`~velvetrope.store.outbox.Outbox`: settlements and releases bound for Redis,
  retried, idempotent per job id.

While Redis cannot be reached, ``on_store_error`` decides:

* ``fail_open``: reservations and leases fall back to local ones at this replica's share —
  each limit divided by N, the live replicas seen through heartbeats before the outage
  (:mod:`~velvetrope.store.leases` says what a pool's share leaves the other replicas).  A
  replica that has never reached Redis has seen no heartbeat: N is then
  ``expected_replicas`` when configured; without it the replica refuses as ``fail_closed``
  does until Redis first answers, since assuming it is alone would let every replica
  enforce the whole limit (N replicas, N times the limit);
* ``fail_closed``: :class:`~velvetrope.errors.StoreUnavailable` (the gateway answers 503
  ``state_unavailable``).

A job settles where it was reserved and gives its lease back where it was taken; a job
reserved and leased in Redis does both in one outbox entry where Redis allows.  A
heartbeat every ``heartbeat_s`` counts the live replicas and, while the breaker is open,
serves as its probe, so service recovers by itself when Redis returns; one that finds that
Redis forgot this replica has the leases re-asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from velvetrope.clock import Clock
from velvetrope.core.bucket import Claim, Denial, Grant, SettleLine, settle_lines
from velvetrope.errors import StoreUnavailable
from velvetrope.store.base import Slot
from velvetrope.store.breaker import CircuitBreaker
from velvetrope.store.call_guard import FAILURES, CallGuard, OnStoreError
from velvetrope.store.leases import Leases
from velvetrope.store.outbox import Outbox
from velvetrope.store.redis_store import RedisStore
from velvetrope.store.replies import parse_reserve, parse_reserve_leased, refused
from velvetrope.store.settlement import Settlements

__all__ = ["GuardedStore", "OnStoreError"]


class GuardedStore:
    """Buckets and leases in Redis, guarded by budgets, a breaker and a fallback."""

    shared = True

    def __init__(
        self,
        redis: RedisStore,
        clock: Clock,
        *,
        on_store_error: OnStoreError = "fail_open",
        call_timeout_s: float = 0.025,
        heartbeat_s: float = 1.0,
        breaker_failures: int = 3,
        breaker_reset_s: float = 0.5,
        expected_replicas: int | None = None,
        observe_call: Callable[[str, float], None] | None = None,
        queue_depth: Callable[[], int] | None = None,
    ) -> None:
        self.redis = redis
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.breaker = CircuitBreaker(clock, failures=breaker_failures, reset_s=breaker_reset_s)
        self.replica = uuid.uuid4().hex[:12]
        self.replicas = expected_replicas or 1  # live replicas at the last heartbeat
        self.fleet_queue_depth = 0
        self._queue_depth = queue_depth or (lambda: 0)
        self._seen: dict[str, tuple[float, float]] = {}  # bucket -> (level, capacity) seen
        self._beaten = False  # a heartbeat reached Redis once
        self.guard = guard = CallGuard(
            redis,
            self.breaker,
            on_store_error=on_store_error,
            call_timeout_s=call_timeout_s,
            expected_replicas=expected_replicas,
            on_failure=lambda: self.leases.lost(self.replicas),
            observe_call=observe_call,
        )
        self.outbox = Outbox(
            ready=self.breaker.allow,
            on_result=guard.heard,
            timeout_s=lambda: guard.budget_s * 4,
            refused=refused,
        )
        self.settlements = Settlements(redis, guard, self.outbox, clock)
        self.leases = Leases(redis, guard, self.outbox, clock, heartbeat_s)
        self._tasks: list[asyncio.Task[None]] = []
        if observe_call is not None:
            redis.observe_round_trips(lambda s: observe_call("round_trip", s))

    @property
    def up(self) -> bool:
        """Whether Redis answered the last call (the breaker is closed)."""
        return self.breaker.closed

    # -- reservations ----------------------------------------------------------------

    def reserve_now(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial | None:
        """Answer without I/O while the breaker is open (per ``on_store_error``, a local
        reservation at 1/N or :class:`StoreUnavailable`; the lease is then left to
        :meth:`acquire`); ``None`` while Redis is to be asked."""
        if not claims and slot is None:
            return Grant(())
        breaker = self.breaker
        if breaker.closed or breaker.state == "half_open":
            return None
        return self.settlements.reserve_locally(job_id, claims, self.replicas)

    async def reserve(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial:
        """Reserve in Redis and, with ``slot``, take a lease for a granted job in the same
        round trip where Redis allows (else two calls; a lease that cannot be had is left
        to :meth:`acquire`).  On failure, per ``on_store_error``, reserve locally at 1/N or
        raise :class:`StoreUnavailable`."""
        leases = self.leases
        if slot is None or not claims or not self.redis.combined or leases.careful():
            res = await self._reserve(job_id, tenant, claims)
            if slot is not None and isinstance(res, Grant):
                with contextlib.suppress(StoreUnavailable):
                    await leases.acquire(job_id, slot, self.replicas)
            return res
        if self.breaker.allow():
            call = self.redis.send_reserve_leased(job_id, tenant, claims, slot)
            try:
                res, lease = parse_reserve_leased(claims, await self.guard.call("reserve", call))
            except (StoreUnavailable, asyncio.CancelledError) as e:
                # the answer was lost, or the caller left before it (the call still runs):
                # not necessarily the reservation and the lease; undo both if they happened,
                # after the call (settling a job without a hold changes nothing)
                lines = settle_lines(claims, 0)
                self.settlements.finish_remote(job_id, tenant, claims, lines, slot.pool)
                if type(e) is not StoreUnavailable:
                    raise
            else:
                self._saw(res)
                if lease is not None:
                    leases.took(job_id, slot, lease)
                return res
        return self.settlements.reserve_locally(job_id, claims, self.replicas)

    async def _reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        if not claims:
            return Grant(())
        if self.breaker.allow():
            call = self.redis.send_reserve(job_id, tenant, claims)
            try:
                res = parse_reserve(claims, await self.guard.call("reserve", call))
            except (StoreUnavailable, asyncio.CancelledError) as e:
                # the answer was lost, or the caller left before it (the call still runs):
                # undo the reservation if it happened (settling a job without a hold
                # changes nothing)
                self.settlements.settle_remote(job_id, tenant, claims, settle_lines(claims, 0))
                if type(e) is not StoreUnavailable:
                    raise
            else:
                self._saw(res)
                return res
        return self.settlements.reserve_locally(job_id, claims, self.replicas)

    def _saw(self, res: Grant | Denial) -> None:
        for snap in res.snapshots:
            self._seen[snap.key] = (snap.remaining, snap.limit)

    def levels(self) -> dict[str, tuple[float, float]]:
        """``(level, capacity)`` of every bucket as this replica last saw it in Redis."""
        return dict(self._seen)

    # -- leases ----------------------------------------------------------------------

    def has_lease(self, job_id: str, pool: str) -> bool:
        return self.leases.has_lease(job_id, pool)

    async def acquire(self, job_id: str, slot: Slot) -> bool:
        """Take a lease for ``job_id`` (true at once if it has one): in Redis, or
        (fail_open) one of this replica's 1/N share of the pool's slots; fail_closed raises
        :class:`StoreUnavailable`."""
        return await self.leases.acquire(job_id, slot, self.replicas)

    def release(self, job_id: str, pool: str) -> None:
        """Give back ``job_id``'s lease of ``pool`` (in Redis through the outbox, or the
        fallback's at once), keeping its reservation."""
        self.leases.end(job_id, pool)

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        """A job ended: settle its lines and give back its lease of ``pool`` (if it has
        one), each where it was taken; both Redis steps leave as one outbox entry where
        Redis allows."""
        settlements = self.settlements
        # settled in Redis where Redis can release the lease in the same call
        together = bool(lines) and self.redis.combined and job_id not in settlements.local_jobs
        if lines and not together:
            settlements.settle(job_id, tenant, claims, lines)
        leased_in_redis = self.leases.end(job_id, pool, release=not together)
        if together:
            if leased_in_redis:
                settlements.finish_remote(job_id, tenant, claims, lines, pool)
            else:
                settlements.settle_remote(job_id, tenant, claims, lines)

    # -- background ------------------------------------------------------------------

    def start(self) -> None:
        """Start the outbox, the calls' watchdog, the heartbeat (also the breaker's probe)
        and lease renewal."""
        loop = asyncio.get_running_loop()
        self.outbox.start()
        self.guard.start()
        self._tasks = [
            loop.create_task(self._beat()),
            loop.create_task(self.leases.renew_forever()),
        ]

    async def flush(self, timeout_s: float) -> bool:
        """Wait for the outbox to empty, at most ``timeout_s``; true if it did."""
        return await self.outbox.flush(timeout_s)

    async def stop(self, flush_s: float = 2.0) -> None:
        """Flush the outbox (bounded), stop background tasks, close the connection."""
        if self.breaker.closed:
            await self.outbox.flush(flush_s)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        await self.guard.stop()
        await self.outbox.stop()
        with contextlib.suppress(*FAILURES):
            await self.redis.close()

    async def beat_once(self) -> bool:
        """One heartbeat; True if Redis answered."""
        guard = self.guard
        leases = self.leases
        try:
            async with asyncio.timeout(max(guard.budget_s, 0.25)):
                view = await self.redis.heartbeat(self.replica, self._queue_depth())
        except FAILURES:
            guard.failed()
            return False
        self.breaker.success()
        guard.answered = True
        if self._beaten and not view.known:
            # Redis forgot this replica: it lost its data (restarted empty, flushed) without
            # a call of ours failing, or this replica fell silent past its TTL
            leases.lost(self.replicas)
        self._beaten = True
        if leases.suspect:
            # Redis's count of replicas may have restarted from nothing: keep the larger
            self.replicas = max(1, view.replicas, leases.careful_replicas)
            await leases.reassert()
        else:
            self.replicas = max(1, view.replicas)
        self.fleet_queue_depth = view.queue_depth
        return True

    async def _beat(self) -> None:
        while True:
            await self.beat_once()
            await asyncio.sleep(self.heartbeat_s)

    def status(self) -> dict[str, Any]:
        guard = self.guard
        outbox = self.outbox
        return {
            "backend": "redis",
            "up": self.up,
            "breaker": self.breaker.state,
            "budget_ms": round(guard.budget_s * 1000, 2),
            "late_calls": guard.late,
            "refused_calls": guard.refusals,
            "replica": self.replica,
            "replicas": self.replicas,
            "expected_replicas": guard.expected_replicas,
            "answered": guard.answered,
            "fleet_queue_depth": self.fleet_queue_depth,
            "on_store_error": guard.on_store_error,
            "fallbacks": dict(guard.fallbacks),
            "ledger_deferred": dict(self.settlements.deferred),
            "outbox": len(outbox),
            "outbox_sent": outbox.sent,
            "outbox_retried": outbox.retried,
            "outbox_dropped": outbox.dropped,
            "outbox_rejected": outbox.rejected,
            **self.leases.counts(),
        }
