"""The in-memory store: one process, no shared state (``state.url: memory://``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from velvetrope.clock import Clock
from velvetrope.core.bucket import Claim, Denial, Grant, MemoryBuckets, SettleLine
from velvetrope.core.controller import AdmissionController, Decision
from velvetrope.core.job import Job, Outcome
from velvetrope.store.base import Slot

__all__ = ["MemoryStore"]


class MemoryStore:
    """:class:`~velvetrope.store.base.Store` over
    :class:`~velvetrope.core.bucket.MemoryBuckets`: every call answers at once, and pool
    slots are the controller's own (nothing is shared, so :meth:`acquire` grants)."""

    shared = False

    def __init__(self, clock: Clock, buckets: MemoryBuckets | None = None) -> None:
        self.clock = clock
        self.buckets = buckets if buckets is not None else MemoryBuckets()

    def reserve_now(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial:
        return self.buckets.reserve(claims, self.clock.now(), with_snapshots=True)

    async def reserve(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial:
        return self.buckets.reserve(claims, self.clock.now(), with_snapshots=True)

    def has_lease(self, job_id: str, pool: str) -> bool:
        return True

    async def acquire(self, job_id: str, slot: Slot) -> bool:
        return True

    def release(self, job_id: str, pool: str) -> None:
        return None  # no leases in memory

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        if lines:  # called once per job: no per-job deduplication here
            self.buckets.settle(lines, self.clock.now())

    def levels(self) -> dict[str, tuple[float, float]]:
        return self.buckets.levels(self.clock.now())

    def start(self) -> None:
        return None

    async def flush(self, timeout_s: float) -> bool:
        return True

    async def stop(self, flush_s: float = 2.0) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"backend": "memory", "up": True}

    # -- for tools that drive a controller directly (the scenario, closed-loop runs) ---

    def arrive(self, ctl: AdmissionController, job: Job) -> Decision:
        """``job`` arrives at ``ctl`` in the gateway's order: its claims reserved here, then
        the controller's decision on that reservation.  Settle every outcome of ``ctl``
        here (:meth:`settle`, as an observer)."""
        claims = ctl.claims(job)
        return ctl.arrive(job, self.reserve_now(job.id, job.tenant, claims) if claims else None)

    def settle(self, o: Outcome) -> None:
        """Settle an ended job's claims here (a controller's observer)."""
        job = o.job
        self.finish(job.id, job.tenant, job.claims, o.settlement.lines, job.pool)
