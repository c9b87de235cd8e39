"""The leases this replica's jobs have, in Redis and from the fallback, per pool.

A job's lease is taken in Redis while it can be asked, else (``fail_open``) from this
replica's 1/N share of a pool's slots: the share also leaves the other replicas what they
held at this replica's last lease reply (a replica that held more than its share keeps
running those jobs), and counts the jobs this replica still runs on Redis leases.  A lease
is given back where it was taken: a Redis one through the outbox, a fallback one at once.

**Leases across an outage.**  Redis may come back without its data (restarted empty), so
after any failed call, and when a heartbeat finds that Redis forgot this replica, the
leases are *suspect* (:meth:`Leases.suspect`): the replica *re-asserts* every lease it holds
— those taken in Redis and those the fallback gave — at its first successful contact (a
heartbeat, or before its next lease), re-creating what Redis lost whatever the pool's
limit: those jobs are running.  The other replicas do the same at their own first contact,
within a heartbeat; until ``2 * heartbeat_s + 1`` s after its re-assertion, a replica
therefore still holds at most its 1/N share of a pool's slots (N as seen before the
outage), so the fleet's ``max_in_flight`` holds through the transition too.  Periodic
renewal (:meth:`Leases.renew_forever`) re-creates a lease the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from velvetrope.clock import Clock
from velvetrope.errors import StoreUnavailable
from velvetrope.store.base import LeaseAnswer, Slot
from velvetrope.store.call_guard import CallGuard
from velvetrope.store.outbox import Outbox
from velvetrope.store.redis_store import RedisStore
from velvetrope.store.replies import parse_lease

__all__ = ["Leases"]


def _recorded(slot: Slot) -> int:
    """The tokens a lease records in Redis: the slot's, or -1 without a token cap."""
    return -1 if slot.max_tokens is None else slot.tokens


class Leases:
    """Per pool, the jobs with a lease in Redis (``remote``) and with one from the fallback
    (``local``), each job id mapped to the tokens its lease records."""

    def __init__(
        self,
        redis: RedisStore,
        guard: CallGuard,
        outbox: Outbox,
        clock: Clock,
        heartbeat_s: float,
    ) -> None:
        self.redis = redis
        self.guard = guard
        self.outbox = outbox
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.remote: dict[str, dict[str, int]] = {}  # pool -> job id -> tokens, in Redis
        self.local: dict[str, dict[str, int]] = {}  # pool -> job id -> tokens
        self._others: dict[str, int] = {}  # pool -> slots the other replicas held, last seen
        self.suspect = False  # a call failed since the leases were last asserted
        self.careful_until = 0.0  # clock time until which a replica holds at most its share
        self.careful_replicas = 1  # the replicas seen before the failure (the share's N)
        self._assert_lock = asyncio.Lock()

    def has_lease(self, job_id: str, pool: str) -> bool:
        """Whether ``job_id`` has a lease of ``pool``, in Redis or from the fallback."""
        remote = self.remote.get(pool)
        if remote is not None and job_id in remote:
            return True
        local = self.local.get(pool)
        return local is not None and job_id in local

    def held(self, pool: str) -> int:
        """Leases of ``pool`` held here, in Redis and from the fallback."""
        remote = self.remote.get(pool)
        local = self.local.get(pool)
        return (len(remote) if remote is not None else 0) + (len(local) if local is not None else 0)

    def lost(self, replicas: int) -> None:
        """Redis may have lost its data (a call failed, or it forgot this replica): the
        leases are to be re-asserted; ``replicas`` (the N seen until now) bounds this
        replica's share until then."""
        if not self.suspect:
            self.suspect = True
            self.careful_replicas = replicas

    def careful(self) -> bool:
        """Whether leases are still taken one at a time against this replica's share (after
        a failure, until the leases are re-asserted and the other replicas had time to)."""
        return self.suspect or self.clock.now() < self.careful_until

    def took(self, job_id: str, slot: Slot, lease: LeaseAnswer) -> None:
        """Redis answered ``job_id``'s lease of ``slot`` (with its reservation)."""
        if lease.granted:
            self.remote.setdefault(slot.pool, {})[job_id] = _recorded(slot)
        self._saw_fleet(slot.pool, lease.in_flight)

    async def acquire(self, job_id: str, slot: Slot, replicas: int) -> bool:
        """Take a lease of ``slot`` for ``job_id`` (true at once if it has one): in Redis,
        or (fail_open) one of this replica's 1/N share (N: ``replicas``) of the pool's slots;
        fail_closed raises :class:`StoreUnavailable`."""
        pool = slot.pool
        mine = self.remote.get(pool)
        if mine is not None and job_id in mine:
            return True  # taken earlier (with the reservation)
        # this replica's share: N is the larger of now and before the failure while careful
        n = max(replicas, self.careful_replicas) if self.careful() else replicas
        share = max(1, math.ceil(slot.max_in_flight / max(1, n)))
        if self.guard.breaker.allow() and (not self.suspect or await self.reassert()):
            if self.careful() and self.held(pool) >= share:
                return False
            call = self.redis.send_acquire(job_id, slot)
            try:
                ans = parse_lease(await self.guard.call("acquire", call))
            except (StoreUnavailable, asyncio.CancelledError) as e:
                # the answer was lost, or the caller left before it (the call still runs):
                # maybe not the lease; give it back if it was taken
                self.release_remote(pool, job_id)
                if type(e) is not StoreUnavailable:
                    raise
            else:
                if ans.granted:
                    self.remote.setdefault(pool, {})[job_id] = _recorded(slot)
                self._saw_fleet(pool, ans.in_flight)
                return bool(ans.granted)
        self.guard.fall_back("lease")
        # the jobs still running on leases taken in Redis count against the share too, and
        # the fleet's slots the other replicas held when Redis last answered are theirs
        allowed = min(share, slot.max_in_flight - self._others.get(pool, 0))
        if self.held(pool) >= allowed:
            return False
        self.local.setdefault(pool, {})[job_id] = _recorded(slot)
        return True

    def _saw_fleet(self, pool: str, in_flight: int) -> None:
        """A lease reply said the fleet runs ``in_flight`` jobs of ``pool``: those not ours
        are the other replicas' (what the fallback leaves them if Redis goes away)."""
        mine = self.remote.get(pool)
        self._others[pool] = max(0, in_flight - (len(mine) if mine is not None else 0))

    async def reassert(self) -> bool:
        """Re-assert every lease held here (see the module's docstring); true once done.
        A fallback lease asserted in Redis is released there when its job ends."""
        async with self._assert_lock:
            if not self.suspect:
                return True
            for pool in sorted(set(self.remote) | set(self.local)):
                local = self.local.get(pool, {})
                held = {**self.remote.get(pool, {}), **local}
                if not held:
                    continue
                was_local = list(local)
                try:
                    await self.guard.call("renew", self.redis.renew(pool, held))
                except StoreUnavailable:
                    return False
                remote = self.remote.setdefault(pool, {})
                for job_id in was_local:
                    tokens = local.pop(job_id, None)
                    if tokens is not None:  # a fallback lease, now in Redis
                        remote[job_id] = tokens
                    else:  # its job ended during the call: give back what was asserted
                        self.release_remote(pool, job_id)
            self.suspect = False
            self.careful_until = self.clock.now() + 2.0 * self.heartbeat_s + 1.0
            return True

    def end(self, job_id: str, pool: str, release: bool = True) -> bool:
        """``job_id`` ended: forget its lease of ``pool``; one from the fallback is given
        back at once, one in Redis through the outbox unless ``release`` is false (the
        caller gives it back with the job's settlement).  True if it had one in Redis."""
        leases = self.remote.get(pool)
        if leases is not None and leases.pop(job_id, None) is not None:
            if release:
                self.release_remote(pool, job_id)
            return True
        local = self.local.get(pool)
        if local is not None:
            local.pop(job_id, None)
        return False

    def release_remote(self, pool: str, job_id: str) -> None:
        """Give back ``job_id``'s lease of ``pool`` in Redis, through the outbox (with the
        other releases of the pool queued at the time, as one call)."""
        self.outbox.put_grouped(("release", pool), job_id, self._send_releases)

    def _send_releases(self, group: tuple[str, str], job_ids: list[str]) -> Any:
        return self.redis.send_release(group[1], job_ids)

    async def renew_forever(self) -> None:
        """Extend the Redis leases every third of their TTL while nothing is suspect."""
        period = max(0.05, self.redis.lease_ttl_s / 3)
        while True:
            await asyncio.sleep(period)
            for pool, held in list(self.remote.items()):
                if held and self.guard.breaker.closed and not self.suspect:
                    with contextlib.suppress(StoreUnavailable):
                        await self.guard.call("renew", self.redis.renew(pool, dict(held)))

    def counts(self) -> dict[str, dict[str, int]]:
        """How many leases each pool has here, in Redis (``leases``) and from the fallback
        (``local_leases``), for the store's status."""
        return {
            "leases": {p: len(h) for p, h in self.remote.items()},
            "local_leases": {p: len(h) for p, h in self.local.items()},
        }
