"""Leases on the gateway: taking a dispatched job's lease on one of its pool's shared
slots from the store (the words as ``docs/design.md``'s glossary has them).

The request machine (:mod:`velvetrope.core.request_machine`) decides when a job needs its
lease (:class:`~velvetrope.core.effects.Acquire`) and holds the pool's next dispatches
meanwhile (:class:`~velvetrope.core.leases.LeaseBrake`); :class:`LeaseTaker` is the I/O:
it asks the store, waiting while every shared slot is leased, woken when a lease of the
pool is given back here, polling (2 ms doubling to 50 ms) for leases given back by other
replicas.
"""

from __future__ import annotations

import asyncio

from velvetrope.core.job import Job
from velvetrope.core.leases import Slot
from velvetrope.store.base import Store

__all__ = ["LeaseTaker"]


class LeaseTaker:
    """Takes dispatched jobs' leases on one pool's shared slots from the store."""

    def __init__(self, pool: str, store: Store) -> None:
        self.pool = pool
        self.store = store
        self._released = asyncio.Event()

    def released(self) -> None:
        """A lease of this pool was given back here: wake the waiter."""
        self._released.set()

    async def take(self, job: Job, slot: Slot, gone: asyncio.Future[None]) -> bool:
        """Acquire the dispatched ``job``'s lease of ``slot``, waiting while the fleet is
        full; false if the client went away first.  Raises
        :class:`~velvetrope.errors.StoreUnavailable` when the store refuses to answer
        (``fail_closed``)."""
        acquire = self.store.acquire
        if await acquire(job.id, slot):
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
            if await acquire(job.id, slot):
                return True
            delay = min(0.05, delay * 2)
