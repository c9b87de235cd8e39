"""The store interface: where bucket levels and fleet-wide slot leases live.

The admission core is sans-IO; shared state is I/O.  So admission is split: the gateway's
ticket asks the :class:`Store` to reserve a job's claims (all or nothing; with Redis one
round trip, which also takes the job's lease when the job will start at once) and
hands the answer, a :class:`~velvetrope.core.bucket.Grant` or a
:class:`~velvetrope.core.bucket.Denial`, to
:meth:`~velvetrope.core.controller.AdmissionController.arrive`; the core runs the lifecycle
either way.  When the job ends, :meth:`Store.finish` settles its claims against what it
used and gives back its slot, without waiting on I/O (a shared store sends both through an
outbox, idempotently per job id).

One interface, two implementations chosen by ``state.url``
(:func:`velvetrope.store.open.open_store`), used the same way by every caller:

* :class:`~velvetrope.store.memory.MemoryStore` (``memory://``): one process; every call
  answers at once (:meth:`Store.reserve_now` never returns ``None``); pool slots are the
  controller's own, so :attr:`Store.shared` is false and :meth:`Store.acquire` grants.
* :class:`~velvetrope.store.guard.GuardedStore` (``redis://``, ``rediss://``,
  ``redis+sentinel://``, ``redis+cluster://``): a fleet of gateways shares buckets and
  counts each pool's in-flight work as expiring leases, so a replica that dies gives its
  slots back; while Redis cannot be reached its failure policy answers without I/O.

Calls that reach Redis may raise :class:`~velvetrope.errors.StoreUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from velvetrope.core.bucket import Claim, Denial, Grant, SettleLine
from velvetrope.core.leases import Slot

__all__ = ["FleetView", "LeaseAnswer", "Slot", "Store"]


class LeaseAnswer(NamedTuple):
    """Whether a slot was granted, and the pool's fleet-wide load after the call:
    ``tokens_in_flight`` sums the tokens of the leases taken under a token cap (only those
    count against one); -1 when the call named no cap (``Slot.max_tokens`` ``None``), which
    neither checks nor records tokens."""

    granted: bool
    in_flight: int
    tokens_in_flight: int


class FleetView(NamedTuple):
    """What the last heartbeat saw: live gateway replicas and their summed queue depth, and
    whether Redis knew this replica as live (false at its first beat, and after Redis lost
    its data or the replica fell silent past the replica TTL)."""

    replicas: int
    queue_depth: int
    known: bool = True


class Store(Protocol):
    """Bucket reservations and settlements, and fleet-wide slots, for one gateway process."""

    @property
    def shared(self) -> bool:
        """Whether limits are shared with other gateway processes; then a pool's slots are
        counted fleet-wide (leases), and a dispatched job must :meth:`acquire` one."""
        ...

    def reserve_now(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial | None:
        """:meth:`reserve` when it can be answered without I/O, else ``None``.  Memory
        always answers; a shared store answers while its state is away (its failure
        policy: a local share, or :class:`~velvetrope.errors.StoreUnavailable`)."""
        ...

    async def reserve(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> Grant | Denial:
        """Reserve every claim or none for ``job_id``; a grant carries snapshots of the
        claimed buckets after it (for ``x-ratelimit-*`` headers).  With ``slot``, a granted
        job also tries for its lease in the same round trip (:meth:`has_lease` says whether
        it got one).  Raises :class:`~velvetrope.errors.StoreUnavailable` when the
        store cannot answer and the failure policy is to refuse."""
        ...

    def has_lease(self, job_id: str, pool: str) -> bool:
        """Whether ``job_id`` has a lease of ``pool`` (always true unless shared)."""
        ...

    async def acquire(self, job_id: str, slot: Slot) -> bool:
        """Take a lease for ``job_id`` if the pool has room fleet-wide (true at once if
        it holds one).  Raises :class:`~velvetrope.errors.StoreUnavailable` when the store
        cannot answer and the failure policy is to refuse."""
        ...

    def release(self, job_id: str, pool: str) -> None:
        """Give back ``job_id``'s lease of ``pool`` now, keeping its reservation: a job
        taken back from its engine and queued again, which asks for a lease again when it
        is dispatched.  Nothing without one; never waits on I/O."""
        ...

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> None:
        """A job ended: settle its ``lines`` (same order as its granted ``claims``) and give
        back its slot in ``pool`` if it holds one, each where it was taken.  Never waits on
        I/O; called once per job."""
        ...

    def levels(self) -> dict[str, tuple[float, float]]:
        """``(level, capacity)`` of every bucket this process knows (for a shared store:
        as last seen in a reply)."""
        ...

    def start(self) -> None:
        """Start background work (heartbeats, lease renewal, the outbox); needs a loop."""
        ...

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every settlement and release has reached the store, at most
        ``timeout_s``; true if nothing is left to send."""
        ...

    async def stop(self, flush_s: float = 2.0) -> None:
        """Flush (bounded), stop background work, release connections."""
        ...

    def status(self) -> dict[str, Any]:
        """The store's state for ``/admin/status``."""
        ...
