"""The bucket-store seam: where bucket levels and fleet-wide slot leases live.

The admission core is sans-IO; shared state is I/O.  So admission is split: the gateway
asks a :class:`BucketStore` to reserve a job's claims (all or nothing, one round trip) and
hands the answer, a :class:`~velvetrope.core.bucket.Grant` or a
:class:`~velvetrope.core.bucket.Denial`, to
:meth:`~velvetrope.core.controller.AdmissionController.arrive`; the core runs the lifecycle
either way.  When the job ends its settlement goes back to the store, idempotently per job
id (the gateway sends it through an :class:`~velvetrope.store.outbox.Outbox`, so a
completion never waits on the store).

:class:`FleetSlots` counts a pool's in-flight work over every gateway replica as leases
that expire unless renewed, so a replica that dies gives its slots back.

Implementations: :class:`~velvetrope.store.memory.MemoryStore` (one process, the default)
and :class:`~velvetrope.store.redis_store.RedisStore` (a fleet).  Every method may raise
:class:`~velvetrope.errors.StoreUnavailable` when the store cannot be reached in time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, SettleLine

__all__ = ["BucketStore", "FleetSlots", "FleetView", "LeaseAnswer", "Slot"]


class BucketStore(Protocol):
    """Bucket levels, reserved and settled atomically."""

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        """Reserve every claim or none for ``job_id``.  A grant carries snapshots of the
        claimed buckets after the reservation (for ``x-ratelimit-*`` headers)."""
        ...

    async def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> bool:
        """Apply a job's settle ``lines`` (same order as its ``claims``), only the first
        time ``job_id`` is settled; return whether they were applied.  Settling a job
        whose reservation never happened may change nothing (Redis) or apply (memory,
        where reservations cannot be lost): callers settle only what was granted, except
        to compensate a reservation whose answer was lost, which only Redis can have."""
        ...

    async def snapshots(self, tenant: str, claims: Sequence[Claim]) -> tuple[BucketSnapshot, ...]:
        """The claimed buckets' state now."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class Slot(NamedTuple):
    """A slot asked of ``pool``: the job's ``tokens`` in flight, against the pool's fleet-wide
    ``max_in_flight`` and ``max_tokens`` (``None``: no token budget)."""

    pool: str
    tokens: int
    max_in_flight: int
    max_tokens: int | None


class LeaseAnswer(NamedTuple):
    """Whether a slot was granted, and the pool's fleet-wide load after the call:
    ``tokens_in_flight`` sums the tokens of the leases taken under a token cap (only those
    count against one); -1 when the call named no cap (``Slot.max_tokens`` ``None``), which
    neither checks nor records tokens."""

    granted: bool
    in_flight: int
    tokens_in_flight: int


class FleetView(NamedTuple):
    """What the last heartbeat saw: live replicas and their summed queue depth."""

    replicas: int
    queue_depth: int


class FleetSlots(Protocol):
    """A pool's slots, counted over the whole fleet of gateways as expiring leases."""

    async def acquire(self, job_id: str, slot: Slot) -> LeaseAnswer:
        """Take one slot for ``job_id`` if the pool has room (a pool with nothing in
        flight always grants one).  Acquiring a lease already held renews it."""
        ...

    async def release(self, pool: str, job_ids: Sequence[str]) -> int:
        """Give back leases (unknown ids are skipped); return how many were released."""
        ...

    async def renew(self, pool: str, job_ids: Sequence[str]) -> int:
        """Extend live leases by the TTL; expired ones are not re-created."""
        ...

    async def heartbeat(self, replica: str, queue_depth: int) -> FleetView:
        """Say this replica is alive; learn how many are."""
        ...
