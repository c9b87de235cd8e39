"""Shared state with a failure policy: per-call time budgets, a circuit breaker, a fallback.

:class:`GuardedStore` is the :class:`~velvetrope.store.base.Store` of a ``state.url`` that
names Redis.  Every call
to Redis runs within a budget: ``call_timeout_s`` plus a multiple of this process's own
event-loop lag (measured every 50 ms, a decaying peak), because under load a reply waits
for the loop as much as for Redis, and a budget that counts our own backlog as Redis's
fault would trip the breaker exactly when shared limits matter most.  Failures feed a
:class:`CircuitBreaker`, so a dead
Redis costs no timeout per request once the breaker opened.  While Redis cannot be reached,
``on_store_error`` decides:

* ``fail_open``: buckets and slots fall back to local ones at this replica's share — each
  limit divided by N, the live replicas seen through heartbeats before the outage; a
  pool's slots also leave the other replicas what they held at this replica's last lease
  reply (a replica that held more than its share keeps running those jobs), and count the
  jobs this replica still runs on Redis leases.  A
  replica that has never reached Redis has seen no heartbeat: N is then
  ``expected_replicas`` when configured; without it the replica refuses as ``fail_closed``
  does until Redis first answers, since assuming it is alone would let every replica
  enforce the whole limit (N replicas, N times the limit);
* ``fail_closed``: :class:`~velvetrope.errors.StoreUnavailable` (the gateway answers 503
  ``state_unavailable``).

A job remembers where it was reserved and where its lease was taken, and settles there:
settlements and releases bound for Redis leave through an :class:`Outbox` (retried,
idempotent per job id), those queued together that share a Redis slot as one call (the
finishes of one tenant tag and pool; on a Cluster the settlements of one tag, the releases
of one pool); local ones apply at once.  A heartbeat every ``heartbeat_s`` counts
the live replicas and, while the breaker is open, serves as its probe, so service recovers
by itself when Redis returns.

**Leases across an outage.**  Redis may come back without its data (restarted empty), so
after any failed call, and when a heartbeat finds that Redis forgot this replica, the
replica *re-asserts* every lease it holds — those taken in Redis
and those the fallback gave — at its first successful contact (a heartbeat, or before its
next slot), re-creating what Redis lost whatever the pool's limit: those jobs are running.
The other replicas do the same at their own first contact, within a heartbeat; until
``2 * heartbeat_s + 1`` s after its re-assertion, a replica therefore still holds at most
its 1/N share of a pool's slots (N as seen before the outage), so the fleet's
``max_in_flight`` holds through the transition too.  Periodic renewal re-creates a lease
the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from time import monotonic, perf_counter  # compiled: a global, not an attribute per call
from typing import Any, Final, Literal

from redis.exceptions import RedisError

from velvetrope.clock import Clock
from velvetrope.core.bucket import Claim, Denial, Grant, MemoryBuckets, SettleLine, settle_lines
from velvetrope.core.quota import LEDGER_PREFIX
from velvetrope.errors import StoreUnavailable
from velvetrope.store.base import Slot
from velvetrope.store.breaker import CircuitBreaker
from velvetrope.store.outbox import Outbox
from velvetrope.store.redis_store import RedisStore
from velvetrope.store.replies import parse_admit, parse_lease, parse_reserve, refused

__all__ = ["GuardedStore", "OnStoreError"]

log = logging.getLogger("velvetrope.store")

OnStoreError = Literal["fail_open", "fail_closed"]
_FAILURES: Final = (RedisError, OSError, TimeoutError, ConnectionError)


def _recorded(slot: Slot) -> int:
    """The tokens a lease records in Redis: the slot's, or -1 without a token cap."""
    return -1 if slot.max_tokens is None else slot.tokens


def _share(c: Claim, n: int) -> Claim:
    """``c`` against a bucket of 1/n of its size and refill."""
    floor = -c.capacity if c.floor is None else c.floor
    return c._replace(capacity=c.capacity / n, rate=c.rate / n, floor=floor / n)


class GuardedStore:
    """Buckets and fleet slots in Redis, guarded by budgets, a breaker and a fallback."""

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
        self.on_store_error = on_store_error
        self.call_timeout_s = call_timeout_s
        self.heartbeat_s = heartbeat_s
        self.breaker = CircuitBreaker(clock, failures=breaker_failures, reset_s=breaker_reset_s)
        self.replica = uuid.uuid4().hex[:12]
        self.expected_replicas = expected_replicas
        self.replicas = expected_replicas or 1  # live replicas at the last heartbeat
        self.answered = False  # Redis answered once: its heartbeats, not a guess, give N
        self.fleet_queue_depth = 0
        self.local = MemoryBuckets()
        self.fallbacks: Counter[str] = Counter()  # fallback decisions by operation
        self._observe = observe_call or (lambda op, s: None)
        self._queue_depth = queue_depth or (lambda: 0)
        self._local_jobs: set[str] = set()  # reserved in the local fallback
        self.deferred: Counter[str] = Counter()  # ledger counts settled locally, sent later
        self._seen: dict[str, tuple[float, float]] = {}  # bucket -> (level, capacity) seen
        self._leases: dict[str, dict[str, int]] = {}  # pool -> job id -> tokens, in Redis
        self._local_leases: dict[str, dict[str, int]] = {}  # pool -> job id -> tokens
        self._others: dict[str, int] = {}  # pool -> slots the other replicas held, last seen
        self._suspect = False  # a call failed since the leases were last asserted
        self._beaten = False  # a heartbeat reached Redis once
        self._assert_lock = asyncio.Lock()
        self._careful_until = 0.0  # clock time until which a replica holds at most its share
        self._careful_replicas = 1  # the replicas seen before the failure (the share's N)
        self.outbox = Outbox(
            ready=self.breaker.allow,
            on_result=self._result,
            timeout_s=lambda: self.budget_s * 4,
            refused=refused,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.loop_lag_s = 0.0  # decaying peak of the event loop's lag
        self.late = 0  # calls answered after the budget while Redis was answering
        self.refusals = 0  # calls Redis refused (error replies naming no passing state)
        self._watch: list[tuple[float, asyncio.Future[Any]]] = []  # (deadline, call)
        self._watchdog: asyncio.Task[None] | None = None
        self.late_cap_s = 1.0
        if observe_call is not None:
            redis.observe_round_trips(lambda s: observe_call("round_trip", s))

    # -- plumbing ------------------------------------------------------------------

    def _result(self, ok: bool) -> None:
        if ok:
            self.breaker.success()
        else:
            self._failed()

    def _failed(self) -> None:
        """A call failed: feed the breaker; Redis may lose (or have lost) its data, so the
        leases held here are to be re-asserted."""
        self.breaker.failure()
        if not self._suspect:
            self._suspect = True
            self._careful_replicas = self.replicas

    async def _call(self, op: str, call: Any) -> Any:
        """Wait for one Redis call (an awaitable of its raw reply) within the budget;
        record its latency; feed the breaker (a call Redis refused, see
        :func:`~velvetrope.store.replies.refused`, counts as Redis answering).  A call still
        pending when the budget runs out while Redis demonstrably answers others is this
        process's backlog, not Redis's: it may wait up to ``late_cap_s`` more (counted in
        ``late``).  Raises
        :class:`StoreUnavailable` on any failure.

        A pipelined call is a plain future: the watchdog (one task, every few ms) fails it
        when its time is up, so a call costs no timer of its own."""
        t0 = perf_counter()
        try:
            if type(call) is asyncio.Future and self._watchdog is not None:
                if not call.done():
                    deadline = monotonic() + self.budget_s
                    self._watch.append((deadline, call))
                out = await call
            else:
                out = await self._wait_alone(call)
        except _FAILURES as e:
            if refused(e):  # Redis answered: it refused this call, it is not away
                self.breaker.success()
                self.answered = True
                self.refusals += 1
            else:
                self._failed()
            self._observe(op, perf_counter() - t0)
            raise StoreUnavailable(f"shared state: {op} failed: {e!r}") from None
        self.breaker.success()
        self.answered = True
        self._observe(op, perf_counter() - t0)
        return out

    async def _wait_alone(self, call: Any) -> Any:
        """:meth:`_call`'s wait for a call the watchdog does not watch (a task on a
        cluster, or before :meth:`start`)."""
        fut = asyncio.ensure_future(call)
        done, _ = await asyncio.wait((fut,), timeout=self.budget_s)
        if not done and self.redis.answering(self.budget_s):
            self.late += 1
            done, _ = await asyncio.wait((fut,), timeout=self.late_cap_s)
        if not done:
            fut.cancel()
            raise TimeoutError(f"no answer within {self.budget_s * 1000:.0f} ms")
        return fut.result()

    async def _watch_calls(self, period_s: float = 0.005) -> None:
        """Fail watched calls whose time is up; give late ones (Redis answering others)
        ``late_cap_s`` more."""
        while True:
            await asyncio.sleep(period_s)
            watch = self._watch
            if not watch:
                continue
            now = monotonic()
            keep: list[tuple[float, asyncio.Future[Any]]] = []
            for deadline, fut in watch:
                if fut.done():
                    continue
                if now < deadline:
                    keep.append((deadline, fut))
                elif deadline > 0 and self.redis.answering(self.budget_s):
                    self.late += 1
                    keep.append((-(now + self.late_cap_s), fut))  # negative: already late
                elif deadline < 0 and now < -deadline:
                    keep.append((deadline, fut))
                else:
                    fut.set_exception(TimeoutError("no answer from Redis within the budget"))
            self._watch = keep

    @property
    def budget_s(self) -> float:
        """The time one call may take now: the configured budget plus 4x the loop lag."""
        return self.call_timeout_s + 4.0 * self.loop_lag_s

    @property
    def up(self) -> bool:
        """Whether Redis answered the last call (the breaker is closed)."""
        return self.breaker.closed

    def _unavailable(self, op: str) -> StoreUnavailable:
        if self.on_store_error == "fail_open":
            return StoreUnavailable(
                f"shared state has not answered yet ({op}); fail_open needs "
                "state.expected_replicas to share limits before Redis was ever seen"
            )
        return StoreUnavailable(f"shared state is unavailable ({op}); on_store_error=fail_closed")

    # -- buckets ---------------------------------------------------------------------

    def reserve_now(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial | None:
        """Answer without I/O while the breaker is open (per ``on_store_error``, a local
        reservation at 1/N or :class:`StoreUnavailable`; the slot is then left to
        :meth:`acquire`); ``None`` while Redis is to be asked."""
        if not claims and slot is None:
            return Grant(())
        breaker = self.breaker
        if breaker.closed or breaker.state == "half_open":
            return None
        return self._reserve_locally(job_id, claims)

    async def reserve(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial:
        """Reserve in Redis and, with ``slot``, take a fleet slot for a granted job in the
        same round trip where Redis allows (else two calls; a slot that cannot be had is
        left to :meth:`acquire`).  On failure, per ``on_store_error``, reserve locally at
        1/N or raise :class:`StoreUnavailable`."""
        if slot is None or not claims or not self.redis.combined or self._careful():
            res = await self._reserve(job_id, tenant, claims)
            if slot is not None and isinstance(res, Grant):
                with contextlib.suppress(StoreUnavailable):
                    await self.acquire(job_id, slot)
            return res
        if self.breaker.allow():
            call = self.redis.send_admit(job_id, tenant, claims, slot)
            try:
                res, lease = parse_admit(claims, await self._call("reserve", call))
            except StoreUnavailable:
                # the answer was lost, not necessarily the reservation and the lease: undo
                # both if they happened (settling a job without a hold changes nothing)
                self._finish_remote(job_id, tenant, claims, settle_lines(claims, 0), slot.pool)
            else:
                self._saw(res)
                if lease is not None:
                    if lease.granted:
                        self._leases.setdefault(slot.pool, {})[job_id] = _recorded(slot)
                    self._saw_fleet(slot.pool, lease.in_flight)
                return res
        return self._reserve_locally(job_id, claims)

    async def _reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        if not claims:
            return Grant(())
        if self.breaker.allow():
            call = self.redis.send_reserve(job_id, tenant, claims)
            try:
                res = parse_reserve(claims, await self._call("reserve", call))
            except StoreUnavailable:
                # the answer was lost, not necessarily the reservation: undo it if it
                # happened (settling a job without a hold changes nothing)
                self._settle_remote(job_id, tenant, claims, settle_lines(claims, 0))
            else:
                self._saw(res)
                return res
        return self._reserve_locally(job_id, claims)

    def _saw(self, res: Grant | Denial) -> None:
        for snap in res.snapshots:
            self._seen[snap.key] = (snap.remaining, snap.limit)

    def _open_fails(self) -> bool:
        """Whether a fallback is refused: ``fail_closed``, or Redis never answered and no
        ``expected_replicas`` says what share this replica may take."""
        return self.on_store_error == "fail_closed" or (
            not self.answered and self.expected_replicas is None
        )

    def _reserve_locally(self, job_id: str, claims: Sequence[Claim]) -> Grant | Denial:
        if self._open_fails():
            self.fallbacks["reserve_refused"] += 1
            raise self._unavailable("reserve")
        self.fallbacks["reserve_local"] += 1
        n = max(1, self.replicas)
        res = self.local.reserve([_share(c, n) for c in claims], self.clock.now())
        if isinstance(res, Grant):
            self._local_jobs.add(job_id)
            return Grant(tuple(claims), self.local.snapshots(res.claims, self.clock.now()))
        return res

    def has_lease(self, job_id: str, pool: str) -> bool:
        remote = self._leases.get(pool)
        if remote is not None and job_id in remote:
            return True
        local = self._local_leases.get(pool)
        return local is not None and job_id in local

    def _held(self, pool: str) -> int:
        """Slots of ``pool`` held here, in Redis and from the fallback."""
        remote = self._leases.get(pool)
        local = self._local_leases.get(pool)
        return (len(remote) if remote is not None else 0) + (len(local) if local is not None else 0)

    def _careful(self) -> bool:
        """Whether slots are still taken one at a time against this replica's share (after
        a failure, until the leases are re-asserted and the other replicas had time to)."""
        return self._suspect or self.clock.now() < self._careful_until

    async def _reassert(self) -> bool:
        """Re-assert every lease held here (see the module's docstring); true once done.
        A fallback lease asserted in Redis is released there when its job ends."""
        async with self._assert_lock:
            if not self._suspect:
                return True
            for pool in sorted(set(self._leases) | set(self._local_leases)):
                local = self._local_leases.get(pool, {})
                held = {**self._leases.get(pool, {}), **local}
                if not held:
                    continue
                was_local = list(local)
                try:
                    await self._call("renew", self.redis.renew(pool, held))
                except StoreUnavailable:
                    return False
                remote = self._leases.setdefault(pool, {})
                for job_id in was_local:
                    tokens = local.pop(job_id, None)
                    if tokens is not None:  # a fallback lease, now in Redis
                        remote[job_id] = tokens
                    else:  # its job ended during the call: give back what was asserted
                        self._release_remote(pool, job_id)
            self._suspect = False
            self._careful_until = self.clock.now() + 2.0 * self.heartbeat_s + 1.0
            return True

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        """A job ended: settle its lines and give back its slot in ``pool`` (if it holds
        one), each where it was taken; both Redis steps leave as one outbox entry where
        Redis allows."""
        leases = self._leases.get(pool)
        remote_lease = leases is not None and leases.pop(job_id, None) is not None
        if not remote_lease:
            local = self._local_leases.get(pool)
            if local is not None:
                local.pop(job_id, None)
        remote_settle = bool(lines) and job_id not in self._local_jobs
        if not remote_settle and lines:
            self.settle(job_id, tenant, claims, lines)
        if remote_settle and remote_lease and self.redis.combined:
            self._finish_remote(job_id, tenant, claims, lines, pool)
            return
        if remote_settle:
            self._settle_remote(job_id, tenant, claims, lines)
        if remote_lease:
            self._release_remote(pool, job_id)

    def _finish_remote(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        job = (job_id, tenant, tuple(claims), tuple(lines))
        self.outbox.put_grouped(
            ("finish", self.redis.tag(tenant), pool), job, self._send_many, len(lines)
        )

    def _send_many(self, group: tuple[str, ...], items: list[Any]) -> Any:
        """One call for the outbox's items of ``group`` (jobs of one slot; job ids)."""
        if group[0] == "finish":
            return self.redis.send_finish_many(group[2], items)
        if group[0] == "settle":
            return self.redis.send_settle_many(items)
        if group[0] == "ledger":
            return self.redis.send_ledger_many(items)
        return self.redis.send_release(group[1], items)

    def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> None:
        """Settle where the job was reserved: locally at once, or in Redis via the outbox.
        The ledger is Redis's: a job settled locally has its ledger counts written there
        through the outbox (``ledger_many.lua``, once per job), when Redis answers again."""
        if job_id in self._local_jobs:
            self._local_jobs.discard(job_id)
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
        self._settle_remote(job_id, tenant, claims, lines)

    def _settle_remote(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> None:
        job = (job_id, tenant, tuple(claims), tuple(lines))
        self.outbox.put_grouped(
            ("settle", self.redis.tag(tenant)), job, self._send_many, len(lines)
        )

    # -- fleet slots ---------------------------------------------------------------------

    async def acquire(self, job_id: str, slot: Slot) -> bool:
        """Take a fleet-wide slot for ``job_id`` (true at once if it holds one): in Redis, or
        (fail_open) one of this replica's 1/N share of local slots; fail_closed raises
        :class:`StoreUnavailable`."""
        pool = slot.pool
        mine = self._leases.get(pool)
        if mine is not None and job_id in mine:
            return True  # taken earlier (with the reservation)
        # this replica's share: N is the larger of now and before the failure while careful
        n = max(self.replicas, self._careful_replicas) if self._careful() else self.replicas
        share = max(1, math.ceil(slot.max_in_flight / max(1, n)))
        if self.breaker.allow() and (not self._suspect or await self._reassert()):
            if self._careful() and self._held(pool) >= share:
                return False
            call = self.redis.send_acquire(job_id, slot)
            try:
                ans = parse_lease(await self._call("acquire", call))
            except StoreUnavailable:
                # the answer was lost, maybe not the lease: give it back if it was taken
                self._release_remote(pool, job_id)
            else:
                if ans.granted:
                    self._leases.setdefault(pool, {})[job_id] = _recorded(slot)
                self._saw_fleet(pool, ans.in_flight)
                return bool(ans.granted)
        if self._open_fails():
            self.fallbacks["lease_refused"] += 1
            raise self._unavailable("lease")
        self.fallbacks["lease_local"] += 1
        # the jobs still running on leases taken in Redis count against the share too, and
        # the fleet's slots the other replicas held when Redis last answered are theirs
        allowed = min(share, slot.max_in_flight - self._others.get(pool, 0))
        if self._held(pool) >= allowed:
            return False
        self._local_leases.setdefault(pool, {})[job_id] = _recorded(slot)
        return True

    def _saw_fleet(self, pool: str, in_flight: int) -> None:
        """A lease reply said the fleet runs ``in_flight`` jobs of ``pool``: those not ours
        are the other replicas' (what the fallback leaves them if Redis goes away)."""
        mine = self._leases.get(pool)
        self._others[pool] = max(0, in_flight - (len(mine) if mine is not None else 0))

    def _release_remote(self, pool: str, job_id: str) -> None:
        self.outbox.put_grouped(("release", pool), job_id, self._send_many)

    def levels(self) -> dict[str, tuple[float, float]]:
        """``(level, capacity)`` of every bucket as this replica last saw it in Redis."""
        return dict(self._seen)

    # -- background ------------------------------------------------------------------

    def start(self) -> None:
        """Start the outbox, the heartbeat (also the breaker's probe) and lease renewal."""
        loop = asyncio.get_running_loop()
        self.outbox.start()
        self._watchdog = loop.create_task(self._watch_calls())
        self._tasks = [
            loop.create_task(self._beat()),
            loop.create_task(self._renew()),
            loop.create_task(self._watch_lag()),
            self._watchdog,
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
        self._watchdog = None
        await self.outbox.stop()
        with contextlib.suppress(*_FAILURES):
            await self.redis.close()

    async def beat_once(self) -> bool:
        """One heartbeat; True if Redis answered."""
        try:
            async with asyncio.timeout(max(self.budget_s, 0.25)):
                view = await self.redis.heartbeat(self.replica, self._queue_depth())
        except _FAILURES:
            self._failed()
            return False
        self.breaker.success()
        self.answered = True
        if self._beaten and not view.known and not self._suspect:
            # Redis forgot this replica: it lost its data (restarted empty, flushed) without
            # a call of ours failing, or this replica fell silent past its TTL
            self._suspect = True
            self._careful_replicas = self.replicas
        self._beaten = True
        if self._suspect:
            # Redis's count of replicas may have restarted from nothing: keep the larger
            self.replicas = max(1, view.replicas, self._careful_replicas)
            await self._reassert()
        else:
            self.replicas = max(1, view.replicas)
        self.fleet_queue_depth = view.queue_depth
        return True

    async def _beat(self) -> None:
        while True:
            await self.beat_once()
            await asyncio.sleep(self.heartbeat_s)

    async def _watch_lag(self, period_s: float = 0.05) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(period_s)
            lag = max(0.0, loop.time() - t - period_s)
            self.loop_lag_s = max(lag, self.loop_lag_s * 0.8)

    async def _renew(self) -> None:
        period = max(0.05, self.redis.lease_ttl_s / 3)
        while True:
            await asyncio.sleep(period)
            for pool, held in list(self._leases.items()):
                if held and self.breaker.closed and not self._suspect:
                    with contextlib.suppress(StoreUnavailable):
                        await self._call("renew", self.redis.renew(pool, dict(held)))

    def status(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "up": self.up,
            "breaker": self.breaker.state,
            "budget_ms": round(self.budget_s * 1000, 2),
            "late_calls": self.late,
            "refused_calls": self.refusals,
            "replica": self.replica,
            "replicas": self.replicas,
            "expected_replicas": self.expected_replicas,
            "answered": self.answered,
            "fleet_queue_depth": self.fleet_queue_depth,
            "on_store_error": self.on_store_error,
            "fallbacks": dict(self.fallbacks),
            "ledger_deferred": dict(self.deferred),
            "outbox": len(self.outbox),
            "outbox_sent": self.outbox.sent,
            "outbox_retried": self.outbox.retried,
            "outbox_dropped": self.outbox.dropped,
            "outbox_rejected": self.outbox.rejected,
            "leases": {p: len(h) for p, h in self._leases.items()},
            "local_leases": {p: len(h) for p, h in self._local_leases.items()},
        }
