"""The gateway's shared state: bucket reservations, settlements and fleet-wide slots.

:func:`build_state` picks the backend from ``state.url``:

* :class:`LocalState` (``memory://``): buckets in this process, settled at once; pool slots
  are the controller's own (``max_in_flight`` per gateway process).
* :class:`~velvetrope.store.guard.GuardedState` (Redis): buckets shared by every replica and
  worker; each dispatched job also holds a fleet-wide slot lease (:class:`FleetGate`), so
  ``max_in_flight`` and ``max_tokens_in_flight`` hold for the whole fleet.

The queue stays local to each replica: ordering needs the jobs at hand, and a shared queue
would put a Redis round trip on every ordering decision.  A replica takes its next job from
its own queue only when that job can also get a fleet slot; :class:`FleetGate` lets at most
one job per pool wait for a slot at a time, so the policy's order is kept up to that one job.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.core import Job
from velvetrope.core.bucket import Claim, Denial, Grant, SettleLine
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect
from velvetrope.store.guard import GuardedState
from velvetrope.store.memory import MemoryStore
from velvetrope.store.redis_store import RedisStore

__all__ = ["FleetGate", "GatewayState", "LocalState", "build_state"]


class GatewayState(Protocol):
    """What the gateway needs of its state backend."""

    @property
    def fleet(self) -> bool:
        """Whether pool slots are counted fleet-wide (leases)."""
        ...

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        """Reserve ``claims``; may raise :class:`~velvetrope.errors.StoreUnavailable`."""
        ...

    async def admit(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        slot: Slot,
    ) -> tuple[Grant | Denial, bool]:
        """Reserve ``claims`` and, if granted, take a fleet slot in the same round trip;
        returns the reservation and whether a slot was taken."""
        ...

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str | None,
    ) -> None:
        """A job ended: settle its claims and give back its slot in ``pool`` (never waits
        on I/O)."""
        ...

    async def acquire(self, job_id: str, slot: Slot) -> bool: ...

    def start(self) -> None: ...

    async def stop(self, flush_s: float = 2.0) -> None: ...

    def status(self) -> dict[str, Any]: ...


class LocalState:
    """``memory://``: buckets in this process; no fleet slots."""

    fleet = False

    def __init__(self, clock: Clock) -> None:
        self.store = MemoryStore(clock)

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        return self.store.reserve_now(claims)

    async def admit(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        slot: Slot,
    ) -> tuple[Grant | Denial, bool]:
        return self.store.reserve_now(claims), False

    def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str | None,
    ) -> None:
        if lines:  # the controller ends each job once: no per-job deduplication here
            self.store.buckets.settle(lines, self.store.clock.now())

    async def acquire(self, job_id: str, slot: Slot) -> bool:
        return True

    def start(self) -> None:
        return None

    async def stop(self, flush_s: float = 2.0) -> None:
        return None

    def levels(self) -> dict[str, tuple[float, float]]:
        return self.store.levels()

    def status(self) -> dict[str, Any]:
        return {"backend": "memory", "up": True}


def build_state(
    config: GatewayConfig,
    clock: Clock,
    *,
    observe_call: Callable[[str, float], None] | None = None,
    queue_depth: Callable[[], int] | None = None,
) -> LocalState | GuardedState:
    """The backend ``config.state`` names."""
    st = config.state
    if not st.shared:
        return LocalState(clock)
    password = os.environ.get(st.password_env) if st.password_env else None
    timeout_s = st.call_timeout_ms / 1000.0
    client = connect(st.url, password=password, timeout_s=max(timeout_s, 0.25))
    policy = config.policy
    shared_tag = bool(policy.models) or any(t.limits is not None for t in policy.tiers)
    redis = RedisStore(
        client,
        namespace=st.namespace,
        shared_tag=shared_tag,
        lease_ttl_s=st.lease_ttl_s,
        replica_ttl_s=max(3 * st.heartbeat_s, 1.0),
        hold_ttl_s=st.hold_ttl_s,
    )
    return GuardedState(
        redis,
        clock,
        on_store_error=st.on_store_error,
        call_timeout_s=timeout_s,
        heartbeat_s=st.heartbeat_s,
        breaker_failures=st.breaker_failures,
        breaker_reset_s=st.breaker_reset_s,
        observe_call=observe_call,
        queue_depth=queue_depth,
    )


class FleetGate:
    """A pool's brake while one of its dispatched jobs waits for a fleet slot.

    As a core saturation signal it admits no further dispatch from this replica's queue
    while a job waits, so at most one job per pool has left the queue without a slot.
    """

    def __init__(self, pool: str, max_in_flight: int, max_tokens: int | None) -> None:
        self.pool = pool
        self.max_in_flight = max_in_flight
        self.max_tokens = max_tokens
        self.waiting = 0
        self._released = asyncio.Event()

    def admits(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        return self.waiting == 0

    def slot(self, job: Job) -> Slot:
        """The slot ``job`` (sized) asks of this pool."""
        return Slot(self.pool, job.cost, self.max_in_flight, self.max_tokens)

    def released(self) -> None:
        """A slot of this pool was given back here: wake the waiter."""
        self._released.set()

    async def hold(
        self, state: GatewayState, job: Job, gone: asyncio.Future[None], pump: Callable[[], None]
    ) -> bool:
        """Acquire a fleet slot for the dispatched ``job``, waiting while the fleet is full
        (woken by local releases, polling up to every 50 ms for remote ones).  False if
        the client went away first.  Raises
        :class:`~velvetrope.errors.StoreUnavailable` under ``fail_closed``."""
        acquire = state.acquire
        slot = self.slot(job)
        if await acquire(job.id, slot):
            return True
        self.waiting += 1
        try:
            delay = 0.002
            while True:
                self._released.clear()
                wake = asyncio.ensure_future(self._released.wait())
                try:
                    await asyncio.wait(
                        (wake, gone), timeout=delay, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    wake.cancel()
                if gone.done():
                    return False
                if await acquire(job.id, slot):
                    return True
                delay = min(0.05, delay * 2)
        finally:
            self.waiting -= 1
            pump()
