"""The in-memory bucket store: one process, no shared state (``state.url: memory://``)."""

from __future__ import annotations

from collections.abc import Sequence

from velvetrope.clock import Clock
from velvetrope.core.bucket import (
    BucketSnapshot,
    Claim,
    Denial,
    Grant,
    MemoryBuckets,
    SettleLine,
)
from velvetrope.core.job import Outcome

__all__ = ["MemoryStore"]


class MemoryStore:
    """:class:`~velvetrope.store.base.BucketStore` over
    :class:`~velvetrope.core.bucket.MemoryBuckets`; every call completes without
    suspending."""

    def __init__(self, clock: Clock, buckets: MemoryBuckets | None = None) -> None:
        self.clock = clock
        self.buckets = buckets if buckets is not None else MemoryBuckets()

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        return self.reserve_now(claims)

    def reserve_now(self, claims: Sequence[Claim]) -> Grant | Denial:
        """:meth:`reserve`, synchronously (used by the fail-open fallback)."""
        return self.buckets.reserve(claims, self.clock.now(), with_snapshots=True)

    async def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> bool:
        return self.buckets.settle(lines, self.clock.now(), job_id)

    async def snapshots(self, tenant: str, claims: Sequence[Claim]) -> tuple[BucketSnapshot, ...]:
        return self.buckets.snapshots(claims, self.clock.now())

    def settle_ended(self, o: Outcome) -> None:
        """The controller's observer when this store is the gateway's only one: settle an
        ended job's claims at the time it ended (no per-job deduplication: the controller
        ends each job once)."""
        lines = o.settlement.lines
        if lines:
            self.buckets.settle(lines, o.at)

    def levels(self) -> dict[str, tuple[float, float]]:
        """Every bucket's ``(level, capacity)`` now."""
        return self.buckets.levels(self.clock.now())

    async def close(self) -> None:
        return None
