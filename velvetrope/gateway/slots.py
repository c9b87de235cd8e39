"""Shared slots (leases) on the gateway: a pool's ``max_in_flight`` kept over every gateway
replica (the words as ``docs/design.md``'s glossary has them).

With a shared store each dispatched job has a lease on one of its pool's slots, counted
over every gateway replica.  Two objects per pool, one job each:

* :class:`SlotBrake` (sans-IO) is a core capacity signal and dispatch tracker: while a job
  this replica dispatched waits for its lease, it holds the replica's further
  dispatches from that pool.  So at most one job per pool leaves the queue without a slot,
  and the policy's order is kept up to that one job.
* :class:`FleetSlot` (I/O) takes a dispatched job's lease from the store, waiting while
  every shared slot is leased: woken when a lease of the pool is given back here, polling
  (2 ms doubling to 50 ms) for leases given back by other replicas.

The slot a job asks for is sized from the pool's capacity at that moment (per engine ×
live engines), so it follows the engines without being resized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from velvetrope.core.capacity import PoolCapacity
from velvetrope.core.job import Job
from velvetrope.store.base import Slot, Store

__all__ = ["FleetSlot", "SlotBrake"]


class SlotBrake:
    """Holds a pool's dispatches while a job dispatched here lacks its fleet slot."""

    __slots__ = ("_has_lease", "lacking", "pool")

    def __init__(self, pool: str, has_lease: Callable[[str, str], bool]) -> None:
        self.pool = pool
        self._has_lease = has_lease  # (job id, pool) -> whether the job has its lease
        self.lacking: set[str] = set()
        """Ids of the jobs dispatched here that have no fleet slot yet (at most one, but
        for a job dispatched while nothing else was in flight)."""

    def admits(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        return not self.lacking

    def started(self, job: Job, now: float) -> None:
        if job.shadow is None and not self._has_lease(job.id, self.pool):  # shadow: none
            self.lacking.add(job.id)

    def ended(self, job: Job, now: float) -> None:
        self.lacking.discard(job.id)

    def slotted(self, job_id: str) -> None:
        """``job_id`` got its slot: release the brake."""
        self.lacking.discard(job_id)


class FleetSlot:
    """Takes dispatched jobs' fleet-wide slots of one pool from the store."""

    def __init__(self, pool: str, capacity: PoolCapacity, store: Store) -> None:
        self.pool = pool
        self.capacity = capacity
        self.store = store
        self.brake = SlotBrake(pool, store.has_lease)
        capacity.signals.append(self.brake)
        capacity.trackers.append(self.brake)
        self._released = asyncio.Event()

    def ask(self, job: Job) -> Slot:
        """The slot ``job`` (sized) asks of this pool now."""
        cap = self.capacity
        return Slot(self.pool, job.cost, cap.max_in_flight, cap.max_tokens)

    def released(self) -> None:
        """A slot of this pool was given back here: wake the waiter."""
        self._released.set()

    async def take(self, job: Job, gone: asyncio.Future[None]) -> bool:
        """Acquire the dispatched ``job``'s slot, waiting while the fleet is full; false if
        the client went away first.  Raises :class:`~velvetrope.errors.StoreUnavailable`
        when the store refuses to answer (``fail_closed``)."""
        acquire = self.store.acquire
        if await acquire(job.id, self.ask(job)):
            self.brake.slotted(job.id)
            return True
        delay = 0.002
        while True:
            self._released.clear()
            wake = asyncio.ensure_future(self._released.wait())
            try:
                await asyncio.wait((wake, gone), timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
            if gone.done():
                return False
            if await acquire(job.id, self.ask(job)):
                self.brake.slotted(job.id)
                return True
            delay = min(0.05, delay * 2)
